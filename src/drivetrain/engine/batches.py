"""The trainer's batch stream: a dataset turned into endless, rank-sharded, resumable batches.

Every dataset is batched by a *batch sampler* and a collate function:

- a dataset that brings its own batching provides ``batch_sampler(batch_size, *, seed, shuffle, rank,
  world_size)`` and ``collate(samples)`` — e.g. :class:`drivetrain.data.sources.StreamingFrames`, whose scene
  sequences keep each batch slot on consecutive frames of one scene for streaming models;
- any other map-style dataset gets :class:`ShuffledBatches` (a per-epoch permutation of the rows, cut into global
  batches of ``data.batch_size × ranks × train.accumulation`` and sharded by rank, with a global position, so a run
  resumes on any split of the global batch) and torch's default collate.

A batch sampler yields lists of dataset keys (a row number, or an object whose ``index`` is one) for the
rest of the current epoch and then moves itself to the next epoch; ``state_dict()`` read right after it
yielded a batch is the position after that batch, and ``load_state_dict(state)`` continues there without
touching the batches before it.

**The resume position is the engine's.** A ``DataLoader`` draws keys from the sampler ahead of what the
trainer consumes (its workers prefetch), so the sampler's own state runs ahead. :class:`BatchStream`
therefore records, each time the loader draws a batch of keys, ``(keys, sampler state after them)`` in a
FIFO; the loader hands batches out in the order their keys were drawn, so each :meth:`BatchStream.next`
takes one record, and :meth:`BatchStream.state_dict` is the position after the last batch the trainer
took. The dataset's records (samples, the collated batch) carry nothing of it.

**One DataLoader, and which options apply.** It is built once per stream from ``DataConfig``:
``num_workers`` and ``prefetch_factor`` as configured; ``pin_memory`` only when CUDA is available (there is
nothing to pin for on a CPU-only machine); ``persistent_workers`` keeps the workers across epochs and across
the restart of iteration at a restored position (the shipped GPU configs keep them: a mini set's epoch is 40–80
steps, and starting 4 workers again costs seconds each time). Each (re)start of iteration reseeds the loader's
private generator from ``(seed, rank, epoch, step)``, so worker seeds never come from (or consume) the global
RNG. A worker's own global RNG is never part of the resume position, with or without persistence: a resumed run
starts its workers at another position than the uninterrupted one did (persistent workers keep the seeds of
their first start, others are reseeded each epoch), and batches reach the workers in another rotation. So a
dataset that drew augmentation from its worker's global RNG would see other draws after a resume; drivetrain's
datasets draw every random number from a per-sample generator (``mix_seed(seed, index)``) and the worker-side
augmentation from the batch position, and resume exactly with persistent workers too
(tests/test_engine_batches.py, tests/test_pipeline_prefetch.py).

**How many workers** (:func:`suggest_num_workers`). A worker delivers a batch every ``w`` ms (the loader's cost
per batch, measured without workers: ``drivetrain tune loader`` reads it off its ``workers=0`` setting); ``W``
workers deliver ``W`` in that time while the step takes ``s`` ms, so they keep up when ``W ≥ w / s``, with
``HEADROOM`` for the batches that cost more than the median; they share the cores with the training process,
which keeps one. docs/data.md has the rule with the costs measured on the shipped configs.

**A run's training batches**, from its config: loader, augmentation stage, device transform and prefetcher.

:func:`build_train_batches` makes what the trainer reads each micro-batch from (``next() -> (batch, dataset
indices)``, with ``state_dict``/``load_state_dict`` for its position, a checkpointed component):

- ``data.loader=torch``: a :class:`~drivetrain.engine.batches.BatchStream` (a DataLoader over this rank's shard),
  augmenting each sample in the loader workers with ``data.augment_on=worker``;
- ``data.loader=dali``: a :class:`~drivetrain.pipeline.dali.DaliStream` (JPEG decoding and the camera augmentation
  in DALI; camera frames only);
- on the training device, in a :class:`~drivetrain.pipeline.prefetch.DevicePrefetcher`: the augmentation
  (``data.augment_on=device``), then, with ``speed.encoder_overlap``, the frozen image encoder under the run's
  autocast; with ``data.prefetch`` the next batch is copied (and transformed) on a side stream while one trains.

The augmentation (camera and lidar, :class:`~drivetrain.pipeline.augment.stage.Augmentation`) draws each batch's
parameters per sample from (run seed, epoch, the sample's place in the epoch's global order), so a resumed run draws
the same, also on another number of ranks.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader, Dataset

from drivetrain.batch import Batch, ModelBatch
from drivetrain.engine.config import ConfigError, DataConfig, TrainConfig
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.precision import autocast
from drivetrain.engine.protocol import AugmentedHostShapes, FrozenEncoder
from drivetrain.pipeline.augment.bev import matmul_roundoff
from drivetrain.pipeline.augment.stage import Augmentation
from drivetrain.pipeline.prefetch import DevicePrefetcher
from drivetrain.seeding import mix_seed

__all__ = [
    "HEADROOM",
    "BatchSampler",
    "BatchStream",
    "ShuffledBatches",
    "brings_own_batching",
    "build_train_batches",
    "close_train_batches",
    "handed_shapes",
    "hands_out_host_batches",
    "loader_wait_ms",
    "suggest_num_workers",
]

# Workers deliver HEADROOM × the batches the step takes: the 90th percentile of a batch's loader cost is 1.06–1.64×
# its median on the shipped configs (docs/data.md), and prefetch_factor batches per worker ride out single slow ones.
HEADROOM = 1.5
WAIT_TARGET = 0.05  # the data wait a step may have (share of the step): the loader in the main process is fine below


class BatchSampler(Protocol):
    """What :class:`BatchStream` needs of a batch sampler (see the module docstring)."""

    def __iter__(self) -> Iterator[list[Any]]:
        """Lists of dataset keys for the rest of the current epoch; then the sampler is at the next epoch."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position of the next batch to yield (int ``epoch`` and ``step``) and the sampler's settings."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the position of ``state``; a ValueError when its settings are not this sampler's."""
        ...


def brings_own_batching(dataset: Dataset) -> bool:
    """Whether ``dataset`` provides ``batch_sampler(...)`` and ``collate(...)`` (see the module docstring)."""
    return callable(getattr(dataset, "batch_sampler", None)) and callable(getattr(dataset, "collate", None))


class ShuffledBatches:
    """Batches of dataset rows: a per-epoch permutation in global steps, sharded across ranks, resumable mid-epoch
    and on another number of ranks.

    The permutation is drawn from ``(seed, epoch)`` alone (a private ``torch.Generator``, the same on every
    rank). The epoch is cut into *global steps* of ``GB = batch_size × world_size × accumulation`` rows (one
    optimizer step of the whole run): global step ``s`` covers permutation rows ``[s·GB, (s+1)·GB)``, and its
    micro-batch ``i`` the rows ``[s·GB + i·B·R, s·GB + (i+1)·B·R)``, of which rank ``r`` takes every ``R``-th
    (from the ``r``-th on). The tail of fewer than ``GB`` rows is dropped, so every optimizer step sees ``GB``
    rows. Which rows an optimizer step sees, and where an epoch ends, depend on ``GB`` only: two ranks × batch
    ``B``, one rank × ``B`` × accumulation 2 and one rank × ``2B`` read the same rows in the same steps (another
    rank holds them, in another micro-batch). With accumulation 1 this is the split of every ``R``-th row to
    rank ``r`` that earlier drivetrain made; with accumulation ``A > 1`` the epoch now ends after whole optimizer
    steps (it used to end after ``⌊size / R / B⌋`` micro-batches, possibly mid-step).

    The position is global: ``sample``, the rows of the epoch consumed by all ranks together (after a micro-batch
    ``s·GB + (i+1)·B·R``), beside ``epoch``; ``step`` (this run's micro-batches into the epoch) is kept beside it
    for the seeds that read it. A state loads into a sampler of the same ``GB`` on any number of ranks, batch size
    and accumulation, when its ``sample`` falls on a micro-batch boundary of this one (a checkpoint's always falls
    on an optimizer step's).

    Args:
        size: dataset length.
        batch_size: rows per micro-batch per rank, ``B``.
        seed: permutation seed.
        shuffle: permute (True) or keep dataset order (False).
        rank, world_size: this process's shard.
        accumulation: micro-batches per optimizer step, ``A``.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        accumulation: int = 1,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: must be in [0, {world_size}), got {rank}")
        if accumulation < 1:
            raise ValueError(f"accumulation: must be ≥ 1, got {accumulation}")
        if size < batch_size * world_size * accumulation:
            raise ValueError(
                f"one optimizer step takes {batch_size} × {world_size} rank(s) × {accumulation} micro-batch(es) = "
                f"{batch_size * world_size * accumulation} samples, more than its {size}"
            )
        self.size, self.batch_size, self.seed, self.shuffle = size, batch_size, seed, shuffle
        self.rank, self.world_size, self.accumulation = rank, world_size, accumulation
        self.global_batch = batch_size * world_size * accumulation
        self.epoch, self.step = 0, 0  # the next micro-batch to yield
        self._cached: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        """Micro-batches per rank per epoch: ``A`` per global step."""
        return self.size // self.global_batch * self.accumulation

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        """This rank's rows for ``epoch``, micro-batch after micro-batch: int64 ``(len(self), batch_size)``."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        if self.shuffle:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(mix_seed(self.seed, epoch)))
        else:
            order = torch.arange(self.size)
        used = order[: len(self) * self.batch_size * self.world_size]  # whole global steps
        rows = used.view(len(self), self.batch_size, self.world_size)[:, :, self.rank]  # every R-th row is rank r's
        self._cached = (epoch, rows)
        return rows

    def __iter__(self) -> Iterator[list[int]]:
        """Yield the rest of the current epoch, then move to the next epoch."""
        epoch, rows = self.epoch, self.epoch_indices(self.epoch)
        while self.step < len(self):
            step = self.step
            self.step += 1
            yield rows[step].tolist()
        self.epoch, self.step = epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        """The global position of the next micro-batch (``epoch``, ``sample``: rows of the epoch all ranks consumed)
        and the global batch it is counted in; ``step``, ``batch_size``, ``world_size`` and ``accumulation`` say
        how this run split it."""
        return {
            "epoch": self.epoch,
            "sample": self.step * self.batch_size * self.world_size,
            "global_batch": self.global_batch,
            "step": self.step,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "accumulation": self.accumulation,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at the global position ``state["epoch"]``, ``state["sample"]`` (a ValueError line when it holds
        another global batch, or falls inside one of this run's micro-batches).

        A state without ``sample`` (drivetrain before elastic resume: ``epoch``, ``step`` per rank) continues with
        the same batch size and world size only, at ``step × batch_size × world_size`` rows."""
        if "sample" not in state:  # an older checkpoint's per-rank position (drivetrain.engine.compat, rule 4)
            state = _global_position(state, self)
        missing = [key for key in ("epoch", "sample", "global_batch") if key not in state]
        if missing:
            raise ValueError(f"sampler: the state has no {missing[0]!r} (it holds {', '.join(state)})")
        if state["global_batch"] != self.global_batch:
            raise ValueError(
                f"sampler: the checkpoint was written with a global batch of {state['global_batch']}, this run has "
                f"{self.global_batch}; keep data.batch_size × ranks × train.accumulation"
            )
        per_micro = self.batch_size * self.world_size
        sample, end = int(state["sample"]), len(self) * per_micro
        if not 0 <= sample <= end:
            raise ValueError(f"sampler: sample {sample} is outside [0, {end}]")
        if sample % per_micro:
            raise ValueError(
                f"sampler: position {sample} falls inside a micro-batch of {self.batch_size} × {self.world_size} "
                "rank(s); resume from a checkpoint (taken after an optimizer step)"
            )
        self.epoch, self.step = int(state["epoch"]), sample // per_micro
        if self.step == len(self):  # the state is the end of an epoch
            self.epoch, self.step = self.epoch + 1, 0


def _global_position(state: dict[str, int], sampler: ShuffledBatches) -> dict[str, int]:
    """An older checkpoint's per-rank position ``(epoch, step)`` as a global one; its batch and world sizes must be
    this run's (one ValueError line otherwise)."""
    missing = [key for key in ("epoch", "step", "batch_size", "world_size") if key not in state]
    if missing:
        raise ValueError(f"sampler: the state has no {missing[0]!r} (it holds {', '.join(state)})")
    for key in ("batch_size", "world_size"):
        if state[key] != getattr(sampler, key):
            raise ValueError(
                f"sampler: the checkpoint was written with {key} {state[key]}, this run has "
                f"{getattr(sampler, key)}; a checkpoint of a drivetrain before elastic resume continues with the "
                "same data.batch_size and number of ranks"
            )
    per_micro = sampler.batch_size * sampler.world_size
    sample = min(int(state["step"]) * per_micro, len(sampler) * per_micro)  # past the new epoch end: the next epoch
    return {"epoch": int(state["epoch"]), "sample": sample, "global_batch": sampler.global_batch}


class _Recorded:
    """The sampler as the DataLoader sees it: every batch of keys drawn leaves ``(keys, state after)``; with
    ``positioned`` each key goes out as ``(key, state after)`` so the worker knows its batch's position."""

    def __init__(self, sampler: BatchSampler, positioned: bool = False) -> None:
        self.sampler, self.positioned = sampler, positioned
        self.records: deque[tuple[list[Any], dict[str, Any]]] = deque()

    def __iter__(self) -> Iterator[list[Any]]:
        for keys in self.sampler:
            state = self.sampler.state_dict()
            self.records.append((keys, state))
            yield [(key, state) for key in keys] if self.positioned else keys


class _Positioned:
    """The dataset seen through positioned keys: ``(key, position)`` → ``(sample, position)``."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, item: tuple[Any, dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
        key, position = item
        return self.dataset[key], position


class _TransformingCollate:
    """Collate in the worker, then ``transform(batch, position)`` there (e.g. worker-side augmentation)."""

    def __init__(
        self, collate: Callable[[list[Any]], ModelBatch], transform: Callable[[ModelBatch, dict[str, Any]], ModelBatch]
    ) -> None:
        self.collate, self.transform = collate, transform

    def __call__(self, items: list[tuple[Any, dict[str, Any]]]) -> ModelBatch:
        return self.transform(self.collate([sample for sample, _ in items]), items[0][1])


class BatchStream:
    """Endless batches of ``dataset`` for one rank; knows which rows each holds and where to resume.

    Args:
        dataset: a map-style dataset, with or without its own batching (see the module docstring).
        cfg: loader settings (batch size, shuffle, workers, pinning, prefetch).
        seed: shuffle seed, the same on every rank; also seeds the loader's worker seeds with the rank.
        rank, world_size: this process's shard.
        accumulation: micro-batches per optimizer step (``train.accumulation``): with the batch size and world size,
            the global batch that cuts a :class:`ShuffledBatches` epoch (a dataset's own batching does not take it).
        transform: ``transform(batch, position)`` run in the loader (in its workers when it has any) after
            collating, with the sampler position after the batch (e.g. ``Augmentation(on="worker")``); needs a
            dataset that brings its own batching.
    """

    def __init__(
        self,
        dataset: Dataset,
        cfg: DataConfig,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        accumulation: int = 1,
        transform: Callable[[ModelBatch, dict[str, Any]], ModelBatch] | None = None,
    ) -> None:
        self.dataset, self.cfg, self.seed, self.rank = dataset, cfg, seed, rank
        shard = {"seed": seed, "shuffle": cfg.shuffle, "rank": rank, "world_size": world_size}
        try:
            if brings_own_batching(dataset):
                self.sampler: BatchSampler = dataset.batch_sampler(cfg.batch_size, **shard)
                collate = dataset.collate
            else:
                self.sampler = ShuffledBatches(len(dataset), cfg.batch_size, **shard, accumulation=accumulation)
                collate = None  # torch's default collate
        except ValueError as err:  # the data cannot fill a batch of this size: a config mistake, said in one line
            raise ConfigError(
                f"data.batch_size: {cfg.batch_size} per rank × {world_size} rank(s) does not fit "
                f"{type(dataset).__name__} ({err}); lower data.batch_size (or train.accumulation) or use more data"
            ) from None
        self._recorded = _Recorded(self.sampler, positioned=transform is not None)
        if transform is not None:
            if collate is None:
                raise ValueError(f"data: {type(dataset).__name__} has no collate of its own to transform after")
            dataset, collate = _Positioned(dataset), _TransformingCollate(collate, transform)
        self._loader = _make_loader(dataset, self._recorded, collate, cfg)
        self._state: dict[str, Any] = self.sampler.state_dict()
        self._iter: Iterator[ModelBatch] | None = None

    def _start(self) -> None:
        self._recorded.records.clear()  # keys drawn by a discarded iterator were never handed out
        self._loader.generator.manual_seed(mix_seed(self.seed, self.rank, self._state["epoch"], self._state["step"]))
        self._iter = iter(self._loader)

    def next(self) -> tuple[ModelBatch, torch.Tensor]:
        """The next batch and the dataset rows it was drawn from (int64 ``(B,)``); rolls over epochs."""
        for _ in range(2):
            if self._iter is None:
                self._start()
            assert self._iter is not None
            try:
                batch = next(self._iter)
            except StopIteration:  # the sampler finished its epoch and moved on to the next one
                self._iter, self._state = None, self.sampler.state_dict()
                continue
            except (ConnectionError, EOFError) as err:  # a worker killed while it handed over a batch's shared memory
                if not self.cfg.num_workers:
                    raise
                lost, self._iter = self._iter, None
                shutdown = getattr(lost, "_shutdown_workers", None)  # torch's loader iterator: stop the other workers
                if shutdown is not None:  # now, not in its __del__, where torch's SIGCHLD check would report the dead
                    with contextlib.suppress(RuntimeError):  # worker again as a traceback ("Exception ignored")
                        shutdown()
                raise RuntimeError(
                    f"DataLoader worker lost while it sent a batch ({type(err).__name__}: {err})"
                ) from err  # the trainer's dead-worker line (step_outcome.dead_worker), with a checkpoint
            keys, self._state = self._recorded.records.popleft()
            return batch, torch.tensor([int(getattr(key, "index", key)) for key in keys], dtype=torch.int64)
        raise ValueError(f"data: an epoch of {type(self.dataset).__name__} holds no batch of {self.cfg.batch_size}")

    def state_dict(self) -> dict[str, Any]:
        """The sampler position after the last batch handed out."""
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue right after the batch that ``state`` was taken after."""
        self.sampler.load_state_dict(state)
        self._state = self.sampler.state_dict()
        self._iter = None  # restart the loader at the restored position


def _make_loader(
    dataset: Dataset, batch_sampler: _Recorded, collate: Callable[[list[Any]], ModelBatch] | None, cfg: DataConfig
) -> DataLoader:
    """The stream's one DataLoader; the module docstring says which ``cfg`` options apply and how."""
    workers: dict[str, Any] = {}
    if cfg.num_workers > 0:  # DataConfig refuses persistent_workers / prefetch_factor without workers
        workers["persistent_workers"] = cfg.persistent_workers
        if cfg.prefetch_factor is not None:
            workers["prefetch_factor"] = cfg.prefetch_factor
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        collate_fn=collate,
        num_workers=cfg.num_workers,
        pin_memory=cfg.pin_memory and torch.cuda.is_available(),
        generator=torch.Generator(),
        **workers,
    )


def suggest_num_workers(cores: int, worker_ms_per_batch: float, step_ms: float) -> int:
    """``data.num_workers`` for a loader that costs ``worker_ms_per_batch`` a batch and a step of ``step_ms``.

    ``0`` when the loader, run in the training process, takes at most ``WAIT_TARGET`` (5 %) of the step; else
    ``⌈HEADROOM · w / s⌉`` workers (each delivers a batch every ``w`` ms, the step takes one every ``s`` ms), at
    most ``cores − 1`` (the training process keeps a core) and at least one. :func:`loader_wait_ms` says what
    remains when the cap leaves the loader behind.

    Args:
        cores: CPU cores this rank's loader may use (the machine's, divided by the ranks on it); ≥ 1.
        worker_ms_per_batch: host milliseconds to read, decode and collate one batch (median, without workers).
        step_ms: milliseconds of the training step without its data wait.

    Returns:
        The number of loader workers.

    Example:
        >>> suggest_num_workers(16, worker_ms_per_batch=111.6, step_ms=44.9)  # a full-size lidar run, H200 host
        4
    """
    if cores < 1 or worker_ms_per_batch < 0 or step_ms <= 0:
        raise ValueError(
            f"suggest_num_workers: needs cores ≥ 1, worker_ms_per_batch ≥ 0 and step_ms > 0, got {cores}, "
            f"{worker_ms_per_batch}, {step_ms}"
        )
    if worker_ms_per_batch <= WAIT_TARGET * step_ms:
        return 0
    return max(1, min(cores - 1, math.ceil(HEADROOM * worker_ms_per_batch / step_ms)))


def loader_wait_ms(workers: int, worker_ms_per_batch: float, step_ms: float) -> float:
    """The data wait a step is expected to have with ``workers`` workers: ``w`` without workers (the loader runs
    in the step), else ``max(0, w / workers − s)`` (the batches the workers cannot deliver in time)."""
    if workers == 0:
        return worker_ms_per_batch
    return max(0.0, worker_ms_per_batch / workers - step_ms)


Transform = Callable[[Batch, dict[str, Any]], Batch]  # (batch, its position) -> batch


@runtime_checkable
class _Closing(Protocol):
    """A batch stream holding processes or files until closed (a DALI pipeline)."""

    def close(self) -> None: ...


def build_train_batches(
    cfg: TrainConfig, model: torch.nn.Module, dataset: Any, ctx: DistContext
) -> tuple[Any, Augmentation | None]:
    """This rank's batch stream of ``dataset`` and the run's augmentation stage (None without one).

    Args:
        cfg: the run's configuration (``data``, ``speed``, ``precision``, ``run.seed``).
        model: the run's model (its frozen encoder with ``speed.encoder_overlap``).
        dataset: the training dataset.
        ctx: this process's place in the process group (rank, world size, device).

    Returns:
        ``(batches, augmentation)``.

    Raises:
        ConfigError: a setting the loader, the model or the strategy cannot honour (one line naming it).
    """
    data, device = cfg.data, ctx.device
    augment = None
    aug_cfg = data.augment
    if aug_cfg is not None and aug_cfg.active:  # camera and lidar, drawn per sample (its global place)
        augment = Augmentation(aug_cfg, seed=cfg.run.seed, rank=ctx.rank, on=data.augment_on)
    in_worker = augment if data.augment_on == "worker" else None
    shard = {"seed": cfg.run.seed, "rank": ctx.rank, "world_size": ctx.world_size}
    if data.loader == "dali":  # decoding and the camera augmentation in DALI (drivetrain.pipeline.dali)
        batches: Any = _dali_stream(cfg, dataset, shard, augment, device)
        on_device = _device_transform(cfg, model, None, device)
    else:
        batches = BatchStream(dataset, data, **shard, accumulation=cfg.train.accumulation, transform=in_worker)
        on_device = _device_transform(cfg, model, augment if in_worker is None else None, device)
    if on_device is not None:  # augment / encode ahead on the device (on a side stream with data.prefetch)
        shapes = _augmented_shapes(cfg, model, augment if in_worker is None else None, device)
        batches = DevicePrefetcher(batches, device, transform=on_device, overlap=data.prefetch, shapes=shapes)
    elif data.prefetch:  # the next batch goes to the device on a side stream (a pass-through on a CPU)
        batches = DevicePrefetcher(batches, device)
    return batches, augment


def hands_out_host_batches(batches: Any, device: torch.device) -> bool:
    """Whether a batch stream of :func:`build_train_batches` hands out final batches on the host: the loader's own
    (a :class:`BatchStream` alone: augmented in the loader, ``data.augment_on=worker``, or not at all; no prefetcher
    copying or transforming them on the device first), or any batch of a CPU run (its device is the host)."""
    return isinstance(batches, BatchStream) or device.type == "cpu"


def handed_shapes(batches: Any) -> Callable[[], Any] | None:
    """What gives the compiled step's bucket of the batch a batch stream of :func:`build_train_batches` handed out
    last, bounded on the host before the device's augmentation (:class:`~drivetrain.engine.protocol.
    AugmentedHostShapes`), or None when the stream bounds none."""
    if isinstance(batches, DevicePrefetcher) and batches.shapes is not None:
        return lambda: batches.handed_shapes
    return None


def _augmented_shapes(
    cfg: TrainConfig, model: torch.nn.Module, augment: Augmentation | None, device: torch.device
) -> Callable[[ModelBatch, dict[str, Any]], Any] | None:
    """With ``speed.compile_step``, device augmentation and a model that can bound it
    (:class:`~drivetrain.engine.protocol.AugmentedHostShapes`) on a GPU: the prefetcher's ``shapes``, the bucket of
    each batch bounded on the host from the batch before its augmentation and the parameters the device applies (the
    same draws, from the same position), so that the step reads nothing of the device before its graph. None
    otherwise (a CPU run counts the augmented batch itself on the host, :func:`hands_out_host_batches`)."""
    if not cfg.speed.compile_step or augment is None or device.type == "cpu":
        return None
    if not isinstance(model, AugmentedHostShapes):
        return None

    def shapes(batch: ModelBatch, position: dict[str, Any]) -> Any:
        params = augment.params(batch, position)  # the draws the transform makes again on its side
        return model.step_shapes_augmented(batch, params, augment.config, matmul_roundoff(device))

    return shapes


def close_train_batches(batches: Any) -> None:
    """Stop what a batch stream holds open (a DALI pipeline's worker processes); others need nothing."""
    stream = batches.stream if isinstance(batches, DevicePrefetcher) else batches
    if isinstance(stream, _Closing):
        stream.close()


def _dali_stream(
    cfg: TrainConfig, dataset: Any, shard: dict[str, int], augment: Augmentation | None, device: torch.device
) -> Any:
    """``data.loader=dali``: the DALI batch stream of ``dataset`` (errors name the setting)."""
    from drivetrain.pipeline.dali import DaliStream

    data = cfg.data
    if augment is not None and augment.config.lidar is not None:
        raise ConfigError("data.augment.lidar: data.loader=dali carries camera frames only; use data.loader=torch")
    try:
        return DaliStream(
            dataset, data.batch_size, shuffle=data.shuffle, **shard,
            augment=augment.config.camera if augment is not None else None, device=device,
            workers=data.num_workers, threads=max(1, data.num_workers), prefetch=data.prefetch_factor or 2,
        )  # fmt: skip
    except (ImportError, ValueError) as err:
        raise ConfigError(str(err)) from None


def _device_transform(
    cfg: TrainConfig, model: torch.nn.Module, augment: Augmentation | None, device: torch.device
) -> Transform | None:
    """What the prefetcher does to each batch on the device: the augmentation (camera and lidar), then (with
    ``speed.encoder_overlap``) the frozen image encoder under the run's autocast; None when neither."""
    encode = None
    if cfg.speed.encoder_overlap:
        if not (isinstance(model, FrozenEncoder) and model.frozen_encoder):
            raise ConfigError(
                f"speed.encoder_overlap: {cfg.model.name} has no frozen encoder (needs encode(batch) and "
                "frozen_encoder, e.g. a camera detector whose model.args freeze its backbone)"
            )
        if cfg.distributed.strategy in ("fsdp", "deepspeed"):
            raise ConfigError(
                f"speed.encoder_overlap: the encoder runs outside the {cfg.distributed.strategy} forward, "
                "whose parameters are sharded; use distributed.strategy ddp or none"
            )
        encode = model.encode
    if augment is None and encode is None:
        return None

    def transform(batch: Batch, position: dict[str, Any]) -> Batch:
        if augment is not None:
            batch = augment(batch, position)
        if encode is not None:
            with torch.no_grad(), autocast(cfg.precision.mode, device):
                batch = replace(batch, encoded=encode(batch))
        return batch

    return transform
