"""Every notebook runs headlessly with papermill in smoke mode and produces its plots."""

import json
from pathlib import Path

import pytest

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
                               cwd=str(notebook.parent), kernel_name="python3", progress_bar=False)
    executed = json.loads(out.read_text())
    outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook drew no plot"
