"""Frame index of a nuScenes-format root: everything a loader needs per key frame, without pickle.

``build_index`` reads the tables with the nuScenes devkit (``pip install 'drivetrain[nuscenes]'``) and
computes, per key frame (sample), in StreamPETR's conventions:

- ``ego_pose`` ``(4, 4)``: lidar → global (ego pose of the lidar sweep × lidar calibration);
- per camera ``intrinsics`` ``(3, 3)``, ``cam2lidar`` ``(4, 4)`` (through the global frame, so the ego
  motion between camera and lidar timestamps is included), the raw ``cam2ego`` and ``cam_ego_pose``
  (ego → global at the camera's timestamp) it is made of, the camera timestamp, image size and file;
- ground-truth boxes in the lidar frame ``(x, y, z, dx, dy, dz, yaw, vx, vy)`` (``z`` = box centre,
  ``dx`` = length), detection label (index into ``CLASSES``), ``num_lidar_pts``, visibility level,
  attribute and instance; velocities from the devkit's ``box_velocity``, NaN (single annotation) → 0;
- lidar sweeps (``prev`` chain): file, sweep-lidar → key-lidar transform and time offset.

A root without annotations (a test split such as nuScenes' ``v1.0-test``: its ``sample_annotation`` and
``instance`` tables empty or absent) is indexed with no boxes, for ``drivetrain predict``.

What differs between the formats of the schema is one :class:`~drivetrain.data.formats.record.DatasetFormat` record,
chosen here (told from the category table, or named with ``dataset=``) and recorded in the index
(:attr:`FrameIndex.format`): the classes labels index and the category map, the attributes kept, whether boxes
carry velocities, where ``num_lidar_pts`` comes from and the splits. Lyft Level 5 roots (see
:mod:`drivetrain.data.formats.lyft.tables`) are indexed the same way as nuScenes ones, except: labels index
``LYFT_CLASSES``; velocities are 0 (Lyft's metric has none); attributes are −1 (none); visibility is 0 (Lyft leaves
it empty); ``num_lidar_pts`` is counted from the key-frame ``LIDAR_TOP`` sweep (Lyft's tables hold −1), so every
key-frame lidar file is read; the splits are mmdetection3d's Lyft ``train``/``val``; ``meta["dataset"]`` is
``"lyft"``.

Saved as one ``.npz`` (numeric arrays, plus the strings as a JSON document stored as bytes), loaded with
``allow_pickle=False``.

The index also records what it was built from, so that it cannot silently describe other data:

- the dataset root *relative to the index file* (an index inside its root follows a copied or moved
  dataset; the absolute root is kept for information only);
- the size and SHA-256 of every table it read: loading refuses an index whose tables changed since
  (:class:`DataError` "stale index"), when the tables are present beside the data;
- the devkit's scene splits (``mini_train``, ``mini_val``, ``train``, ``val``, ...) restricted to the
  indexed scenes, so training and evaluation can take disjoint scenes without the devkit
  (:meth:`FrameIndex.split`).

File names stay inside the root: :func:`check_root` refuses a ``sample_data`` or ``map`` file name that is
absolute or has a ``..`` part (naming the table, the row and the value) before the devkit or the walk looks for
any file, and loading an index refuses such a name in its metadata (:mod:`drivetrain.data.table_paths`). The
root itself is the one the index was built from, or the one the caller names.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from drivetrain.data.errors import DataError
from drivetrain.data.formats.record import DatasetFormat
from drivetrain.data.formats.registry import FORMATS, detect_format, format_of, index_meta
from drivetrain.data.formats.schema import CAMERAS, LIDAR, TABLES
from drivetrain.data.index_check import check_index
from drivetrain.data.io import NPZ_ERRORS, read_points
from drivetrain.data.points_in_boxes import count_points_in_boxes
from drivetrain.data.table_paths import ANNOTATION_TABLES, check_root
from drivetrain.geometry.rigid import invert, transform, yaw_from_matrix
from drivetrain.safeio import json_files
from drivetrain.safeio.files import replacing
from drivetrain.safeio.reads import human_bytes, open_regular

__all__ = ["FrameIndex", "build_index", "check_root", "load_index", "save_index", "table_fingerprint"]

FORMAT = "drivetrain-frame-index/3"
# Tables a root without annotations may lack (a test split, as nuScenes' v1.0-test, ships boxes to nobody): read as
# empty, so its key frames are indexed without ground truth.
ARRAYS = (
    "timestamp",  # (F,) float64 seconds
    "scene_id",  # (F,) int64
    "frame_in_scene",  # (F,) int64
    "ego_pose",  # (F, 4, 4) float64 lidar → global
    "lidar2ego",  # (F, 4, 4) float64
    "intrinsics",  # (F, N, 3, 3) float64
    "cam2lidar",  # (F, N, 4, 4) float64
    "cam2ego",  # (F, N, 4, 4) float64 camera → ego (calibration)
    "cam_ego_pose",  # (F, N, 4, 4) float64 ego → global at the camera's timestamp
    "cam_timestamp",  # (F, N) float64 seconds
    "image_size",  # (F, N, 2) int64 (W, H)
    "box_offset",  # (F + 1,) int64: boxes of frame f are [box_offset[f], box_offset[f + 1])
    "boxes",  # (M, 9) float32 lidar frame
    "labels",  # (M,) int64
    "num_lidar_pts",  # (M,) int64
    "visibility",  # (M,) int64, 1..4 (0 = unknown)
    "attribute",  # (M,) int64 index into ATTRIBUTES, −1 = none
    "instance",  # (M,) int64 index into meta["instances"]
    "sweep_offset",  # (F + 1,) int64
    "sweep2lidar",  # (S, 4, 4) float64 sweep lidar → key-frame lidar
    "sweep_dt",  # (S,) float64 seconds, key-frame time − sweep time
)


@dataclass(frozen=True)
class FrameIndex:
    """Arrays (see ``ARRAYS``) and string metadata of every key frame, in scene order."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]  # root, version, classes, cameras, scenes, sample_tokens, image_files, ...; Lyft: dataset

    def __len__(self) -> int:
        return len(self.arrays["timestamp"])

    @property
    def format(self) -> DatasetFormat:
        """The dataset format the index was built from (its classes, splits, submission writer, metric)."""
        return format_of(self.meta)

    @property
    def num_cameras(self) -> int:
        """Cameras per frame, N."""
        return len(self.meta["cameras"])

    def boxes_of(self, frame: int) -> slice:
        """Rows of the box arrays (``boxes``, ``labels``, ...) that belong to ``frame``."""
        off = self.arrays["box_offset"]
        return slice(int(off[frame]), int(off[frame + 1]))

    def sweeps_of(self, frame: int) -> slice:
        """Rows of the sweep arrays (``sweep2lidar``, ``sweep_dt``) of ``frame``, most recent first."""
        off = self.arrays["sweep_offset"]
        return slice(int(off[frame]), int(off[frame + 1]))

    def scene_lengths(self) -> list[int]:
        """Frames per scene, scenes in index order."""
        return np.bincount(self.arrays["scene_id"], minlength=len(self.meta["scenes"])).tolist()

    def split(self, name: str) -> FrameIndex:
        """The frames of the scenes of devkit split ``name`` (e.g. ``mini_train``); DataError if unknown/empty."""
        splits = self.meta.get("splits", {})
        if name not in splits:
            raise DataError(f"unknown split {name!r}; this index has {sorted(splits)}", self.meta.get("root", "index"))
        if not splits[name]:
            raise DataError(f"split {name!r} holds none of this index's scenes", self.meta.get("root", "index"))
        return self.subset(splits[name])

    def subset(self, scenes: list[str]) -> FrameIndex:
        """The frames of the named scenes (in index order), with scene ids, offsets and metadata renumbered."""
        unknown = sorted(set(scenes) - set(self.meta["scenes"]))
        if unknown:
            raise ValueError(f"scenes: not in this index: {unknown}")
        keep_scene = np.isin(np.asarray(self.meta["scenes"]), list(scenes))
        frames = np.flatnonzero(keep_scene[self.arrays["scene_id"]])  # (F',)
        arr = self.arrays
        new_id = np.cumsum(keep_scene) - 1  # old scene id → new one
        per_frame = set(ARRAYS) - {"box_offset", "sweep_offset", *_BOX_ARRAYS, *_SWEEP_ARRAYS}
        out = {k: arr[k][frames] for k in per_frame}
        out["scene_id"] = new_id[arr["scene_id"][frames]]
        for per, offset in (("boxes", "box_offset"), ("sweeps", "sweep_offset")):
            spans = [np.arange(arr[offset][f], arr[offset][f + 1]) for f in frames]
            rows = np.concatenate(spans) if spans else np.zeros(0, np.int64)
            counts = [len(span) for span in spans]
            out[offset] = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
            keys = _BOX_ARRAYS if per == "boxes" else _SWEEP_ARRAYS
            out.update({k: arr[k][rows] for k in keys})
        meta = dict(self.meta)
        for key in _FRAME_META:
            meta[key] = [self.meta[key][f] for f in frames]
        meta["sweep_files"] = [self.meta["sweep_files"][s] for s in _rows(arr["sweep_offset"], frames)]
        meta["scenes"] = [n for n, k in zip(self.meta["scenes"], keep_scene, strict=True) if k]
        meta["scene_tokens"] = [t for t, k in zip(self.meta["scene_tokens"], keep_scene, strict=True) if k]
        meta["splits"] = {n: [s for s in names if s in meta["scenes"]] for n, names in self.meta["splits"].items()}
        return FrameIndex(out, meta)


# Arrays indexed by box and by sweep, and metadata lists indexed by frame (for FrameIndex.subset).
_BOX_ARRAYS = ("boxes", "labels", "num_lidar_pts", "visibility", "attribute", "instance")
_SWEEP_ARRAYS = ("sweep2lidar", "sweep_dt")
_FRAME_META = ("sample_tokens", "prev_tokens", "next_tokens", "image_files", "lidar_files")


def _rows(offset: np.ndarray, frames: np.ndarray) -> list[int]:
    return [r for f in frames for r in range(int(offset[f]), int(offset[f + 1]))]


def table_fingerprint(root: str | Path, version: str) -> dict[str, list[int | str]]:
    """``{table: [size in bytes, SHA-256]}`` of the tables under ``root/version`` that exist."""
    out: dict[str, list[int | str]] = {}
    for name in TABLES:
        path = Path(root) / version / f"{name}.json"
        if path.is_file():
            digest = hashlib.sha256()
            with path.open("rb") as f:
                for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                    digest.update(chunk)
            out[name] = [path.stat().st_size, digest.hexdigest()]
    return out


def build_index(
    root: str | Path,
    version: str = "v1.0-mini",
    *,
    cameras: tuple[str, ...] = CAMERAS,
    max_sweeps: int = 10,
    check_files: bool = True,
    progress: bool = True,
    dataset: str | DatasetFormat | None = None,
) -> FrameIndex:
    """Index every key frame of ``root/version`` (see the module docstring).

    ``dataset`` is a format (or its name in :data:`~drivetrain.data.formats.registry.FORMATS`: ``"nuscenes"``,
    ``"lyft"``), whose category check the root must pass; None tells it from the category table (each format's
    rule: every name a Lyft class is Lyft).

    Raises:
        DataError: naming the table folder when the tables are inconsistent (a dangling token, a missing or
            mistyped field): the devkit's own errors on such tables are reported this way, not as tracebacks.
    """
    if max_sweeps < 0:
        raise ValueError(f"max_sweeps: must be ≥ 0, got {max_sweeps}")
    if isinstance(dataset, str) and dataset not in FORMATS:
        raise ValueError(f"dataset: expected one of {tuple(FORMATS)} or None, got {dataset!r}")
    root = check_root(root, version, annotations=False)
    if dataset is None:
        fmt = detect_format(root, version)
    else:  # a format named by the caller: the root must be of it
        fmt = FORMATS[dataset] if isinstance(dataset, str) else dataset
        fmt.check_categories(root, version)
    try:
        return _build_index(root, version, cameras, max_sweeps, check_files, progress, fmt)
    except DataError:
        raise
    except (KeyError, AssertionError, TypeError, ValueError, IndexError, AttributeError) as err:
        # The devkit and the walk below index the tables by token and field without checking them.
        raise DataError(
            f"inconsistent nuScenes tables ({type(err).__name__}: {err}); regenerate or repair them", root / version
        ) from None


def _build_index(
    root: Path, version: str, cameras: tuple[str, ...], max_sweeps: int, check_files: bool, progress: bool,
    fmt: DatasetFormat,
) -> FrameIndex:  # fmt: skip
    try:
        from nuscenes import NuScenes
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("indexing needs the nuScenes devkit: pip install 'drivetrain[nuscenes]'") from err

    class Tables(NuScenes):
        def __load_table__(self, table_name: str) -> Any:  # the devkit's table reader: a missing ANNOTATION_TABLE is []
            path = Path(self.table_root) / f"{table_name}.json"
            if not path.is_file() and table_name in ANNOTATION_TABLES:
                return []
            try:  # check_root read these already; a table it does not know (lidarseg...) is bounded the same way
                return json_files.load(path)
            except json_files.JSONLimitError as err:
                raise DataError(str(err), path) from None
            except ValueError as err:
                raise DataError(f"table is not valid JSON ({err})", path) from None

    nusc = Tables(version=version, dataroot=str(root), verbose=False)
    walk = _IndexWalk(nusc, root, version, cameras, max_sweeps, fmt)
    scenes = sorted(nusc.scene, key=lambda s: s["name"])
    with tqdm(total=sum(s["nbr_samples"] for s in scenes), desc="index", unit="frame", disable=not progress) as bar:
        for scene_id, scene in enumerate(scenes):
            walk.scene(scene_id, scene, bar)
    arrays, meta = walk.finish()
    # Tables with null or NaN poses, calibrations or sizes yield non-finite matrices or boxes: refuse them here
    # rather than write an index that projects every box to nowhere.
    check_index(arrays, meta, root / version)
    if not np.isfinite(arrays["boxes"]).all():
        raise DataError("sample_annotation holds non-finite box values (translation, size or rotation)", root / version)
    index = FrameIndex(arrays, meta)
    if check_files:
        _check_files(index)
    return index


class _IndexWalk:
    """Walks the devkit's tables scene by scene, key frame by key frame, collecting the index columns."""

    def __init__(
        self, nusc: Any, root: Path, version: str, cameras: tuple[str, ...], max_sweeps: int, fmt: DatasetFormat
    ) -> None:
        self.nusc, self.root, self.version, self.cameras, self.max_sweeps = nusc, root, version, cameras, max_sweeps
        self.fmt = fmt
        self.class_of = fmt.category_to_class  # category → class
        self.label_of = {c: i for i, c in enumerate(fmt.classes)}
        attrs = fmt.attributes  # the attributes kept (Lyft: none, its object_action_* are in no detection metric)
        self.attr_of = {a["token"]: attrs.index(a["name"]) for a in nusc.attribute if a["name"] in attrs}
        self.cols: dict[str, list[Any]] = {k: [] for k in ARRAYS if k not in ("box_offset", "sweep_offset")}
        self.known_categories = set(fmt.categories)  # others are not of this format
        self.unknown_categories: Counter[str] = Counter()  # annotations left out: a category the format lacks
        self.bad_sizes = 0  # annotations left out: a size ≤ 0
        self.annotations = 0
        self.box_counts: list[int] = []
        self.sweep_counts: list[int] = []
        self.instance_id: dict[str, int] = {}
        self.meta: dict[str, Any] = {
            "format": FORMAT,
            "root": str(root.resolve()),
            "version": version,
            "classes": list(fmt.classes),
            "attributes": list(fmt.attributes),
            "cameras": list(cameras),
            "scenes": [],
            "scene_tokens": [],
            "sample_tokens": [],
            "prev_tokens": [],  # the sample before each key frame in its scene ("" at a scene start)
            "next_tokens": [],
            "image_files": [],
            "lidar_files": [],
            "sweep_files": [],
            "instances": [],
            "tables": table_fingerprint(root, version),
            "splits": fmt.splits(),
            **index_meta(fmt),
        }

    def scene(self, scene_id: int, scene: dict[str, Any], bar: Any) -> None:
        self.meta["scenes"].append(scene["name"])
        self.meta["scene_tokens"].append(scene["token"])
        sample_token, frame = scene["first_sample_token"], 0
        while sample_token:
            sample = self.nusc.get("sample", sample_token)
            self._key_frame(scene_id, frame, sample)
            sample_token, frame = sample["next"], frame + 1
            bar.update(1)

    def _key_frame(self, scene_id: int, frame: int, sample: dict[str, Any]) -> None:
        """One row of every per-frame column, plus the frame's boxes and sweeps."""
        nusc, cols, meta = self.nusc, self.cols, self.meta
        missing = [c for c in (*self.cameras, LIDAR) if c not in sample["data"]]
        if missing:
            raise DataError(
                f"sample {sample['token']} has no key-frame data for {missing}",
                self.root / self.version / "sample_data.json",
            )
        lidar_sd = nusc.get("sample_data", sample["data"][LIDAR])
        l2e = _calib(nusc, lidar_sd)
        lidar2global = _pose(nusc, lidar_sd) @ l2e
        global2lidar = invert(lidar2global)
        cols["timestamp"].append(lidar_sd["timestamp"] / 1e6)
        cols["scene_id"].append(scene_id)
        cols["frame_in_scene"].append(frame)
        cols["ego_pose"].append(lidar2global)
        cols["lidar2ego"].append(l2e)
        self._cameras(sample, global2lidar)
        meta["lidar_files"].append(lidar_sd["filename"])
        meta["sample_tokens"].append(sample["token"])
        meta["prev_tokens"].append(sample["prev"])
        meta["next_tokens"].append(sample["next"])
        self.box_counts.append(self._boxes(sample, global2lidar, lidar_sd["filename"]))
        self.sweep_counts.append(self._sweeps(lidar_sd, global2lidar))

    def _cameras(self, sample: dict[str, Any], global2lidar: np.ndarray) -> None:
        """Intrinsics, camera→lidar (through the global frame at the camera time), poses, times, sizes, files."""
        nusc = self.nusc
        intr, c2l, c2e, cam_pose, cam_time, size, files = [], [], [], [], [], [], []
        for cam in self.cameras:
            sd = nusc.get("sample_data", sample["data"][cam])
            cs = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
            intr.append(np.array(cs["camera_intrinsic"], dtype=np.float64).reshape(3, 3))
            c2e.append(_calib(nusc, sd))
            cam_pose.append(_pose(nusc, sd))
            c2l.append(global2lidar @ cam_pose[-1] @ c2e[-1])
            cam_time.append(sd["timestamp"] / 1e6)
            size.append((sd["width"], sd["height"]))
            files.append(sd["filename"])
        self.cols["intrinsics"].append(np.stack(intr))
        self.cols["cam2lidar"].append(np.stack(c2l))
        self.cols["cam2ego"].append(np.stack(c2e))
        self.cols["cam_ego_pose"].append(np.stack(cam_pose))
        self.cols["cam_timestamp"].append(np.array(cam_time, dtype=np.float64))
        self.cols["image_size"].append(np.array(size, dtype=np.int64))
        self.meta["image_files"].append(files)

    def _boxes(self, sample: dict[str, Any], global2lidar: np.ndarray, lidar_file: str) -> int:
        """The key frame's annotations of the detection classes, in the lidar frame; how many."""
        nusc, cols = self.nusc, self.cols
        n_boxes = 0
        for ann_token in sample["anns"]:
            ann = nusc.get("sample_annotation", ann_token)
            self.annotations += 1
            name = self.class_of.get(ann["category_name"])
            if name is None:
                if ann["category_name"] not in self.known_categories:  # a renamed or foreign category: said below
                    self.unknown_categories[ann["category_name"]] += 1
                continue
            if any(isinstance(v, int | float) and math.isfinite(v) and v <= 0 for v in ann["size"]):
                self.bad_sizes += 1  # a box of no extent: nothing to learn or match; said below (NaN: refused below)
                continue
            rot = global2lidar[:3, :3] @ transform(ann["rotation"], [0, 0, 0])[:3, :3]
            centre = global2lidar[:3, :3] @ np.asarray(ann["translation"]) + global2lidar[:3, 3]
            velocity = np.nan_to_num(nusc.box_velocity(ann_token), nan=0.0) if self.fmt.velocities else np.zeros(3)
            velocity = global2lidar[:3, :3] @ velocity
            w, length, h = ann["size"]
            cols["boxes"].append([*centre, length, w, h, yaw_from_matrix(rot), velocity[0], velocity[1]])
            cols["labels"].append(self.label_of[name])
            cols["num_lidar_pts"].append(ann["num_lidar_pts"])
            cols["visibility"].append(int(ann["visibility_token"] or 0))
            attrs = ann["attribute_tokens"]
            cols["attribute"].append(self.attr_of.get(attrs[0], -1) if attrs else -1)
            cols["instance"].append(self.instance_id.setdefault(ann["instance_token"], len(self.instance_id)))
            n_boxes += 1
        if self.fmt.count_points and n_boxes:
            cols["num_lidar_pts"][-n_boxes:] = self._count_points(lidar_file, cols["boxes"][-n_boxes:])
        return n_boxes

    def _count_points(self, lidar_file: str, boxes: list[list[float]]) -> list[int]:
        """Points of the key-frame sweep ``lidar_file`` inside each lidar-frame box (Lyft tables hold −1)."""
        points = read_points(self.root / lidar_file)  # (P, 5)
        return count_points_in_boxes(points[:, :3], np.asarray(boxes)[:, :7]).tolist()

    def _sweeps(self, lidar_sd: dict[str, Any], global2lidar: np.ndarray) -> int:
        """Up to ``max_sweeps`` earlier lidar sweeps: sweep→lidar transforms, Δt and files; how many."""
        sweeps, sd = 0, lidar_sd
        while sweeps < self.max_sweeps and sd["prev"]:
            sd = self.nusc.get("sample_data", sd["prev"])
            self.cols["sweep2lidar"].append(global2lidar @ _pose(self.nusc, sd) @ _calib(self.nusc, sd))
            self.cols["sweep_dt"].append((lidar_sd["timestamp"] - sd["timestamp"]) / 1e6)
            self.meta["sweep_files"].append(sd["filename"])
            sweeps += 1
        return sweeps

    def finish(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The index arrays and metadata."""
        table = self.root / self.version / "sample_annotation.json"
        if self.unknown_categories:
            names = ", ".join(f"{name!r} ({n})" for name, n in self.unknown_categories.most_common(5))
            warnings.warn(
                f"{table}: {sum(self.unknown_categories.values())} of {self.annotations} annotations have a category "
                f"the {self.fmt.title} taxonomy does not hold and are left out of the index: "
                f"{names}; rename them to the taxonomy's categories "
                "(drivetrain.data.formats.nuscenes.tables.CATEGORIES)",
                RuntimeWarning,
                stacklevel=3,
            )
        if self.bad_sizes:
            warnings.warn(
                f"{table}: {self.bad_sizes} of {self.annotations} annotations have a size of zero or below and are "
                "left out of the index",
                RuntimeWarning,
                stacklevel=3,
            )
        meta = self.meta
        meta["instances"] = list(self.instance_id)
        meta["splits"] = {name: [s for s in scenes if s in meta["scenes"]] for name, scenes in meta["splits"].items()}
        return _assemble(self.cols, self.box_counts, self.sweep_counts, len(self.cameras)), meta


def _calib(nusc: Any, sd: dict[str, Any]) -> np.ndarray:
    cs = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
    return transform(cs["rotation"], cs["translation"])


def _pose(nusc: Any, sd: dict[str, Any]) -> np.ndarray:
    pose = nusc.get("ego_pose", sd["ego_pose_token"])
    return transform(pose["rotation"], pose["translation"])


def _assemble(
    cols: dict[str, list[Any]], box_counts: list[int], sweep_counts: list[int], num_cams: int
) -> dict[str, np.ndarray]:
    def stack(key: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.asarray(cols[key], dtype=dtype).reshape(-1, *shape) if cols[key] else np.zeros((0, *shape), dtype)

    arrays = {
        "timestamp": stack("timestamp", (), np.float64),
        "scene_id": stack("scene_id", (), np.int64),
        "frame_in_scene": stack("frame_in_scene", (), np.int64),
        "ego_pose": stack("ego_pose", (4, 4), np.float64),
        "lidar2ego": stack("lidar2ego", (4, 4), np.float64),
        "intrinsics": stack("intrinsics", (num_cams, 3, 3), np.float64),
        "cam2lidar": stack("cam2lidar", (num_cams, 4, 4), np.float64),
        "cam2ego": stack("cam2ego", (num_cams, 4, 4), np.float64),
        "cam_ego_pose": stack("cam_ego_pose", (num_cams, 4, 4), np.float64),
        "cam_timestamp": stack("cam_timestamp", (num_cams,), np.float64),
        "image_size": stack("image_size", (num_cams, 2), np.int64),
        "box_offset": np.concatenate([[0], np.cumsum(box_counts, dtype=np.int64)]).astype(np.int64),
        "boxes": stack("boxes", (9,), np.float32),
        "labels": stack("labels", (), np.int64),
        "num_lidar_pts": stack("num_lidar_pts", (), np.int64),
        "visibility": stack("visibility", (), np.int64),
        "attribute": stack("attribute", (), np.int64),
        "instance": stack("instance", (), np.int64),
        "sweep_offset": np.concatenate([[0], np.cumsum(sweep_counts, dtype=np.int64)]).astype(np.int64),
        "sweep2lidar": stack("sweep2lidar", (4, 4), np.float64),
        "sweep_dt": stack("sweep_dt", (), np.float64),
    }
    return arrays


def _check_files(index: FrameIndex) -> None:
    root = Path(index.meta["root"])
    for rel in (
        [f for files in index.meta["image_files"] for f in files]
        + index.meta["lidar_files"]
        + index.meta["sweep_files"]
    ):
        if not (root / rel).is_file():
            raise DataError("file listed in sample_data.json is missing", root / rel)


def save_index(index: FrameIndex, path: str | Path) -> Path:
    """Write ``index`` to ``path`` (``.npz``; no pickled objects), recording the root relative to it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(index.meta, root_from_index=os.path.relpath(index.meta["root"], path.parent.resolve()))
    meta = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with replacing(path) as f:  # a link at the index's name (a dataset folder may come from anyone) is replaced
        np.savez(f, meta_json=meta, **index.arrays)
    return path


def load_index(path: str | Path, root: str | Path | None = None) -> FrameIndex:
    """Read an index written by :func:`save_index`.

    Args:
        path: the ``.npz`` file.
        root: dataset root; default: where the index says, relative to the index file (so a copied or moved
            dataset with its index inside reads its own files).

    Raises:
        DataError: naming the file when it is missing, unreadable, of another format, or stale (the root's
            tables differ from those the index was built from).
    """
    path = Path(path)
    try:  # a regular file (a FIFO would block), whose arrays do not expand: np.savez stores them uncompressed
        f = open_regular(path)
    except FileNotFoundError:
        raise DataError("index file does not exist (create it with `drivetrain data index`)", path) from None
    except OSError as err:
        raise DataError(f"cannot read the index ({err.strerror or type(err).__name__})", path) from None
    with f:
        _check_arrays_size(f, path)
        try:
            loaded = np.load(f, allow_pickle=False)
        except NPZ_ERRORS:  # numpy reads a non-zip as a (pickled) .npy
            raise DataError(
                "not a readable .npz index (truncated, or not a zip archive of arrays); rebuild it with "
                "`drivetrain data index`",
                path,
            ) from None
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise DataError("not a .npz index (a single .npy array); rebuild it with `drivetrain data index`", path)
        try:
            with loaded as npz:
                data = {k: npz[k] for k in npz.files}
        except NPZ_ERRORS as err:
            raise DataError(
                f"truncated or corrupt .npz index ({err}); rebuild it with `drivetrain data index`", path
            ) from None
    missing = [k for k in ("meta_json", *ARRAYS) if k not in data]
    if missing:
        raise DataError(f"index lacks arrays {missing}; rebuild it with `drivetrain data index`", path)
    try:
        meta = json_files.loads(data.pop("meta_json").tobytes().decode())
    except json_files.JSONLimitError as err:
        raise DataError(f"index metadata: {err}; rebuild the index", path) from None
    except (ValueError, UnicodeDecodeError) as err:
        raise DataError(f"index metadata is not valid JSON ({err}); rebuild the index", path) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise DataError(f"index format {found!r}, expected {FORMAT!r}; rebuild it", path)
    check_index(data, meta, path)
    if not isinstance(meta.get("root_from_index"), str) or not isinstance(meta.get("tables", {}), dict):
        raise DataError("index metadata lacks its root or table fingerprints; rebuild the index", path)
    if root is not None:
        meta["root"] = str(Path(root).resolve())
    else:
        meta["root"] = str((path.parent / meta["root_from_index"]).resolve())
    _check_fresh(meta, path)
    return FrameIndex(data, meta)


def _check_arrays_size(f: Any, path: Path) -> None:
    """DataError unless the zip archive ``f`` declares at most its own size in arrays: :func:`save_index` writes
    them uncompressed (``np.savez``), so more is a deflated member made to inflate (refused before inflating)."""
    size = os.fstat(f.fileno()).st_size
    try:
        with zipfile.ZipFile(f) as archive:
            declared = sum(m.file_size for m in archive.infolist())
    except (zipfile.BadZipFile, ValueError, EOFError):
        declared = 0  # not a zip: np.load's own refusal below names it
    finally:
        f.seek(0)
    if declared > size:
        raise DataError(
            f"its arrays declare {human_bytes(declared)} uncompressed, more than the file's {human_bytes(size)} (an "
            "index stores them uncompressed); rebuild it with `drivetrain data index`",
            path,
        )


def _check_fresh(meta: dict[str, Any], path: Path) -> None:
    """DataError if the tables under the root differ from those the index was built from."""
    built = meta.get("tables", {})
    tables = Path(meta["root"]) / meta["version"]
    if not tables.is_dir():  # only the data files were copied: nothing to compare with
        return
    now = table_fingerprint(meta["root"], meta["version"])
    compared = set(built) | set(now) if built else set()  # an annotation table added since counts as a change
    changed = sorted(name for name in compared if now.get(name) != built.get(name))
    if changed:
        raise DataError(
            f"stale index: the tables {changed} under {tables} changed since it was built "
            f"(regenerated data?); rebuild it with `drivetrain data index --root {meta['root']}`",
            path,
        )
