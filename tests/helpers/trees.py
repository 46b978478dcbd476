"""Snapshots of folder trees, to prove a refused command changed nothing: compare ``tree(root)`` before and after."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

DIGEST_UP_TO = 64 << 20  # bytes: larger files (a sparse 2 GB lidar file) are compared by size and mtime alone


def tree(root: str | Path) -> dict[str, tuple]:
    """Every entry under ``root`` and ``root`` itself (``"."``), never following a link or opening a special file (a
    FIFO would wait for a writer): kind, then the link target, the file's size and SHA-256 (files up to
    :data:`DIGEST_UP_TO`), or a special file's mode; and the mtime. ``{}`` when ``root`` does not exist."""
    root = Path(root)
    if not os.path.lexists(root):
        return {}
    out: dict[str, tuple] = {".": ("dir", None, root.lstat().st_mtime_ns)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            rel, st = path.relative_to(root).as_posix(), path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path), st.st_mtime_ns)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", None, st.st_mtime_ns)
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest() if st.st_size <= DIGEST_UP_TO else None
                out[rel] = ("file", st.st_size, digest, st.st_mtime_ns)
            else:
                out[rel] = ("special", stat.S_IFMT(st.st_mode), st.st_mtime_ns)
    return out
