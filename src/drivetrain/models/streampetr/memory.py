"""StreamPETR's temporal memory: the top-k decoded queries of past frames, carried in the current frame's
lidar coordinates.

Per sample the memory holds ``M`` entries (newest first): the decoder embedding ``(E,)``, the reference
point (the predicted box centre, metres), the velocity ``(vx, vy)``, the entry's age in seconds (float64)
and the pose that takes the entry's frame to the current lidar frame ``(4, 4)``. Each frame:

- :meth:`MemoryBank.pre_update` (before the forward): ages grow by the new timestamp, poses and reference
  points move from the global frame into the new lidar frame (``ego_pose_inv``), the memory is cut to
  ``M`` entries, and every sample whose previous frame is not the previous frame of its scene
  (``prev_exists`` False) is cleared; there the first ``num_propagated`` entries get the fixed pseudo
  reference points (``U(0, 1)`` · range + min, not trained) and identity poses.
- :meth:`MemoryBank.post_update` (after the forward): the ``topk`` queries of the last decoder layer with the
  highest class score are prepended (embedding, centre and velocity detached; age 0; identity pose), then
  everything moves to the global frame (``ego_pose``) and ages become ``−timestamp``, so that the next
  ``pre_update`` turns them into ages again.

Both updates are also functions of a :class:`MemoryState` (:meth:`MemoryBank.aligned`, :meth:`MemoryBank.appended`),
which the methods above apply to the tensors the bank holds; the compiled training step (``speed.compile_step``)
calls them on tensors of fixed shape ``(B, K+M, ·)`` passed into its graph and written back in place, the empty bank
as zeros with a ``filled`` flag of 0 (:meth:`~.detector.StreamPETR.step_inputs`).

Mirrors ``StreamPETRHead.reset_memory``, ``pre_update_memory`` and ``post_update_memory`` of StreamPETR
(``projects/mmdet3d_plugin/models/dense_heads/streampetr_head.py``) with ``memory_refresh``,
``topk_gather`` and ``transform_reference_points`` of ``projects/mmdet3d_plugin/models/utils/misc.py``.
Deviations, each for a stated reason: the memory is module state saved with checkpoints
(``get_extra_state``; every rank's through the detector's ``stream_state``,
:class:`drivetrain.engine.state.StreamState`), so a run resumed mid-scene continues with the same memory (the
original starts empty); the memory tensors are created on the first ``pre_update`` as in the original, but ages are
kept in float64 from the start (the original's first zeros are float32 and become float64 on the first
concatenation; the values are the same).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from drivetrain.models.streampetr.recipe import PC_RANGE

__all__ = ["MEMORY_DTYPES", "MemoryBank", "MemoryState"]

_FIELDS = ("embedding", "reference", "age", "pose", "velocity")


class MemoryState(NamedTuple):
    """The memory's tensors: ``(B, M, E)`` embeddings, ``(B, M, 3)`` reference points (metres), ``(B, M, 1)`` float64
    ages (seconds), ``(B, M, 4, 4)`` poses and ``(B, M, 2)`` velocities (``M`` entries, newest first)."""

    embedding: torch.Tensor
    reference: torch.Tensor
    age: torch.Tensor
    pose: torch.Tensor
    velocity: torch.Tensor


MEMORY_DTYPES = MemoryState(torch.float32, torch.float32, torch.float64, torch.float32, torch.float32)
"""The dtype of each memory tensor as :meth:`MemoryBank.pre_update` creates it (ages in float64)."""


class MemoryBank(nn.Module):
    """Per-sample FIFO of past queries in the current lidar frame (see the module docstring).

    Args:
        embed_dims: ``E`` (256).
        memory_len: entries kept, ``M`` (1024).
        topk: queries added per frame (256).
        num_propagated: entries that become queries of the next frame; at a scene start they get the pseudo
            reference points (256).
        pc_range: ``(x_min, y_min, z_min, x_max, y_max, z_max)`` metres of the pseudo reference points (the
            published :data:`~.recipe.PC_RANGE`).
    """

    def __init__(
        self,
        embed_dims: int = 256,
        memory_len: int = 1024,
        topk: int = 256,
        num_propagated: int = 256,
        pc_range: tuple[float, ...] = PC_RANGE,
    ) -> None:
        super().__init__()
        if not 0 <= num_propagated <= memory_len or not 0 < topk <= memory_len:
            raise ValueError(
                f"memory: need 0 ≤ num_propagated ≤ memory_len and 0 < topk ≤ memory_len, got "
                f"num_propagated={num_propagated}, topk={topk}, memory_len={memory_len}"
            )
        self.embed_dims, self.memory_len, self.topk, self.num_propagated = embed_dims, memory_len, topk, num_propagated
        self.register_buffer("pc_min", torch.tensor(pc_range[:3], dtype=torch.float32), persistent=False)
        self.register_buffer("pc_size", torch.tensor(pc_range[3:], dtype=torch.float32) - self.pc_min,
                             persistent=False)  # fmt: skip
        self.pseudo_reference = nn.Embedding(num_propagated, 3)  # U(0, 1), frozen (the original's init_weights)
        nn.init.uniform_(self.pseudo_reference.weight, 0, 1)
        self.pseudo_reference.weight.requires_grad_(False)
        self.embedding: torch.Tensor | None = None  # (B, M, E)
        self.reference: torch.Tensor | None = None  # (B, M, 3) metres
        self.age: torch.Tensor | None = None  # (B, M, 1) float64 seconds
        self.pose: torch.Tensor | None = None  # (B, M, 4, 4)
        self.velocity: torch.Tensor | None = None  # (B, M, 2)

    def reset(self) -> None:
        """Forget everything (the next ``pre_update`` starts from an empty memory)."""
        for name in _FIELDS:
            setattr(self, name, None)

    def state(self) -> MemoryState:
        """The memory as a :class:`MemoryState` (after :meth:`pre_update` or :meth:`post_update`)."""
        if self.embedding is None:
            raise RuntimeError("memory: post_update before pre_update")
        return MemoryState(self.embedding, self.reference, self.age, self.pose, self.velocity)

    def set_state(self, state: MemoryState) -> None:
        """Hold ``state`` (what :meth:`aligned` or :meth:`appended` returned)."""
        self.embedding, self.reference, self.age, self.pose, self.velocity = state

    def pre_update(self, prev_exists: torch.Tensor, timestamp: torch.Tensor, ego_pose_inv: torch.Tensor) -> None:
        """Bring the memory into the new frame; clear it where a scene starts.

        Args:
            prev_exists: ``(B,)`` bool or float: the previous step of this batch slot was the previous frame.
            timestamp: ``(B,)`` float64 seconds of the new frame.
            ego_pose_inv: ``(B, 4, 4)`` global → lidar of the new frame.
        """
        keep = prev_exists.to(torch.float32)  # (B,)
        b = keep.shape[0]
        if self.embedding is None:
            state = self.empty(b, self.memory_len, keep.device)
        else:
            if self.embedding.device != keep.device:  # restored from a checkpoint loaded on another device
                for name in _FIELDS:
                    setattr(self, name, getattr(self, name).to(keep.device))
            if self.embedding.shape[0] != b:
                raise ValueError(f"prev_exists: batch of {b}, the memory holds {self.embedding.shape[0]} samples")
            state = self._moved(self.state(), keep, timestamp, ego_pose_inv)
        self.set_state(self._seeded(state, keep))

    def empty(self, batch: int, entries: int, device: torch.device) -> MemoryState:
        """A memory of zeros: ``batch`` samples of ``entries`` entries (:data:`MEMORY_DTYPES`)."""
        tails = ((self.embed_dims,), (3,), (1,), (4, 4), (2,))
        return MemoryState(
            *(
                torch.zeros(batch, entries, *tail, dtype=dtype, device=device)
                for tail, dtype in zip(tails, MEMORY_DTYPES, strict=True)
            )
        )

    def aligned(
        self,
        state: MemoryState,
        keep: torch.Tensor,
        filled: torch.Tensor,
        timestamp: torch.Tensor,
        ego_pose_inv: torch.Tensor,
    ) -> MemoryState:
        """:meth:`pre_update` as a function of the state (the compiled step's: no attribute is read or set).

        Args:
            state: the memory after the previous frame's :meth:`appended`, ``(B, M', ·)`` with ``M' ≥ M`` (zeros
                where ``filled`` is 0).
            keep: ``(B,)`` float32 ``prev_exists``.
            filled: ``(B,)`` float32: 1 where ``state`` holds a previous frame, 0 where it stands for
                :meth:`pre_update`'s empty memory (which ``state`` times 0 is: the same values, zeros signed).
            timestamp: ``(B,)`` float64 seconds of the new frame.
            ego_pose_inv: ``(B, 4, 4)`` global → lidar of the new frame.

        Returns:
            The memory of the new frame, ``(B, M, ·)``: what :meth:`pre_update` holds after it.
        """
        return self._seeded(self._moved(state, keep * filled, timestamp, ego_pose_inv), keep)

    def _moved(
        self, state: MemoryState, keep: torch.Tensor, timestamp: torch.Tensor, ego_pose_inv: torch.Tensor
    ) -> MemoryState:
        """Ages grown, poses and reference points in the new lidar frame, cut to ``M`` entries, times ``keep``."""
        b, m = keep.shape[0], self.memory_len
        age = state.age + timestamp.to(torch.float64).view(b, 1, 1)  # (B, M', 1)
        pose = ego_pose_inv.unsqueeze(1) @ state.pose  # (B, M', 4, 4)
        reference = _transform(state.reference, ego_pose_inv)  # (B, M', 3)
        return MemoryState(
            embedding=state.embedding[:, :m] * keep.view(b, 1, 1),  # (B, M, E)
            reference=reference[:, :m] * keep.view(b, 1, 1),  # (B, M, 3)
            age=age[:, :m] * keep.view(b, 1, 1).to(torch.float64),  # (B, M, 1)
            pose=pose[:, :m] * keep.view(b, 1, 1, 1),  # (B, M, 4, 4)
            velocity=state.velocity[:, :m] * keep.view(b, 1, 1),  # (B, M, 2)
        )

    def _seeded(self, state: MemoryState, keep: torch.Tensor) -> MemoryState:
        """Where a scene starts (``keep`` 0) the first ``num_propagated`` entries get the pseudo reference points and
        identity poses."""
        if self.num_propagated == 0:
            return state
        b, p = keep.shape[0], self.num_propagated
        start = (1 - keep).view(b, 1, 1)  # (B, 1, 1): 1 where the scene starts
        pseudo = self.pseudo_reference.weight * self.pc_size + self.pc_min  # (P, 3) metres
        eye = torch.eye(4, device=keep.device, dtype=state.pose.dtype)  # (4, 4)
        reference = torch.cat([state.reference[:, :p] + start * pseudo, state.reference[:, p:]], dim=1)  # (B, M, 3)
        pose = torch.cat([state.pose[:, :p] + start.unsqueeze(-1) * eye, state.pose[:, p:]], dim=1)  # (B, M, 4, 4)
        return state._replace(reference=reference, pose=pose)

    def post_update(
        self,
        cls_logits: torch.Tensor,
        box_preds: torch.Tensor,
        hidden: torch.Tensor,
        timestamp: torch.Tensor,
        ego_pose: torch.Tensor,
    ) -> None:
        """Prepend the frame's ``topk`` best queries, then move the memory to the global frame (:meth:`appended` of
        the memory held).

        Args:
            cls_logits: ``(B, Q, C)`` class logits of the last decoder layer (denoising queries left out).
            box_preds: ``(B, Q, 10)`` decoded boxes of the last layer: centre in metres first, velocity last.
            hidden: ``(B, Q, E)`` decoder output of the last layer.
            timestamp: ``(B,)`` float64 seconds of the frame.
            ego_pose: ``(B, 4, 4)`` lidar → global of the frame.
        """
        self.set_state(self.appended(self.state(), cls_logits, box_preds, hidden, timestamp, ego_pose))

    def appended(
        self,
        state: MemoryState,
        cls_logits: torch.Tensor,
        box_preds: torch.Tensor,
        hidden: torch.Tensor,
        timestamp: torch.Tensor,
        ego_pose: torch.Tensor,
    ) -> MemoryState:
        """:meth:`post_update` as a function of the state: the memory ``state`` ``(B, M, ·)`` of the frame with its
        ``topk`` best queries prepended, in the global frame, ``(B, K+M, ·)`` (arguments as :meth:`post_update`)."""
        b = cls_logits.shape[0]
        score = cls_logits.sigmoid().amax(dim=-1)  # (B, Q): the best class's score
        index = score.topk(self.topk, dim=1).indices  # (B, K)
        new_reference = _gather(box_preds[..., :3], index).detach()  # (B, K, 3)
        new_velocity = _gather(box_preds[..., -2:], index).detach()  # (B, K, 2)
        new_embedding = _gather(hidden, index).detach()  # (B, K, E)
        new_age = new_reference.new_zeros(b, self.topk, 1, dtype=torch.float64)  # (B, K, 1)
        new_pose = torch.eye(4, device=hidden.device, dtype=state.pose.dtype).expand(b, self.topk, 4, 4)
        embedding = torch.cat([new_embedding.to(state.embedding.dtype), state.embedding], dim=1)  # (B, K+M, E)
        reference = torch.cat([new_reference.to(state.reference.dtype), state.reference], dim=1)  # (B, K+M, 3)
        velocity = torch.cat([new_velocity.to(state.velocity.dtype), state.velocity], dim=1)  # (B, K+M, 2)
        age = torch.cat([new_age, state.age], dim=1)  # (B, K+M, 1)
        pose = torch.cat([new_pose, state.pose], dim=1)  # (B, K+M, 4, 4)
        return MemoryState(
            embedding=embedding,
            reference=_transform(reference, ego_pose),  # (B, K+M, 3) global
            age=age - timestamp.to(torch.float64).view(b, 1, 1),  # (B, K+M, 1)
            pose=ego_pose.unsqueeze(1).to(pose.dtype) @ pose,  # (B, K+M, 4, 4)
            velocity=velocity,
        )

    def get_extra_state(self) -> dict[str, Any]:
        """The memory tensors (``{}`` when empty), so that checkpoints carry the memory."""
        if self.embedding is None:
            return {}
        return {name: getattr(self, name).detach().clone() for name in _FIELDS}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore the memory saved by :meth:`get_extra_state` (an empty dict empties it)."""
        if not state:
            self.reset()
            return
        missing = [name for name in _FIELDS if name not in state]
        if missing:
            raise ValueError(f"memory state: missing {missing}")
        for name in _FIELDS:
            setattr(self, name, state[name])


def _transform(points: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``(B, K, 3)`` points through per-sample ``(B, 4, 4)`` matrices (``transform_reference_points``)."""
    homogeneous = torch.cat([points, torch.ones_like(points[..., :1])], dim=-1)  # (B, K, 4)
    return (matrix.unsqueeze(1).to(points.dtype) @ homogeneous.unsqueeze(-1)).squeeze(-1)[..., :3]  # (B, K, 3)


def _gather(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[b, index[b]]``: ``(B, Q, ·)`` by ``(B, K)`` → ``(B, K, ·)`` (``topk_gather``)."""
    return values.gather(1, index.unsqueeze(-1).expand(*index.shape, values.shape[-1]))  # (B, K, ·)
