"""Writing and deleting drivetrain's outputs without ever reaching through a symbolic link.

Run directories, sweep caches and dataset folders may hold links that a user (or whoever made the folder) put
there: ``samples/`` linked to a larger disk, a checkpoint linked in from another run, a report picture that
points at a file elsewhere. drivetrain deletes only what it made, and a link is not what it points to. Every
writer and every delete goes through this module, under two rules:

- **A file**: a link (or a FIFO, a device) at the name of a file drivetrain writes is *replaced* by the new
  file — the link itself, never its target. One rule for every output, whether the user named it
  (``--png out.png``, ``--json``, ``--out``) or drivetrain picked it (``config.yaml``, ``frame-3.png``,
  ``RUN/eval/.../metrics_summary.json``): the target is left byte for byte as it was.
  :func:`replacing` (and :func:`replace_text` / :func:`replace_bytes` / :func:`save_figure`) write a
  temporary file beside the name and rename it over the name atomically, so a reader never sees a half-written
  file either; :func:`open_output` (``open``'s ``opener`` :func:`no_follow`) opens a file that is written as it
  goes (a log, ``metrics.jsonl``, a lock) with ``O_NOFOLLOW``, after unlinking a link at the name.
- **A folder**: a folder drivetrain writes into or deletes from *below* a folder the user named
  (``RUN/checkpoints``, ``RUN/checkpoints/corrupt``, ``RUN/eval/step-N-SPLIT``, a synthetic dataset's
  ``samples/CAM_FRONT``) must be a real folder: :func:`real_dir` checks every component below the named one
  with ``lstat`` and *refuses* a link with :class:`LinkedFolderError` (one line naming it), before anything is
  written or deleted. A folder the user named — ``run.out_dir``, ``--out DIR`` — may itself be a link (to a
  larger disk): that is where the user sent the output.

A writer that opens its own files (the nuScenes devkit writes its metric files with plain ``open``) writes into
:func:`staged_outputs`: a new, empty folder that nobody else can have planted anything in, whose files are then
renamed into place like :func:`replacing`'s.

:func:`remove_path` unlinks a link (or a file) and removes a real folder with what is in it; links inside the
folder are unlinked, never followed (``shutil.rmtree`` on Linux works through directory descriptors, so a link
swapped in during the walk is not followed either). The folder checks are made before writing: a link swapped
in by a process running at the same time is outside what this module guards against (docs/safety.md).

This module imports nothing of drivetrain, so every package may use it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "LINKED",
    "LinkedFolderError",
    "no_follow",
    "open_output",
    "real_dir",
    "remove_path",
    "replace_bytes",
    "replace_text",
    "replacing",
    "save_figure",
    "staged_outputs",
    "write_inside",
]

LINKED = "a symbolic link, not a folder: drivetrain never writes or deletes through a link; remove the link"


class LinkedFolderError(OSError):
    """A folder drivetrain would write into or delete from is a symbolic link (``errno.ELOOP``); ``filename``
    names it and ``strerror`` says why. ``str()`` is one line: ``PATH: a symbolic link, not a folder: ...``."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


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


def real_dir(path: str | Path, *, base: str | Path | None = None, create: bool = False) -> Path:
    """Check that ``path`` and every folder between ``base`` and it are real folders, not links; returns ``path``.

    Call it before writing into or deleting from a folder drivetrain picked below one the user named: ``base``
    is the named one (a run directory, a dataset root; it may itself be a link), each component after it is
    checked with ``lstat``. Missing components end the check (nothing below them exists), or with ``create``
    are made one by one (``mkdir`` never follows a link at its name) and checked as made.

    Args:
        path: the folder to write into or delete from.
        base: the folder the user named, which ``path`` lies in (default: ``path``'s parent, so only ``path``'s
            own name is checked); it must exist when ``create`` is set (it is never made here).
        create: make the missing folders.

    Returns:
        ``path``.

    Raises:
        LinkedFolderError: a component is a symbolic link (nothing was written or deleted below it).
        NotADirectoryError: a component is a file.
        ValueError: ``path`` is not inside ``base`` (a programming error).
    """
    path = Path(path)
    base = path.parent if base is None else Path(base)
    parts = path.relative_to(base).parts
    if ".." in parts:
        raise ValueError(f"{path}: has a '..' part below {base}")
    current = base
    for part in parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            if not create:
                return path
            with contextlib.suppress(FileExistsError):  # made meanwhile: checked as any other
                os.mkdir(current)
            mode = os.lstat(current).st_mode
        if stat.S_ISLNK(mode):
            raise LinkedFolderError(errno.ELOOP, LINKED, str(current))
        if not stat.S_ISDIR(mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(current))
    return path


def no_follow(path: str | Path, flags: int) -> int:
    """An ``opener`` for :func:`open` that never follows a link at ``path``: ``open(path, "a", opener=no_follow)``.

    The file is opened with ``O_NOFOLLOW | O_NONBLOCK`` added to ``flags``; a link there (``ELOOP``) or a FIFO
    nobody reads (``ENXIO``) is unlinked and the open tried once more, and what is opened must be a regular file
    (else it is unlinked too, and opened once more): a link's target is never touched and a FIFO never blocks.
    Use it only for opens that create the file (``"w"``, ``"a"``, ``"x"`` modes). Returns the file descriptor.
    """
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for last in (False, True):
        try:
            fd = os.open(path, flags, 0o666)
        except OSError as err:  # ELOOP: a link; ENXIO: a FIFO nobody reads
            if last or err.errno not in (errno.ELOOP, errno.ENXIO):
                raise
            os.unlink(path)
            continue
        if stat.S_ISREG(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            return fd
        os.close(fd)
        if last:
            break
        os.unlink(path)  # a FIFO with a reader, a device: not ours to write into
    raise OSError(errno.EEXIST, "not a regular file (and could not be replaced by one)", str(path))


def open_output(path: str | Path, mode: str = "w", **kwargs: Any) -> IO[Any]:
    """``open(path, mode)`` for a file written as it goes, without following a link at its name (:func:`no_follow`:
    a link, a FIFO or a device there is replaced by a regular file of ours).

    Args:
        path: the file.
        mode: ``"w"``, ``"a"``, ``"a+"``, ``"x"``, with ``"b"`` for bytes.
        kwargs: passed to :func:`open` (``encoding``, ``buffering``, ...).

    Returns:
        The open file object.
    """
    if not any(c in mode for c in "wax"):
        raise ValueError(f"open_output: mode {mode!r} does not create a file")
    return open(path, mode, opener=no_follow, **kwargs)


def write_inside(base: str | Path, name: str | Path, data: bytes) -> Path:
    """Write ``data`` as the file ``base/name``: the folders between are made as real folders (:func:`real_dir`:
    a link among them is refused) and a link at the name is replaced (:func:`open_output`); returns the path.

    For a generator writing many files under a folder the user named (``data synth`` under ``--out``): the file is
    written in place, under its own name (no temporary file to leave behind when the process is killed).
    """
    path = Path(base) / name
    real_dir(path.parent, base=base, create=True)
    with open_output(path, "wb") as f:
        f.write(data)
    return path


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
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), "wb") as f:
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


def save_figure(fig: Any, path: str | Path, **kwargs: Any) -> Path:
    """``fig.savefig`` (a matplotlib figure) into ``path`` through :func:`replacing`; returns ``path``.

    The format is the suffix's (``.png``, ``.pdf``, ``.svg``; ``png`` without one) unless ``format=`` is given;
    unlike ``savefig(path)``, no suffix is ever added to the name.
    """
    path = Path(path)
    kwargs.setdefault("format", path.suffix.lstrip(".").lower() or "png")
    with replacing(path) as f:
        fig.savefig(f, **kwargs)
    return path


@contextlib.contextmanager
def staged_outputs(folder: str | Path) -> Iterator[Path]:
    """A new, empty folder inside ``folder`` for a writer that opens its own files; when the block ends, what was
    written there is renamed into ``folder`` (a link at one of those names is replaced, not written through) and
    the staging folder removed. On an error the staging folder is removed and ``folder`` is left as it was.

    The nuScenes devkit writes ``metrics_summary.json`` with plain ``open``: into the staging folder, which this
    process has just made, nothing can have been planted. Empty subfolders (the devkit's ``plots/`` when it
    draws nothing) are not moved; another subfolder takes the name only where it is free, a link or an empty
    folder (``OSError`` otherwise: a folder of the user's is never merged into or deleted).

    Args:
        folder: an existing folder (checked by the caller: :func:`real_dir`).

    Example::

        with staged_outputs(out) as stage:
            DetectionEval(nusc, config, predictions, split, str(stage)).main()
    """
    folder = Path(folder)
    stage = folder / f".drivetrain-staging-{os.getpid()}"
    remove_path(stage)  # a leftover of a killed run of this pid (or a planted link: unlinked)
    os.mkdir(stage)
    try:
        yield stage
        for entry in sorted(stage.iterdir()):
            target = folder / entry.name
            if entry.is_dir() and not entry.is_symlink():
                if not any(entry.iterdir()):
                    continue
                if target.is_symlink():  # rename() puts a folder only over nothing or an empty folder
                    target.unlink()
            os.replace(entry, target)
    finally:
        remove_path(stage, ignore_errors=True)
