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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.records.fingerprint import changed_files, fingerprint_at, fingerprint_now
from workbench.records.stages import measured_code
from workbench.atomic import check_writable, write_text_atomically
from workbench.records.results import REPO_ROOT, RESULTS_DIR, device_info, git_commit, load_result, provenance_line

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
# The Jupyter kernel every notebook declares, and that the report, nbval and the tests run them on
# (`make setup` installs it into .venv).
KERNEL_NAME = "workbench"
KERNEL_DISPLAY_NAME = "workbench (.venv)"


def smoke_mode(smoke: bool) -> bool:
    """True for the fast run: the `smoke` parameter, or WORKBENCH_SMOKE=1 (set by `make test` for nbval)."""
    return bool(smoke) or os.environ.get("WORKBENCH_SMOKE", "0") == "1"


def has_cuda() -> bool:
    import torch  # here: the CLI's other commands start without torch

    return torch.cuda.is_available()


def committed_result(name: str, results_dir: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """The newest committed GPU result ``benchmarks/results/<name>.json`` (or in ``results_dir``), announced
    with its provenance.

    Prints plainly when there is none, so a GPU-only section never shows silently nothing.
    """
    record = load_result(name, results_dir)
    if record is None:
        print(f"No committed result '{name}' yet: run the GPU benchmark (see README, 'GPU host').")
        return None
    print(f"Showing committed result '{name}': {provenance_line(record)}")
    return record


def executed_finding(executed: Path) -> str:
    """The first line a notebook's cell tagged ``finding`` printed, or '' when it has none."""
    nb = json.loads(Path(executed).read_text())
    for cell in nb.get("cells", []):
        if "finding" in cell.get("metadata", {}).get("tags", []):
            for output in cell.get("outputs", []):
                text = "".join(output.get("text", "")).strip()
                if output.get("output_type") == "stream" and text:
                    return text.splitlines()[0]
    return ""


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
    return body.replace("</head>", f"<style>{REPORT_CSS}</style></head>", 1)


# Text output wraps at spaces only (never inside a number); a word wider than the page scrolls; tables
# scroll alone.
REPORT_CSS = (".jp-OutputArea-output pre{white-space:pre-wrap;word-break:normal;overflow-wrap:normal;"
              "overflow-x:auto;max-width:62rem}"
              ".jp-RenderedHTMLCommon table{font-size:.85rem}")


@dataclass
class ResultFreshness:
    """Whether a committed result still measures the code as it is."""
    name: str  # file name in benchmarks/results, without .json
    provenance: str  # machine, date and commit (workbench.records.results.provenance_line)
    measured_paths: list[str]  # the code it measures: its bench and the library packages
    commit: str | None  # the commit the result was measured at
    stale: bool | None  # True: the code it measures changed since that commit; None: cannot tell
    note: str  # why, in words


def bench_name(record: dict[str, Any]) -> str | None:
    """The bench that wrote a record, from its command: ``benchmarks/<name>/...``, ``-m benchmarks.<name>``
    or the gpu test ``tests/benchmarks/test_<name>.py`` that runs it; the committed records' commands name
    the paths ``workbench/bench/<name>...`` and ``tests/bench/test_<name>.py``."""
    m = re.search(r"tests/bench(?:marks)?/test_(\w+)\.py|(?:workbench[/.]bench|\bbenchmarks)[/.](?!results\b)(\w+)",
                  str(record.get("command", "")))
    return (m.group(1) or m.group(2)) if m else None


INDEX_CSS = ("body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;"
             "color:#222;line-height:1.45}ul{list-style:none;padding:0}li{margin:.7rem 0}a{font-weight:600}"
             ".run{color:#555}table{border-collapse:collapse;font-size:.9rem}th,td{padding:.3rem .6rem;"
             "border-bottom:1px solid #ddd;text-align:left;vertical-align:top}th{background:#f4f4f4}"
             ".finding{font-size:1.05rem}.stale{color:#a40;font-weight:600}.current{color:#2a7a2a}.unknown{color:#777}")


def measured_only(fingerprint: dict[str, str], bench: str) -> dict[str, str]:
    """The files of a fingerprint whose code a result measures: not how results are shown (record readers,
    plots) nor, except for the README flow, the command-line parsers (option checks and help text)."""
    return {name: digest for name, digest in fingerprint.items()
            if not name.endswith(("/record.py", "/plots.py")) and (bench == "flow" or not name.endswith("/cli.py"))}


def result_freshness(results_dir: str | os.PathLike = RESULTS_DIR, repo: str | os.PathLike = REPO_ROOT
                     ) -> list[ResultFreshness]:
    """For every ``*.json`` record in ``results_dir``: does the code it measures (its bench's source and the
    library paths benchmarks/stages.toml lists for it) still read as it did at the record's commit?
    Comments and docstrings do not count (:mod:`workbench.records.fingerprint`), nor code that only moved;
    code, added and removed files do."""
    repo = Path(repo)
    out, at_commit, now = [], {}, {}
    for path in sorted(Path(results_dir).glob("*.json")):
        record = json.loads(path.read_text())
        bench = bench_name(record)
        paths = [f"benchmarks/{bench}", *measured_code().get(bench, ())] if bench else []
        # where the bench's code lived at the record's commit too (git keeps where it was)
        paths_then = [*paths, f"workbench/bench/{bench}", *(["tests/bench/test_flow.py"] if bench == "flow" else [])]
        commit = str(record.get("git_commit", "")).removesuffix("+dirty")
        if not paths:
            out.append(ResultFreshness(path.stem, provenance_line(record), paths, None, None,
                                       "its command names no bench, so the code it measures is unknown"))
            continue
        key = (commit, tuple(paths))
        if key not in at_commit:
            at_commit[key] = fingerprint_at(repo, commit, paths_then) if commit else None
        then = at_commit[key]
        if then is None:
            stale, note = None, f"its commit {commit[:12] or '?'} is not in this clone"
        else:
            if key[1] not in now:
                now[key[1]] = fingerprint_now(repo, paths)
            changed = changed_files(measured_only(then, bench), measured_only(now[key[1]], bench))
            stale = bool(changed)
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            note = (f"the code it measures changed since {commit[:12]}: {shown}" if changed else
                    f"current: the code it measures reads as at {commit[:12]} (comments and docstrings aside)")
        out.append(ResultFreshness(path.stem, provenance_line(record), paths, commit or None, stale, note))
    return out


def run_description() -> str:
    """The commit and machine of this run, in one line."""
    dev = device_info()
    machine = dev.get("gpu") or f"{dev.get('cpu_count', '?')} CPU cores ({dev.get('cpu', '?')})"
    commit = git_commit()
    short = commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")
    return f"commit {short}, on {dev.get('host', '?')}: {machine}"


def results_table(rows: list[ResultFreshness]) -> str:
    """The committed results as an HTML table; a result whose measured code changed is marked."""
    mark = {True: '<span class="stale">code changed</span>', False: '<span class="current">current</span>',
            None: '<span class="unknown">unknown</span>'}
    body = "\n".join(f"<tr><td>{html.escape(r.name)}</td><td>{html.escape(r.provenance)}</td><td>{mark[r.stale]}</td>"
                     f"<td>{html.escape(r.note)}</td></tr>" for r in rows)
    return ("<table><tr><th>result</th><th>measured on</th><th>status</th><th>why</th></tr>\n"
            f"{body}\n</table>")


def check_kernel(name: str | None = None) -> None:
    """Raise a one-line UserError, with the fix, when the Jupyter kernel ``name`` (KERNEL_NAME) is missing."""
    import sys

    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    from workbench.cli import UserError

    name = name or KERNEL_NAME
    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise UserError(f"the Jupyter kernel '{name}' the notebooks run on is not installed: run `make setup` "
                        f"(or {sys.executable} -m ipykernel install --sys-prefix --name {name} "
                        f"--display-name '{KERNEL_DISPLAY_NAME}')") from None


def run_notebooks(out_dir: str | os.PathLike = "reports", *, smoke: bool = False,
                  only: list[str] | None = None, show_code: bool = False) -> Path:
    """Execute and render every notebook; returns the path of index.html. Stops at the first failure."""
    import papermill as pm

    out = Path(out_dir)
    check_writable(out / "index.html")  # before minutes of notebooks
    check_kernel()
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
                                cwd=str(NOTEBOOK_DIR), kernel_name=KERNEL_NAME, progress_bar=False)
        except pm.PapermillExecutionError as e:  # the cell's traceback is in the executed notebook
            raise ValueError(f"{nb_path.name}: cell {e.exec_count} failed ({e.ename}: "
                               f"{str(e.evalue).splitlines()[0] if e.evalue else ''}); see {executed}") from None
        page = write_text_atomically(out / (nb_path.stem + ".html"), render_html(executed, show_code=show_code))
        title, summary = notebook_title_and_summary(nb_path)
        rows.append((page.name, title, executed_finding(executed), summary, time.perf_counter() - t0))
        print(f"[report] {nb_path.name} done in {rows[-1][4]:.1f} s -> {page}", flush=True)
    rows.append(write_benchmark_summary(out))
    items = "\n".join(f'<li><a href="{h}">{html.escape(title)}</a>'
                      + (f'<br><span class="finding">{html.escape(finding)}</span>' if finding else "")
                      + f'<br><small>{html.escape(shows)} (ran in {secs:.0f} s)</small></li>'
                      for h, title, finding, shows, secs in rows)
    freshness = result_freshness()
    stale = sum(r.stale is True for r in freshness)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>workbench reports</title>"
            f"<style>{INDEX_CSS}</style></head><body>"
            f"<h1>workbench reports</h1><p class='run'>{'smoke run' if smoke else 'full run'}, "
            f"{time.strftime('%Y-%m-%d %H:%M')}, {html.escape(run_description())}</p><ul>\n{items}\n</ul>"
            f"<h2>Committed results</h2><p>{len(freshness)} results; for {stale} of them the code they measure has changed "
            f"since they were measured (comments and docstrings do not count).</p>\n"
            f"{results_table(freshness)}</body></html>\n")
    index = write_text_atomically(out / "index.html", page)
    print(f"[report] wrote {index}")
    return index


def write_benchmark_summary(out: Path) -> tuple[str, str, str, str, float]:
    """``<out>/benchmarks.html``: the headline figures of every committed result (workbench.records.summary)
    as one page; returns its row for the index."""
    import mistune

    from workbench.records.summary import render

    t0 = time.perf_counter()
    body = mistune.html(render())
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>workbench benchmarks</title></head>"
            f"<body>{body}</body></html>\n")
    html = write_text_atomically(out / "benchmarks.html", page)
    return (html.name, "Benchmark summary", "", "headline figures of every committed result in benchmarks/results, "
            "with machine, date and commit", time.perf_counter() - t0)


def register(sub) -> None:
    import argparse

    p = sub.add_parser("report", help="run every notebook and render HTML reports",
                       description="Execute every notebook in notebooks/ on the `workbench` kernel (papermill) and "
                                   "render each to HTML, with an index of what each found and whether each "
                                   "committed result still measures today's code.",
                       epilog="examples:\n  workbench report                      # reports/index.html\n"
                              "  workbench report --smoke --out /tmp/r  # the fast version\n"
                              "  workbench report --only 01 06          # two notebooks",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="reports", help="output folder (default: reports)")
    p.add_argument("--smoke", action="store_true", help="fast run with small inputs")
    p.add_argument("--only", nargs="*", help="run only notebooks whose name contains one of these (default: all)")
    p.add_argument("--show-code", action="store_true", help="keep the code cells in the HTML (hidden by default)")
    p.set_defaults(func=lambda a: (run_notebooks(a.out, smoke=a.smoke, only=a.only, show_code=a.show_code), 0)[1])

