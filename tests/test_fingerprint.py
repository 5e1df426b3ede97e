"""Code fingerprints: comments and docstrings do not count, code does."""

import subprocess

from workbench.records.fingerprint import changed_files, code_text, fingerprint_at, fingerprint_now

BASE = '"""Module doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1  # one more\n'


def test_comments_and_docstrings_do_not_change_the_code():
    same = '"""Other words."""\n# a new comment\ndef f(x):\n    """Reworded."""\n    return x + 1\n'
    assert code_text("a.py", BASE) == code_text("a.py", same)
    assert code_text("a.py", BASE) != code_text("a.py", BASE.replace("x + 1", "x + 2"))
    assert code_text("a.py", "def g():\n    'only a docstring'\n") == code_text("a.py", "def g():\n    pass\n")
    assert code_text("README.md", "a") != code_text("README.md", "b")  # other files count as they are


def test_fingerprints_of_a_commit_and_of_the_tree(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(BASE)
    (tmp_path / "pkg" / "b.py").write_text("X = 1\n")
    git("add", ".")
    git("commit", "-qm", "one")
    then = fingerprint_at(tmp_path, "HEAD", ["pkg"])
    assert set(then) == {"pkg/a.py", "pkg/b.py"}
    (tmp_path / "pkg" / "a.py").write_text(BASE.replace("# one more", "# reworded"))
    assert changed_files(then, fingerprint_now(tmp_path, ["pkg"])) == []
    (tmp_path / "pkg" / "b.py").write_text("X = 2\n")
    (tmp_path / "pkg" / "c.py").write_text("Y = 1\n")
    assert changed_files(then, fingerprint_now(tmp_path, ["pkg"])) == ["pkg/b.py", "pkg/c.py"]
    assert fingerprint_at(tmp_path, "0" * 40, ["pkg"]) is None


def test_code_that_only_moved_is_not_a_change():
    then = {"old/a.py": "1111", "old/b.py": "2222"}
    assert changed_files(then, {"new/a.py": "1111", "new/b.py": "2222"}) == []
    assert changed_files(then, {"new/a.py": "1111", "new/b.py": "3333"}) == ["new/b.py", "old/b.py"]
    assert changed_files(then, {"new/a.py": "1111"}) == ["old/b.py"]  # removed
    assert changed_files({}, {"new/a.py": "1111"}) == ["new/a.py"]  # added
