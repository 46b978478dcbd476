"""Run directories: drivetrain writes only into its own, one training process at a time.

**Marker.** A run directory is recognised by ``<run.out_dir>/.drivetrain-run``, a small JSON document
``{"format": "drivetrain-run", "version": 1, "drivetrain": "<version>", "created": "<UTC time>"}`` that the trainer
writes (atomically) as soon as it holds the directory's lock. :func:`check_run_dir` runs before anything is
written: a ``run.out_dir`` that is missing or empty becomes a run; one that holds the marker is a run; any other
existing folder is refused with one :class:`ConfigError` line naming it, so that training never writes
``config.yaml``, ``metrics.jsonl`` or checkpoints among someone else's files. A run of a drivetrain older than
the marker (``config.yaml`` and committed checkpoints, no marker) is refused too, with the way to adopt it:
create an empty ``.drivetrain-run`` (``touch DIR/.drivetrain-run``); the next run there writes the full marker.

**Folders.** The folders a run writes into and deletes from — ``checkpoints`` (with ``corrupt`` and
``superseded``), ``eval``, ``tensorboard`` — must be real folders of the run: :func:`check_run_dir` refuses one that
is a symbolic link (one ConfigError line naming it) before anything is written, so that a run whose
``checkpoints`` links to another run's never prunes, moves or overwrites that run's checkpoints. The run
directory itself may be a link (to a larger disk): the user named it. A file of the run that is a link
(``config.yaml``, ``metrics.jsonl``, the lock, the marker) is replaced by the run's own file, its target kept
(:mod:`drivetrain.safe_files`).

**Lock.** One training process per run directory: an advisory lock on ``<run.out_dir>/.drivetrain.lock``.

Two ``drivetrain train`` processes writing the same run directory would interleave metrics lines and
checkpoints. Rank 0 takes an exclusive ``flock`` on the lock file when the trainer is built and keeps it
until the run ends; a second process gets a :class:`ConfigError` naming the PID and host that hold it. The
kernel drops the lock when its holder dies (``kill -9`` included), so a stale lock file never blocks a resume.
Within one process a run directory can be locked again (an interactive session building a second trainer
for the same run while the first is still referenced).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import IO, Any

import drivetrain
from drivetrain import safe_json
from drivetrain.engine.checkpoint import no_room
from drivetrain.engine.config import ConfigError
from drivetrain.safe_files import LinkedFolderError, open_output, real_dir, replace_text
from drivetrain.safe_reads import read_text

__all__ = [
    "LOCK_FILE",
    "RUN_FOLDERS",
    "RUN_FORMAT",
    "RUN_MARKER",
    "START_TOKEN",
    "RunDirLock",
    "check_run_dir",
    "check_run_folders",
    "prepare_run_dir",
    "write_run_marker",
]

LOCK_FILE = ".drivetrain.lock"
# Rank 0's proof that every rank sees its run folder, made and removed at start (drivetrain.engine.agreement);
# a start killed in between leaves one, which a new or empty folder may hold.
START_TOKEN = ".drivetrain-start-"
RUN_MARKER = ".drivetrain-run"
RUN_FORMAT = "drivetrain-run"
RUN_VERSION = 1
# The folders of a run that training writes into or deletes from (checked not to be links by check_run_dir).
RUN_FOLDERS = ("checkpoints", "checkpoints/corrupt", "checkpoints/superseded", "eval", "tensorboard")
_HELD: dict[Path, IO[str]] = {}  # run directories this process holds, by their lock file's path (resolved folder)


@atexit.register
def _release_all() -> None:  # trainers built but never fitted or closed (the kernel would drop the locks anyway)
    while _HELD:
        _HELD.popitem()[1].close()


def prepare_run_dir(out_dir: Path) -> Path:
    """Create ``out_dir`` if needed and check it is a writable folder; one-line ConfigError otherwise."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"run.out_dir: {out_dir} exists and is not a folder") from None
    except OSError as err:
        raise ConfigError(f"run.out_dir: cannot create {out_dir} ({err.strerror})") from None
    if not out_dir.is_dir():
        raise ConfigError(f"run.out_dir: {out_dir} is not a folder")
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"run.out_dir: {out_dir} is not writable")
    return out_dir


def check_run_dir(out_dir: Path) -> None:
    """ConfigError (one line, naming the folder) unless ``out_dir`` may be written by a run: it is missing, empty,
    or a drivetrain run (its marker) whose :data:`RUN_FOLDERS` are real folders. Reads only; see the module
    docstring."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ConfigError(f"run.out_dir: {out_dir} exists and is not a folder")
    marker = out_dir / RUN_MARKER
    if marker.exists() or marker.is_symlink():
        _read_marker(marker)
        check_run_folders(out_dir)
        return
    try:
        entries = [p for p in out_dir.iterdir() if p.name != LOCK_FILE and not p.name.startswith(START_TOKEN)]
    except OSError as err:
        raise ConfigError(f"run.out_dir: cannot list {out_dir} ({err.strerror})") from None
    if not entries:
        return
    if (out_dir / "config.yaml").is_file() and any((out_dir / "checkpoints").glob("step-*/COMMITTED")):
        raise ConfigError(
            f"run.out_dir: {out_dir} holds a run of an older drivetrain (config.yaml and checkpoints, no {RUN_MARKER} "
            f"marker); if it is yours, adopt it with `touch {marker}` and run again, or choose another run.out_dir"
        )
    raise ConfigError(
        f"run.out_dir: {out_dir} is not empty and is not a drivetrain run (no {RUN_MARKER}); choose a new or empty "
        "folder"
    )


def check_run_folders(out_dir: Path) -> None:
    """ConfigError (one line naming it) when one of the run's :data:`RUN_FOLDERS` is a symbolic link or a file."""
    for name in RUN_FOLDERS:
        try:
            real_dir(out_dir / name, base=out_dir)
        except (LinkedFolderError, NotADirectoryError) as err:
            raise ConfigError(f"run.out_dir: {err.filename} is {err.strerror}") from None


def _read_marker(marker: Path) -> dict[str, Any] | None:
    """The marker's content; None for an empty marker (a run adopted with ``touch``); ConfigError if not ours."""
    try:
        text = read_text(marker, limit=1 << 16)  # a regular file (a FIFO would block) of at most 64 KiB
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not text"
        raise ConfigError(f"run.out_dir: {marker} is not a drivetrain run marker ({reason})") from None
    if not text.strip():
        return None
    try:
        content = safe_json.loads(text)  # nesting bounded: a deep one is "not a marker", not a RecursionError
    except ValueError:
        content = None
    if not isinstance(content, dict) or content.get("format") != RUN_FORMAT:
        raise ConfigError(
            f"run.out_dir: {marker} is not a drivetrain run marker (expected JSON with format {RUN_FORMAT!r}); not "
            f"writing into {marker.parent}"
        )
    return content


def write_run_marker(out_dir: Path) -> Path:
    """Write ``out_dir``'s marker (atomically) unless it is there already; returns its path.

    An empty marker (a run adopted with ``touch``) is replaced by the full one. Call after :func:`check_run_dir`
    and with the directory's lock held.
    """
    marker = Path(out_dir) / RUN_MARKER
    if (marker.exists() or marker.is_symlink()) and _read_marker(marker) is not None:
        return marker
    content = {
        "format": RUN_FORMAT,
        "version": RUN_VERSION,
        "drivetrain": drivetrain.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        return replace_text(marker, json.dumps(content, indent=1) + "\n")
    except OSError as err:
        if no_room(err) is not None:  # a full disk is not the config's fault: the caller's write-failure line
            raise
        raise ConfigError(f"run.out_dir: cannot write {marker} ({err.strerror})") from None


def _same_file(f: IO[str], path: Path) -> bool:
    """Whether the open file ``f`` is (still) the file at ``path``."""
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path, follow_symlinks=False))
    except FileNotFoundError:
        return False


class RunDirLock:
    """The exclusive lock of one run directory (take it with :meth:`acquire`, give it back with :meth:`release`)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = prepare_run_dir(Path(out_dir)) / LOCK_FILE
        self.key = self.path.parent.resolve() / LOCK_FILE  # the run directory's, not a link's target

    def acquire(self) -> None:
        """Take the lock (no-op if this process holds it); ConfigError naming the holder if another does."""
        if self.key in _HELD:
            return
        try:  # a link at the name is replaced: writing our pid through it would overwrite the link's target
            f = open_output(self.path, "a+")  # held open for the life of the run
        except OSError as err:
            if no_room(err) is not None:  # as for the marker: a write failure, named by the caller
                raise
            raise ConfigError(f"run.out_dir: cannot write {self.path} ({err.strerror})") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise ConfigError(
                    f"run.out_dir: {self.path.parent} is in use by another training process ({holder}); "
                    "wait for it to finish, stop it, or choose another run.out_dir"
                ) from None
            raise ConfigError(f"run.out_dir: cannot lock {self.path} ({err.strerror})") from None
        if not _same_file(f, self.path):  # deleted or replaced between open and lock: lock the file there now
            f.close()
            return self.acquire()
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        _HELD[self.key] = f

    def verify(self) -> None:
        """Check that the lock file at the path is still the one this process holds (call before writing).

        Someone deleting ``.drivetrain.lock`` mid-run would let a second trainer lock a new file there. The holder
        notices at its next check: it takes the lock on the file now at the path (with a warning) — or, when
        another process already holds that one, raises ConfigError naming it, so that only one writes on.
        """
        f = _HELD.get(self.key)
        if f is None or _same_file(f, self.path):
            return
        del _HELD[self.key]
        f.close()
        warnings.warn(
            f"{self.path} was deleted or replaced while this run held it; locking the run directory again",
            RuntimeWarning,
            stacklevel=2,
        )
        self.acquire()

    def release(self) -> None:
        """Give the lock back (no-op if this process does not hold it)."""
        f = _HELD.pop(self.key, None)
        if f is not None:
            f.close()  # closing the file drops the flock
