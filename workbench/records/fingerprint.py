"""What a record measured, as code: a fingerprint per source file that ignores comments and docstrings, so a
result goes stale when the code it measures changes, not when only its comments or docstrings do."""

from __future__ import annotations

import ast
import hashlib
import subprocess
from pathlib import Path


def code_text(path: str, text: str) -> str:
    """The part of a file that decides what runs: a Python file's syntax tree without docstrings (comments
    never reach it); any other file as it is."""
    if not path.endswith(".py"):
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def _digest(path: str, text: str) -> str:
    return hashlib.sha256(code_text(path, text).encode()).hexdigest()[:16]


def fingerprint_at(repo: Path, commit: str, paths: list[str]) -> dict[str, str] | None:
    """{file: digest} of the files under ``paths`` at ``commit`` (None when the commit is not here); the files
    are read in one ``git cat-file --batch``."""
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "--", *paths], cwd=repo,
                            capture_output=True, text=True, timeout=60)
    if listed.returncode != 0:
        return None
    names = listed.stdout.split()
    if not names:
        return {}
    blobs = subprocess.run(["git", "cat-file", "--batch"], cwd=repo, capture_output=True, timeout=60,
                           input="".join(f"{commit}:{name}\n" for name in names).encode()).stdout
    out, at = {}, 0
    for name in names:
        header_end = blobs.index(b"\n", at)
        header = blobs[at:header_end].split()
        if len(header) < 3 or header[1] != b"blob":  # "<ref> missing"
            at = header_end + 1
            continue
        size = int(header[2])
        text = blobs[header_end + 1:header_end + 1 + size].decode(errors="replace")
        out[name] = _digest(name, text)
        at = header_end + 1 + size + 1
    return out


def fingerprint_now(repo: Path, paths: list[str]) -> dict[str, str]:
    """{file: digest} of the files under ``paths`` in the working tree that git tracks or would track."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *paths],
                            cwd=repo, capture_output=True, text=True, timeout=60)
    out = {}
    for name in listed.stdout.split():
        file = repo / name
        if file.is_file():
            out[name] = _digest(name, file.read_text(errors="replace"))
    return out


def changed_files(then: dict[str, str], now: dict[str, str]) -> list[str]:
    """Files whose code is on one side only (added, removed or changed), sorted; a file whose code moved
    to another path, unchanged, is not one of them."""
    then_codes, now_codes = set(then.values()), set(now.values())
    return sorted({name for name, code in now.items() if code not in then_codes}
                  | {name for name, code in then.items() if code not in now_codes})
