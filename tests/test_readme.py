"""README.md runs as written: every ```python block, and every ```sh block a CPU machine can run.

A shell block whose first line is ``# needs: ...`` says what it needs: ``gpu`` and ``make`` blocks are not
run here (``make`` ones run the whole suite themselves), ``espeak-ng`` blocks run where it is installed.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of README.md that names its language."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer((REPO / "README.md").read_text())]


def needs(code: str) -> set[str]:
    first = code.splitlines()[0] if code.strip() else ""
    m = re.match(r"#\s*needs:\s*([\w\-, ]+)", first)
    return {n.strip() for n in m.group(1).split(",")} if m else set()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


BLOCKS = readme_blocks()


def test_readme_has_the_blocks_this_test_runs():
    languages = [lang for lang, _ in BLOCKS]
    assert "python" in languages and "sh" in languages
    assert {lang for lang in languages} <= {"python", "sh"}, "a block in a language this test does not run"
    for lang, code in BLOCKS:
        assert needs(code) <= {"gpu", "make", "espeak-ng"}, code.splitlines()[0]


@pytest.mark.parametrize("index", [i for i, (lang, _) in enumerate(BLOCKS) if lang == "python"])
def test_python_block_runs(index, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(BLOCKS[index][1])
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("index", [i for i, (lang, _) in enumerate(BLOCKS) if lang == "sh"])
def test_shell_block_runs(index, tmp_path):
    code = BLOCKS[index][1]
    wanted = needs(code)
    if wanted & {"gpu", "make"}:
        pytest.skip(f"needs {', '.join(sorted(wanted))}: not run by the README test")
    if "espeak-ng" in wanted and not shutil.which("espeak-ng"):
        pytest.skip("needs espeak-ng, which is not installed")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (code, proc.stderr[-3000:])


def test_architecture_names_every_package_and_the_repository_keeps_its_own_design():
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    packages = sorted(p.name for p in (REPO / "workbench").iterdir() if (p / "__init__.py").exists())
    assert [p for p in packages if f"`workbench/{p}/`" not in text] == []
    for doc in [REPO / "README.md", *(REPO / "workbench").rglob("*.py")]:
        if "bench" not in doc.relative_to(REPO).parts[1:2]:  # benchmarks/ records name their sources
            assert "DESIGN.md" not in doc.read_text(), doc


def test_the_headline_quotes_the_committed_summary():
    """Every figure of the README's headline is one that benchmarks/SUMMARY.md (generated from the records)
    states, so the headline cannot drift from the measurements."""
    text = (REPO / "README.md").read_text()
    headline = text[text.index("<!-- headline -->"):text.index("<!-- /headline -->")]
    summary = (REPO / "benchmarks" / "SUMMARY.md").read_text()
    figures = re.findall(r"\d[\d,]*\.\d+", headline)
    assert len(figures) >= 6
    assert [f for f in figures if f not in summary] == []
