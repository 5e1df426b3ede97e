"""Notebook support: smoke switch, showing committed GPU results on CPU machines, and `workbench report`.

`workbench report` executes every notebook in notebooks/ with papermill, renders each to HTML under
reports/, and writes reports/index.html linking them with one line on what each shows (the notebook's
first markdown line).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from workbench.atomic import write_text_atomically
from workbench.bench.results import REPO_ROOT, load_result, provenance_line

NOTEBOOK_DIR = REPO_ROOT / "notebooks"


def smoke_mode(smoke: bool) -> bool:
    """True for the fast run: the `smoke` parameter, or WORKBENCH_SMOKE=1 (set by `make test` for nbval)."""
    return bool(smoke) or os.environ.get("WORKBENCH_SMOKE", "0") == "1"


def has_cuda() -> bool:
    import torch  # here: the CLI's other commands start without torch

    return torch.cuda.is_available()


def committed_result(name: str) -> dict[str, Any] | None:
    """The newest committed GPU result ``benchmarks/results/<name>.json``, announced with its provenance.

    Prints plainly when there is none, so a GPU-only section never shows silently nothing.
    """
    record = load_result(name)
    if record is None:
        print(f"No committed result '{name}' yet: run the GPU benchmark (see README, 'GPU host').")
        return None
    print(f"Showing committed result '{name}': {provenance_line(record)}")
    return record


def gpu_section_note(what: str) -> bool:
    """Say whether a live GPU section runs here; returns has_cuda()."""
    if has_cuda():
        return True
    print(f"No CUDA GPU on this machine: '{what}' is not run live; the committed GPU results are shown.")
    return False


def notebook_title_and_summary(path: Path) -> tuple[str, str]:
    """The notebook's title (its first markdown line) and the line after it (what it shows)."""
    nb = json.loads(path.read_text())
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            lines = [ln.strip().lstrip("#").strip() for ln in "".join(cell.get("source", "")).splitlines()]
            lines = [ln for ln in lines if ln]
            if lines:
                return lines[0], (lines[1] if len(lines) > 1 else "")
    return path.stem, ""


def run_notebooks(out_dir: str | os.PathLike = "reports", *, smoke: bool = False,
                  only: list[str] | None = None) -> Path:
    """Execute and render every notebook; returns the path of index.html. Stops at the first failure."""
    import nbformat  # optional dependencies (the notebooks extra)
    import papermill as pm
    from nbconvert import HTMLExporter

    out = Path(out_dir)
    (out / "executed").mkdir(parents=True, exist_ok=True)
    notebooks = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(o in nb.name for o in only)]
    if not notebooks:
        raise FileNotFoundError(f"no notebooks found in {NOTEBOOK_DIR}"
                                + (f" whose name contains one of {only}" if only else ""))
    rows = []
    for nb_path in notebooks:
        t0 = time.perf_counter()
        print(f"[report] {nb_path.name} ...", flush=True)
        executed = out / "executed" / nb_path.name
        pm.execute_notebook(str(nb_path), str(executed), parameters={"smoke": smoke, "interactive": False},
                            cwd=str(NOTEBOOK_DIR), kernel_name="python3", progress_bar=False)
        body, _ = HTMLExporter(template_name="lab").from_notebook_node(nbformat.read(executed, as_version=4))
        html = write_text_atomically(out / (nb_path.stem + ".html"), body)
        rows.append((html.name, *notebook_title_and_summary(nb_path), time.perf_counter() - t0))
        print(f"[report] {nb_path.name} done in {rows[-1][3]:.1f} s -> {html}", flush=True)
    rows.append(write_benchmark_summary(out))
    items = "\n".join(f'<li><a href="{h}">{title}</a>: {summary} <small>({secs:.0f} s)</small></li>'
                      for h, title, summary, secs in rows)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>workbench reports</title></head><body>"
            f"<h1>workbench reports</h1><p>{'smoke run' if smoke else 'full run'}, "
            f"{time.strftime('%Y-%m-%d %H:%M')}</p><ul>\n{items}\n</ul></body></html>\n")
    index = write_text_atomically(out / "index.html", page)
    print(f"[report] wrote {index}")
    return index


def write_benchmark_summary(out: Path) -> tuple[str, str, str, float]:
    """``<out>/benchmarks.html``: the headline figures of every committed result (workbench.bench.summary)
    as one page; returns its row for the index."""
    import mistune

    from workbench.bench.summary import render  # here: the records' readers import torch and pandas

    t0 = time.perf_counter()
    body = mistune.html(render())
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>workbench benchmarks</title></head>"
            f"<body>{body}</body></html>\n")
    html = write_text_atomically(out / "benchmarks.html", page)
    return (html.name, "Benchmark summary", "headline figures of every committed result in benchmarks/results, "
            "with machine, date and commit", time.perf_counter() - t0)


def register(sub) -> None:
    p = sub.add_parser("report", help="run every notebook and render HTML reports")
    p.add_argument("--out", default="reports", help="output folder (default: reports)")
    p.add_argument("--smoke", action="store_true", help="fast run with small inputs")
    p.add_argument("--only", nargs="*", help="run only notebooks whose name contains one of these")
    p.set_defaults(func=lambda a: (run_notebooks(a.out, smoke=a.smoke, only=a.only), 0)[1])

