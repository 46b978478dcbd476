"""Batches from datasets that bring their own batching, e.g. streaming (temporal) training on scenes.

A dataset opts in by providing

- ``batch_sampler(batch_size, *, seed, shuffle, rank, world_size)``: a batch sampler (an iterable of lists
  of dataset keys, one pass per epoch, advancing its own epoch when a pass ends) with ``state_dict()`` /
  ``load_state_dict()``, and
- ``collate(samples)``: the collate function, returning a batch object that carries ``sampler_state`` (the
  sampler position right *after* this batch) and ``frame_index`` (the dataset rows it holds).

:class:`SamplerBatches` then plays the role :class:`~drivetrain.engine.sampler.BatchStream` plays for plain
map-style datasets: it crosses epochs, and its state is the position after the last batch the trainer
*consumed* (taken from that batch, so loader workers prefetching ahead do not move it). Resuming continues
with the next unseen batch without loading the ones before it. :class:`drivetrain.data.FrameDataset`
implements the protocol with its scene-sequence sampler.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from drivetrain.engine.config import DataConfig

__all__ = ["SamplerBatches", "brings_own_batching"]


def brings_own_batching(dataset: Dataset) -> bool:
    """Whether ``dataset`` provides ``batch_sampler(...)`` and ``collate(...)`` (see module docstring)."""
    return callable(getattr(dataset, "batch_sampler", None)) and callable(getattr(dataset, "collate", None))


class SamplerBatches:
    """Endless batches of a dataset with its own batch sampler and collate function.

    Args:
        dataset: implements the protocol above.
        cfg: loader settings; ``batch_size`` is passed to the dataset's batch sampler.
        seed, rank, world_size: the batch sampler's shuffle seed (the same on every rank) and shard.
    """

    def __init__(self, dataset: Any, cfg: DataConfig, *, seed: int, rank: int, world_size: int) -> None:
        self.dataset, self.cfg = dataset, cfg
        self.sampler = dataset.batch_sampler(
            cfg.batch_size, seed=seed, shuffle=cfg.shuffle, rank=rank, world_size=world_size
        )
        self._state: dict[str, Any] = self.sampler.state_dict()
        self._iter: Iterator[Any] | None = None

    def _start(self) -> Iterator[Any]:
        extra: dict[str, Any] = {}
        if self.cfg.num_workers > 0:
            extra["persistent_workers"] = False  # the sampler is re-iterated from a restored position
            if self.cfg.prefetch_factor is not None:
                extra["prefetch_factor"] = self.cfg.prefetch_factor
        loader = DataLoader(
            self.dataset,
            batch_sampler=self.sampler,
            collate_fn=self.dataset.collate,
            num_workers=self.cfg.num_workers,
            pin_memory=self.cfg.pin_memory and torch.cuda.is_available(),
            **extra,
        )
        return iter(loader)

    def next(self) -> tuple[Any, torch.Tensor]:
        """The next batch and the dataset rows it holds (int64 ``(B,)``); rolls over to the next epoch."""
        for _ in range(2):
            if self._iter is None:
                self._iter = self._start()
            try:
                batch = next(self._iter)
            except StopIteration:  # the sampler finished its epoch and moved on to the next one
                self._iter = None
                continue
            if batch.sampler_state is None:
                raise ValueError("data: the dataset's collate must set batch.sampler_state (the position after it)")
            self._state = dict(batch.sampler_state)
            return batch, torch.as_tensor(batch.frame_index)
        raise ValueError(f"data: an epoch of {type(self.dataset).__name__} holds no batch of {self.cfg.batch_size}")

    def state_dict(self) -> dict[str, Any]:
        """The position after the last consumed batch."""
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        self._state = self.sampler.state_dict()
        self._iter = None  # restart the loader at the restored position
