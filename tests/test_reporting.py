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
    assert 'href="00_corpus.html"' in page and "Duration histogram" in page
    assert 'href="benchmarks.html"' in page
    bench = (tmp_path / "benchmarks.html").read_text()
    assert "<h2>decoding.json</h2>" in bench and "commit" in bench  # every committed result, with provenance
    assert not list(tmp_path.glob("*.tmp*"))
