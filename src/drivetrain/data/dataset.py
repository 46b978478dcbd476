"""``FrameDataset``: map-style dataset of key frames from a frame index; decodes images and lidar.

``dataset[i]`` (or ``dataset[FrameKey]`` from :class:`~drivetrain.data.sampler.SequenceSampler`) returns a
:class:`Sample` of NumPy arrays: the frame's camera images (uint8 ``(N, H, W, 3)``, decoded with
libjpeg-turbo through simplejpeg), camera matrices, ego pose, 3D ground truth in the lidar frame, the
per-camera 2D ground truth, and optionally the lidar points with sweeps. ``collate`` turns a list of
samples into a :class:`~drivetrain.batch.Batch`.

Bad input: a missing or undecodable image, a missing or truncated lidar file, or images whose size
differs from the index raise :class:`DataError` naming the file. With ``on_error="skip"`` the sample is
replaced by a :class:`Skipped` marker and a warning; ``collate`` drops it and lists it in
``Batch.skipped`` (so the count reaches the training loop even from loader worker processes).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

from drivetrain.data.errors import DataError
from drivetrain.data.index import FrameIndex, load_index
from drivetrain.data.io import read_image, read_points
from drivetrain.data.sweep_cache import SweepCache
from drivetrain.data.sweeps import SweepConfig, merge_sweeps
from drivetrain.geometry.projection import Boxes2D, lidar2img, project_boxes

__all__ = ["DatasetConfig", "FrameDataset", "FrameKey", "Sample", "Skipped"]


class FrameKey(NamedTuple):
    """What a sequence sampler yields: the frame, and whether the previous step of its batch slot was the
    previous frame of the same scene."""

    index: int
    prev_exists: bool


@dataclass(frozen=True)
class DatasetConfig:
    """What ``FrameDataset`` loads."""

    load_images: bool = True  # decode the camera images
    load_points: bool = False  # read the key-frame lidar points (x, y, z, intensity, Δt)
    num_sweeps: int = 0  # previous lidar sweeps merged into the points (Δt > 0), at most what the index has
    use_dim: tuple[int, ...] = (0, 1, 2, 3, 4)  # point columns kept of (x, y, z, intensity, Δt); PointPillars 0,1,2,4
    sweep_choice: Literal["random", "nearest"] = "random"  # more sweeps than num_sweeps: a random subset, or nearest
    remove_close: bool = False  # drop sweep points within 1 m of the sensor (|x| < 1 and |y| < 1)
    pad_empty_sweeps: bool = False  # a frame without sweeps repeats its key frame num_sweeps times
    sweep_seed: int = 0  # random sweep subsets are drawn from (sweep_seed, sample token)
    sweep_cache: str | None = None  # folder written by `drivetrain data cache` with these settings
    filter_empty: bool = True  # drop GT boxes without lidar points (mmdetection3d's use_valid_flag)
    min_depth: float = 0.1  # 2D GT: box centre at least this far in front of the camera
    min_size: float = 2.0  # 2D GT: clipped box at least this many pixels wide and high
    on_error: Literal["raise", "skip"] = "raise"  # skip: warn, and collate drops and counts the sample

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error: expected 'raise' or 'skip', got {self.on_error!r}")
        if self.num_sweeps < 0:
            raise ValueError(f"num_sweeps: must be ≥ 0, got {self.num_sweeps}")
        if self.num_sweeps and not self.load_points:
            raise ValueError("num_sweeps: needs load_points=True")
        if self.sweep_cache is not None and not self.load_points:
            raise ValueError("sweep_cache: needs load_points=True")
        _ = self.sweep_config  # validates use_dim and sweep_choice

    @property
    def sweep_config(self) -> SweepConfig:
        """How the points are merged (the sweep cache is keyed by it)."""
        return SweepConfig(
            num_sweeps=self.num_sweeps,
            use_dim=tuple(self.use_dim),
            choice=self.sweep_choice,
            remove_close=self.remove_close,
            pad_empty_sweeps=self.pad_empty_sweeps,
            seed=self.sweep_seed,
        )


@dataclass
class Sample:
    """One key frame. ``N`` cameras, ``M`` GT boxes, ``P`` points; boxes in the lidar frame."""

    index: int
    token: str
    scene_id: int
    frame_in_scene: int
    prev_exists: bool
    timestamp: float  # seconds
    images: np.ndarray | None  # (N, H, W, 3) uint8 RGB
    intrinsics: np.ndarray  # (N, 3, 3) float32
    lidar2img: np.ndarray  # (N, 4, 4) float32
    cam2ego: np.ndarray  # (N, 4, 4) float32: camera → ego frame of the key frame (lidar2ego @ cam2lidar)
    lidar2ego: np.ndarray  # (4, 4) float32
    ego_pose: np.ndarray  # (4, 4) float64: lidar → global
    gt_boxes: np.ndarray  # (M, 9) float32 (x, y, z_centre, dx, dy, dz, yaw, vx, vy)
    gt_labels: np.ndarray  # (M,) int64
    boxes_2d: list[Boxes2D]  # per camera
    image_size: tuple[int, int]  # (W, H)
    points: np.ndarray | None  # (P, len(use_dim)) float32, columns use_dim of (x, y, z, intensity, Δt)


@dataclass(frozen=True)
class Skipped:
    """Stands in for a sample that could not be read (``on_error="skip"``)."""

    index: int
    token: str
    reason: str


class FrameDataset:
    """Key frames of a frame index (an :class:`FrameIndex` or the path of a saved one).

    Args:
        index: the index, or its ``.npz`` path.
        config: what to load.
        root: dataset root (default: the root the index names, relative to the index file).
        split: keep only the scenes of this devkit split (``mini_train``, ``mini_val``, ``train``, ``val``,
            ...); None keeps every indexed scene.
    """

    def __init__(
        self,
        index: FrameIndex | str | Path,
        config: DatasetConfig | None = None,
        root: str | Path | None = None,
        split: str | None = None,
    ) -> None:
        self.index = index if isinstance(index, FrameIndex) else load_index(index, root)
        if split is not None:
            self.index = self.index.split(split)
        self.root = Path(root if root is not None else self.index.meta["root"])
        self.config = config or DatasetConfig()
        arr = self.index.arrays
        self._lidar2img = lidar2img(arr["intrinsics"], arr["cam2lidar"]).astype(np.float32)  # (F, N, 4, 4)
        self._cam2ego = (arr["lidar2ego"][:, None] @ arr["cam2lidar"]).astype(np.float32)  # (F, N, 4, 4)
        self._sweep_cache = None
        if self.config.sweep_cache is not None:
            self._sweep_cache = SweepCache(self.config.sweep_cache, self.index, self.config.sweep_config)

    def __len__(self) -> int:
        return len(self.index)

    def scene_lengths(self) -> list[int]:
        """Frames per scene, scenes in index order (what a :class:`SequenceSampler` is built from)."""
        return self.index.scene_lengths()

    def __getitem__(self, key: int | FrameKey | tuple[int, bool]) -> Sample | Skipped:
        frame = int(key[0]) if isinstance(key, tuple) else int(key)
        if not 0 <= frame < len(self):
            raise IndexError(f"frame {frame} out of range for {len(self)} frames")
        in_scene = self.index.arrays["frame_in_scene"][frame] > 0
        prev_exists = bool(key[1]) if isinstance(key, tuple) else bool(in_scene)
        try:
            return self._load(frame, prev_exists)
        except DataError as err:
            if self.config.on_error == "raise":
                raise
            warnings.warn(f"skipping frame {frame}: {err}", RuntimeWarning, stacklevel=2)
            return Skipped(frame, self.index.meta["sample_tokens"][frame], str(err))

    def _load(self, frame: int, prev_exists: bool) -> Sample:
        arr, meta, cfg = self.index.arrays, self.index.meta, self.config
        sizes = arr["image_size"][frame]  # (N, 2)
        if not (sizes == sizes[0]).all():
            raise DataError(
                f"frame {frame}: cameras differ in image size {sizes.tolist()}; a batch needs one size", self.root
            )
        image_size = (int(sizes[0, 0]), int(sizes[0, 1]))
        images = None
        if cfg.load_images:
            images = np.stack([read_image(self.root / f, image_size) for f in meta["image_files"][frame]])
        sl = self.index.boxes_of(frame)
        boxes, labels = arr["boxes"][sl], arr["labels"][sl]
        if cfg.filter_empty:
            keep = arr["num_lidar_pts"][sl] > 0
            boxes, labels = boxes[keep], labels[keep]
        if not np.isfinite(boxes).all():
            raise DataError(f"frame {frame}: non-finite ground-truth box values", self.root)
        boxes_2d = [
            project_boxes(
                boxes,
                arr["intrinsics"][frame, c],
                arr["cam2lidar"][frame, c],
                image_size,
                min_depth=cfg.min_depth,
                min_size=cfg.min_size,
            )
            for c in range(self.index.num_cameras)
        ]
        points = self._points(frame) if cfg.load_points else None
        return Sample(
            index=frame,
            token=meta["sample_tokens"][frame],
            scene_id=int(arr["scene_id"][frame]),
            frame_in_scene=int(arr["frame_in_scene"][frame]),
            prev_exists=prev_exists,
            timestamp=float(arr["timestamp"][frame]),
            images=images,
            intrinsics=arr["intrinsics"][frame].astype(np.float32),
            lidar2img=self._lidar2img[frame],
            cam2ego=self._cam2ego[frame],
            lidar2ego=arr["lidar2ego"][frame].astype(np.float32),
            ego_pose=arr["ego_pose"][frame],
            gt_boxes=np.ascontiguousarray(boxes),
            gt_labels=np.ascontiguousarray(labels),
            boxes_2d=boxes_2d,
            image_size=image_size,
            points=points,
        )

    def _points(self, frame: int) -> np.ndarray:
        if self._sweep_cache is not None:
            return self._sweep_cache.points(self.index.meta["sample_tokens"][frame])
        points, _ = merge_sweeps(self.index, frame, self.root, self.config.sweep_config, read_points)
        return points  # (P, C)
