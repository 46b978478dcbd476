"""Starting a run: its folder (marker, lock), what it resumes, and the ranks agreeing on both.

**Resume.** The checkpoint ``--resume`` names, checked against this run before anything is restored.

Two steps, so that the ranks of a process group can agree on the checkpoint in between
(:mod:`drivetrain.engine.distributed`). :func:`find_resume`, every rank alone and before any collective: ``--resume
auto`` takes the run's newest committed checkpoint that loads (none: the run starts from step 0, saying why when
corrupt ones were skipped); ``--resume DIR`` takes that checkpoint directory (or its ``state.pt``); each of these is
one :class:`ConfigError` line: another format version, a config that differs from the saved one (read in today's
spelling; the keys a resume may change excepted), another global batch. :func:`restore_found`, once the components
are built: a missing or an extra component and an older run's state that cannot continue exactly
(:mod:`drivetrain.engine.compat`) are one ConfigError line each before anything is restored; then every component is
restored in the mapping's order (the RNG states last); a component's state this run cannot continue (a ValueError of
its ``load_state_dict``, e.g. another number of scene streams) is one ConfigError line too. A resume with another
``train.steps`` that reshapes the learning-rate schedule warns.

**Elastic resume.** A run continues on any number of ranks, with any ``data.batch_size`` and
``train.accumulation``, under any of the strategies ``none``, ``ddp`` and ``fsdp`` (and their options), when it keeps
the *global batch* ``data.batch_size × ranks × train.accumulation`` (:func:`check_elastic`; otherwise one line names
the ``train.accumulation`` that keeps it). What makes that exact:

- the data position is global (:class:`~drivetrain.engine.batches.ShuffledBatches` counts the rows all ranks
  consumed, and its epochs are cut in global batches; :class:`~drivetrain.data.sampler.SequenceSampler` deals
  scenes to the run's ``data.batch_size × ranks`` streams, which a resume must keep), so every optimizer step reads
  the rows (frames) the uninterrupted run's step read;
- the model, optimizer and loss-scaler states are full (unsharded) ones, loaded through the strategy
  (:class:`~drivetrain.engine.state.StrategyState`), and the step and schedule are counters; a streaming model's
  per-stream state (a temporal detector's memory) is every rank's, and each rank takes its streams' rows
  (:class:`~drivetrain.engine.state.StreamState`);
- the RNG states are restored per rank on the same number of ranks; on another number each rank's are re-derived
  from ``(run.seed, rank, iteration)`` (:class:`~drivetrain.engine.state.RngState`). Draws that depend on the rank
  rather than on the sample (dropout masks) then differ from the uninterrupted run's; the augmentation draws each
  sample's parameters from its place in the epoch's global order, not from these states
  (:func:`~drivetrain.pipeline.augment.camera.augment_seeds`), so it is the same on any split.

Only rounding differs: a gradient that two ranks averaged is a sum over one rank's micro-batches now, in another
order (float64 runs agree to a few ulps per summed term, tests/test_engine_elastic.py). A DeepSpeed run resumes
only under DeepSpeed; a checkpoint of a drivetrain before elastic resume continues on its own split only
(:mod:`drivetrain.engine.compat`, rule 4).

After a resume, :func:`set_aside_unusable` moves corrupt checkpoints and those of an abandoned continuation aside, so
that a later ``--resume auto`` cannot pick them over this run's progress.

**Run directories.** drivetrain writes only into its own, one training process at a time.

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
(:mod:`drivetrain.safeio.files`).

**Lock.** One training process per run directory: an advisory lock on ``<run.out_dir>/.drivetrain.lock``.

Two ``drivetrain train`` processes writing the same run directory would interleave metrics lines and
checkpoints. Rank 0 takes an exclusive ``flock`` on the lock file when the trainer is built and keeps it
until the run ends; a second process gets a :class:`ConfigError` naming the PID and host that hold it. The
kernel drops the lock when its holder dies (``kill -9`` included), so a stale lock file never blocks a resume.
Within one process a run directory can be locked again (an interactive session building a second trainer
for the same run while the first is still referenced).

**Agreement.** Ranks agree, or nobody commits: at start every rank proves it sees rank 0's run folder and
resumed the same state.

Every rank decides alone what it starts from — rank 0 checks the run folder, every rank finds the checkpoint
``--resume`` names in its own view of ``run.out_dir`` — and a rank whose folder is not rank 0's (each node with a
folder of its own at that path) or holds a stale copy would train from another state, diverge without a word and
commit checkpoints of the mix. So before the first collective of the run and before anything is written into the
run folder, :func:`agree_on_start` compares what every rank saw:

1. **The folder.** Rank 0 creates a token file ``.drivetrain-start-<random hex>`` in its ``run.out_dir`` (and the
   folder, when it is new) and sends its name to every rank (one broadcast); each rank looks for it in its own
   ``run.out_dir`` (for up to :data:`SEE_WAIT_S`: a network file system may show a new file late).
2. **One gather** of every rank's view: whether it sees the token, the ConfigError line it met while starting (if
   any), the checkpoint it resumed (its directory name and :meth:`~drivetrain.engine.checkpoint.Checkpointer.identity`,
   the digest of its ``COMMITTED`` marker, which records the state's size and SHA-256) and the digest of its config
   (without the :data:`NODE_LOCAL` keys, such as ``data.num_workers``, that a node may set for itself).

Rank 0 then removes the token (and the folder it created for it, when the start stops; a token that a start killed
in between leaves behind does not make a new folder "not empty": :func:`~drivetrain.engine.resume.check_run_dir`).
Any difference is one :class:`RanksDisagree` line (a :class:`~drivetrain.engine.config.ConfigError`: ``drivetrain
train`` exits with status 2), the same on every rank, naming the first cause in this order: a rank that does not see
rank 0's folder, a rank that could not start (its own line; a line every rank met is given as is), ranks that resumed
different checkpoints (a node with a stale or unshared copy of ``checkpoints/``), ranks with different configs. Every
rank leaves at the same point, so none is left waiting in a collective, and nothing of the run was written.

The check costs a broadcast, a gather and a file made and removed; a rank that does not see the token waits
:data:`SEE_WAIT_S` before it says so.

A process alone (no process group, or a group of one) skips all of it: its start errors are raised as they come.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import secrets
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

import drivetrain
from drivetrain.engine.build import lr_factor
from drivetrain.engine.checkpoint import (
    CORRUPT,
    SUPERSEDED,
    Checkpointer,
    CheckpointError,
    CheckpointWarning,
    check_components,
    check_format,
    checkpoint_dir,
    no_room,
)
from drivetrain.engine.compat import refuse_own_augmentation_generator, upgrade_saved_config
from drivetrain.engine.config import ConfigError, TrainConfig, config_diff, config_to_dict
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.state import Stateful, TrainState
from drivetrain.safeio import json_files
from drivetrain.safeio.files import LinkedFolderError, open_output, real_dir, replace_text
from drivetrain.safeio.reads import read_text

__all__ = [
    "ELASTIC_KEYS",
    "LOCK_FILE",
    "NODE_LOCAL",
    "RUN_FOLDERS",
    "RUN_FORMAT",
    "RUN_MARKER",
    "SEE_WAIT_S",
    "START_TOKEN",
    "Found",
    "RanksDisagree",
    "RunDirLock",
    "agree_on_start",
    "check_elastic",
    "check_run_dir",
    "check_run_folders",
    "disagreement",
    "find_resume",
    "prepare_run_dir",
    "restore_found",
    "set_aside_unusable",
    "write_run_marker",
]

# Config keys a resume may change when the global batch is kept (check_elastic), beside the distributed.* keys of
# the torch-native strategies: how the global batch is split does not change what is learned (up to rounding).
ELASTIC_KEYS = ("data.batch_size", "train.accumulation", "train.global_batch")
_DEEPSPEED_KEYS = ("distributed.deepspeed_zero_stage", "distributed.deepspeed_offload_optimizer",
                   "distributed.deepspeed_offload_params")  # fmt: skip


@dataclass
class Found:
    """What a start continues from: the checkpoint ``--resume`` found (its directory and loaded state), or none.

    Attributes:
        path: the checkpoint directory; None when the run starts from step 0.
        checkpoint: its loaded state, until :func:`restore_found` hands it to the components.
        note: why ``--resume auto`` starts from step 0 when corrupt checkpoints were skipped (else None).
    """

    path: Path | None = None
    checkpoint: dict[str, Any] | None = None
    note: str | None = None


def find_resume(resume: str, checkpointer: Checkpointer, cfg: TrainConfig, world_size: int) -> Found:
    """The checkpoint ``resume`` names, loaded and checked against this run; restores nothing (no collective).

    Args:
        resume: ``"auto"`` or the path of a checkpoint directory (or its ``state.pt``).
        checkpointer: the run's checkpointer.
        cfg: this run's configuration.
        world_size: this run's number of ranks.

    Returns:
        The checkpoint found; for ``auto`` with nothing to resume, none (with a note when corrupt checkpoints were
        skipped).

    Raises:
        ConfigError: the checkpoint cannot be found or read, is of another format version, was written with another
            config (the keys a resume may change excepted) or with another global batch (one line naming it).
    """
    if resume == "auto":
        found = checkpointer.load_latest()
        if found is None:
            if not checkpointer.skipped:
                return Found()
            return Found(
                note=f"no usable checkpoint in {checkpointer.root} ({len(checkpointer.skipped)} corrupt, moved to "
                f"{checkpointer.root / CORRUPT}); starting from step 0"
            )
        path, ckpt = found
    else:
        path, ckpt = _load_named(resume, checkpointer)
    try:  # before anything is read from it: another format version
        check_format(ckpt, path)
    except CheckpointError as err:
        raise ConfigError(f"--resume: {err}") from None
    saved = upgrade_saved_config(ckpt["config"])
    diff = [line for line in config_diff(saved, config_to_dict(cfg)) if not _elastic(line.partition(":")[0])]
    if diff:
        raise ConfigError(
            f"--resume: the config differs from the one checkpoint {path} was written with:\n  "
            + "\n  ".join(diff)
            + "\n"
            + _ways_forward(saved, [line.split(": ", 1)[0] for line in diff], path)
        )
    check_elastic(saved, int(ckpt["world_size"]), cfg, world_size, path)
    return Found(path, ckpt)


def restore_found(
    found: Found, checkpointer: Checkpointer, components: dict[str, Stateful], cfg: TrainConfig, model: Any,
    state: TrainState,
) -> None:  # fmt: skip
    """Restore ``components`` from the checkpoint :func:`find_resume` found (nothing when it found none).

    Collective where the strategy's restore is (FSDP, DeepSpeed): every rank calls it, with the same checkpoint.

    Args:
        found: what :func:`find_resume` returned (its loaded state is released here).
        checkpointer: the run's checkpointer.
        components: what a checkpoint holds, in restore order (the trainer's).
        cfg: this run's configuration.
        model: this run's model.
        state: the loop counters (one of ``components``; read after the restore).

    Raises:
        ConfigError: the checkpoint lacks a component or holds one the run has not, or cannot be continued exactly
            by this model (one line naming it); nothing was restored.
    """
    ckpt, path, found.checkpoint = found.checkpoint, found.path, None
    if ckpt is None:
        return
    if "streams" in components and "streams" not in ckpt:  # older: the model state holds rank 0's (compat rule 5)
        ckpt = {**ckpt, "streams": None}
    try:  # before anything is read from it: a missing or an extra component
        check_components(ckpt, components, path)
    except CheckpointError as err:
        raise ConfigError(f"--resume: {err}") from None
    refuse_own_augmentation_generator(model, ckpt, path)
    try:
        checkpointer.restore(ckpt, components, path)  # in the mapping's order: the RNG states last
    except ValueError as err:  # a component's state this run cannot continue (e.g. another number of scene streams)
        raise ConfigError(f"--resume: checkpoint {path}: {str(err).splitlines()[0]}") from None
    _warn_schedule_change(cfg, ckpt["config"]["train"]["steps"], state.step)


def _ways_forward(saved: dict[str, Any], keys: list[str], path: Path) -> str:
    """What to do about a config that differs from the checkpoint's in ``keys``: undo the change to resume exactly
    (the saved values, as overrides), or keep it and start a new run from the checkpoint's weights
    (``model.init_from``), since a resumed run continues only the run it was."""
    import json
    import shlex

    from drivetrain.engine.config import resolved_sections

    resolved = resolved_sections(saved)
    undo = []
    for key in keys:
        node: Any = resolved
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:  # a key the saved config lacks is undone by leaving it out
            value = node if isinstance(node, str) and _reads_back(node) else json.dumps(node)  # JSON is YAML
            undo.append(shlex.quote(f"{key}={value}"))
    put_back = f" (or override {' '.join(undo)})" if undo else ""
    return (
        f"to resume exactly, drop the change{put_back}; to keep it, start a new run from these weights: "
        f"model.init_from={shlex.quote(str(path))} run.out_dir=NEW_DIR (the weights only: optimizer, schedule and "
        "data order start afresh; docs/engine.md, model.init_from)"
    )


_ABSENT = object()


def _reads_back(text: str) -> bool:
    """Whether ``KEY=text`` gives the string ``text`` back (an override's value is read as YAML: ``true``, ``1e-3``
    or ``null`` would not)."""
    import yaml

    from drivetrain.engine.config_files import load_yaml

    try:
        return load_yaml(text) == text  # bounded, as an override's value is read
    except yaml.YAMLError:
        return False


def _elastic(key: str) -> bool:
    """Whether config key ``key`` may differ on a resume that keeps the global batch (:func:`check_elastic`)."""
    return key in ELASTIC_KEYS or (key.startswith("distributed.") and key not in _DEEPSPEED_KEYS)


def check_elastic(saved: dict[str, Any], saved_world_size: int, cfg: TrainConfig, world_size: int, path: Path) -> None:
    """Refuse, in one line, a resume that changes the global batch or moves to or from DeepSpeed.

    The global batch is ``data.batch_size × ranks × train.accumulation``; when this run's differs from the
    checkpoint's, the line names the ``train.accumulation`` (else the ``data.batch_size``) that would keep it on
    this many ranks. Everything else about the split (ranks, batch size, accumulation, the strategy among
    ``none``, ``ddp`` and ``fsdp`` and its options) may change.

    Args:
        saved: the checkpoint's config in today's spelling.
        saved_world_size: the ranks that wrote the checkpoint.
        cfg: this run's configuration.
        world_size: this run's number of ranks.
        path: the checkpoint, for the message.

    Raises:
        ConfigError: the global batch is not kept, or the strategy moves to or from ``deepspeed``.
    """
    try:
        batch, accumulation = int(saved["data"]["batch_size"]), int(saved["train"]["accumulation"])
        saved_strategy = str(saved["distributed"]["strategy"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            f"--resume: checkpoint {path}: its config names no data.batch_size, train.accumulation or "
            "distributed.strategy, which the global batch check reads"
        ) from None
    before, now = batch * saved_world_size * accumulation, cfg.data.batch_size * world_size * cfg.train.accumulation
    if before != now:
        if before % (cfg.data.batch_size * world_size) == 0:
            keep = f"set train.accumulation={before // (cfg.data.batch_size * world_size)} to keep it"
        elif before % (world_size * cfg.train.accumulation) == 0:
            keep = f"set data.batch_size={before // (world_size * cfg.train.accumulation)} to keep it"
        elif before % world_size == 0:
            keep = f"set data.batch_size × train.accumulation to {before // world_size} (e.g. data.batch_size="
            keep += f"{before // world_size} and train.accumulation=1) to keep it"
        else:
            keep = f"it does not divide among {world_size} ranks: resume on a number of ranks that divides {before}"
        raise ConfigError(
            f"--resume: checkpoint {path} was written with a global batch of {before} ({batch} × "
            f"{saved_world_size} rank(s) × {accumulation}); this run has {now} ({cfg.data.batch_size} × {world_size} "
            f"× {cfg.train.accumulation}): {keep}"
        )
    strategies = (saved_strategy, cfg.distributed.strategy)
    if strategies[0] != strategies[1] and "deepspeed" in strategies:
        raise ConfigError(
            f"--resume: checkpoint {path} was written under distributed.strategy {strategies[0]!r}, this run has "
            f"{strategies[1]!r}; a run resumes under none, ddp and fsdp alike, but DeepSpeed only under DeepSpeed"
        )


def _load_named(resume: str, checkpointer: Checkpointer) -> tuple[Path, dict[str, Any]]:
    """``--resume DIR``: the checkpoint directory and its loaded state (ConfigError lines for anything else)."""
    try:
        path = checkpoint_dir(resume)  # a checkpoint folder or its state.pt
    except CheckpointError as err:
        raise ConfigError(f"--resume: {err}") from None
    if not path.exists():
        raise ConfigError(f"--resume: {path} does not exist (pass auto, or a checkpoint directory)")
    if (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file():
        raise ConfigError(
            f"--resume: {path} is a run directory; pass --resume auto with run.out_dir={path}, or one of "
            f"its checkpoints ({path / 'checkpoints' / 'step-N'})"
        )
    try:
        return path, checkpointer.load(path)
    except CheckpointError as err:
        raise ConfigError(f"--resume: {err}") from None


def _warn_schedule_change(cfg: TrainConfig, saved_steps: int, step: int) -> None:
    """Warn when a resume with another ``train.steps`` reshapes the schedule (its length follows it)."""
    sched, lr = cfg.schedule, cfg.optim.lr
    if saved_steps == cfg.train.steps or sched.total_steps is not None or sched.kind == "warmup_constant":
        return
    before, after = lr * lr_factor(sched, step, saved_steps), lr * lr_factor(sched, step, cfg.train.steps)
    if not math.isclose(before, after, rel_tol=1e-6):
        warnings.warn(
            f"train.steps changed from {saved_steps} to {cfg.train.steps}: the {sched.kind} schedule "
            f"stretches with it, so the lr at step {step} jumps from {before:.3g} to {after:.3g}; pass "
            f"schedule.total_steps={saved_steps} to keep the old schedule (the lr then stays at its final "
            "value past that step)",
            RuntimeWarning,
            stacklevel=3,
        )


def set_aside_unusable(checkpointer: Checkpointer, step: int, continued: bool) -> None:
    """Rank 0, after a resume: move corrupt checkpoints and those of an abandoned continuation aside.

    Corrupt ones (committed, but failing to load) go to ``checkpoints/corrupt/``; with ``continued`` (the run
    resumed, or ``--resume auto`` found nothing usable and starts from 0), committed ones newer than ``step`` (a
    ``--resume DIR`` of an older checkpoint, or the start from 0) to ``checkpoints/superseded/``. Nothing is deleted.

    Args:
        checkpointer: the run's checkpointer (its ``skipped`` checkpoints are the corrupt ones).
        step: the iteration this run continues from.
        continued: whether newer committed checkpoints are superseded.
    """
    for path, reason in checkpointer.skipped:
        if path.is_dir():
            target = checkpointer.set_aside(path, CORRUPT)
            warnings.warn(f"moved corrupt checkpoint {path} to {target} ({reason})", CheckpointWarning, stacklevel=2)
    if not continued:
        return
    for saved, path in checkpointer.committed():
        if saved > step:
            target = checkpointer.set_aside(path, SUPERSEDED)
            warnings.warn(
                f"moved checkpoint {path} to {target}: it is newer than step {step}, which this run continues from",
                CheckpointWarning,
                stacklevel=2,
            )


LOCK_FILE = ".drivetrain.lock"
# Rank 0's proof that every rank sees its run folder, made and removed at start (drivetrain.engine.distributed);
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
        content = json_files.loads(text)  # nesting bounded: a deep one is "not a marker", not a RecursionError
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


# Keys a node may set for itself (they change neither what is learned nor when the ranks meet in a collective).
NODE_LOCAL = ("run.threads", "data.num_workers", "data.pin_memory", "data.persistent_workers", "data.prefetch_factor")
# How long a rank looks for rank 0's token before it counts as unseen (a shared file system may show it late).
SEE_WAIT_S = 2.0


class RanksDisagree(ConfigError):
    """The ranks of a run did not start from the same run folder, checkpoint and config (one line, every rank)."""


def agree_on_start(
    ctx: DistContext, out_dir: Path, cfg: TrainConfig, resumed: Path | None, error: ConfigError | None
) -> None:
    """Check, on every rank of the group at once, that every rank starts from the same run folder and state.

    Collective (a broadcast and one gather): every rank calls it once, before the run's first other collective
    and before anything is written into ``out_dir`` (the module docstring says what is compared).

    Args:
        ctx: this process's place in the group.
        out_dir: the run folder, as this rank sees it (``run.out_dir``).
        cfg: this rank's configuration (compared by digest).
        resumed: the checkpoint directory this rank resumes; None when it starts from step 0.
        error: the ConfigError this rank met while deciding what to start from (it took part all the same).

    Raises:
        ConfigError: ``error`` itself, in a process alone.
        RanksDisagree: any difference between the ranks, or any rank's ``error`` (the same line on every rank).
    """
    if not ctx.initialized or ctx.world_size == 1:
        if error is not None:
            raise error
        return
    created: list[Path] = []
    token: Path | None = None
    if ctx.is_main and error is None:  # a folder rank 0 refused gets nothing written into it
        try:
            token, created = _write_token(out_dir)
        except OSError as err:
            error = ConfigError(f"run.out_dir: cannot write into {out_dir} ({err.strerror or err})")
    try:
        name = ctx.broadcast_from_main(None if token is None else token.name)
        views = ctx.gather_to_main(_view(ctx, out_dir, cfg, resumed, error, name))
    finally:
        if token is not None:  # every rank has looked (or the group is gone): the token goes either way
            with contextlib.suppress(OSError):
                token.unlink()
    line = disagreement(views, str(out_dir))
    if line is not None:
        _remove_folders(created)  # made for the token only: the run does not start
        raise RanksDisagree(line)


def disagreement(views: list[dict[str, Any]], out_dir: str) -> str | None:
    """The line that says why the ranks' ``views`` (in rank order, as :func:`agree_on_start` gathers them)
    disagree, or None when every rank may start; causes in the module docstring's order."""
    main = views[0]
    if main["error"] is None:
        for view in views[1:]:
            if not view["sees_folder"]:
                return (
                    f"run.out_dir: {_who(view)} does not see the run folder run.out_dir={out_dir} that {_who(main)} "
                    f"writes ({main['folder']} on rank 0, {view['folder']} on rank {view['rank']}): each node has a "
                    "folder of its own there; run.out_dir must be one folder shared by every node; nothing was written"
                )
    failed = [view for view in views if view["error"] is not None]
    if failed:
        if len(failed) == len(views) and len({view["error"] for view in views}) == 1:
            return failed[0]["error"]
        return f"{_who(failed[0])}: {failed[0]['error']}"
    resumed = _groups(views, "resumed")
    if len(resumed) > 1:
        ckpts = "; ".join(f"{_ranks(group)}: {_checkpoint(group[0]['resumed'])}" for group in resumed)
        return (
            f"--resume: the ranks resumed different checkpoints ({ckpts}); a node has a stale or unshared copy of "
            "them: run.out_dir (and a --resume DIR) must be one folder shared by every node; nothing was written"
        )
    configs = _groups(views, "config")
    if len(configs) > 1:
        return (
            f"the ranks run different configs ({'; '.join(_ranks(group) for group in configs)}, one config each); "
            "every node must run the same command with the same config files; nothing was written"
        )
    return None


def _view(
    ctx: DistContext, out_dir: Path, cfg: TrainConfig, resumed: Path | None, error: ConfigError | None,
    token: str | None,
) -> dict[str, Any]:  # fmt: skip
    """What this rank saw (``token``: the name of rank 0's token, None when it wrote none), as plain values."""
    identity = None
    if resumed is not None and error is None:
        try:
            identity = (resumed.name, Checkpointer.identity(resumed))
        except CheckpointError as err:  # its marker went away after the load: this rank cannot start
            error = ConfigError(f"--resume: {err}")
    return {
        "rank": ctx.rank,
        "host": socket.gethostname(),
        "folder": str(Path(os.path.abspath(out_dir))),
        "sees_folder": ctx.is_main or (token is not None and _sees(out_dir / token)),
        "error": None if error is None else str(error),
        "resumed": identity,
        "config": _config_digest(cfg),
    }


def _config_digest(cfg: TrainConfig) -> str:
    """SHA-256 of ``cfg`` without its :data:`NODE_LOCAL` keys."""
    data = config_to_dict(cfg)
    for key in NODE_LOCAL:
        section, name = key.split(".")
        data.get(section, {}).pop(name, None)
    return hashlib.sha256(yaml.safe_dump(data, sort_keys=True).encode()).hexdigest()


def _sees(token: Path) -> bool:
    """Whether ``token`` is (or shows up within :data:`SEE_WAIT_S`) a file in this rank's view."""
    deadline = time.monotonic() + SEE_WAIT_S
    while not token.is_file():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _write_token(out_dir: Path) -> tuple[Path, list[Path]]:
    """Create ``out_dir`` (as needed) and a new token file in it; returns the token and the folders created
    (innermost last). Raises OSError (what was made is removed)."""
    created = []
    folder = Path(out_dir)
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        created.append(folder)
        folder = folder.parent
    created.reverse()
    try:
        for folder in created:
            folder.mkdir()
        token = Path(out_dir) / f"{START_TOKEN}{secrets.token_hex(8)}"
        with open(token, "x") as f:  # a new name: never anyone else's file
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    except OSError:
        _remove_folders(created)
        raise
    return token, created


def _remove_folders(created: list[Path]) -> None:
    """Delete the folders :func:`_write_token` made (innermost first), each only while it is empty."""
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _groups(views: list[dict[str, Any]], key: str) -> list[list[dict[str, Any]]]:
    """``views`` grouped by ``view[key]``, in order of each group's lowest rank."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for view in views:
        groups.setdefault(view[key], []).append(view)
    return list(groups.values())


def _who(view: dict[str, Any]) -> str:
    return f"rank {view['rank']} (host {view['host']})"


def _ranks(group: list[dict[str, Any]]) -> str:
    more = len(group) - 1
    return _who(group[0]) + (f" and {more} more rank{'s' if more > 1 else ''}" if more else "")


def _checkpoint(identity: tuple[str, str] | None) -> str:
    if identity is None:
        return "none (step 0)"
    name, digest = identity
    return f"{name} (COMMITTED digest {digest[:12]})"
