"""nbval runs each notebook once, as `workbench report` and papermill do: smoke mode, no panels.

`make test` runs `pytest --nbval-lax notebooks` (WORKBENCH_SMOKE=1). This file turns that run into the notebook
test that tests/test_notebooks.py made with papermill, without a second execution:

- the papermill parameters (PARAMETERS) are injected after each notebook's `parameters` cell;
- each panel (a cell that tests `interactive` in an `if`: the ipywidgets panels) runs again right after, with
  interactive=True, so the panels' code still runs (and must not raise) in a headless kernel; a cell that
  only passes `interactive` on (notebook 02's plan, for its progress bar) runs once, with it off;
- a last item per notebook, `checks`, asserts on the outputs of the run with interactive=False: no error, at
  least one plot, no widget, and every `meaning` cell printed something.
"""

import copy
import re
import textwrap

import pytest

PARAMETERS = {"smoke": True, "interactive": False}  # what papermill passed: `workbench report` passes the same
# a panel cell run again with interactive=True (one that raises leaves the later cells as papermill ran them)
INTERACTIVE_RERUN = "interactive = True\ntry:\n{source}\nfinally:\n    interactive = False\n"
PANEL = re.compile(r"^\s*if\b[^\n]*\binteractive\b", re.MULTILINE)


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _injected(source: str) -> str:
    lines = "".join(f"{name} = {value!r}\n" for name, value in PARAMETERS.items())
    return f"{source.rstrip()}\n\n# Injected parameters (notebooks/conftest.py, as papermill injects them)\n{lines}"


def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("nbval", False) and not config.getoption("nbval_lax", False):
        return  # no notebook items: nbval collects them only when asked
    from nbval.plugin import IPyNbCell, IPyNbFile

    out, cells_of = [], {}
    for item in items:
        if not isinstance(item, IPyNbCell):
            out.append(item)
            continue
        cells_of.setdefault(item.parent, []).append(item)
        out.append(item)
        if "parameters" in _tags(item.cell):
            item.cell = copy.deepcopy(item.cell)
            item.cell.source = _injected(item.cell.source)
        elif PANEL.search(item.cell.source):
            cell = copy.deepcopy(item.cell)
            cell.source = INTERACTIVE_RERUN.format(source=textwrap.indent(cell.source, "    "))
            out.append(IPyNbCell.from_parent(item.parent, name=f"{item.name} (interactive)",
                                             cell_num=item.cell_num, cell=cell, options=item.options))
    for parent, cells in cells_of.items():
        assert isinstance(parent, IPyNbFile)
        assert any("parameters" in _tags(c.cell) for c in cells), f"{parent.name}: no `parameters` cell"
        last = max(i for i, it in enumerate(out) if getattr(it, "parent", None) is parent)
        out.insert(last + 1, NotebookChecks.from_parent(parent, name="checks", cells=cells))
    items[:] = out


class NotebookChecks(pytest.Item):
    """What the papermill test asserted on the executed notebook, on the outputs nbval collected."""

    def __init__(self, *, cells, **kwargs):
        super().__init__(**kwargs)
        self.cells = cells

    def runtest(self):
        unrun = [c.name for c in self.cells if c.test_outputs is None and not c.options["skip"]]
        assert not unrun, f"cells that did not run: {unrun}"
        outputs = [o for c in self.cells for o in (c.test_outputs or [])]
        assert not [o for o in outputs if o.get("output_type") == "error"]
        assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook drew no plot"
        assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        silent = [c.cell_num for c in self.cells if "meaning" in _tags(c.cell)
                  and not "".join(o.get("text", "") for o in (c.test_outputs or [])
                                  if o.get("output_type") == "stream").strip()]
        assert not silent, f"`meaning` cells that printed nothing: {silent}"

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}::checks"
