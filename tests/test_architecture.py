"""The layering rules of docs/ARCHITECTURE.md, checked over the source: no two modules import each other,
no library module imports the benchmarks, and only the reports read the records."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "workbench"
LIBRARY_PACKAGES = ("data", "bucketing", "oomptimizer", "memory", "models", "decoding", "adapters", "training",
                    "records")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _raw_imports() -> dict[str, set[str]]:
    """Every workbench module -> every module it imports (anywhere in the file), with each imported name."""
    graph = {}
    for path in ROOT.rglob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
        graph[_module_name(path)] = found
    return graph


def _imports() -> dict[str, set[str]]:
    """Every workbench module -> the workbench modules it imports (anywhere in the file)."""
    raw = _raw_imports()
    return {name: {m for m in found if m in raw and m != name} for name, found in raw.items()}


def test_no_two_modules_import_each_other():
    graph = _imports()
    mutual = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps
                     if a in graph.get(b, set()) and not (a.startswith(b + ".") or b.startswith(a + "."))})
    assert mutual == []  # a package's __init__ importing its own modules is not a circle


def test_no_library_module_imports_the_benchmarks():
    offenders = sorted(f"{a} -> {b}" for a, found in _raw_imports().items() for b in found
                       if b == "benchmarks" or b.startswith("benchmarks."))
    assert offenders == []


def test_only_the_reports_read_the_records():
    """records/ reads benchmarks/results for notebooks, SUMMARY.md and `workbench report`; no other library
    package depends on it."""
    offenders = sorted(f"{a} -> {b}" for a, deps in _imports().items() for b in deps
                       if a.split(".")[1] in LIBRARY_PACKAGES and a.split(".")[1] != "records"
                       and b.startswith("workbench.records"))
    assert offenders == []


def test_models_hold_models_only():
    """models/ imports neither the bucketing nor the data packages (the recipe that needs them is training/)."""
    offenders = sorted(f"{a} -> {b}" for a, deps in _imports().items() for b in deps
                       if a.startswith("workbench.models") and b.startswith(("workbench.bucketing", "workbench.data")))
    assert offenders == []


def test_no_code_reads_the_archive_of_superseded_results():
    """benchmarks/results/archive/ holds superseded records for people only: no module names it, and the
    summary and the staleness mark read the results folder's own *.json, not its subfolders."""
    import json
    import tempfile

    from workbench.records.summary import render
    from workbench.reporting import result_freshness

    named = [str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py") if "archive" in p.read_text()]
    scripts = [str(p) for p in (ROOT.parent / "scripts").glob("*") if p.is_file() and "archive" in p.read_text()]
    assert not named and not scripts
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "archive").mkdir()
        (Path(folder) / "archive" / "models.json").write_text(json.dumps({"not": "a record"}))
        assert "models.json" not in render(Path(folder)) and result_freshness(folder) == []


def test_notebooks_define_no_functions_or_classes():
    """Notebooks call the library: a function or class a cell defines belongs in a module, with a test."""
    import json
    import re

    notebooks = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
    assert notebooks
    found = [f"{nb.name} cell {i}: {m.group(0).strip()}" for nb in notebooks
             for i, cell in enumerate(json.loads(nb.read_text())["cells"]) if cell["cell_type"] == "code"
             for m in re.finditer(r"^\s*(def|class)\s+\w+", "".join(cell["source"]), re.M)]
    assert found == []
