"""What a checkpoint holds: a dict of stateful components, and the format version that says how to read it.

The trainer names everything it checkpoints once, as a mapping ``{name: component}`` (model, optimizer, loss
scaler, loop counters (:class:`TrainState`), schedule, data position, a streaming model's per-stream state
(:class:`StreamState`), RNG states); every component has
``state_dict()`` and ``load_state_dict(state)`` (:class:`Stateful`). A checkpoint is one dict: each component's
state under its name, beside the :data:`METADATA` the trainer checks before restoring (``format_version``,
``world_size``, ``config``, ``versions``). :class:`~drivetrain.engine.checkpoint.Checkpointer` iterates the mapping
on save and restore; a checkpoint missing a component of the mapping, or holding one the mapping lacks, is refused
in one line naming it.
This module imports only :mod:`drivetrain.engine.state` and :mod:`drivetrain.seeding` of drivetrain's, so the
checkpointer can import it.

Format versions (:data:`FORMAT_VERSION` is the one this drivetrain writes and reads):

- **1** — the sampler position counted in samples (``data`` held ``position`` and ``num_replicas``); written by
  drivetrain 0.1.0 before the sampler counted batches, with the field ``format: 1``.
- **2** — the sampler position in batches (``epoch``, ``step``), the components above. Checkpoints written until
  this field was named ``format_version`` say ``format: 1`` as well: drivetrain did not raise the number when the
  sampler changed, so :func:`format_version` tells the two apart by their data position, once, here.

A checkpoint of another version is refused in one line naming its version and this one
(:func:`drivetrain.engine.checkpoint.check_format`); nothing converts old layouts on restore.

The protocol is that of ``torch.distributed.checkpoint.stateful.Stateful`` (anything that satisfies one satisfies
the other); it is declared here because importing that package costs seconds at every start of the command line.

**RNG state.** The RNG states of Python, NumPy and torch (CPU and CUDA) as plain data that
``torch.load(weights_only=True)`` accepts.

Example:
    >>> state = capture_rng()
    >>> a = torch.rand(2); restore_rng(state); torch.equal(a, torch.rand(2))
    True
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from drivetrain.seeding import mix_seed

__all__ = [
    "FORMAT_VERSION",
    "METADATA",
    "META_KEYS",
    "OLD_VERSION_KEY",
    "SHARDS_KEY",
    "VERSION_KEY",
    "FixedState",
    "RngState",
    "ScheduleState",
    "Stateful",
    "StrategyState",
    "StreamState",
    "TrainState",
    "capture_rng",
    "format_version",
    "restore_rng",
    "seed_all",
]

FORMAT_VERSION = 2
VERSION_KEY = "format_version"
OLD_VERSION_KEY = "format"  # the version field until version 2 was named format_version (see above)
SHARDS_KEY = "shards"  # a sharded checkpoint's folder of model and optimizer tensors (absent in a single-file one)
# What a checkpoint says about itself beside the components: written by the trainer, read before restoring.
META_KEYS = ("world_size", "config", "versions")
_RESEED = 0x5EED  # salt of the RNG streams re-derived on an elastic resume (RngState)
METADATA = (VERSION_KEY, OLD_VERSION_KEY, SHARDS_KEY, *META_KEYS)


@runtime_checkable
class Stateful(Protocol):
    """A checkpointed component: ``state_dict()`` returns plain data (dicts, lists, tensors, numbers, strings,
    what ``torch.load(weights_only=True)`` reads back) and ``load_state_dict`` restores from it."""

    def state_dict(self) -> Any:
        """The component's state as plain data."""
        ...

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...


@dataclass
class TrainState:
    """Loop counters: ``iteration`` (optimizer iterations done, skipped ones included), ``step`` (updates
    applied; drives the schedule), ``skipped`` (iterations whose update was skipped for non-finite
    gradients), ``nonfinite_losses`` (iterations with a non-finite loss)."""

    iteration: int = 0
    step: int = 0
    skipped: int = 0
    nonfinite_losses: int = 0

    def advance(self, applied: bool, loss_bad: bool) -> None:
        """Count one iteration: an applied update, or a skipped one (``loss_bad``: for a non-finite loss)."""
        if applied:
            self.step += 1
        else:
            self.skipped += 1
            self.nonfinite_losses += int(loss_bad)
        self.iteration += 1

    def state_dict(self) -> dict[str, int]:
        """The loop counters as a dict of ints."""
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Set the loop counters from :meth:`state_dict`'s dict."""
        for key in vars(self):
            setattr(self, key, int(state[key]))


def format_version(state: Mapping[str, Any]) -> int | None:
    """The format version of a loaded checkpoint, or None when it names none (not a training checkpoint).

    Args:
        state: the checkpoint's dict, as :meth:`Checkpointer.load` returns it.

    Returns:
        ``state["format_version"]``; for a checkpoint that says ``format: 1`` (versions 1 and 2 both did), 1 when
        its data position counts samples and 2 otherwise.
    """
    if VERSION_KEY in state:
        return state[VERSION_KEY]
    if state.get(OLD_VERSION_KEY) == 1:
        data = state.get("data")
        return 1 if isinstance(data, Mapping) and "position" in data else 2
    return None


class StrategyState:
    """The model and the optimizer through the run's strategy, as the two components :attr:`model` and
    :attr:`optimizer` (in that order in the mapping).

    A checkpoint writes them as shards (:mod:`~drivetrain.engine.dcp_files`): their ``sharded_state_dict()`` is one
    ``strategy.sharded_state()`` (``torch.distributed.checkpoint.state_dict.get_state_dict``: under FSDP each rank's
    own shards, no gather), read by ``model`` and handed over by ``optimizer``. A strategy without
    ``sharded_state`` (DeepSpeed) has no ``sharded_state_dict``: its full state dicts come from one
    ``strategy.full_state()`` (``state_dict()``) and go into the checkpoint's one file, as before.

    Restoring takes what the checkpoint holds: :class:`~drivetrain.engine.dcp_files.Shards` (loaded into this
    run's live tensors, each rank reading the slices its own shards need: another strategy or number of ranks
    reshards), full state dicts keyed by parameter name (a sharded checkpoint read whole), or a single-file
    checkpoint's ``model.state_dict()``/``optimizer.state_dict()`` (``strategy.load_full_state``). ``model``'s
    ``load_state_dict`` keeps its state until ``optimizer``'s loads both.

    Args:
        strategy: a :class:`~drivetrain.engine.strategy.Strategy` (or the DeepSpeed one).
    """

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy
        self._optimizer_sd: Any = None  # read with the model's, not yet handed over
        self._model_sd: Any = None  # restored, waiting for the optimizer's
        sharded = hasattr(strategy, "sharded_state")
        self.model: Stateful = _Part(self._model_state, self._load_model, self._model_shards if sharded else None)
        self.optimizer: Stateful = _Part(
            self._optimizer_state, self._load_optimizer, self._optimizer_state if sharded else None
        )
        if sharded:  # what only optimizer.step() changes in place: an asynchronous save copies it beside the next step
            self.model.stepped_only = self._parameters  # type: ignore[attr-defined]
            self.optimizer.stepped_only = lambda: (None, strategy.optimizer)  # type: ignore[attr-defined]

    def _parameters(self) -> tuple[set[str], Any]:
        """The model's parameter names (its buffers change in the forward) and the optimizer that steps them."""
        return {name for name, _ in self._strategy.model.named_parameters()}, self._strategy.optimizer

    def _model_state(self) -> dict[str, Any]:
        model_sd, self._optimizer_sd = self._strategy.full_state()
        return model_sd

    def _model_shards(self) -> dict[str, Any]:
        model_sd, self._optimizer_sd = self._strategy.sharded_state()
        return model_sd

    def _optimizer_state(self) -> dict[str, Any]:
        if self._optimizer_sd is None:
            raise RuntimeError("StrategyState: the optimizer's state is read with the model's; read 'model' first")
        optimizer_sd, self._optimizer_sd = self._optimizer_sd, None
        return optimizer_sd

    def _load_model(self, state: Any) -> None:
        self._model_sd = state

    def _load_optimizer(self, state: Any) -> None:
        if self._model_sd is None:
            raise RuntimeError("StrategyState: the model's state loads with the optimizer's; restore 'model' first")
        model_sd, self._model_sd = self._model_sd, None
        if hasattr(model_sd, "skeleton"):  # Shards: into the live tensors, resharded by DCP
            from drivetrain.engine import dcp_files

            folder = model_sd.folder
            model_sd, state = model_sd.skeleton, getattr(state, "skeleton", state)  # no tensors: no Shards
            live_model, live_optimizer = self._strategy.sharded_state(create=True)
            wanted = {*dcp_files.shard_keys(model_sd), *dcp_files.shard_keys(state)}
            live = {
                **dcp_files.split_tensors(live_model, "model")[1],
                **dcp_files.split_tensors(live_optimizer, "optimizer")[1],
            }
            templates = {key: t for key, t in live.items() if key in wanted or key.startswith("model/")}
            templates.update(dcp_files.allocate(folder, sorted(wanted - set(templates))))  # not live before a step
            dcp_files.read_into(folder, templates)  # a key this run or the checkpoint lacks: one line
            model_sd, state = dcp_files.join_tensors(model_sd, templates), dcp_files.join_tensors(state, templates)
            self._strategy.load_sharded_state(model_sd, state, full=False)
        elif _keyed_by_name(state):  # a sharded checkpoint read whole
            self._strategy.load_sharded_state(model_sd, state, full=True)
        else:  # a single-file checkpoint's state dicts
            self._strategy.load_full_state(model_sd, state)


def _keyed_by_name(optimizer_sd: Any) -> bool:
    """Whether an optimizer state dict names its parameters (``get_state_dict``'s) rather than numbering them."""
    groups = optimizer_sd.get("param_groups") if isinstance(optimizer_sd, dict) else None
    return bool(groups) and any(isinstance(p, str) for g in groups for p in g.get("params", []))


class _Part:
    """A :class:`Stateful` made of two functions (the halves of :class:`StrategyState`), with a third for its
    sharded state (absent when the strategy has none)."""

    def __init__(self, read: Any, load: Any, sharded: Any = None) -> None:
        self.state_dict, self.load_state_dict = read, load
        if sharded is not None:
            self.sharded_state_dict = sharded


class ScheduleState:
    """The learning-rate schedule: a pure function of the applied updates, so its state is a record to check.

    ``state_dict()`` is ``{"step": updates applied, "kind": schedule kind}``; ``load_state_dict`` checks it
    against the run's schedule kind and the loop counters restored before it (``train`` comes first).

    Args:
        kind: the run's ``schedule.kind``.
        train: the loop counters, with an int ``step`` (:class:`TrainState`).
    """

    def __init__(self, kind: str, train: Any) -> None:
        self.kind, self.train = kind, train

    def state_dict(self) -> dict[str, Any]:
        """The updates applied and the schedule kind."""
        return {"step": self.train.step, "kind": self.kind}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check the record against this run (a mismatch is one ValueError line naming the field)."""
        if state_dict["kind"] != self.kind:
            raise ValueError(f"schedule.kind: {state_dict['kind']!r} in the checkpoint, {self.kind!r} in this run")
        if int(state_dict["step"]) != self.train.step:
            raise ValueError(
                f"schedule.step: {state_dict['step']} in the checkpoint, but its train counters say {self.train.step}"
            )


class RngState:
    """Every rank's RNG states (Python, NumPy, torch CPU and CUDA): a list in rank order, the same on every rank.

    ``state_dict()`` gathers them (collective under torchrun); ``load_state_dict`` restores this rank's when the
    list has one state per rank of this run. A checkpoint of another number of ranks (an elastic resume,
    :mod:`drivetrain.engine.resume`) has no state for some ranks and others' would be shared out arbitrarily, so then
    every rank re-seeds its RNGs from ``(seed, rank, iteration)``: deterministic, different per rank, but not the
    uninterrupted run's draws — what draws from them (dropout masks) continues differently; the data order and the
    augmentation do not draw from them. It must come last in the mapping: nothing restored after it may draw from
    the global RNGs.

    Args:
        ctx: this process's place in the process group (:class:`~drivetrain.engine.distributed.DistContext`):
            ``rank``, ``world_size`` and ``gather_to_main(obj)``.
        seed: the run seed (``run.seed``).
        train: the loop counters (:class:`TrainState`, restored before this): the iteration a re-seed starts at.
    """

    def __init__(self, ctx: Any, seed: int = 0, train: Any = None) -> None:
        self.ctx, self.seed, self.train = ctx, seed, train

    def state_dict(self) -> list[dict[str, Any]]:
        """Every rank's :func:`~drivetrain.engine.state.capture_rng`, in rank order."""
        return self.ctx.gather_to_main(capture_rng())

    def load_state_dict(self, state_dict: list[dict[str, Any]]) -> None:
        """Restore this rank's RNG states, or re-seed them when the list is of another number of ranks."""
        if len(state_dict) == self.ctx.world_size:
            restore_rng(state_dict[self.ctx.rank])
            return
        iteration = self.train.iteration if self.train is not None else 0
        seed_all(mix_seed(_RESEED, self.seed, self.ctx.rank, iteration))


class StreamState:
    """A streaming model's per-stream state (:class:`~drivetrain.engine.protocol.StreamMemory`, e.g. a temporal
    detector's memory bank) of every rank: a list in rank order, like :class:`RngState`'s.

    The model's own state dict holds rank 0's rows only (module extra state), which every rank would load; this
    component holds all of them. Rank ``r`` walks streams ``[r·B, (r+1)·B)`` of the run's ``B × ranks``
    (:class:`~drivetrain.data.sampler.SequenceSampler`), so the ranks' rows, concatenated, are the streams in global
    order, and a resume hands rank ``r`` of this run its ``B`` rows — on the same or another split of the same
    streams. It comes after ``data`` in the mapping (whose sampler refuses another number of streams in one line).

    Args:
        ctx: this process's place in the process group (``rank``, ``world_size``, ``gather_to_main``).
        model: the model (:class:`~drivetrain.engine.protocol.StreamMemory`).
        batch_size: this run's streams per rank, ``data.batch_size``.
    """

    def __init__(self, ctx: Any, model: Any, batch_size: int) -> None:
        self.ctx, self.model, self.batch_size = ctx, model, batch_size

    def state_dict(self) -> list[dict[str, Any]]:
        """Every rank's ``stream_state()`` on the CPU, in rank order (collective under torchrun)."""
        mine = {name: value.detach().cpu() for name, value in self.model.stream_state().items()}
        return self.ctx.gather_to_main(mine)

    def load_state_dict(self, state_dict: list[dict[str, Any]] | None) -> None:
        """Give this rank its streams' rows (``None``: a checkpoint from before this component, whose model state
        holds rank 0's rows: kept as the model loaded them); a ValueError line when the rows are not ``B × ranks``."""
        if state_dict is None:
            return
        if any(not part for part in state_dict):  # before the first frame: nothing to continue
            self.model.load_stream_state({})
            return
        rows = {name: torch.cat([part[name] for part in state_dict]) for name in state_dict[0]}
        streams = next(iter(rows.values())).shape[0]
        b, rank = self.batch_size, self.ctx.rank
        if streams != b * self.ctx.world_size:
            raise ValueError(
                f"streams: the checkpoint holds the state of {streams} scene streams, this run walks {b} × "
                f"{self.ctx.world_size}; set data.batch_size={streams // self.ctx.world_size} to keep them"
            )
        self.model.load_stream_state({name: value[rank * b : (rank + 1) * b] for name, value in rows.items()})


class FixedState:
    """A component whose state was taken earlier (the data position at the start of a failed step).

    Args:
        state: what :meth:`state_dict` returns.
    """

    def __init__(self, state: Any) -> None:
        self.state = state

    def state_dict(self) -> Any:
        """The state given."""
        return self.state

    def load_state_dict(self, state_dict: Any) -> None:
        """Replace the state."""
        self.state = state_dict


def seed_all(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """This process's RNG states: tensors, ints and floats only (no pickled objects)."""
    version, py_state, gauss = random.getstate()
    kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        # this rank's device (its LOCAL_RANK's), whose state restore_rng puts on the restoring rank's device
        "cuda_device": torch.cuda.current_device() if torch.cuda.is_available() else -1,
    }
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng` returned."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        device = state.get("cuda_device")
        if isinstance(device, int) and 0 <= device < len(state["cuda"]):
            # The saving rank's device onto this rank's (the current device): under torchrun a rank's local rank, and
            # so its device index, changes with the node layout (8 × 1 → 4 × 2); by index, a node with fewer GPUs
            # than the saving one had no generator for the later states (IndexError), and a rank took another's.
            torch.cuda.set_rng_state(state["cuda"][device])
        else:  # an older checkpoint: by index, the devices this node has
            torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])
