"""Atomic writes: one home for 'write a temp file beside the target, then rename'.

A reader never sees a half-written file, and a failure (Ctrl-C too) leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffixes, so gzip and lhotse recognise it); on success
    it replaces ``path``, on any error it is deleted, and so are the parent folders this created.

    Refused before anything is written: a ``path`` that is a folder, a parent that is a file."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    created = _make_parents(path.parent)
    tmp = path.with_name(f".tmp{os.getpid()}-{path.name}")
    done = False
    try:
        yield tmp
        os.replace(tmp, path)
        done = True
    except OSError as e:
        if e.filename in (str(tmp), tmp) and e.errno is not None:  # name the file asked for, not the temp file
            raise type(e)(e.errno, e.strerror, str(path)) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
        if not done:
            for folder in created:  # innermost first; only folders that are still empty
                with contextlib.suppress(OSError):
                    folder.rmdir()


def check_writable(path: str | os.PathLike) -> Path:
    """Refuse, before any work, a target an atomic write would fail on at the end: a folder, a path under a
    file, or one on a read-only file system or without write permission (an OSError naming the path)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a folder", str(folder))
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder))
    if not os.access(folder, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
    return path


@contextlib.contextmanager
def new_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """Create ``folder`` (and missing parents) for the block; if the block fails, remove what this created,
    with everything written inside (folders that already existed are left as they were)."""
    created = _make_parents(Path(folder)) if not Path(folder).is_dir() else []
    try:
        yield Path(folder)
    except BaseException:
        if created:
            shutil.rmtree(created[-1], ignore_errors=True)  # the outermost folder this created
        raise


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns those created, innermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a folder", str(folder))
    made = []
    try:
        for f in reversed(missing):
            f.mkdir()
            made.insert(0, f)
    except OSError:
        for f in made:
            f.rmdir()
        raise
    return made


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_bytes_atomically(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)
