"""Every notebook runs headlessly with papermill in smoke mode and produces its plots."""

import json
from pathlib import Path

import pytest

from workbench.reporting import KERNEL_DISPLAY_NAME, KERNEL_NAME

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert any(nb.name.startswith("00_corpus") for nb in NOTEBOOKS)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(notebook, tmp_path):
    papermill = pytest.importorskip("papermill")
    nb = json.loads(notebook.read_text())
    first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "parameters" in first_code.get("metadata", {}).get("tags", []), "first code cell must be `parameters`"
    assert "smoke" in "".join(first_code["source"])
    out = tmp_path / notebook.name
    papermill.execute_notebook(str(notebook), str(out), parameters={"smoke": True, "interactive": False},
                               cwd=str(notebook.parent), kernel_name=KERNEL_NAME, progress_bar=False)
    executed = json.loads(out.read_text())
    outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook drew no plot"
    assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    silent = [i for i, c in enumerate(executed["cells"]) if "meaning" in c.get("metadata", {}).get("tags", [])
              and not "".join("".join(o.get("text", "")) for o in c.get("outputs", [])
                              if o.get("output_type") == "stream").strip()]
    assert not silent, f"`meaning` cells that printed nothing: {silent}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_declares_the_workbench_kernel(notebook):
    """JupyterLab, papermill and nbval open every notebook on the project's .venv kernel, not python3."""
    spec = json.loads(notebook.read_text())["metadata"].get("kernelspec", {})
    assert spec == {"name": KERNEL_NAME, "display_name": KERNEL_DISPLAY_NAME, "language": "python"}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_interactive_panels_are_on_by_default(notebook):
    """A live kernel shows the panels; papermill runs (report, tests) pass interactive=False."""
    nb = json.loads(notebook.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    assert "interactive: bool = True" in "".join(cell["source"])


def test_make_test_runs_nbval_on_the_workbench_kernel():
    makefile = (NOTEBOOKS[0].parents[1] / "Makefile").read_text()
    line = next(ln for ln in makefile.splitlines() if "--nbval" in ln)
    assert f"--nbval-kernel-name {KERNEL_NAME}" in line


def _parameter_names(notebook: Path) -> list[str]:
    """The names assigned in a notebook's parameters cell, read with Python's own parser."""
    import ast

    nb = json.loads(notebook.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    tree = ast.parse("".join(cell["source"]))
    return [node.target.id for node in tree.body if isinstance(node, ast.AnnAssign)]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_help_notebook_lists_every_parameter(notebook):
    """papermill's parameter parser drops a line whose inline comment it cannot read (one with '=' in it)."""
    pytest.importorskip("papermill")
    from papermill.inspection import display_notebook_help

    import click

    names = _parameter_names(notebook)
    assert "smoke" in names and "interactive" in names
    lines = []
    ctx = click.Context(click.Command("papermill"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(click, "echo", lambda message="", **kw: lines.append(str(message)))
        display_notebook_help(ctx, str(notebook), None)
    listed = {line.split(":")[0].strip() for line in lines if line.startswith("  ") and ":" in line}
    assert listed == set(names), f"--help-notebook misses {set(names) - listed}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_title_carries_its_number(notebook):
    """The index and the reports list the notebooks as NN Title, in the order a reader takes them."""
    title = "".join(json.loads(notebook.read_text())["cells"][0]["source"]).splitlines()[0]
    assert title.startswith(f"# {notebook.name[:2]} "), title


OPEN_SECTIONS = ("Explore", "In one line", "Live")  # panels, the index's line, a live GPU run: no reading of their own


def _sections(nb: dict) -> list[tuple[str, list[dict]]]:
    """(heading, cells) of each `## ` section of a notebook."""
    out: list[tuple[str, list[dict]]] = []
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and text.startswith("## "):
            out.append((text.splitlines()[0][3:], []))
        elif out:
            out[-1][1].append(cell)
    return out


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_section_ends_with_what_it_means(notebook):
    """Each section's last code cell is tagged `meaning`: it prints what the result means, from the figures."""
    missing = []
    for heading, cells in _sections(json.loads(notebook.read_text())):
        if heading.startswith(OPEN_SECTIONS):
            continue
        code = [c for c in cells if c["cell_type"] == "code"]
        tagged = [i for i, c in enumerate(code) if "meaning" in c.get("metadata", {}).get("tags", [])]
        if not tagged or any("print(" not in "".join(code[i]["source"]) for i in tagged) or \
                not all("interactive" in "".join(c["source"]) for c in code[tagged[-1] + 1:]):
            missing.append(heading)
    assert not missing, f"sections without a closing `meaning` cell: {missing}"
