"""Notebook support: smoke switch, showing committed GPU results on CPU machines, and `workbench report`.

`workbench report` executes every notebook in notebooks/ with papermill, renders each to HTML under
reports/ (code cells hidden unless ``--show-code``), and writes reports/index.html linking them with one
line on what each shows (the notebook's first markdown line), the commit and machine of the run, and
every committed result with its machine and commit, flagged when the code it measures changed after it.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.atomic import check_writable, write_text_atomically
from workbench.bench.results import REPO_ROOT, RESULTS_DIR, device_info, git_commit, load_result, provenance_line

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
# The library code each bench's records measure, besides the bench's own source (workbench/bench/<name>).
MEASURED_CODE = {
    "allocator": ("workbench/memory",),
    "bucketing": ("workbench/bucketing", "workbench/data"),
    "byo_models": ("workbench/adapters", "workbench/oomptimizer", "workbench/memory/oom.py"),
    "manifest_reading": ("workbench/data",),
    "decoding": ("workbench/decoding",),
    "losses": ("workbench/models/losses.py", "workbench/models/losses_triton.py", "workbench/models/loss_inputs.py"),
    "models": ("workbench/models",),
    "oomptimizer": ("workbench/oomptimizer", "workbench/models"),
    "throughput": ("workbench/models", "workbench/oomptimizer", "workbench/bucketing", "workbench/data",
                   "workbench/memory"),
    "flow": ("workbench/models", "workbench/oomptimizer", "workbench/bucketing", "workbench/data",  # the README's
             "workbench/memory", "workbench/decoding", "workbench/cli.py",                        # commands
             "README.md", "tests/bench/test_flow.py"),
}


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


def render_html(executed: str | os.PathLike, *, show_code: bool = False) -> str:
    """An executed notebook as one HTML page; code cells (inputs and prompts) hidden unless ``show_code``."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", exclude_input=not show_code,
                            exclude_input_prompt=not show_code, exclude_output_prompt=not show_code)
    body, _ = exporter.from_notebook_node(nbformat.read(executed, as_version=4))
    return body


@dataclass
class ResultFreshness:
    """Whether a committed result still measures the code as it is."""
    name: str  # file name in benchmarks/results, without .json
    provenance: str  # machine, date and commit (workbench.bench.results.provenance_line)
    measured_paths: list[str]  # the code it measures: its bench and the library packages
    last_change: str | None  # newest commit that touched those paths (None: no git history here)
    stale: bool | None  # True: the code changed after the result's commit; None: cannot tell
    note: str  # why, in words


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)


def bench_name(record: dict[str, Any]) -> str | None:
    """The bench that wrote a record, from its command (``.../workbench/bench/<name>.py`` or ``<name>/``, or
    the gpu test ``tests/bench/test_<name>.py`` that runs it)."""
    m = re.search(r"workbench[/.]bench[/.](\w+)|tests/bench/test_(\w+)\.py", str(record.get("command", "")))
    return (m.group(1) or m.group(2)) if m else None


def result_freshness(results_dir: str | os.PathLike = RESULTS_DIR, repo: str | os.PathLike = REPO_ROOT
                     ) -> list[ResultFreshness]:
    """For every ``*.json`` record in ``results_dir``: is its commit at or after the newest commit that
    changed the code it measures (``git log`` over the bench's source and MEASURED_CODE)?"""
    repo = Path(repo)
    out = []
    for path in sorted(Path(results_dir).glob("*.json")):
        record = json.loads(path.read_text())
        bench = bench_name(record)
        paths = ([f"workbench/bench/{bench}.py", f"workbench/bench/{bench}", *MEASURED_CODE.get(bench, ())]
                 if bench else [])
        commit = str(record.get("git_commit", "")).removesuffix("+dirty")
        last = _git(repo, "log", "-1", "--format=%H", "--", *paths).stdout.strip() if paths else ""
        if not paths:
            stale, note = None, "its command names no bench, so the code it measures is unknown"
        elif not last:
            stale, note = None, "no git history of the code it measures here"
        elif _git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            stale, note = None, f"its commit {commit[:12] or '?'} is not in this clone"
        elif _git(repo, "merge-base", "--is-ancestor", last, commit).returncode == 0:
            stale, note = False, "current: made at or after the last change to the code it measures"
        else:
            changed = [p for p in paths if _git(repo, "log", "-1", "--format=%H", f"{commit}..{last}", "--", p).stdout]
            stale, note = True, (f"stale: {', '.join(changed)} changed after the result's commit {commit[:12]} "
                                 f"(last in {last[:12]})")
        out.append(ResultFreshness(path.stem, provenance_line(record), paths, last or None, stale, note))
    return out


def run_description() -> str:
    """The commit and machine of this run, in one line."""
    dev = device_info()
    machine = dev.get("gpu") or f"{dev.get('cpu_count', '?')} CPU cores ({dev.get('cpu', '?')})"
    commit = git_commit()
    short = commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")
    return f"commit {short}, on {dev.get('host', '?')}: {machine}"


def results_table(rows: list[ResultFreshness]) -> str:
    """The committed results as an HTML table, stale ones marked."""
    mark = {True: "&#9888; ", False: "", None: "? "}
    red = ' style="color:#b00"'
    body = "\n".join(f"<tr><td>{html.escape(r.name)}</td><td>{html.escape(r.provenance)}</td>"
                     f"<td{red if r.stale else ''}>{mark[r.stale]}{html.escape(r.note)}</td></tr>" for r in rows)
    return ("<table><tr><th>result</th><th>machine, date, commit</th><th>code it measures</th></tr>\n"
            f"{body}\n</table>")


def run_notebooks(out_dir: str | os.PathLike = "reports", *, smoke: bool = False,
                  only: list[str] | None = None, show_code: bool = False) -> Path:
    """Execute and render every notebook; returns the path of index.html. Stops at the first failure."""
    import papermill as pm

    out = Path(out_dir)
    check_writable(out / "index.html")  # before minutes of notebooks
    notebooks = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(o in nb.name for o in only)]
    if not notebooks:
        raise FileNotFoundError(f"no notebooks found in {NOTEBOOK_DIR}"
                                + (f" whose name contains one of {only}" if only else ""))
    (out / "executed").mkdir(parents=True, exist_ok=True)
    rows = []
    for nb_path in notebooks:
        t0 = time.perf_counter()
        print(f"[report] {nb_path.name} ...", flush=True)
        executed = out / "executed" / nb_path.name
        try:
            pm.execute_notebook(str(nb_path), str(executed), parameters={"smoke": smoke, "interactive": False},
                                cwd=str(NOTEBOOK_DIR), kernel_name="python3", progress_bar=False)
        except pm.PapermillExecutionError as e:  # the cell's traceback is in the executed notebook
            raise ValueError(f"{nb_path.name}: cell {e.exec_count} failed ({e.ename}: "
                               f"{str(e.evalue).splitlines()[0] if e.evalue else ''}); see {executed}") from None
        page = write_text_atomically(out / (nb_path.stem + ".html"), render_html(executed, show_code=show_code))
        rows.append((page.name, *notebook_title_and_summary(nb_path), time.perf_counter() - t0))
        print(f"[report] {nb_path.name} done in {rows[-1][3]:.1f} s -> {page}", flush=True)
    rows.append(write_benchmark_summary(out))
    items = "\n".join(f'<li><a href="{h}">{title}</a>: {summary} <small>({secs:.0f} s)</small></li>'
                      for h, title, summary, secs in rows)
    freshness = result_freshness()
    stale = sum(r.stale is True for r in freshness)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>workbench reports</title></head><body>"
            f"<h1>workbench reports</h1><p>{'smoke run' if smoke else 'full run'}, "
            f"{time.strftime('%Y-%m-%d %H:%M')}, {html.escape(run_description())}</p><ul>\n{items}\n</ul>"
            f"<h2>Committed results</h2><p>{len(freshness)} results, {stale} made before the last change to "
            f"the code they measure.</p>\n{results_table(freshness)}</body></html>\n")
    index = write_text_atomically(out / "index.html", page)
    print(f"[report] wrote {index}")
    return index


def write_benchmark_summary(out: Path) -> tuple[str, str, str, float]:
    """``<out>/benchmarks.html``: the headline figures of every committed result (workbench.bench.summary)
    as one page; returns its row for the index."""
    import mistune

    from workbench.bench.summary import render

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
    p.add_argument("--show-code", action="store_true", help="keep the code cells in the HTML (hidden by default)")
    p.set_defaults(func=lambda a: (run_notebooks(a.out, smoke=a.smoke, only=a.only, show_code=a.show_code), 0)[1])

