"""One training process per run directory: an advisory lock on ``<run.out_dir>/.drivetrain.lock``.

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
import os
import socket
from pathlib import Path
from typing import IO

from drivetrain.engine.config import ConfigError

__all__ = ["LOCK_FILE", "RunDirLock", "prepare_run_dir"]

LOCK_FILE = ".drivetrain.lock"
_HELD: dict[Path, IO[str]] = {}  # run directories this process holds, by resolved path


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


class RunDirLock:
    """The exclusive lock of one run directory (take it with :meth:`acquire`, give it back with :meth:`release`)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = prepare_run_dir(Path(out_dir)) / LOCK_FILE
        self.key = self.path.resolve()

    def acquire(self) -> None:
        """Take the lock (no-op if this process holds it); ConfigError naming the holder if another does."""
        if self.key in _HELD:
            return
        try:
            f = open(self.path, "a+")  # noqa: SIM115 - held open for the life of the run
        except OSError as err:
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
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        _HELD[self.key] = f

    def release(self) -> None:
        """Give the lock back (no-op if this process does not hold it)."""
        f = _HELD.pop(self.key, None)
        if f is not None:
            f.close()  # closing the file drops the flock
