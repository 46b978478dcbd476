"""Atomic checkpoints: write to a temp dir, fsync, rename, commit marker, then prune to the k latest.

Layout under ``<run>/checkpoints/``::

    step-00000100/state.pt      torch.save of a dict of plain tensors, lists, ints and strings
    step-00000100/COMMITTED     JSON {step, file, size, sha256}; written last, so its presence means complete

A save writes ``.step-N.tmp-<pid>/state.pt``, fsyncs the file and the temp dir, renames the temp dir to
``step-N`` (fsyncing the parent), writes ``COMMITTED`` through its own temp file + rename + fsync, and only
then deletes older checkpoints beyond ``keep`` and any leftovers of interrupted saves. A crash at any point
leaves either the previous committed checkpoints untouched or a new one that is complete.

Loading uses ``torch.load(weights_only=True)`` after checking the marker's size and SHA-256; a directory
without a marker, with a wrong checksum or that fails to load is skipped with a :class:`CheckpointWarning`.
Committed checkpoints that fail to load are never deleted: :meth:`Checkpointer.set_aside` moves them to
``checkpoints/corrupt/`` (and checkpoints of an abandoned continuation to ``checkpoints/superseded/``), where
pruning does not see them. Pruning after a save counts only checkpoints up to the one just written, so a
newer, bad checkpoint can never push good ones out.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from drivetrain.safe_files import remove_path

__all__ = ["CheckpointError", "CheckpointWarning", "Checkpointer", "checkpoint_dir"]

MARKER = "COMMITTED"
CORRUPT = "corrupt"  # committed checkpoints that failed to load, moved aside
SUPERSEDED = "superseded"  # checkpoints newer than the one a run resumed from, moved aside
STATE_FILE = "state.pt"
_NAME = re.compile(r"^step-(\d+)$")
_TMP = re.compile(r"^\.step-\d+\.tmp-\d+$")  # a save's temporary directory (see save)
# Test hook: seconds to sleep inside a save (after the state file is written, and again after the rename),
# so that a test can kill the process while a checkpoint is half written.
DELAY_ENV = "DRIVETRAIN_TEST_CHECKPOINT_DELAY_S"


class CheckpointWarning(UserWarning):
    """A checkpoint directory was skipped (uncommitted, corrupt or unreadable)."""


class CheckpointError(RuntimeError):
    """A checkpoint that was asked for explicitly cannot be used."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint directory a user means: ``path`` itself, or the folder of its ``state.pt`` / ``COMMITTED``
    file (passing the weights file is the mmdetection habit). Raises CheckpointError for any other file."""
    path = Path(path)
    if path.is_file() or path.is_symlink():
        if path.name in (STATE_FILE, MARKER):
            return path.parent
        raise CheckpointError(
            f"{path} is a file, not a checkpoint; pass a run directory, one of its checkpoints/step-N folders or "
            f"that folder's {STATE_FILE}"
        )
    return path


class Checkpointer:
    """Saves and finds checkpoints in ``root``; only one process (rank 0) may call :meth:`save`.

    Args:
        root: the checkpoints folder (created on first save).
        keep: committed checkpoints to keep.
    """

    def __init__(self, root: str | Path, keep: int = 5) -> None:
        if keep < 1:
            raise ValueError(f"keep: must be ≥ 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self._delay = float(os.environ.get(DELAY_ENV, "0") or 0)
        # Committed checkpoints the last load_latest() skipped: (path, reason).
        self.skipped: list[tuple[Path, str]] = []

    @staticmethod
    def name(step: int) -> str:
        """Directory name of the checkpoint of ``step``, e.g. ``step-00000040``."""
        return f"step-{step:08d}"

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write ``state`` as the checkpoint of ``step`` atomically, then prune; return its directory."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / self.name(step)
        tmp = self.root / f".{final.name}.tmp-{os.getpid()}"
        remove_path(tmp)  # a leftover of this pid's killed save (a link there is unlinked, never followed)
        tmp.mkdir()
        state_path = tmp / STATE_FILE
        try:
            with open(state_path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        except (OSError, RuntimeError) as err:  # torch reports a full disk as "unexpected pos N vs M"
            remove_path(tmp, ignore_errors=True)
            raise CheckpointError(self._write_failure(err)) from None
        _fsync_dir(tmp)
        self._sleep()
        remove_path(final)  # an uncommitted or superseded attempt at the same step
        os.replace(tmp, final)
        _fsync_dir(self.root)
        self._sleep()
        marker = {"step": step, "file": STATE_FILE, "size": (final / STATE_FILE).stat().st_size}
        marker["sha256"] = _sha256(final / STATE_FILE)
        marker_tmp = final / f"{MARKER}.tmp"
        with open(marker_tmp, "w") as f:
            json.dump(marker, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(marker_tmp, final / MARKER)
        _fsync_dir(final)
        self.prune(newest=step)
        return final

    def _write_failure(self, err: BaseException) -> str:
        free = shutil.disk_usage(self.root).free
        reason = "the disk is full" if free < (64 << 20) or getattr(err, "errno", None) == 28 else str(err)
        return (
            f"cannot write a checkpoint in {self.root} ({reason}; {free / 2**20:.0f} MiB free); the older "
            "checkpoints are kept — free space, then --resume auto"
        )

    def _sleep(self) -> None:
        if self._delay > 0:
            time.sleep(self._delay)

    def committed(self) -> list[tuple[int, Path]]:
        """Committed checkpoints (marker present), oldest first."""
        found = []
        if self.root.is_dir():
            for path in self.root.iterdir():
                m = _NAME.match(path.name)
                if m and (path / MARKER).is_file():
                    found.append((int(m.group(1)), path))
        return sorted(found)

    def prune(self, newest: int | None = None) -> None:
        """Delete committed checkpoints beyond the ``keep`` newest, and leftovers of interrupted saves.

        Args:
            newest: count only checkpoints up to this step (the one just saved); newer ones are left alone.
        """
        counted = [(step, path) for step, path in self.committed() if newest is None or step <= newest]
        for _, path in counted[: -self.keep]:
            remove_path(path, ignore_errors=True)  # a linked checkpoint loses its link, its target stays
        for path in self.root.iterdir():
            is_tmp = _TMP.match(path.name) is not None
            uncommitted = _NAME.match(path.name) is not None and not (path / MARKER).is_file()
            if path.is_dir() and (is_tmp or uncommitted):
                remove_path(path, ignore_errors=True)

    def load(self, path: str | Path) -> dict[str, Any]:
        """Load one checkpoint directory (marker and checksum verified); raises CheckpointError.

        ``path`` may also be the checkpoint's ``state.pt`` or ``COMMITTED`` file (:func:`checkpoint_dir`).
        """
        path = checkpoint_dir(path)
        marker_path = path / MARKER
        if not marker_path.is_file():
            if not (path / STATE_FILE).exists() and _NAME.match(path.name) is None:
                raise CheckpointError(
                    f"{path}: not a checkpoint (no {STATE_FILE}, no {MARKER} marker); pass a run directory, one of "
                    f"its checkpoints/step-N folders or that folder's {STATE_FILE}"
                )
            raise CheckpointError(f"{path}: no {MARKER} marker (the save did not finish)")
        try:
            marker = json.loads(marker_path.read_text())
        except (OSError, ValueError) as err:  # ValueError includes undecodable bytes
            raise CheckpointError(f"{path}: unreadable {MARKER} marker ({err})") from None
        fields = {"file": str, "size": int, "sha256": str}
        if not isinstance(marker, dict) or not all(isinstance(marker.get(k), t) for k, t in fields.items()):
            raise CheckpointError(f"{path}: malformed {MARKER} marker (needs file, size and sha256)")
        if Path(marker["file"]).name != marker["file"] or marker["file"] in ("", ".", ".."):
            raise CheckpointError(f"{path}: the {MARKER} marker names a file outside the checkpoint")
        state_path = path / marker["file"]
        try:
            size = state_path.stat().st_size
        except OSError as err:
            raise CheckpointError(f"{path}: unreadable state file ({err.strerror})") from None
        if size != marker["size"] or _sha256(state_path) != marker["sha256"]:
            raise CheckpointError(f"{state_path}: size or SHA-256 differs from the {MARKER} marker (corrupt)")
        try:
            return torch.load(state_path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several types for a bad archive
            raise CheckpointError(f"{state_path}: cannot be loaded ({type(err).__name__}: {err})") from None

    def load_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that loads, skipping bad ones with a warning; None if there is none.

        Committed checkpoints that were skipped are listed in :attr:`skipped` (for :meth:`set_aside`).
        """
        self.skipped = []
        candidates = []
        if self.root.is_dir():
            for path in self.root.iterdir():
                m = _NAME.match(path.name)
                if m and path.is_dir():
                    candidates.append((int(m.group(1)), path))
        for _, path in sorted(candidates, reverse=True):
            try:
                return path, self.load(path)
            except CheckpointError as err:
                warnings.warn(f"skipping checkpoint: {err}", CheckpointWarning, stacklevel=2)
                if (path / MARKER).is_file():
                    self.skipped.append((path, str(err)))
        return None

    def set_aside(self, path: Path, folder: str) -> Path:
        """Move checkpoint ``path`` into ``root/folder/`` (out of pruning's and resume's sight); returns where."""
        target_dir = self.root / folder
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / path.name
        n = 1
        while target.exists():
            target = target_dir / f"{path.name}.{n}"
            n += 1
        os.replace(path, target)
        _fsync_dir(self.root)
        return target
