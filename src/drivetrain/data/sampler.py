"""``SequenceSampler``: batches for streaming (temporal) training, resumable mid-epoch and on another split of the
same streams.

Each of the ``S = B × world_size`` *streams* (batch slots of the whole run) walks consecutive key frames of one
scene, then of the next scene dealt to it, so a model with a temporal memory (StreamPETR) sees each scene in order
in one slot; with gradient accumulation the consecutive micro-batches are consecutive frames. Per epoch the scenes
are shuffled with ``(seed, epoch)`` and dealt to the global streams, each to the stream with the fewest frames so
far (the lowest-numbered one on a tie); rank ``r`` walks streams ``[r·B, (r+1)·B)``. An epoch has as many steps as
the *shortest* stream (every rank takes the same number of steps; the tails of longer streams are dropped this
epoch). A run continued from a checkpoint of a drivetrain before this dealing (scenes dealt round-robin to ranks,
then to each rank's slots; its state has no ``streams``) keeps dealing that way (``dealing="per_rank"``, saved in
its later states) on the same ranks and batch size, so it continues exactly; with one rank the two dealings agree.
It yields lists of :class:`~drivetrain.data.dataset.FrameKey` ``(index, prev_exists)``.

The dealing depends on ``S`` alone, not on how the streams are split across ranks: 2 ranks × ``B`` 2, 4 ranks ×
``B`` 1 and 1 rank × ``B`` 4 walk the same frames in the same streams, step after step. So the position —
``(epoch, step)``, one frame per stream per step — is global, and a run resumes on another number of ranks when it
keeps ``S`` (and the accumulation, which the global batch check of :mod:`drivetrain.engine.resume` holds);
a state of another ``S`` is one ValueError line naming the ``data.batch_size`` that keeps it.

Resume: ``state_dict()`` is the position of the next batch to yield (read right after a batch: the position
after it); ``load_state_dict`` continues there without replaying earlier batches. A ``DataLoader`` draws
batches ahead of what training consumes, so the trainer records the state per batch drawn
(:mod:`drivetrain.engine.batches`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from drivetrain.data.dataset import FrameKey

__all__ = ["SequenceSampler"]


class SequenceSampler:
    """Batch sampler over scenes of consecutive frames (frames of scene ``i`` are contiguous, in order).

    Args:
        scene_lengths: frames per scene, in index order (``FrameDataset.scene_lengths()``).
        batch_size: streams (slots) per rank, ``B``.
        seed: shuffle seed (the same on every rank).
        shuffle: shuffle the scene order every epoch.
        rank, world_size: this process's shard: streams ``[rank·B, (rank+1)·B)`` of ``B × world_size``.
    """

    def __init__(
        self,
        scene_lengths: Sequence[int],
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size: must be ≥ 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: must be in [0, world_size={world_size}), got {rank}")
        if len(scene_lengths) < batch_size * world_size:
            raise ValueError(
                f"scene_lengths: {len(scene_lengths)} scenes cannot fill {batch_size} slots × {world_size} ranks"
            )
        if any(n < 1 for n in scene_lengths):
            raise ValueError("scene_lengths: every scene needs at least one frame")
        self.scene_lengths = [int(n) for n in scene_lengths]
        self.scene_start = np.concatenate([[0], np.cumsum(self.scene_lengths)]).tolist()
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.streams = batch_size * world_size
        self.dealing = "global"  # "per_rank" after loading an older checkpoint's state (load_state_dict)
        self.epoch, self.step = 0, 0
        self._cached: tuple[int, list[list[tuple[int, bool]]]] | None = None

    def streams_of(self, epoch: int) -> list[list[tuple[int, bool]]]:
        """Every stream's frames in ``epoch``, ``(frame index, prev_exists)``, in stream order (all ranks')."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        order = np.arange(len(self.scene_lengths))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(order)
        if self.dealing == "global":
            streams = self._deal(order)
        else:  # "per_rank": round-robin to ranks, then on each rank to its streams (before elastic resume)
            streams = [
                s for r in range(self.world_size) for s in self._deal(order[r :: self.world_size], self.batch_size)
            ]
        self._cached = (epoch, streams)
        return streams

    def _deal(self, scenes: np.ndarray, count: int | None = None) -> list[list[tuple[int, bool]]]:
        """``scenes`` dealt in order to ``count`` streams (default all), each to the one with the fewest frames."""
        count = self.streams if count is None else count
        streams: list[list[tuple[int, bool]]] = [[] for _ in range(count)]
        fewest = [(0, s) for s in range(count)]  # (frames so far, stream): the heap's top takes the next scene
        for scene in scenes:
            _, s = heapq.heappop(fewest)
            start = self.scene_start[scene]
            streams[s].extend((start + f, f > 0) for f in range(self.scene_lengths[scene]))
            heapq.heappush(fewest, (len(streams[s]), s))
        return streams

    def _slots(self, epoch: int, rank: int) -> list[list[tuple[int, bool]]]:
        """Rank ``rank``'s ``B`` streams in ``epoch``."""
        return self.streams_of(epoch)[rank * self.batch_size : (rank + 1) * self.batch_size]

    def steps_in_epoch(self, epoch: int | None = None) -> int:
        """Batches in ``epoch`` (default: the current one): the shortest stream's frames."""
        return min(len(s) for s in self.streams_of(self.epoch if epoch is None else epoch))

    def __len__(self) -> int:
        """Batches in the current epoch (from the start of it)."""
        return self.steps_in_epoch()

    def __iter__(self) -> Iterator[list[FrameKey]]:
        """Yield the rest of the current epoch, then move to the next epoch."""
        epoch = self.epoch
        slots = self._slots(epoch, self.rank)
        steps = self.steps_in_epoch(epoch)
        while self.step < steps:
            step = self.step
            self.step += 1
            yield [FrameKey(*slot[step]) for slot in slots]
        self.epoch, self.step = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """The position of the next batch (epoch, step: global) and the settings a resumed sampler must share
        (``streams``; ``batch_size``, ``rank`` and ``world_size`` say how this run split them)."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "seed": self.seed,
            "streams": self.streams,
            "dealing": self.dealing,
            "batch_size": self.batch_size,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_frames": sum(self.scene_lengths),
            "num_scenes": len(self.scene_lengths),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state["epoch"]``, ``state["step"]``; ``seed``, ``num_frames`` and ``num_scenes``, when
        present, must match, and so must the number of streams — but not how they are split (``batch_size``,
        ``rank``, ``world_size``): every split walks the same streams in lockstep. A state without ``streams``
        (drivetrain before elastic resume dealt scenes per rank) continues with the same batch size and world size
        only."""
        mine = self.state_dict()
        for key in ("seed", "num_frames", "num_scenes"):
            if key in state and state[key] != mine[key]:
                raise ValueError(f"state_dict: {key} is {state[key]} in the state but {mine[key]} in this sampler")
        if "streams" in state:
            if state["streams"] != self.streams:
                per_rank = state["streams"] / self.world_size
                keep = (
                    f"data.batch_size={int(per_rank)}"
                    if per_rank.is_integer()
                    else f"{state['streams']} streams (data.batch_size × ranks)"
                )
                raise ValueError(
                    f"sampler: the checkpoint walked {state['streams']} scene streams (data.batch_size × ranks), "
                    f"this run {self.batch_size} × {self.world_size} = {self.streams}; set {keep} to keep them"
                )
        else:  # an older checkpoint (drivetrain.engine.compat, rule 4): scenes were dealt per rank
            for key in ("batch_size", "world_size"):
                if key in state and state[key] != mine[key]:
                    raise ValueError(
                        f"state_dict: {key} is {state[key]} in the state but {mine[key]} in this sampler; a "
                        "checkpoint of a drivetrain before elastic resume continues with the same data.batch_size "
                        "and number of ranks"
                    )
        dealing = state.get("dealing", "global" if "streams" in state else "per_rank")
        if dealing == "per_rank" and "streams" in state and state.get("world_size") != self.world_size:
            raise ValueError(
                f"sampler: the checkpoint dealt scenes per rank to {state.get('world_size')} ranks (a run begun "
                f"before elastic resume), this run has {self.world_size}; resume it on {state.get('world_size')}"
            )
        if dealing not in ("global", "per_rank"):
            raise ValueError(f"state_dict: dealing is {dealing!r}, expected 'global' or 'per_rank'")
        if dealing != self.dealing:
            self.dealing, self._cached = dealing, None
        epoch, step = int(state["epoch"]), int(state["step"])
        if step < 0 or epoch < 0:
            raise ValueError(f"state_dict: epoch and step must be ≥ 0, got {epoch}, {step}")
        if step >= self.steps_in_epoch(epoch):
            epoch, step = epoch + 1, 0  # the state is the end of an epoch
        self.epoch, self.step = epoch, step
