"""Removing and rewriting files drivetrain made, without ever reaching through a symbolic link.

Run directories, sweep caches and dataset folders may hold links that a user (or whoever made the folder) put
there: ``samples/`` linked to a larger disk, a checkpoint linked in from another run, a report picture that
points at a file elsewhere. drivetrain deletes only what it made, and a link is not what it points to:

- :func:`remove_path` unlinks a link (or a file) and removes a real folder with what is in it; links inside
  the folder are unlinked, never followed (``shutil.rmtree`` on Linux works through directory descriptors, so
  a link swapped in during the walk is not followed either);
- :func:`replacing` (and :func:`replace_text` / :func:`replace_bytes`) write one of our outputs through a
  temporary file beside it and an atomic rename, so a link at that name is replaced by the file instead of
  having its target overwritten, and a reader never sees a half-written file.

This module imports nothing of drivetrain, so every package may use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["remove_path", "replace_bytes", "replace_text", "replacing"]


def remove_path(path: str | Path, *, ignore_errors: bool = False) -> None:
    """Delete ``path``: a link or a file is unlinked (a link's target is left as it is), a real folder is removed
    with everything in it, a missing path is nothing to do.

    Args:
        path: what to delete.
        ignore_errors: leave what cannot be removed instead of raising ``OSError``.
    """
    path = Path(path)
    try:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink(missing_ok=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=ignore_errors)
    except OSError:
        if not ignore_errors:
            raise


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file to write that becomes ``path`` when the ``with`` block ends (atomic rename); on an error
    nothing at ``path`` changes. A link at ``path`` is replaced by the new file; its target is not touched.

    Example::

        with replacing(run / "index.npz") as f:
            np.savez(f, **arrays)
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a leftover of a killed writer (or a planted link): O_EXCL would refuse it
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:  # a failed write or close names no file: ours
            err.filename = str(path)
        raise


def replace_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` as the file ``path`` through :func:`replacing`; returns ``path``."""
    with replacing(path) as f:
        f.write(data)
    return Path(path)


def replace_text(path: str | Path, text: str) -> Path:
    """:func:`replace_bytes` of ``text`` encoded as UTF-8."""
    return replace_bytes(path, text.encode())
