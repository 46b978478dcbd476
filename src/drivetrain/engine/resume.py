"""Continuing a run: the checkpoint ``--resume`` names, checked against this run before anything is restored.

Two steps, so that the ranks of a process group can agree on the checkpoint in between
(:mod:`drivetrain.engine.agreement`). :func:`find_resume`, every rank alone and before any collective: ``--resume
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
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivetrain.engine.checkpoint import (
    CORRUPT,
    SUPERSEDED,
    Checkpointer,
    CheckpointError,
    CheckpointWarning,
    check_components,
    check_format,
    checkpoint_dir,
)
from drivetrain.engine.compat import refuse_own_augmentation_generator, upgrade_saved_config
from drivetrain.engine.config import ConfigError, TrainConfig, config_diff, config_to_dict
from drivetrain.engine.schedule import lr_factor
from drivetrain.engine.state import Stateful, TrainState

__all__ = ["ELASTIC_KEYS", "Found", "check_elastic", "find_resume", "restore_found", "set_aside_unusable"]

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
