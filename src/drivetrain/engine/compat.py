"""What older runs left behind, read in today's terms: every rule that exists only so that an older drivetrain's
checkpoints and configs keep working (or are refused in one line naming today's spelling), in one place. Their
data (old builder spellings, moved keys) is in :mod:`drivetrain.engine.old_spellings`, a leaf the registry reads too.
What is read, and until which version: docs/design.md, "Compatibility policy"
(:data:`~drivetrain.engine.old_spellings.READ_UNTIL`).

Rules (old form → what it maps to):

1. **Flat camera augmentation in a saved config.** ``data.augment: {image: ..., bev: ...}`` (before
   ``data.augment`` had ``camera`` and ``lidar`` sections) → ``data.augment: {camera: {image: ..., bev: ...},
   lidar: null}``. The draws are the same (the camera draws first from the same seeds), so such a run
   resumes exactly (:func:`upgrade_saved_config`).
2. **Model arguments that moved out of a model.** ``old_spellings.MOVED_ARGS`` lists them per model (old key → new
   dotted key, or dropped, and the hint): the lidar models' ``model.args.augment`` → ``data.augment.lidar`` and
   ``model.args.seed`` dropped. A saved config is upgraded (:func:`upgrade_saved_config`); a config that sets one
   today is refused with the hint (:func:`drivetrain.engine.registry.check_args` through
   :func:`~drivetrain.engine.old_spellings.moved_args`).
3. **The lidar models' own generator in a checkpoint.** A model state with a top-level ``_extra_state`` (that
   generator) for a model that keeps no extra state: ``--resume`` is refused in one line (its draws came from
   that generator, today's from run.seed, the rank and the batch position, so the run cannot continue exactly;
   :func:`refuse_own_augmentation_generator`); evaluation drops it and scores the weights
   (:func:`drop_own_augmentation_generator`).

4. **Per-rank data positions.** A ``data`` state of a drivetrain before elastic resume (:mod:`drivetrain.engine.resume`)
   counts each rank's batches: ``ShuffledBatches``' ``(epoch, step)`` without the global ``sample``, a
   ``SequenceSampler``'s position without ``streams`` (scenes dealt round-robin to ranks, then to slots). It continues
   on the same ``data.batch_size`` and number of ranks (anything else is one line naming the two), the first at
   ``step × batch_size × ranks`` rows (with accumulation 1 the rows each rank reads are the ones it would have read;
   with more, epochs now end after whole optimizer steps), the second keeping its per-rank dealing
   (``dealing="per_rank"``) for the rest of the run. Read by the samplers' ``load_state_dict``, beside the current
   form (:class:`drivetrain.engine.batches.ShuffledBatches`, :class:`drivetrain.data.sampler.SequenceSampler`).
   Not carried over: such a run's augmentation was drawn per batch from (run seed, rank, batch position); it
   continues with today's per-sample draws (:func:`drivetrain.pipeline.augment.camera.augment_seeds`), so an
   augmented run resumes, but its later draws are not the ones the older drivetrain would have made.

5. **A streaming model's checkpoint without ``streams``.** Before every rank's stream state was checkpointed
   (:class:`drivetrain.engine.state.StreamState`), only the model state held it, as rank 0's rows: such a checkpoint
   resumes with those (every rank starts from rank 0's memory, as it did then); read in
   :func:`drivetrain.engine.resume.resume_run`, which lets the component load ``None``.

6. **Builder spellings.** Configs and run directories before the registry named our builders
   ``package.module:Name``: ``old_spellings.ALIASES`` maps each to its short name, a fixed table (no import is
   derived from the text; :func:`drivetrain.engine.registry.canonical_name` reads it).

The saved config is upgraded wherever a checkpoint's config is read: the resume check against the run's config
(:mod:`drivetrain.engine.resume`) and ``drivetrain eval --checkpoint`` (:mod:`drivetrain.engine.eval_run`).

Three older forms are read beside the code that reads the current form, not here (besides rule 4's):

- a checkpoint's ``format: 1`` field → format version 1 or 2, told by its data position
  (:func:`drivetrain.engine.state.format_version`: the checkpointer reads it, and importing this module there
  would close an import cycle through the config);
- the flat camera keys in a current config → refused in one line naming their new place (``moved_augment_key`` of
  :mod:`drivetrain.pipeline.augment.stage`);
- a run directory of a drivetrain from before the run marker → refused in one line saying how to adopt it
  (:func:`drivetrain.engine.resume.check_run_dir`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from drivetrain.engine.old_spellings import moved_args
from drivetrain.engine.typed import ConfigError

__all__ = ["drop_own_augmentation_generator", "refuse_own_augmentation_generator", "upgrade_saved_config"]

_OWN_GENERATOR = "_extra_state"  # the top-level extra state of an older lidar model: its augmentation generator


def upgrade_saved_config(saved: dict[str, Any]) -> dict[str, Any]:
    """A config saved by an older drivetrain (a checkpoint's) in today's spelling (rules 1 and 2).

    Args:
        saved: the config as a checkpoint holds it (plain data); not changed.

    Returns:
        A copy in today's spelling; a config already in it comes back equal.
    """
    from drivetrain.engine.config import _deepcopy
    from drivetrain.engine.registry import canonical_name, known_names

    out = _deepcopy(saved)
    data, model = out.get("data"), out.get("model")
    augment = data.get("augment") if isinstance(data, dict) else None
    if isinstance(augment, dict) and augment and not set(augment) & {"camera", "lidar"}:
        data["augment"] = {"camera": augment, "lidar": None}
    args = model.get("args") if isinstance(model, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    if isinstance(args, dict) and isinstance(name, str) and canonical_name("model", name) in known_names("model"):
        for key, (target, _) in moved_args(canonical_name("model", name)).items():  # where its old keys went
            value = args.pop(key, None)
            if value is not None and target:
                _set_dotted(out, target, value)
    return out


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``key`` ``a.b.c``; a section missing (or null) on the way is made with its
    defaults, as a config of today's spelling would hold it."""
    from drivetrain.engine.config import TrainConfig, _plain

    *parents, last = key.split(".")
    node, section = data, TrainConfig
    for part in parents:
        section = _field_type(section, part)
        if not isinstance(node.get(part), dict):
            node[part] = _plain(section()) if dataclasses.is_dataclass(section) else {}
        node = node[part]
    node[last] = value


def _field_type(cls: Any, name: str) -> Any:
    """The dataclass type of field ``name`` of dataclass ``cls`` (``X | None`` → ``X``), or None."""
    if not dataclasses.is_dataclass(cls):
        return None
    tp = typing.get_type_hints(cls).get(name)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next((a for a in typing.get_args(tp) if a is not type(None)), None)
    return tp if dataclasses.is_dataclass(tp) else None


def _holds_own_generator(model: nn.Module, weights: Mapping[str, Any]) -> bool:
    """Whether ``weights`` hold an older lidar model's generator: top-level extra state ``model`` does not keep."""
    return _OWN_GENERATOR in weights and type(model).get_extra_state is nn.Module.get_extra_state


def refuse_own_augmentation_generator(model: nn.Module, checkpoint: Mapping[str, Any], path: Path) -> None:
    """Refuse to resume a checkpoint whose lidar model drew its own augmentation (rule 3).

    Args:
        model: the run's model.
        checkpoint: the loaded checkpoint (its ``model`` state).
        path: the checkpoint directory, for the message.

    Raises:
        ConfigError: one line, when the checkpoint holds such a generator.
    """
    if _holds_own_generator(model, checkpoint["model"]):
        raise ConfigError(
            f"--resume: checkpoint {path} holds a lidar model's own augmentation generator (model.args.augment, "
            "model.args.seed); the augmentation lives in data.augment.lidar now, drawn per batch from run.seed, "
            "the rank and the batch position, so the run cannot continue exactly: start a new run (drivetrain "
            "eval --checkpoint still scores this one)"
        )


def drop_own_augmentation_generator(model: nn.Module, weights: dict[str, Any]) -> dict[str, Any]:
    """``weights`` without an older lidar model's generator (rule 3), for evaluating its checkpoint.

    Args:
        model: the model the weights load into.
        weights: a checkpoint's model state.

    Returns:
        ``weights`` itself, or a copy without the generator when it holds one.
    """
    if _holds_own_generator(model, weights):
        return {k: v for k, v in weights.items() if k != _OWN_GENERATOR}
    return weights
