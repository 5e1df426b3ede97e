"""The notebooks' structure. `make test` runs each one with nbval, in smoke mode, with the parameters papermill
passes, and checks its outputs (notebooks/conftest.py); nothing here executes a notebook."""

import json
import re
from pathlib import Path

import pytest

from workbench.reporting import KERNEL_DISPLAY_NAME, KERNEL_NAME

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert any(nb.name.startswith("00_corpus") for nb in NOTEBOOKS)


def _nbval_conftest():
    """notebooks/conftest.py, the hooks that make `make test`'s nbval run the notebook test."""
    import importlib.util

    path = NOTEBOOKS[0].parent / "conftest.py"
    spec = importlib.util.spec_from_file_location("notebooks_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_starts_with_its_parameters_and_nbval_injects_papermills(notebook):
    """nbval runs each notebook once, with the parameters papermill ran them with (smoke, no panels), and checks
    its outputs (an error, no plot, a widget, a silent `meaning` cell fail it): notebooks/conftest.py."""
    nb = json.loads(notebook.read_text())
    first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "parameters" in first_code.get("metadata", {}).get("tags", []), "first code cell must be `parameters`"
    assert "smoke" in "".join(first_code["source"])
    conftest = _nbval_conftest()
    assert conftest.PARAMETERS == {"smoke": True, "interactive": False}
    assert set(conftest.PARAMETERS) <= set(_parameter_names(notebook))
    injected = conftest._injected("".join(first_code["source"]))
    namespace: dict = {}
    exec(injected, namespace)  # the parameters cell holds assignments only
    assert {name: namespace[name] for name in conftest.PARAMETERS} == conftest.PARAMETERS


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_panel_runs_again_with_interactive_on(notebook):
    """The nbval run has interactive=False; each panel (a cell that tests `interactive` in an `if`) runs a second
    time with it on, so the panels' code runs in `make test` too."""
    conftest = _nbval_conftest()
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    panels = [c for c in cells if re.search(r"widget_panel\(|interactive_panel\(|explore_block\(", "".join(c["source"]))]
    assert panels, "every notebook offers a panel"
    assert all(conftest.PANEL.search("".join(c["source"])) for c in panels)


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
    assert "WORKBENCH_SMOKE=1" in line and line.rstrip().endswith(" notebooks")
    assert "-n 2 --dist loadfile" in line  # two workers, each notebook's cells on one kernel, in order


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
