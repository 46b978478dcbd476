"""Atomic checkpoints: write to a temp dir, fsync, rename, commit marker, then prune to the k latest.

Layout under ``<run>/checkpoints/``::

    step-00000100/state.pt                torch.save of a dict of plain tensors, lists, ints and strings
    step-00000100/weights/__R_0.distcp    rank R's model and optimizer tensors (a sharded checkpoint)
    step-00000100/weights/.metadata.json  their index, JSON (:mod:`drivetrain.engine.dcp_files`)
    step-00000100/COMMITTED               JSON {step, file, size, sha256[, files: [{file, size, sha256}]]};
                                          written last, so its presence means complete

A save writes ``.step-N.tmp-<pid>/state.pt``, fsyncs the file and the temp dir, renames the temp dir to
``step-N`` (fsyncing the parent), writes ``COMMITTED`` through its own temp file + rename + fsync, and only
then deletes older checkpoints beyond ``keep`` and any leftovers of interrupted saves. A crash at any point
leaves either the previous committed checkpoints untouched or a new one that is complete. A sharded save
(:meth:`Checkpointer.save_state` with the model and optimizer of :class:`~drivetrain.engine.state.StrategyState`)
is collective: rank 0 makes the temp dir (``<pid>`` is its pid), every rank writes and fsyncs its shards through
``torch.distributed.checkpoint`` and hashes them, the ranks agree, and rank 0 writes ``state.pt`` and commits with
every file in the marker; a rank that fails or dies before the agreement leaves nothing committed. With
``asynchronous`` the write runs in a background thread on a copy of the tensors (at most one in flight; see
:meth:`Checkpointer.save_state`).

A write that fails — a full disk (``ENOSPC``), an exceeded quota (``EDQUOT``), a read-only file system (``EROFS``)
or any other error, of the state file, a shard or the marker — raises one :class:`CheckpointError` line naming the
folder and the reason (on every rank of a sharded save), after removing what the save wrote: nothing of it is
marked committed, and the committed checkpoints are those of before (one of the same step, which the trainer never
writes twice, is renamed aside to ``.step-N.old-<pid>`` while the new one is written and put back if it fails).

Loading uses ``torch.load(weights_only=True)`` after checking the marker's size and SHA-256, through
:func:`~drivetrain.safeio.torch_files.load_torch_file`: ``state.pt`` must be a regular file (a FIFO there would
block the load forever) and a zip archive whose members declare no more bytes than the file holds (what
``torch.save`` writes; a deflated member that would inflate to gigabytes is refused before a byte is inflated).
A sharded checkpoint's files are checked the same way: each a regular file of the marker's size and SHA-256, the
index parsed as JSON (never unpickled), every shard it names covered by the marker, every tensor's slice a
``torch.save`` archive that does not expand; then its tensors are read whole (``shards="full"``) or left for the
live tensors to load, resharded (``"lazy"``, a resume). A directory without a marker, with a wrong checksum, a
special or expanding file, or that fails to load is skipped with a :class:`CheckpointWarning`.
Committed checkpoints that fail to load are never deleted: :meth:`Checkpointer.set_aside` moves them to
``checkpoints/corrupt/`` (and checkpoints of an abandoned continuation to ``checkpoints/superseded/``), where
pruning does not see them. Pruning after a save counts only checkpoints up to the one just written, so a
newer, bad checkpoint can never push good ones out. Saving, pruning and moving aside refuse (one
:class:`CheckpointError` line) a ``checkpoints`` folder, or its ``corrupt``/``superseded`` folder, that is a symbolic
link: writing or deleting there would reach another run's checkpoints (a linked ``step-N`` is pruned or moved as
the link, its target kept).

What the state is: a dict of stateful components (:mod:`drivetrain.engine.state`). :meth:`Checkpointer.save_state`
writes every component's ``state_dict()`` under its name beside the metadata and the format version (a component
with a ``sharded_state_dict()`` its tensors as shards, the rest in ``state.pt``); :meth:`Checkpointer.restore`
refuses another format version (:func:`check_format`) and a missing or extra component (:func:`check_components`),
each in one line, then calls every component's ``load_state_dict`` once, in order. Single-file checkpoints (every
drivetrain before sharded saves, and DeepSpeed's) load as before.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from drivetrain.engine import dcp_files
from drivetrain.engine.dcp_files import SHARDS, ShardError, Shards
from drivetrain.engine.state import (
    FORMAT_VERSION,
    META_KEYS,
    METADATA,
    OLD_VERSION_KEY,
    SHARDS_KEY,
    VERSION_KEY,
    Stateful,
    format_version,
)
from drivetrain.safeio import json_files
from drivetrain.safeio.files import LinkedFolderError, real_dir, remove_path
from drivetrain.safeio.reads import open_regular, read_text
from drivetrain.safeio.torch_files import TorchFileError, check_archives, check_file, load_torch_file

__all__ = [
    "DENIED",
    "NO_ROOM",
    "CheckpointError",
    "CheckpointWarning",
    "Checkpointer",
    "check_components",
    "check_format",
    "checkpoint_dir",
    "no_room",
    "write_reason",
]

MARKER = "COMMITTED"
CORRUPT = "corrupt"  # committed checkpoints that failed to load, moved aside
SUPERSEDED = "superseded"  # checkpoints newer than the one a run resumed from, moved aside
STATE_FILE = "state.pt"
MAX_MARKER_BYTES = 1 << 16  # a marker is ~150 bytes of JSON; a larger one is not ours (and is not read)
_NAME = re.compile(r"^step-(\d+)$")
_TMP = re.compile(r"^\.step-\d+\.tmp-\d+$")  # a save's temporary directory (see save)
# Test hook: seconds to sleep inside a save (after the state file is written, and again after the rename; in an
# asynchronous save, in its background thread), so that a test can kill the process while a checkpoint is half
# written.
DELAY_ENV = "DRIVETRAIN_TEST_CHECKPOINT_DELAY_S"
# Test hook: seconds every rank sleeps inside a sharded save after writing its shards, before the ranks compare
# outcomes, so that a test can kill one rank while the others wait to commit.
SHARD_DELAY_ENV = "DRIVETRAIN_TEST_SHARD_DELAY_S"
# The write errors that mean "no room to write here", with the words a message gives them.
NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
}


# The write errors of permissions, with their words: neither is a lack of room (chmod fixes them, freeing space
# does not), so a message never calls them a full disk nor advises freeing space.
DENIED = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def _in_chain(err: BaseException | None, codes: dict[int, str]) -> OSError | None:
    """The OSError with an errno of ``codes`` that ``err`` is or was raised from (its cause/context chain), or None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in codes:
            return err
        err = err.__cause__ or err.__context__
    return None


def no_room(err: BaseException | None) -> OSError | None:
    """The OSError of :data:`NO_ROOM` that ``err`` is or was raised from (its cause/context chain), or None."""
    return _in_chain(err, NO_ROOM)


def write_reason(err: BaseException) -> tuple[str, str]:
    """Why a write failed and what to do, in words: ``("the disk is full", "free space")``,
    ``("the file system is read-only", "make it writable")``, ``("permission denied: PATH", "make it writable
    for this user")``, else the error's last line and ``"fix that"``."""
    room, denied = no_room(err), _in_chain(err, DENIED)
    if room is not None:
        return NO_ROOM[room.errno], "make it writable" if room.errno == errno.EROFS else "free space"
    if denied is not None:
        where = f": {denied.filename}" if denied.filename else ""
        return f"{DENIED[denied.errno]}{where}", "make it writable for this user"
    return (str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__), "fix that"


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


def _size_and_sha256(path: Path) -> tuple[int, str]:
    return path.stat().st_size, _sha256(path)


def _serialize(state: Mapping[str, Any]) -> bytes:
    """``torch.save`` of ``state`` into bytes (a copy of everything in it, tensors included)."""
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return buffer.getvalue()


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _all_gather(obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj`` (small) in rank order over ``group``; ``[obj]`` without a process group."""
    if not _distributed():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _raise_first(errors: list[str | None]) -> None:
    """Raise the first of the ranks' error lines as a CheckpointError (every rank raises the same one)."""
    for error in errors:
        if error:
            raise CheckpointError(error)


def checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint directory a user means: ``path`` itself, or the folder of its ``state.pt`` / ``COMMITTED``
    file (passing the weights file is the mmdetection habit). Raises CheckpointError for any other file (a FIFO or
    a device named ``state.pt`` counts as that file: its load then says what it is)."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        if path.name in (STATE_FILE, MARKER):
            return path.parent
        raise CheckpointError(
            f"{path} is a file, not a checkpoint; pass a run directory, one of its checkpoints/step-N folders or "
            f"that folder's {STATE_FILE}"
        )
    return path


def check_format(state: Mapping[str, Any], where: object) -> None:
    """Raise one CheckpointError line unless ``state`` (the checkpoint ``where``) is of this format version.

    The line names the checkpoint's version, this drivetrain's and what to do (the drivetrain that wrote it,
    from the checkpoint's ``versions``, or a new run); :mod:`drivetrain.engine.state` lists the versions.
    """
    version = format_version(state)
    if version == FORMAT_VERSION:
        return
    if version is None:
        raise CheckpointError(
            f"checkpoint {where}: no format version (neither {VERSION_KEY} nor {OLD_VERSION_KEY}); not a drivetrain "
            "training checkpoint"
        )
    versions = state.get("versions")
    wrote = versions.get("drivetrain") if isinstance(versions, Mapping) else None
    by = f"drivetrain {wrote}, which wrote it," if isinstance(wrote, str) else "the drivetrain that wrote it"
    older = isinstance(version, int) and not isinstance(version, bool) and version < FORMAT_VERSION
    fix = f"resume it with {by} or start a new run" if older else f"resume it with {by} or a newer one"
    raise CheckpointError(
        f"checkpoint {where}: format version {version!r}, this drivetrain reads version {FORMAT_VERSION}; {fix}"
    )


def check_components(state: Mapping[str, Any], components: Mapping[str, Stateful], where: object) -> None:
    """Raise one CheckpointError line naming the first component ``state`` lacks, or holds beyond ``components``.

    Args:
        state: the checkpoint's dict (its :data:`~drivetrain.engine.state.METADATA` keys are no components).
        components: what the run restores, by name.
        where: the checkpoint, for the message.
    """
    saved = [name for name in state if name not in METADATA]
    missing = [name for name in components if name not in state]
    if missing:
        raise CheckpointError(
            f"checkpoint {where}: no {missing[0]!r} state, which this run restores (it holds {', '.join(saved)})"
        )
    extra = [name for name in saved if name not in components]
    if extra:
        raise CheckpointError(
            f"checkpoint {where}: holds {extra[0]!r} state, which this run has no component for (it restores "
            f"{', '.join(components)})"
        )


def _cuda_device() -> int | None:
    """The calling thread's current CUDA device, for a thread that works for it (None where CUDA is not in use)."""
    return torch.cuda.current_device() if torch.cuda.is_initialized() else None


class _StepGate:
    """Holds the next ``optimizer.step()`` until an asynchronous save has copied the tensors that step changes in
    place (parameters and optimizer state: nothing else writes them between two steps), so that the copy runs
    beside the next forward and backward instead of blocking training. ``waited`` is how long the step waited."""

    def __init__(self, optimizer: Any, save_step: int) -> None:
        self.save_step, self.stall, self.waited, self.passed = save_step, 0.0, 0.0, False
        self._copied = threading.Event()
        self._handle = optimizer.register_step_pre_hook(self._hold)

    def _hold(self, *_: Any) -> None:
        if not self.passed:
            started = time.perf_counter()
            self._copied.wait()
            self.waited, self.passed = time.perf_counter() - started, True

    def open(self) -> None:
        """The copy is made: the step may go on."""
        self._copied.set()

    def remove(self) -> None:
        """Unregister the hook (outside the optimizer's step: a hook may not remove itself while it runs)."""
        self._handle.remove()


def _stepped_only(components: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> tuple[set[str], Any]:
    """The keys of ``tensors`` only an optimizer step changes in place, and that optimizer: of the components that
    declare ``stepped_only()`` → ``(names or None for all, optimizer)`` (:class:`~.state.StrategyState`'s model
    parameters and optimizer state); none without such a component."""
    keys: set[str] = set()
    optimizer = None
    for name, component in components.items():
        declared = getattr(component, "stepped_only", None)
        if declared is None:
            continue
        names, optimizer = declared()
        prefix = f"{name}/"
        for key in tensors:
            if key.startswith(prefix) and (names is None or key[len(prefix) :] in names):
                keys.add(key)
    return (keys, optimizer) if optimizer is not None else (set(), None)


class Checkpointer:
    """Saves and finds checkpoints in ``root``; only one process (rank 0) may call :meth:`save`.

    Args:
        root: the checkpoints folder (created on first save).
        keep: committed checkpoints to keep.
    """

    def __init__(self, root: str | Path, keep: int = 5, *, shards: str = "full") -> None:
        if keep < 1:
            raise ValueError(f"keep: must be ≥ 1, got {keep}")
        if shards not in ("full", "lazy"):
            raise ValueError(f"shards: 'full' or 'lazy', got {shards!r}")
        self.root = Path(root)
        self.keep = keep
        self.shards = shards
        self._delay = float(os.environ.get(DELAY_ENV, "0") or 0)
        self._shard_delay = float(os.environ.get(SHARD_DELAY_ENV, "0") or 0)
        # Committed checkpoints the last load_latest() skipped: (path, reason).
        self.skipped: list[tuple[Path, str]] = []
        self.last_stall_s = 0.0  # how long the last save_state() call blocked its caller
        self._stall: tuple[int, float] | None = None  # (step, stall) of the last save, once final (pop_stall)
        self._inflight: threading.Thread | None = None  # the asynchronous save being written
        self._gate: _StepGate | None = None  # the in-flight save's hold on the next optimizer step
        self._staging: dict[str, torch.Tensor] = {}  # asynchronous saves' copies, reused by the next one
        self._failure: BaseException | None = None  # what it raised
        self._group: Any = None  # the process group of asynchronous saves (gloo, made at the first one)

    @staticmethod
    def name(step: int) -> str:
        """Directory name of the checkpoint of ``step``, e.g. ``step-00000040``."""
        return f"step-{step:08d}"

    def save_state(
        self,
        step: int,
        components: Mapping[str, Stateful],
        meta: Mapping[str, Any],
        *,
        write: bool = True,
        asynchronous: bool = False,
    ) -> Path:
        """Checkpoint ``components`` as step ``step``: ``{format_version, **meta, name: state_dict() ...}``.

        Every rank of a run calls it, with ``write`` true on the one that writes the small state (rank 0): a
        component's state may be collective (the model under FSDP, the RNG states), so each is read on every rank,
        in order. A component with a ``sharded_state_dict()`` (the model and the optimizer,
        :class:`~drivetrain.engine.state.StrategyState`) has its tensors written as DCP shards by every rank
        (:mod:`~drivetrain.engine.dcp_files`), the rest of its state in ``state.pt``; with none, rank 0 writes one
        ``state.pt`` (:meth:`save`). A save in flight is waited for first (:meth:`wait`); :attr:`last_stall_s`
        is the time this call blocked.

        Args:
            step: the step the checkpoint is named after.
            components: what the run checkpoints, by name (restored in this order).
            meta: what the checkpoint says about itself; keys from :data:`~drivetrain.engine.state.META_KEYS`.
            write: write the small state (else only read the components; without a process group, write nothing).
            asynchronous: copy the tensors off the live ones and write them in a background thread; the checkpoint
                is committed when that finishes (:meth:`wait`).

        Returns:
            The checkpoint's directory (committed once the save, or with ``asynchronous`` its :meth:`wait`, returns).

        Raises:
            ValueError: a ``meta`` key that is no metadata, or a component named like metadata.
            CheckpointError: the checkpoint, or the one in flight before it, could not be written (see :meth:`save`).
        """
        started = time.perf_counter()
        unknown = [key for key in meta if key not in META_KEYS]
        if unknown:
            raise ValueError(f"checkpoint meta: {unknown[0]!r} is none of {', '.join(META_KEYS)}")
        clash = [name for name in components if name in METADATA]
        if clash:
            raise ValueError(f"checkpoint components: {clash[0]!r} is the name of a metadata field")
        self.wait()  # at most one save in flight: the previous one commits (or raises) before this one starts
        state: dict[str, Any] = {VERSION_KEY: FORMAT_VERSION, **meta}
        tensors: dict[str, torch.Tensor] = {}
        for name, component in components.items():
            sharded = getattr(component, "sharded_state_dict", None)
            if sharded is None:
                state[name] = component.state_dict()
            else:
                state[name], found = dcp_files.split_tensors(sharded(), name)
                tensors.update(found)
        final = self.root / self.name(step)
        if not tensors:  # no sharded component (DeepSpeed's full state dicts): rank 0 writes one file
            path = self.save(step, state) if write else final
        elif not write and not _distributed():
            path = final  # one process that only reads
        else:
            state[SHARDS_KEY] = SHARDS
            small, failed = None, None
            if write:
                try:
                    small = _serialize(state)  # a snapshot: bytes, before training changes anything
                except (OSError, RuntimeError) as err:
                    small, failed = b"", self._write_failure(err)  # said by every rank, at the first agreement
            if asynchronous:
                group = self._async_group()
                later, optimizer = _stepped_only(components, tensors)
                now = dcp_files.stage({k: t for k, t in tensors.items() if k not in later}, self._staging)
                gate = _StepGate(optimizer, step) if later else None
                self._inflight = threading.Thread(
                    target=self._write_in_background,
                    args=(step, small, now, {k: tensors[k] for k in later}, gate, group, failed, _cuda_device()),
                    name=f"checkpoint-{step}",
                )
                self._gate = gate
                self._inflight.start()
            else:
                self._write_sharded(step, small, tensors, None, failed)
            path = final
        self.last_stall_s = time.perf_counter() - started
        if self._gate is not None and self._inflight is not None:
            self._gate.stall = self.last_stall_s  # final once the next optimizer step passed it (pop_stall)
        else:
            self._stall = (step, self.last_stall_s)
        return path

    def pop_stall(self) -> tuple[int, float] | None:
        """``(step, seconds)``: how long the last save blocked training, once that is known (then None until the
        next save). A synchronous save's stall is its call; an asynchronous one's is its call plus the time the
        first optimizer step after it waited for the staged copy of the tensors that step changes."""
        gate = self._gate
        if gate is not None and gate.passed:
            self._stall, self._gate = (gate.save_step, gate.stall + gate.waited), None
            gate.remove()
        stall, self._stall = self._stall, None
        return stall

    @property
    def in_flight(self) -> bool:
        """Whether an asynchronous save is being written."""
        return self._inflight is not None

    def wait(self) -> None:
        """Wait for the asynchronous save in flight (if any) to commit; raise what it raised (on every rank the
        same :class:`CheckpointError` line: its outcome is agreed across ranks)."""
        if self._inflight is None:
            return
        self._inflight.join()
        self._inflight, failure, self._failure = None, self._failure, None
        gate, self._gate = self._gate, None
        if gate is not None:  # the run ended (or saves again) before an optimizer step met the gate
            gate.remove()
            if self._stall is None or gate.passed:
                self._stall = (gate.save_step, gate.stall + gate.waited)
        if failure is not None:
            raise failure

    def _async_group(self) -> Any:
        """The process group asynchronous saves use (a gloo group of every rank, so their collectives run beside
        training's on another thread); None without a process group. Made at the first one (collective)."""
        if not _distributed():
            return None
        if self._group is None:
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")
        return self._group

    def _write_in_background(
        self,
        step: int,
        small: bytes | None,
        staged: dict[str, torch.Tensor],
        later: dict[str, torch.Tensor],
        gate: _StepGate | None,
        group: Any,
        failed: str | None,
        device: int | None = None,
    ) -> None:
        try:
            try:  # the tensors only an optimizer step changes: copied here while the next step's forward runs
                if device is not None:  # a new thread's CUDA device is 0, not the rank's (DCP's writer syncs it)
                    torch.cuda.set_device(device)
                staged = {**staged, **dcp_files.stage(later, self._staging)}
            finally:
                if gate is not None:
                    gate.open()
            self._write_sharded(step, small, staged, group, failed)
        except BaseException as err:  # handed to wait(), which raises it on the training thread
            self._failure = err

    def _write_sharded(
        self, step: int, small: bytes | None, tensors: dict[str, torch.Tensor], group: Any, failed: str | None = None
    ) -> None:
        """Write a sharded checkpoint (collective over ``group``): rank 0 (``small`` given) makes the temp folder,
        every rank writes its shards and hashes them, rank 0 writes ``state.pt``, renames and commits with every
        file's size and SHA-256 in the marker, then prunes. A failure anywhere is one CheckpointError on every rank,
        with nothing of this save left (:meth:`save`'s rules)."""
        final = self.root / self.name(step)
        error = failed
        if small is not None and error is None:
            try:
                self._check_root(create=True)
                remove_path(self.root / f".{final.name}.tmp-{os.getpid()}")  # a leftover of this pid's killed save
                (self.root / f".{final.name}.tmp-{os.getpid()}" / SHARDS).mkdir(parents=True)
            except CheckpointError as err:
                error = str(err)
            except OSError as err:
                error = self._write_failure(err)
        replies = _all_gather((error, os.getpid(), small is not None), group)
        writer = next(rank for rank, (_, _, writes) in enumerate(replies) if writes)
        tmp = self.root / f".{final.name}.tmp-{replies[writer][1]}"
        _raise_first([e for e, _, _ in replies])
        files: dict[str, tuple[int, str]] = {}
        try:
            for name in dcp_files.write_shards(tmp / SHARDS, tensors, group):
                files[f"{SHARDS}/{name}"] = _size_and_sha256(tmp / SHARDS / name)
        except (OSError, RuntimeError, ShardError) as err:  # torch reports a full disk as "unexpected pos N vs M"
            error = self._write_failure(err)
        except BaseException as err:  # DCP's CheckpointException (a BaseException): the first rank's error
            failures = getattr(err, "failures", None)
            if not isinstance(failures, dict) or not failures:
                raise
            first = next(iter(failures.values()))
            error = self._write_failure(first[0] if isinstance(first, tuple) else err)
        if self._shard_delay > 0:
            time.sleep(self._shard_delay)
        replies = _all_gather((error, files), group)
        if small is not None and any(e for e, _ in replies):
            remove_path(tmp, ignore_errors=True)
        _raise_first([e for e, _ in replies])
        outcome = None
        if small is not None:
            for _, written in replies:
                files.update(written)
            try:
                self._publish(step, tmp, final, small, files)
            except CheckpointError as err:
                outcome = str(err)
        _raise_first([_all_gather(outcome, group)[writer]])

    @staticmethod
    def restore(state: Mapping[str, Any], components: Mapping[str, Stateful], where: object) -> None:
        """Load a checkpoint's ``state`` into ``components``: each ``load_state_dict`` once, in the mapping's order.

        Nothing is loaded unless the format version is this drivetrain's and the checkpoint holds exactly the
        components named (each refusal is one CheckpointError line naming ``where`` and the version or name).
        """
        check_format(state, where)
        check_components(state, components, where)
        for name, component in components.items():
            component.load_state_dict(state[name])

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write ``state`` as the checkpoint of ``step`` atomically, then prune; return its directory.

        Raises:
            CheckpointError: the checkpoint could not be written (one line naming the folder and why, e.g. a
                full disk); nothing of this save is left or committed, the committed checkpoints are kept.
        """
        final = self.root / self.name(step)
        tmp = self.root / f".{final.name}.tmp-{os.getpid()}"
        self._check_root(create=True)
        try:
            remove_path(tmp)  # a leftover of this pid's killed save (a link there is unlinked, never followed)
            tmp.mkdir()
            with open(tmp / STATE_FILE, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
        except (OSError, RuntimeError) as err:  # torch reports a full disk as "unexpected pos N vs M"
            remove_path(tmp, ignore_errors=True)
            raise CheckpointError(self._write_failure(err)) from None
        self._sleep()
        self._rename_and_commit(step, tmp, final, {})
        return final

    def _publish(self, step: int, tmp: Path, final: Path, small: bytes, files: dict[str, tuple[int, str]]) -> None:
        """Rank 0's end of a sharded save: ``state.pt`` beside the shards every rank wrote into ``tmp``, then the
        rename, the marker naming every file (``files`` and the shard index) and pruning."""
        try:
            with open(tmp / STATE_FILE, "wb") as f:
                f.write(small)
                f.flush()
                os.fsync(f.fileno())
            files[f"{SHARDS}/{dcp_files.INDEX}"] = _size_and_sha256(tmp / SHARDS / dcp_files.INDEX)
            _fsync_dir(tmp / SHARDS)
            _fsync_dir(tmp)
        except OSError as err:
            remove_path(tmp, ignore_errors=True)
            raise CheckpointError(self._write_failure(err)) from None
        self._sleep()
        self._rename_and_commit(step, tmp, final, files)

    def _rename_and_commit(self, step: int, tmp: Path, final: Path, files: dict[str, tuple[int, str]]) -> None:
        """Rename the written ``tmp`` to ``final`` (a committed one of the same step aside until this one is),
        write the marker, prune. Raises one CheckpointError line, with nothing of this save left."""
        old = self.root / f".{final.name}.old-{os.getpid()}"
        kept = (final / MARKER).is_file()  # a committed checkpoint of this step: replaced only once this one is
        aside = False
        try:
            if kept:
                remove_path(old)
                os.replace(final, old)
                aside = True
            else:
                remove_path(final)  # an uncommitted attempt at the same step
            os.replace(tmp, final)
            _fsync_dir(self.root)
            self._sleep()
            self._commit(final, step, files)
        except OSError as err:
            remove_path(tmp, ignore_errors=True)
            if aside or not kept:  # final is this save's (renamed, not committed or its marker not durable)
                remove_path(final, ignore_errors=True)
            if aside:
                os.replace(old, final)
            raise CheckpointError(self._write_failure(err)) from None
        remove_path(old, ignore_errors=True)
        self.prune(newest=step)

    @staticmethod
    def _commit(final: Path, step: int, files: Mapping[str, tuple[int, str]]) -> None:
        """Write the ``COMMITTED`` marker of ``final`` (temp file, fsync, rename, fsync of the folder): the state
        file's size and SHA-256, and under ``files`` those of every shard file (sizes and digests given)."""
        marker: dict[str, Any] = {"step": step, "file": STATE_FILE, "size": (final / STATE_FILE).stat().st_size}
        marker["sha256"] = _sha256(final / STATE_FILE)
        if files:
            marker["files"] = [{"file": f, "size": size, "sha256": sha} for f, (size, sha) in sorted(files.items())]
        marker_tmp = final / f"{MARKER}.tmp"
        with open(marker_tmp, "w") as f:
            json.dump(marker, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(marker_tmp, final / MARKER)
        _fsync_dir(final)

    def _write_failure(self, err: BaseException) -> str:
        """The one line of a failed save: the folder, why (the disk is full, ...) and what to do."""
        try:
            free: int | None = shutil.disk_usage(self.root).free
        except OSError:  # the folder could not even be made
            free = None
        reason, fix = write_reason(err)
        errno_named = _in_chain(err, {**NO_ROOM, **DENIED}) is not None
        if not errno_named and free is not None and free < (64 << 20):  # torch's "unexpected pos" names no errno
            reason, fix = NO_ROOM[errno.ENOSPC], "free space"
        if free is not None and _in_chain(err, DENIED) is None:  # room is beside the point of a permission
            reason += f"; {free / 2**20:.0f} MiB free"
        return (
            f"cannot write a checkpoint in {self.root} ({reason}); the older checkpoints are kept — {fix}, then "
            "--resume auto"
        )

    def _check_root(self, folder: str = "", *, create: bool = False) -> Path:
        """``root`` (or ``root/folder``), checked to be real folders before a save, a prune or a move writes or
        deletes there (:func:`~drivetrain.safeio.files.real_dir`; made when missing with ``create`` or ``folder``).

        Raises:
            CheckpointError: one of them is a link (a run's ``checkpoints`` linked to another run's would make
                pruning delete that run's checkpoints) or a file; nothing was written, deleted or moved.
        """
        target = self.root / folder
        try:
            if create:
                self.root.parent.mkdir(parents=True, exist_ok=True)  # the run directory (named by the user)
            return real_dir(target, base=self.root.parent, create=create or bool(folder))
        except (LinkedFolderError, NotADirectoryError) as err:
            raise CheckpointError(
                f"not writing or deleting checkpoints in {err.filename}: {err.strerror}; nothing was saved, deleted "
                "or moved"
            ) from None
        except OSError as err:
            if create:  # the folder could not be made: a write failure, named as a failed save is
                raise CheckpointError(self._write_failure(err)) from None
            raise

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
        self._check_root()
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
            marker = json_files.loads(read_text(marker_path, limit=MAX_MARKER_BYTES, what="a marker may hold"))
        except (OSError, ValueError) as err:  # ValueError includes undecodable bytes
            reason = err.strerror if isinstance(err, OSError) and err.strerror else err
            raise CheckpointError(f"{path}: unreadable {MARKER} marker ({reason})") from None
        fields = {"file": str, "size": int, "sha256": str}
        if not isinstance(marker, dict) or not all(isinstance(marker.get(k), t) for k, t in fields.items()):
            raise CheckpointError(f"{path}: malformed {MARKER} marker (needs file, size and sha256)")
        if Path(marker["file"]).name != marker["file"] or marker["file"] in ("", ".", ".."):
            raise CheckpointError(f"{path}: the {MARKER} marker names a file outside the checkpoint")
        state_path = path / marker["file"]
        try:  # a regular file (a FIFO would block), of the marker's size and SHA-256, whose members do not expand
            state = load_torch_file(state_path, size=marker["size"], sha256=marker["sha256"])
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise CheckpointError(f"{state_path}: unreadable state file ({reason})") from None
        except TorchFileError as err:
            raise CheckpointError(f"{state_path}: {err}") from None
        if not isinstance(state, dict) or SHARDS_KEY not in state:
            return state  # a single-file checkpoint (every drivetrain before sharded saves)
        return self._with_shards(path, marker, state)

    def _with_shards(self, path: Path, marker: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """A sharded checkpoint's state: every shard file checked against the marker (a regular file of its size
        and SHA-256, named in the shard index), then its components' tensors read whole (``shards="full"``) or
        left in the shards for the live tensors to load (``"lazy"``: :class:`~.dcp_files.Shards`)."""
        if state.pop(SHARDS_KEY) != SHARDS:
            raise CheckpointError(f"{path / STATE_FILE}: names a shard folder other than {SHARDS}/")
        listed = marker.get("files")
        if not isinstance(listed, list) or not all(
            isinstance(e, dict) and isinstance(e.get("file"), str) and isinstance(e.get("size"), int)
            and isinstance(e.get("sha256"), str) for e in listed
        ):  # fmt: skip
            raise CheckpointError(f"{path}: malformed {MARKER} marker (a sharded checkpoint lists its files)")
        names = set()
        for entry in listed:
            folder, _, name = entry["file"].partition("/")
            if folder != SHARDS or Path(name).name != name or name in ("", ".", ".."):
                raise CheckpointError(f"{path}: the {MARKER} marker names a file outside the checkpoint's shards")
            try:
                check_file(path / entry["file"], size=entry["size"], sha256=entry["sha256"])
            except OSError as err:
                reason = err.strerror or type(err).__name__
                raise CheckpointError(f"{path / entry['file']}: unreadable shard ({reason})") from None
            except TorchFileError as err:
                raise CheckpointError(f"{path / entry['file']}: {err}") from None
            names.add(name)
        folder = path / SHARDS
        try:
            if dcp_files.INDEX not in names:
                raise ShardError(f"{folder}: the {MARKER} marker does not cover the shard index")
            slices: dict[str, list[tuple[int, int]]] = {}
            for info in dcp_files.index_of(folder).storage_data.values():
                slices.setdefault(info.relative_path, []).append((info.offset, info.length))
            unlisted = sorted(set(slices) - names)
            if unlisted:
                raise ShardError(f"{folder / unlisted[0]}: a shard the {MARKER} marker does not cover")
            for name, where in slices.items():  # each tensor a torch.save archive that does not expand
                try:
                    check_archives(folder / name, where)
                except TorchFileError as err:
                    raise ShardError(f"{folder / name}: {err}") from None
            sharded = [name for name, value in state.items() if dcp_files.shard_keys(value)]
            if self.shards == "lazy":
                return {**state, **{name: Shards(folder, state[name]) for name in sharded}}
            tensors = dcp_files.read_full(folder)
            return {**state, **{name: dcp_files.join_tensors(state[name], tensors) for name in sharded}}
        except ShardError as err:
            raise CheckpointError(str(err)) from None
        except (OSError, RuntimeError) as err:
            raise CheckpointError(f"{folder}: unreadable shards ({str(err).strip().splitlines()[-1]})") from None

    @staticmethod
    def identity(path: str | Path) -> str:
        """What tells two copies of the committed checkpoint ``path`` apart: the SHA-256 of its ``COMMITTED``
        marker's bytes (hex), which record the state's size and SHA-256. Reads only the marker (≤ 64 KiB).

        Raises:
            CheckpointError: the marker cannot be read (one line naming it).
        """
        marker = checkpoint_dir(path) / MARKER
        try:  # a regular file of at most 64 KiB (a FIFO there cannot block)
            with open_regular(marker, limit=MAX_MARKER_BYTES, what="a marker may hold") as f:
                return hashlib.sha256(f.read()).hexdigest()
        except OSError as err:
            raise CheckpointError(f"{marker}: unreadable {MARKER} marker ({err.strerror or err})") from None

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
        """Move checkpoint ``path`` into ``root/folder/`` (out of pruning's and resume's sight); returns where.

        A linked ``path`` is moved as the link; ``root`` or ``root/folder`` being a link is a CheckpointError.
        """
        target_dir = self._check_root(folder)
        target = target_dir / path.name
        n = 1
        while target.exists() or target.is_symlink():
            target = target_dir / f"{path.name}.{n}"
            n += 1
        os.replace(path, target)
        _fsync_dir(self.root)
        return target
