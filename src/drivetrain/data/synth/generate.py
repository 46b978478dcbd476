"""Write a synthetic dataset in the nuScenes format: tables, camera JPEGs, lidar sweeps, a map mask.

The result loads with ``nuscenes.NuScenes(version='v1.0-mini', dataroot=root)`` and evaluates with the
devkit's ``DetectionEval`` on the ``mini_train`` / ``mini_val`` splits (scene names are the mini split's).
Every record the devkit reads is filled consistently: one ego pose per sample_data (key frames and
sweeps), calibrated sensors with w-x-y-z quaternions and camera intrinsics, instances with annotation
chains (so ``box_velocity`` recovers the velocity), ``num_lidar_pts`` from the simulated key-frame sweep,
attributes by class and motion, visibility from the rendered images. Scenes are independent (one RNG
per scene from the seed), so the output is identical for a seed, with any number of worker processes.

What is written is the format's: ``synth_format`` (a :class:`~drivetrain.data.formats.synth_format.SynthFormat`,
from the format's package) names the table folder, the static tables, the category each object is annotated as, the
fields in which its rows differ and the file names. The default is nuScenes'; Lyft's
(:mod:`drivetrain.data.formats.lyft.synth`) writes the same scenes as a Lyft Level 5 ``v1.01-train`` folder.

The generator writes only into a new or empty folder, or over a synthetic dataset of its own — finished or left
unfinished by a killed generation — which it deletes first (only what it made: :mod:`drivetrain.data.synth.outputs`).
Any other folder is refused before anything is written: a real dataset's tables are never overwritten. Its manifest
(:mod:`drivetrain.data.synth.manifest`) is the first file written and is marked complete after the last.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import struct
import zlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
from tqdm import tqdm

from drivetrain.data.errors import DataError
from drivetrain.data.formats.registry import DEFAULT
from drivetrain.data.formats.schema import CAMERAS, LIDAR, TABLES, token
from drivetrain.data.formats.synth_format import SynthFormat
from drivetrain.data.synth import raycast
from drivetrain.data.synth.config import SynthConfig
from drivetrain.data.synth.manifest import MANIFEST, folder_state, write_manifest
from drivetrain.data.synth.names import KEY_INTERVAL_US, SWEEP_INTERVAL_US, scene_start_us
from drivetrain.data.synth.outputs import remove_generated
from drivetrain.data.synth.render import background, corners_in_camera, make_rig, render
from drivetrain.data.synth.world import SceneLayout, make_layout
from drivetrain.geometry.rigid import invert, matrix_to_quaternion, transform, yaw_quaternion
from drivetrain.safeio.files import real_dir, write_inside

__all__ = ["generate"]

SUN_GLOBAL = np.array([0.35, 0.55, 0.76]) / np.linalg.norm([0.35, 0.55, 0.76])


def generate(
    root: str | Path,
    config: SynthConfig,
    *,
    workers: int = 1,
    progress: bool = True,
    synth_format: SynthFormat | None = None,
) -> dict[str, int]:
    """Generate ``config`` into ``root``. Returns record counts.

    Args:
        root: a new or empty folder (created), or one holding a synthetic dataset of ours, finished or not: that
            set is deleted first (see the module).
        config: what to generate.
        workers: processes, one scene each at a time.
        progress: show a progress bar.
        synth_format: what to write: a format's ``synth`` (``FORMATS[name].synth``; default: nuScenes', tables in
            ``v1.0-mini/``; Lyft's: a Lyft ``v1.01-train`` folder).

    Raises:
        DataError: ``root`` is not empty and holds no synthetic dataset of ours (no manifest), or its manifest is
            not the generator's; nothing is written.
    """
    synth = DEFAULT.synth if synth_format is None else synth_format
    root = Path(root)
    state, _ = folder_state(root)
    if state == "foreign":
        raise DataError(
            f"is not empty and holds no synthetic dataset of drivetrain (no {MANIFEST}); not writing into it — "
            "choose a new or empty folder",
            root,
        )
    if state in ("complete", "unfinished"):
        remove_generated(root, replacing=True)
    root.mkdir(parents=True, exist_ok=True)  # the folder named (--out): the folders below it are real ones
    write_manifest(root, config, synth.name, complete=False)  # first: a killed generation is recognisably ours
    version = synth.version
    real_dir(root / version, base=root, create=True)  # never written through a link (drivetrain.safeio.files)
    tables: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
    # the per-scene tables are filled below, "map" last
    tables.update(synth.static_tables(config.seed))
    jobs = [(root, config, i, synth) for i in range(len(config.scenes))]
    bar = tqdm(total=len(jobs) * config.samples_per_scene, desc="synth", unit="frame", disable=not progress)
    results: Iterator[dict[str, list[dict[str, Any]]]]
    if workers > 1:
        pool = ProcessPoolExecutor(max_workers=workers)
        results = pool.map(_scene_star, jobs)
    else:
        pool = None
        results = (_scene(*job, bar=bar) for job in jobs)
    try:
        for part in results:
            for name, rows in part.items():
                tables[name].extend(rows)
            if pool is not None:
                bar.update(config.samples_per_scene)
    finally:
        if pool is not None:
            pool.shutdown()
        bar.close()
    tables["map"] = [
        {
            "token": token(config.seed, "map"),
            "log_tokens": [row["token"] for row in tables["log"]],
            "category": "semantic_prior",
            "filename": synth.map_file(config.seed),
        }
    ]
    _write_png(root, tables["map"][0]["filename"], np.full((8, 8), 255, dtype=np.uint8))
    for name, rows in tables.items():
        write_inside(root, f"{version}/{name}.json", json.dumps(rows, indent=0).encode())
    write_manifest(root, config, synth.name, complete=True)  # last: every file is there
    return {name: len(rows) for name, rows in tables.items()}


def _scene_star(job: tuple[Path, SynthConfig, int, SynthFormat]) -> dict[str, list[dict[str, Any]]]:
    return _scene(*job, bar=None)


def _scene(
    root: Path, config: SynthConfig, index: int, synth: SynthFormat, bar: Any
) -> dict[str, list[dict[str, Any]]]:
    """All records of one scene; writes its images and lidar files."""
    scene = _SceneWriter(root, config, index, synth)
    for j in range(config.samples_per_scene):
        scene.key_frame(j)
        if bar is not None:
            bar.update(1)
    return scene.finish()


class _SceneWriter:
    """One scene's files and table rows, key frame by key frame (random draws in a fixed order)."""

    def __init__(self, root: Path, config: SynthConfig, index: int, synth: SynthFormat) -> None:
        self.root, self.config, self.synth = root, config, synth
        self.seed, self.name = config.seed, config.scenes[index]
        self.rng = np.random.default_rng([self.seed, index])
        duration = (config.samples_per_scene - 1) * KEY_INTERVAL_US / 1e6
        layout = make_layout(self.rng, duration, config.annotation_range)
        # per object its category in this format (None: scenery, not annotated), and a size that replaces its kind's
        annotated = synth.annotate([obj.name for obj in layout.objects])
        self.categories = [category for category, _ in annotated]
        if any(size is not None for _, size in annotated):
            objects = [
                obj if size is None else dataclasses.replace(obj, size=size)
                for obj, (_, size) in zip(layout.objects, annotated, strict=True)
            ]
            layout = dataclasses.replace(layout, objects=tuple(objects))
        self.layout = layout
        self.rig = make_rig(config.image_width, config.image_height, config.focal)
        self.backgrounds = [background(self.rig, c) for c in range(len(CAMERAS))]
        self.l2e = raycast.lidar2ego()
        self.t0 = scene_start_us(index)
        self.log_token, self.scene_token = self.token("log"), self.token("scene")
        self.sample_tokens = [self.token("sample", j) for j in range(config.samples_per_scene)]
        self.out: dict[str, list[dict[str, Any]]] = {
            k: [] for k in ("instance", "calibrated_sensor", "ego_pose", "sample", "sample_data", "sample_annotation")
        }
        self.out["log"] = [
            {
                "token": self.log_token,
                "logfile": f"synthetic-{self.name}",
                "vehicle": "synthetic",
                "date_captured": "2018-08-01",
                "location": "singapore-onenorth",
            }
        ]
        self.out["log"][0].update(synth.log_fields(self.name))
        self.calib = self._calibration()
        self.channel_chain: dict[str, list[dict[str, Any]]] = {c: [] for c in (*CAMERAS, LIDAR)}
        self.ann_by_object: dict[int, list[dict[str, Any]]] = {}

    def token(self, *parts: Any) -> str:
        return token(self.seed, self.name, *parts)

    def _calibration(self) -> dict[str, str]:
        """One calibrated_sensor row per camera and the lidar; their tokens by channel."""
        calib = {}
        sensors = [(cam, self.rig.cam2ego[c], self.rig.intrinsics[c].tolist()) for c, cam in enumerate(CAMERAS)]
        for channel, to_ego, intrinsic in [*sensors, (LIDAR, self.l2e, [])]:
            calib[channel] = self.token("calib", channel)
            self.out["calibrated_sensor"].append(
                {
                    "token": calib[channel],
                    "sensor_token": token(self.seed, "sensor", channel),
                    "translation": to_ego[:3, 3].tolist(),
                    "rotation": matrix_to_quaternion(to_ego[:3, :3]).tolist(),
                    "camera_intrinsic": intrinsic,
                }
            )
        return calib

    def _sample_data(
        self, channel: str, ts: int, key: bool, sample_tok: str, filename: str, size: tuple[int, int]
    ) -> None:
        """A sample_data row of ``channel`` at ``ts`` with its ego pose (linked into a chain in ``finish``)."""
        sd_token = self.token("sd", channel, ts)
        ego = _ego_pose(self.layout, (ts - self.t0) / 1e6)
        self.out["ego_pose"].append(
            {
                "token": sd_token,
                "timestamp": ts,
                "rotation": matrix_to_quaternion(ego[:3, :3]).tolist(),
                "translation": ego[:3, 3].tolist(),
            }
        )
        row = {
            "token": sd_token,
            "sample_token": sample_tok,
            "ego_pose_token": sd_token,
            "calibrated_sensor_token": self.calib[channel],
            "timestamp": ts,
            "fileformat": "jpg" if channel != LIDAR else "pcd",
            "is_key_frame": key,
            "height": size[1],
            "width": size[0],
            "filename": filename,
            "prev": "",
            "next": "",
        }
        self.channel_chain[channel].append(self.synth.sample_data_row(row, channel == LIDAR))

    def key_frame(self, j: int) -> None:
        """Key frame ``j``: its lidar sweeps, six camera images, annotations and sample row."""
        sample_tok, ts = self.sample_tokens[j], self.t0 + j * KEY_INTERVAL_US
        t = j * KEY_INTERVAL_US / 1e6
        ego = _ego_pose(self.layout, t)
        boxes_g = self.layout.boxes(t)  # (M, 9) global
        near = np.flatnonzero(np.linalg.norm(boxes_g[:, :2] - ego[:2, 3], axis=1) <= self.config.annotation_range)
        lidar_hits = self._lidar(ts, sample_tok)
        covered, visible = self._cameras(ts, sample_tok, ego, boxes_g[near], near)
        num_pts = np.bincount(lidar_hits[lidar_hits >= 0], minlength=len(self.layout.objects))
        for n, obj in enumerate(near):
            if self.categories[obj] is None:
                continue  # scenery in this format (Lyft: barriers and cones)
            frac = visible[n] / covered[n] if covered[n] > 0 else 0.0
            self._annotate(int(obj), j, boxes_g[obj], frac, int(num_pts[obj]))
        self.out["sample"].append(
            {
                "token": sample_tok,
                "timestamp": ts,
                "prev": self.sample_tokens[j - 1] if j else "",
                "next": self.sample_tokens[j + 1] if j + 1 < len(self.sample_tokens) else "",
                "scene_token": self.scene_token,
            }
        )

    def _lidar(self, ts: int, sample_tok: str) -> np.ndarray:
        """Write the sweeps before the key frame, then the key frame's; the object hit by each key-frame point."""
        lidar_hits = np.empty(0, dtype=np.int64)
        for k in range(self.config.sweeps_per_sample, -1, -1):
            ts_k = ts - k * SWEEP_INTERVAL_US
            filename = self.synth.lidar_file(self.name, ts_k, k == 0)
            points, hit = _sweep(self.layout, (ts_k - self.t0) / 1e6, self.config, self.l2e, self.rng)
            write_inside(self.root, filename, points.tobytes())
            if k == 0:
                lidar_hits = hit
            self._sample_data(LIDAR, ts_k, k == 0, sample_tok, filename, (0, 0))
        return lidar_hits

    def _cameras(
        self, ts: int, sample_tok: str, ego: np.ndarray, boxes_g: np.ndarray, near: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Render and write the six images (exposed at the key-frame time); per box, pixels covered and visible."""
        rig = self.rig
        labels = np.array([self.layout.objects[i].label for i in near], dtype=np.int64)
        ego_inv = invert(ego)
        boxes_e = _boxes_to_frame(boxes_g, ego_inv)
        covered = np.zeros(len(near), dtype=np.int64)
        visible = np.zeros(len(near), dtype=np.int64)
        for c, cam in enumerate(CAMERAS):
            corners = corners_in_camera(boxes_e, rig.cam2ego[c])
            sun_cam = invert(rig.cam2ego[c])[:3, :3] @ (ego_inv[:3, :3] @ SUN_GLOBAL)
            shot = render(rig, c, corners, labels, self.backgrounds[c], sun_cam)
            covered += shot.covered
            visible += np.bincount(shot.instance[shot.instance >= 0], minlength=len(near))
            filename = self.synth.camera_file(self.name, c, ts)
            jpeg = simplejpeg.encode_jpeg(shot.image, quality=self.config.jpeg_quality, colorspace="RGB")
            write_inside(self.root, filename, jpeg)  # a link at the name (or among its folders) is never followed
            self._sample_data(cam, ts, True, sample_tok, filename, (rig.width, rig.height))
        return covered, visible

    def _annotate(self, obj: int, j: int, box: np.ndarray, visible_fraction: float, num_lidar_pts: int) -> None:
        """The sample_annotation of object ``obj`` (global ``box``) in key frame ``j``."""
        o, frac = self.layout.objects[obj], visible_fraction
        self.ann_by_object.setdefault(obj, []).append(
            {
                "token": self.token("ann", obj, j),
                "sample_token": self.sample_tokens[j],
                "instance_token": self.token("instance", obj),
                "visibility_token": "1" if frac < 0.4 else "2" if frac < 0.6 else "3" if frac < 0.8 else "4",
                "attribute_tokens": [token(self.seed, "attribute", o.attribute)] if o.attribute else [],
                "translation": box[:3].tolist(),
                "size": [box[4], box[3], box[5]],  # nuScenes: width, length, height
                "rotation": yaw_quaternion(box[6]).tolist(),
                "prev": "",
                "next": "",
                "num_lidar_pts": num_lidar_pts,
                "num_radar_pts": 0,
            }
        )
        self.ann_by_object[obj][-1].update(self.synth.annotation_fields(self.seed, o.attribute))

    def finish(self) -> dict[str, list[dict[str, Any]]]:
        """Link the prev/next chains and add the instance and scene rows; the scene's tables."""
        out = self.out
        for rows in (*self.channel_chain.values(), *self.ann_by_object.values()):
            _link(rows)
        for rows in self.channel_chain.values():
            out["sample_data"].extend(rows)
        for obj, rows in sorted(self.ann_by_object.items()):
            out["sample_annotation"].extend(rows)
            out["instance"].append(
                {
                    "token": self.token("instance", obj),
                    "category_token": token(self.seed, "category", str(self.categories[obj])),
                    "nbr_annotations": len(rows),
                    "first_annotation_token": rows[0]["token"],
                    "last_annotation_token": rows[-1]["token"],
                }
            )
        out["scene"] = [
            {
                "token": self.scene_token,
                "log_token": self.log_token,
                "nbr_samples": len(self.sample_tokens),
                "first_sample_token": self.sample_tokens[0],
                "last_sample_token": self.sample_tokens[-1],
                "name": self.name,
                "description": f"synthetic straight road, ego at {self.layout.ego_speed:.1f} m/s, "
                f"{len(self.ann_by_object)} objects",
            }
        ]
        return out


def _ego_pose(layout: SceneLayout, t: float) -> np.ndarray:
    """``(4, 4)`` ego → global at scene time ``t``."""
    xy = layout.ego_xy(t)
    return transform(yaw_quaternion(layout.heading), [xy[0], xy[1], 0.0])


def _boxes_to_frame(boxes: np.ndarray, to_frame: np.ndarray) -> np.ndarray:
    """``(M, 9)`` boxes → the frame of the ``(4, 4)`` transform ``to_frame`` (rotations about z only here)."""
    out = boxes.copy()
    out[:, :3] = boxes[:, :3] @ to_frame[:3, :3].T + to_frame[:3, 3]
    dyaw = np.arctan2(to_frame[1, 0], to_frame[0, 0])
    out[:, 6] = (boxes[:, 6] + dyaw + np.pi) % (2 * np.pi) - np.pi
    out[:, 7:9] = boxes[:, 7:9] @ to_frame[:2, :2].T
    return out


def _sweep(
    layout: SceneLayout, t: float, config: SynthConfig, l2e: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Ray-cast one lidar sweep at scene time ``t``: points ``(P, 5)`` and the object each hit (−1 ground)."""
    ego = _ego_pose(layout, t)
    boxes_g = layout.boxes(t)
    labels = np.array([o.label for o in layout.objects], dtype=np.int64)
    boxes_l = _boxes_to_frame(boxes_g, invert(ego @ l2e))
    return raycast.cast(boxes_l, labels, -l2e[2, 3], config.lidar_rings, config.lidar_azimuths, config.lidar_range, rng)


def _link(rows: list[dict[str, Any]]) -> None:
    """Fill ``prev``/``next`` of records in time order."""
    rows.sort(key=lambda r: r.get("timestamp", 0))
    for a, b in itertools.pairwise(rows):
        a["next"], b["prev"] = b["token"], a["token"]


def _write_png(root: Path, filename: str, gray: np.ndarray) -> None:
    """A minimal 8-bit greyscale PNG as ``root/filename`` (the devkit's map mask only needs the file to exist and
    decode)."""
    h, w = gray.shape
    raw = b"".join(b"\x00" + gray[r].tobytes() for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    write_inside(root, filename, png)
