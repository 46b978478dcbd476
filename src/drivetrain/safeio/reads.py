"""Reading files from folders drivetrain does not control, without hanging on them or being blown up by them.

Configs, run directories, checkpoints and datasets may come from someone else (docs/safety.md). Two things in
them would stop a command rather than make it do something wrong, and both are refused here, before a byte is
read:

- **a path that is not a regular file.** A FIFO blocks ``open()`` for reading until a writer appears (forever,
  in practice); a character device may never end (``/dev/zero``) or have effects when opened. Every reader of an
  untrusted file asks :func:`regular_stat` (``os.stat`` then ``S_ISREG``; a link is followed, since a linked
  ``samples/`` or a linked checkpoint is a normal thing to have) before it opens anything, and
  :func:`open_regular` opens with ``O_NONBLOCK`` and checks the opened file again with ``fstat``, so a FIFO
  swapped in between the two cannot block either.
- **a small file that stands for a huge one.** A read is bounded by what the caller knows the file may hold
  (``limit``: a config is kilobytes, a JPEG's bytes follow from its pixels); a zip archive (a checkpoint, an
  ``.npz``) is bounded by the sizes its members declare (:func:`zip_members_size`), read from its central
  directory without inflating anything.

Every refusal is an :class:`OSError` subclass whose ``strerror`` says what is wrong ("a FIFO, not a regular
file"), so readers that already turn ``OSError`` into their one-line error (``cannot read image (...)``) say it
without new code. This module imports nothing of drivetrain, so every package may use it.

Example:
    >>> text = read_text(run / "config.yaml", limit=MAX_CONFIG_BYTES)  # doctest: +SKIP
"""

from __future__ import annotations

import errno
import os
import stat
import zipfile
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "FileTooLargeError",
    "NotRegularFileError",
    "UnsafeReadError",
    "file_kind",
    "human_bytes",
    "open_regular",
    "read_bytes",
    "read_text",
    "regular_stat",
    "zip_members_size",
]

# O_NOCTTY: a terminal device opened by mistake must not become our controlling terminal (we refuse it anyway).
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


class UnsafeReadError(OSError):
    """A file that is refused before it is read; ``strerror`` is the reason, ``filename`` the path."""

    def __str__(self) -> str:  # the reason alone: callers name the file in their own words
        return self.strerror or ""


class NotRegularFileError(UnsafeReadError):
    """The path names a FIFO, a device, a socket or a directory, where a regular file is read."""


class FileTooLargeError(UnsafeReadError):
    """The file (or what a zip archive's members declare) is larger than what the caller allows."""


def file_kind(mode: int) -> str:
    """What ``st_mode`` is, in words with an article: ``a FIFO``, ``a directory``, ``a regular file``, ..."""
    for test, word in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return word
    return "a special file"


def human_bytes(n: int) -> str:
    """``n`` bytes for a message: ``634 bytes``, ``3.0 MiB``, ``2.0 GiB``."""
    if n < 1024:
        return f"{n} bytes"
    value, units = n / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.1f} {units[0]}"


def _refuse_kind(path: str | Path, mode: int) -> NotRegularFileError:
    return NotRegularFileError(errno.EINVAL, f"{file_kind(mode)}, not a regular file", str(path))


def _refuse_size(path: str | Path, size: int, limit: int, what: str | None) -> FileTooLargeError:
    bound = f"the {human_bytes(limit)} {what}" if what else f"the {human_bytes(limit)} allowed"
    return FileTooLargeError(errno.EFBIG, f"{human_bytes(size)}, more than {bound}", str(path))


def regular_stat(path: str | Path, *, limit: int | None = None, what: str | None = None) -> os.stat_result:
    """``os.stat(path)`` (a link followed) if it is a regular file of at most ``limit`` bytes; nothing is opened.

    Args:
        path: the file.
        limit: the most bytes the file may hold; None: any size.
        what: what sets ``limit``, for the message (``"a config may hold"``).

    Returns:
        The file's stat result.

    Raises:
        NotRegularFileError: a FIFO, device, socket or directory.
        FileTooLargeError: more than ``limit`` bytes.
        OSError: the file is missing or cannot be looked at (``FileNotFoundError``, ``PermissionError``, ...).
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse_kind(path, st.st_mode)
    if limit is not None and st.st_size > limit:
        raise _refuse_size(path, st.st_size, limit, what)
    return st


def open_regular(path: str | Path, *, limit: int | None = None, what: str | None = None) -> BinaryIO:
    """Open ``path`` for binary reading only if it is a regular file (at most ``limit`` bytes).

    The path is checked with ``stat`` before it is opened, opened without blocking (``O_NONBLOCK``: a FIFO put
    there after the check cannot block), and checked again on the open descriptor (``fstat``: the file read is
    the file checked). The caller closes the file (``with open_regular(p) as f:``).

    Raises:
        NotRegularFileError, FileTooLargeError, OSError: as :func:`regular_stat`.
    """
    regular_stat(path, limit=limit, what=what)
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse_kind(path, st.st_mode)
        if limit is not None and st.st_size > limit:
            raise _refuse_size(path, st.st_size, limit, what)
        os.set_blocking(fd, True)  # a regular file never blocks; plain reads from here on
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, *, limit: int | None = None, what: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (a file that grew past ``limit`` after
    the check is refused, not cut short). Raises as :func:`open_regular`."""
    with open_regular(path, limit=limit, what=what) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise _refuse_size(path, len(data), limit, what)
    return data


def read_text(
    path: str | Path,
    *,
    limit: int | None = None,
    what: str | None = None,
    encoding: str = "utf-8",
    errors: str = "strict",
) -> str:
    """:func:`read_bytes` decoded (``UnicodeDecodeError`` for bytes that are not ``encoding``, unless ``errors``
    says otherwise, as ``bytes.decode``)."""
    return read_bytes(path, limit=limit, what=what).decode(encoding, errors)


def zip_members_size(path: str | Path) -> tuple[int, bool]:
    """What a zip archive inflates to: the sum of the uncompressed sizes its members declare, and whether every
    member is stored uncompressed. Only the central directory is read; nothing is inflated.

    The declared size is what a reader allocates (torch's and NumPy's zip readers size their buffer from it and
    fail on a member that inflates to more), so a bound on it bounds the memory a load takes. Every entry counts,
    also two that name the same bytes.

    Raises:
        NotRegularFileError: ``path`` is not a regular file.
        zipfile.BadZipFile: not a zip archive (or a damaged one).
        OSError: the file cannot be read.
    """
    with open_regular(path) as f, zipfile.ZipFile(f) as archive:
        members = archive.infolist()
    return sum(m.file_size for m in members), all(m.compress_type == zipfile.ZIP_STORED for m in members)
