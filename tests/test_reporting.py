import json
import os
import subprocess
from pathlib import Path

from workbench.reporting import NOTEBOOK_DIR, notebook_title_and_summary, smoke_mode


def test_every_notebook_has_a_title_and_a_line_on_what_it_shows():
    for nb in sorted(Path(NOTEBOOK_DIR).glob("[0-9][0-9]_*.ipynb")):
        title, summary = notebook_title_and_summary(nb)
        assert title and title != nb.stem, nb.name
        assert len(summary.split()) >= 5, f"{nb.name}: the second markdown line should say what it shows"


def test_smoke_switch(monkeypatch):
    monkeypatch.delenv("WORKBENCH_SMOKE", raising=False)
    assert smoke_mode(False) is False and smoke_mode(True) is True
    monkeypatch.setenv("WORKBENCH_SMOKE", "1")
    assert smoke_mode(False) is True


def test_report_renders_html_and_index(tmp_path):
    from workbench.reporting import run_notebooks

    index = run_notebooks(tmp_path, smoke=True, only=["00_corpus"])
    html = (tmp_path / "00_corpus.html").read_text()
    assert "data:image/png;base64" in html  # the plots are embedded
    page = index.read_text()
    assert 'href="00_corpus.html"' in page and "Duration histogram" in page  # what it shows
    assert '<span class="finding">' in page and " utterances, " in page  # and what it found
    assert 'href="benchmarks.html"' in page
    bench = (tmp_path / "benchmarks.html").read_text()
    assert "<h2>decoding_nemo.json</h2>" in bench and "commit" in bench  # every committed result, with provenance
    assert not list(tmp_path.glob("*.tmp*"))
    assert "corpus_arrays(" not in html  # code cells are hidden by default
    from workbench.records.results import git_commit

    assert f"commit {git_commit()[:12]}" in page and ("CPU cores" in page or "NVIDIA" in page)  # the run's own
    assert "Committed results" in page and "<td>decoding_nemo</td>" in page


def test_a_missing_kernel_is_one_line_with_the_fix(tmp_path, monkeypatch, capsys):
    import workbench.reporting as reporting
    from workbench.cli import main

    reporting.check_kernel()  # make setup installed it
    monkeypatch.setattr(reporting, "KERNEL_NAME", "no-such-workbench-kernel")
    assert main(["report", "--out", str(tmp_path), "--smoke", "--only", "00"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "no-such-workbench-kernel" in err and "make setup" in err and "ipykernel install" in err
    assert not (tmp_path / "executed").exists()  # stopped before any notebook ran


def test_code_cells_are_hidden_unless_asked(tmp_path):
    import nbformat

    from workbench.reporting import render_html

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("secret_variable_name = 6 * 7\nprint(secret_variable_name)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="forty-two printed\n")]
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), cell]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    hidden, shown = render_html(path), render_html(path, show_code=True)
    assert "forty-two printed" in hidden and "secret_variable_name" not in hidden
    assert "forty-two printed" in shown and "secret_variable_name" in shown


def _git(repo, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.strip()


def _commit(repo, rel, text):
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", rel)
    return _git(repo, "rev-parse", "HEAD")


def test_results_older_than_the_code_they_measure_are_flagged(tmp_path):
    from workbench.reporting import result_freshness

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    first = _commit(repo, "workbench/decoding/greedy.py", "v1")
    _commit(repo, "benchmarks/decoding.py", "bench v1")
    measured = _commit(repo, "workbench/models/model.py", "v1")  # models code: measured by the models bench
    _commit(repo, "workbench/decoding/greedy.py", "v2")  # decoding changes after `measured`
    _commit(repo, "workbench/models/model.py", "v1  # a comment, no code")  # models: only a comment
    latest = _commit(repo, "README.md", "docs only")
    results = tmp_path / "results"
    results.mkdir()
    for name, commit, command in [("old_decoding", measured, "python benchmarks/decoding.py"),
                                  ("new_decoding", latest + "+dirty", "python -m benchmarks.decoding"),
                                  ("models", measured, "python3 /x/benchmarks/models/run.py"),
                                  ("unknown_commit", "f" * 40, "python benchmarks/decoding.py"),
                                  ("no_bench", first, "python something_else.py"),
                                  # the README flow runs as a gpu test and measures the code its commands run
                                  ("flow", measured, "python3 -m pytest -q -m gpu tests/benchmarks/test_flow.py")]:
        (results / f"{name}.json").write_text(json.dumps({"git_commit": commit, "command": command,
                                                          "device": {"cpu_count": 2}, "date": "2026-12-01"}))
    by_name = {r.name: r for r in result_freshness(results, repo)}
    assert by_name["old_decoding"].stale is True
    assert by_name["old_decoding"].note.endswith("changed since " + measured[:12] + ": workbench/decoding/greedy.py")
    assert "benchmarks/decoding.py" not in by_name["old_decoding"].note  # it did not change after
    assert by_name["new_decoding"].stale is False
    assert by_name["models"].stale is False  # only a comment changed since
    assert "comments and docstrings aside" in by_name["models"].note
    assert by_name["unknown_commit"].stale is None and "not in this clone" in by_name["unknown_commit"].note
    assert by_name["no_bench"].stale is None
    assert by_name["flow"].stale is True and by_name["flow"].note.endswith("README.md, workbench/decoding/greedy.py")


def test_report_takes_show_code():
    from workbench.cli import build_parser

    assert build_parser().parse_args(["report", "--show-code"]).show_code is True
    assert build_parser().parse_args(["report"]).show_code is False


def test_each_notebook_has_one_finding_cell_and_the_index_reads_its_first_line(tmp_path):
    import nbformat

    from workbench.reporting import NOTEBOOK_DIR, executed_finding

    for path in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert sum("finding" in c.metadata.get("tags", []) for c in nb.cells) == 1, path.name
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print('x')")
    cell.metadata["tags"] = ["finding"]
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="2D is 1.2x 1D.\nmore\n")]
    nb.cells = [nbformat.v4.new_code_cell("1"), cell]
    nbformat.write(nb, tmp_path / "x.ipynb")
    assert executed_finding(tmp_path / "x.ipynb") == "2D is 1.2x 1D."
