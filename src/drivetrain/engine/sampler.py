"""A resumable, rank-sharded sampler and the batch stream that consumes it.

:class:`ResumableSampler` orders the dataset by a permutation drawn from ``(seed, epoch)`` only (a private
``torch.Generator``, never the global RNG), gives rank ``r`` of ``R`` every ``R``-th index of it (the tail
that does not divide evenly is dropped so ranks stay in step), and starts each pass at ``position``. Its
``state_dict`` is ``{epoch, position}``: a resumed run continues with the next unseen sample, without
loading, decoding or augmenting the batches it skips.

:class:`BatchStream` wraps a ``DataLoader`` over that sampler, crosses epoch boundaries, and advances the
sampler's position by what the trainer has *consumed* (loader prefetching runs ahead of that).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from drivetrain.engine.config import DataConfig
from drivetrain.engine.rng import mix_seed

__all__ = ["BatchStream", "ResumableSampler"]


class ResumableSampler(Sampler[int]):
    """Per-epoch permutation, sharded across ranks, resumable mid-epoch.

    Args:
        size: dataset length.
        num_replicas, rank: data-parallel world size and this rank.
        seed: permutation seed (the same on every rank).
        shuffle: permute (True) or keep dataset order (False).
    """

    def __init__(self, size: int, num_replicas: int = 1, rank: int = 0, seed: int = 0, shuffle: bool = True) -> None:
        if size < num_replicas:
            raise ValueError(f"dataset: {size} samples cannot be split across {num_replicas} ranks")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank: must be in [0, {num_replicas}), got {rank}")
        self.size, self.num_replicas, self.rank = size, num_replicas, rank
        self.seed, self.shuffle = seed, shuffle
        self.epoch = 0
        self.position = 0  # samples of this rank's share already consumed in this epoch
        self._cached: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        """Samples per rank per epoch."""
        return self.size // self.num_replicas

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        """This rank's indices for ``epoch``, in order: int64 ``(len(self),)``."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        if self.shuffle:
            gen = torch.Generator().manual_seed(mix_seed(self.seed, epoch))
            order = torch.randperm(self.size, generator=gen)
        else:
            order = torch.arange(self.size)
        indices = order[: len(self) * self.num_replicas][self.rank :: self.num_replicas]
        self._cached = (epoch, indices)
        return indices

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_indices(self.epoch)[self.position :].tolist())

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_replicas": self.num_replicas}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_replicas"] != self.num_replicas:
            raise ValueError(
                f"sampler: checkpoint was written with {state['num_replicas']} data-parallel ranks, "
                f"this run has {self.num_replicas}; resume with the same number of ranks"
            )
        if not 0 <= state["position"] <= len(self):
            raise ValueError(f"sampler: position {state['position']} is outside [0, {len(self)}]")
        self.epoch, self.position = state["epoch"], state["position"]


class BatchStream:
    """Endless batches from ``dataset`` in sampler order; knows which samples each batch holds.

    Args:
        dataset: a map-style dataset whose items collate with the default collate function.
        cfg: loader settings (batch size, workers, pinning, prefetch).
        sampler: the resumable sampler; its position counts consumed samples.
        seed: seeds the loader's private generator (worker base seeds), per epoch and position.
    """

    def __init__(self, dataset: Dataset, cfg: DataConfig, sampler: ResumableSampler, seed: int = 0) -> None:
        if len(sampler) < cfg.batch_size:
            raise ValueError(
                f"data.batch_size: {cfg.batch_size} is larger than the {len(sampler)} samples per rank per epoch"
            )
        self.dataset, self.cfg, self.sampler, self.seed = dataset, cfg, sampler, seed
        self._loader: DataLoader | None = None
        self._iter: Iterator[Any] | None = None

    def _make_loader(self) -> DataLoader:
        cfg = self.cfg
        extra: dict[str, Any] = {}
        if cfg.num_workers > 0:
            extra["persistent_workers"] = cfg.persistent_workers
            if cfg.prefetch_factor is not None:
                extra["prefetch_factor"] = cfg.prefetch_factor
        return DataLoader(
            self.dataset,
            batch_size=cfg.batch_size,
            sampler=self.sampler,
            num_workers=cfg.num_workers,
            pin_memory=cfg.pin_memory and torch.cuda.is_available(),
            drop_last=True,
            generator=torch.Generator(),
            **extra,
        )

    def _start(self) -> None:
        if self._loader is None:
            self._loader = self._make_loader()
        # The loader draws worker base seeds from its own generator, never from the global RNG.
        self._loader.generator.manual_seed(mix_seed(self.seed, self.sampler.epoch, self.sampler.position))
        self._iter = iter(self._loader)

    def next(self) -> tuple[Any, torch.Tensor]:
        """The next batch and the dataset indices it holds (int64 ``(B,)``); rolls over to the next epoch."""
        if self.sampler.position + self.cfg.batch_size > len(self.sampler):
            self.sampler.epoch, self.sampler.position = self.sampler.epoch + 1, 0
            self._iter = None
        if self._iter is None:
            self._start()
        assert self._iter is not None
        start = self.sampler.position
        batch = next(self._iter)
        indices = self.sampler.epoch_indices(self.sampler.epoch)[start : start + self.cfg.batch_size]
        self.sampler.position += self.cfg.batch_size
        return batch, indices

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)
        self._iter = None  # restart the loader at the restored position
