"""Merge a key frame's lidar points with its earlier sweeps, as mmdetection3d's loaders do.

mmdetection3d (1.x, ``mmdet3d/datasets/transforms/loading.py``) loads lidar in two steps:
``LoadPointsFromFile`` reads the key frame's ``.pcd.bin`` (``load_dim=5``: x, y, z, intensity, ring) and
``LoadPointsFromMultiSweeps.transform`` then

1. sets the key frame's column 4 (the ring index) to 0: its time offset;
2. picks sweeps from the frame's list (most recent first): all of them if there are at most ``sweeps_num``,
   else the ``sweeps_num`` most recent in test mode, else ``np.random.choice(len, sweeps_num,
   replace=False)`` — a random subset, in the order drawn;
3. per chosen sweep: reads it, optionally drops points with ``|x| < 1 and |y| < 1`` (``remove_close``),
   moves xyz into the key frame's lidar frame and writes the time offset Δt = t_key − t_sweep (seconds)
   into column 4;
4. concatenates key frame then sweeps and keeps the columns ``use_dim`` (PointPillars: ``[0, 1, 2, 4]`` =
   x, y, z, Δt; intensity dropped). ``pad_empty_sweeps`` repeats the key frame ``sweeps_num`` times when
   the frame has no sweep list.

:func:`merge_sweeps` does the same with the sweeps of a :class:`~drivetrain.data.index.FrameIndex`, which
follows the lidar ``prev`` chain as mmdetection3d's info converter does (``data index --max-sweeps 10``
gives the published ten). Two deviations, both named here:

- *Random subsets are drawn once per (seed, sample)* from ``np.random.default_rng([seed, key])`` with
  ``key`` from the sample token (so a split's subset of the index draws what the whole index draws), not
  from the global NumPy state each time the frame is read. That keeps loading deterministic, resumable and
  equal to the sweep cache (:mod:`drivetrain.data.sweep_cache`), which stores one merge per frame. When a
  frame has at most ``num_sweeps`` sweeps (the published 10 of a 10-sweep index) nothing is drawn.
- *The sweep transform is the exact one* (``R p + t`` with the sweep → key-lidar matrix of the index), as
  mmdetection3d 0.x applied ``sensor2lidar``. mmdetection3d 1.x applies ``p @ R`` then subtracts the
  translation column of ``lidar2sensor`` (= ``−Rᵀt``), which adds ``Rᵀt`` instead of ``t``: wrong by the
  translation rotated through the small yaw between sweep and key frame.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drivetrain.data.index import FrameIndex

__all__ = ["REMOVE_CLOSE_RADIUS", "SweepConfig", "choose_sweeps", "merge_sweeps", "sample_key"]

LOAD_DIM = 5  # x, y, z, intensity, ring (key frame) / Δt (sweeps): the nuScenes and Lyft .pcd.bin layout
DT_COLUMN = 4
REMOVE_CLOSE_RADIUS = 1.0  # mmdetection3d's _remove_close default


@dataclass(frozen=True)
class SweepConfig:
    """How the points of a key frame are assembled (``LoadPointsFromMultiSweeps``'s arguments)."""

    num_sweeps: int = 0  # earlier sweeps merged in (sweeps_num); 0 = the key frame alone
    use_dim: tuple[int, ...] = (0, 1, 2, 3, 4)  # columns kept of (x, y, z, intensity, Δt); PointPillars: 0,1,2,4
    choice: str = "random"  # more sweeps than num_sweeps: "random" subset (training) or "nearest" (test_mode)
    remove_close: bool = False  # drop sweep points with |x| < 1 m and |y| < 1 m (the sensor's own car)
    pad_empty_sweeps: bool = False  # a frame without sweeps gets its key frame repeated num_sweeps times
    seed: int = 0  # the random subsets are drawn from (seed, sample token)

    def __post_init__(self) -> None:
        if self.num_sweeps < 0:
            raise ValueError(f"num_sweeps: must be ≥ 0, got {self.num_sweeps}")
        if not self.use_dim or len(set(self.use_dim)) != len(self.use_dim):
            raise ValueError(f"use_dim: need distinct column numbers, got {self.use_dim}")
        if not all(0 <= d < LOAD_DIM for d in self.use_dim):
            raise ValueError(f"use_dim: columns must lie in 0..{LOAD_DIM - 1} (x, y, z, intensity, Δt): {self.use_dim}")
        if self.choice not in ("random", "nearest"):
            raise ValueError(f"choice: expected 'random' or 'nearest', got {self.choice!r}")

    def settings(self) -> dict[str, object]:
        """The fields as JSON-ready values (what a sweep cache is keyed by)."""
        return {
            "num_sweeps": self.num_sweeps,
            "use_dim": list(self.use_dim),
            "choice": self.choice,
            "remove_close": self.remove_close,
            "pad_empty_sweeps": self.pad_empty_sweeps,
            "seed": self.seed,
        }


def sample_key(token: str) -> int:
    """A 63-bit integer of a sample token: what its random sweep subset is drawn from, with the seed."""
    return int.from_bytes(hashlib.sha256(token.encode()).digest()[:8], "little") >> 1


def choose_sweeps(available: int, key: int, config: SweepConfig) -> np.ndarray:
    """Which of a frame's ``available`` sweeps (0 = most recent) are merged, in merge order: int64 ``(n,)``.

    ``key`` identifies the sample (:func:`sample_key` of its token): random subsets depend on it and the seed.
    """
    n = config.num_sweeps
    if available <= n:
        return np.arange(available)
    if config.choice == "nearest":
        return np.arange(n)
    return np.random.default_rng([config.seed, key]).choice(available, n, replace=False)


def merge_sweeps(
    index: FrameIndex,
    frame: int,
    root: Path,
    config: SweepConfig,
    read: Callable[[Path], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """The merged point cloud of ``frame`` and the extent of each part.

    Args:
        index: the frame index (sweeps most recent first, ``sweep2lidar`` and ``sweep_dt`` per sweep).
        frame: row of the index.
        root: dataset root the index's file names are relative to.
        config: what to merge.
        read: reads a ``.pcd.bin`` into ``(P, 5)`` float32 (raises DataError naming the file if bad).

    Returns:
        points ``(P, len(use_dim))`` float32, key frame first then the chosen sweeps; parts ``(S + 1, 2)``
        float64 rows ``(count, Δt)`` — the key frame (Δt 0) and each merged sweep, in order (what the
        sweep cache stores instead of a per-point Δt column).
    """
    arr, meta = index.arrays, index.meta
    key = read(root / meta["lidar_files"][frame])
    key = np.array(key[:, :LOAD_DIM], dtype=np.float32)  # (P0, 5) a private copy
    key[:, DT_COLUMN] = 0.0
    parts, spans = [key], [(len(key), 0.0)]
    sl = index.sweeps_of(frame)
    available = sl.stop - sl.start
    if available == 0 and config.pad_empty_sweeps:
        for _ in range(config.num_sweeps):
            pad = _drop_close(key) if config.remove_close else key
            parts.append(pad)
            spans.append((len(pad), 0.0))
    for choice in choose_sweeps(available, sample_key(meta["sample_tokens"][frame]), config):
        s = sl.start + int(choice)
        pts = np.array(read(root / meta["sweep_files"][s])[:, :LOAD_DIM], dtype=np.float32)  # (Ps, 5)
        if config.remove_close:
            pts = _drop_close(pts)
        mat = arr["sweep2lidar"][s]
        pts[:, :3] = pts[:, :3] @ mat[:3, :3].T.astype(np.float32) + mat[:3, 3].astype(np.float32)
        pts[:, DT_COLUMN] = np.float32(arr["sweep_dt"][s])
        parts.append(pts)
        spans.append((len(pts), float(np.float32(arr["sweep_dt"][s]))))
    points = np.concatenate(parts, 0)[:, list(config.use_dim)]  # (P, C)
    return np.ascontiguousarray(points), np.asarray(spans, dtype=np.float64)


def _drop_close(points: np.ndarray, radius: float = REMOVE_CLOSE_RADIUS) -> np.ndarray:
    """Points outside the square ``|x| < radius and |y| < radius`` (mmdetection3d's ``_remove_close``)."""
    close = (np.abs(points[:, 0]) < radius) & (np.abs(points[:, 1]) < radius)
    return points[~close]
