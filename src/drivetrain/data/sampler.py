"""``SequenceSampler``: batches for streaming (temporal) training, resumable mid-epoch.

Each of the ``B`` batch slots walks consecutive key frames of one scene, then of the next scene dealt to
it, so a model with a temporal memory (StreamPETR) sees each scene in order in one slot. Per epoch the
scenes are shuffled with ``(seed, epoch)``, dealt round-robin to ranks (``rank`` / ``world_size``), and on
each rank to the slot with the fewest frames so far. An epoch has as many steps as the *shortest* slot of
any rank (every rank takes the same number of steps; the tails of longer slots are dropped this epoch).
It yields lists of :class:`~drivetrain.data.dataset.FrameKey` ``(index, prev_exists)``.

Resume: ``state_dict()`` is the position of the next batch to yield (read right after a batch: the position
after it); ``load_state_dict`` continues there without replaying earlier batches. A ``DataLoader`` draws
batches ahead of what training consumes, so the trainer records the state per batch drawn
(:mod:`drivetrain.engine.batches`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from drivetrain.data.dataset import FrameKey

__all__ = ["SequenceSampler"]


class SequenceSampler:
    """Batch sampler over scenes of consecutive frames (frames of scene ``i`` are contiguous, in order).

    Args:
        scene_lengths: frames per scene, in index order (``FrameDataset.scene_lengths()``).
        batch_size: slots per rank, ``B``.
        seed: shuffle seed (the same on every rank).
        shuffle: shuffle the scene order every epoch.
        rank, world_size: this process's shard.
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
        self.epoch, self.step = 0, 0

    def _slots(self, epoch: int, rank: int) -> list[list[tuple[int, bool]]]:
        order = np.arange(len(self.scene_lengths))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(order)
        slots: list[list[tuple[int, bool]]] = [[] for _ in range(self.batch_size)]
        for scene in order[rank :: self.world_size]:
            slot = min(range(self.batch_size), key=lambda b: len(slots[b]))
            start = self.scene_start[scene]
            slots[slot].extend((start + f, f > 0) for f in range(self.scene_lengths[scene]))
        return slots

    def steps_in_epoch(self, epoch: int | None = None) -> int:
        """Batches in ``epoch`` (default: the current one): the shortest slot of any rank."""
        epoch = self.epoch if epoch is None else epoch
        return min(len(s) for r in range(self.world_size) for s in self._slots(epoch, r))

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
        """The position of the next batch (epoch, step) and the settings a resumed sampler must share."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_frames": sum(self.scene_lengths),
            "num_scenes": len(self.scene_lengths),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state["epoch"]``, ``state["step"]``; other keys, when present, must match — but ``rank``:
        the ranks move in lockstep, and a checkpoint holds one position (rank 0's) for all of them."""
        mine = self.state_dict()
        for key in ("seed", "batch_size", "world_size", "num_frames", "num_scenes"):
            if key in state and state[key] != mine[key]:
                raise ValueError(f"state_dict: {key} is {state[key]} in the state but {mine[key]} in this sampler")
        epoch, step = int(state["epoch"]), int(state["step"])
        if step < 0 or epoch < 0:
            raise ValueError(f"state_dict: epoch and step must be ≥ 0, got {epoch}, {step}")
        if step >= self.steps_in_epoch(epoch):
            epoch, step = epoch + 1, 0  # the state is the end of an epoch
        self.epoch, self.step = epoch, step
