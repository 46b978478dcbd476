"""The sweep cache: each key frame's merged point cloud, built once, memory-mapped by the loader.

Merging ten sweeps means eleven file reads and ten transforms per key frame, every epoch; the lidar paper
(the SSN/PointPillars Lyft paper) pre-processed them into Python pickles (large, and unsafe to load).
``drivetrain data cache`` writes them once into a folder the loader maps without parsing anything:

``manifest.json``
    format and version, the settings the points were merged with (:class:`SweepConfig` fields and the
    storage dtype), the frames (sample tokens, and a digest per frame of everything its points come from:
    file names, sweep transforms and Δt), and per shard its frame range, point count, and the size and
    SHA-256 of each file. Written last: a folder without it is an unfinished build.
``shard-00000.points`` …
    the points of a run of frames (``frames_per_shard``), row after row, raw little-endian ``float32``
    (or ``float16``) × the stored columns: ``use_dim`` without Δt. Δt is the same for every point of a
    sweep, so it is kept once per part (key frame or sweep) instead of per point: the cache is that much
    smaller than the merged array (PointPillars' x, y, z, Δt: 12 instead of 16 bytes a point) and still
    lossless.
``shard-00000.npz``
    ``point_offset`` (frames + 1,) int64 and, per frame, its parts: ``part_offset`` (frames + 1,), and per
    part ``part_count`` int64 and ``part_dt`` float32. NumPy's format with ``allow_pickle=False``.
``shard-00000.json``
    that shard's manifest entry, written after its files: what makes a shard count as done, so an
    interrupted build resumes from the shards that are finished (and verified).
``build.json``
    the manifest without its shards, written first when a build starts. These two files, with their format
    marker, are what makes a folder a sweep cache: a build writes only into an empty folder or a cache, a
    ``manifest.json`` or ``build.json`` of another format is refused (never deleted), and ``--rebuild`` deletes
    only the files they name and the temporary files of our writers, never another file of the folder.

Loading (:class:`SweepCache`) checks that the cache was built with the settings asked for and that every
frame's digest matches the index in use; anything else is a :class:`DataError` that says which setting
or frame differs and the command that rebuilds it. ``float16`` storage halves the points file but rounds
x, y, z (to 1/64 m between 16 and 32 m, 1/32 m up to 64 m): it is an option, never the default.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from drivetrain.data.errors import DataError
from drivetrain.data.index import FrameIndex
from drivetrain.data.io import NPZ_ERRORS
from drivetrain.data.sweeps import DT_COLUMN, SweepConfig, merge_sweeps
from drivetrain.safeio import json_files
from drivetrain.safeio.files import open_output, replace_text
from drivetrain.safeio.reads import open_regular, zip_members_size

__all__ = ["CACHE_FORMAT", "BuildReport", "SweepCache", "build_cache", "frame_digests", "verify_cache"]

CACHE_FORMAT = "drivetrain-sweep-cache"
CACHE_VERSION = 1
MANIFEST = "manifest.json"
BUILD = "build.json"  # the head of the build under way (the manifest without its shards), written first
# The files of a cache, and the temporary files its writers leave when killed (see _build_shard, _write_json).
_SHARD = re.compile(r"^shard-\d{5}\.(points|npz|json)$")
_TEMP = re.compile(
    r"^(shard-\d{5}\.(points\.tmp|tmp\.npz)"
    r"|\.(shard-\d{5}|manifest|build)\.json\.tmp-\d+"  # safe_files.replace_text's
    r"|(shard-\d{5}|manifest|build)\.json\.tmp)$"  # of drivetrain before it
)
DTYPES = ("float32", "float16")


def frame_digests(index: FrameIndex) -> list[str]:
    """Per frame, a SHA-256 (16 hex digits) of what its merged points come from: token, lidar and sweep
    files, sweep transforms and time offsets. A changed index changes the digest of the frames it touches."""
    arr, meta = index.arrays, index.meta
    out = []
    for f in range(len(index)):
        sl = index.sweeps_of(f)
        h = hashlib.sha256()
        h.update(meta["sample_tokens"][f].encode())
        h.update(meta["lidar_files"][f].encode())
        for s in range(sl.start, sl.stop):
            h.update(meta["sweep_files"][s].encode())
        h.update(np.ascontiguousarray(arr["sweep2lidar"][sl], dtype=np.float64).tobytes())
        h.update(np.ascontiguousarray(arr["sweep_dt"][sl], dtype=np.float64).tobytes())
        out.append(h.hexdigest()[:16])
    return out


def _stored_columns(config: SweepConfig) -> list[int]:
    """Positions (within the merged array's columns) stored per point: all but Δt."""
    return [i for i, d in enumerate(config.use_dim) if d != DT_COLUMN]


def _settings(config: SweepConfig, dtype: str) -> dict[str, Any]:
    return {**config.settings(), "dtype": dtype}


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build_cache` did."""

    path: Path
    frames: int
    points: int
    bytes: int  # points + index files of every shard
    shards_built: int
    shards_reused: int


def build_cache(
    index: FrameIndex,
    root: Path,
    out: Path,
    config: SweepConfig,
    read: Callable[[Path], np.ndarray],
    dtype: str = "float32",
    frames_per_shard: int = 64,
    workers: int = 1,
    rebuild: bool = False,
    progress: Callable[[int], None] | None = None,
) -> BuildReport:
    """Write (or finish) the sweep cache of every frame of ``index`` into ``out``.

    Args:
        index: frames to cache (all of them, in index order).
        root: dataset root of the index's files.
        out: cache folder (created).
        config: how points are merged.
        read: ``.pcd.bin`` reader, ``(P, 5)`` float32.
        dtype: ``float32`` (lossless) or ``float16``.
        frames_per_shard: frames per shard file (the unit of resume and of verification).
        workers: processes building shards (1: in this process).
        rebuild: discard a cache of other settings or index at ``out`` instead of refusing.
        progress: called with the number of frames of every shard finished or reused.

    Raises:
        DataError: ``out`` holds a cache of other settings or frames (without ``rebuild``), or a lidar file
            is missing or corrupt (naming it).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
    if frames_per_shard < 1 or workers < 1:
        raise ValueError(f"frames_per_shard and workers must be ≥ 1, got {frames_per_shard}, {workers}")
    if out.exists() and not out.is_dir():
        raise DataError("exists and is not a folder; choose a folder for the sweep cache", out)
    out.mkdir(parents=True, exist_ok=True)
    head = _head(index, config, dtype, frames_per_shard)
    _claim(out, head, rebuild)
    ranges = [(s, min(s + frames_per_shard, len(index))) for s in range(0, len(index), frames_per_shard)]
    entries: dict[int, dict[str, Any]] = {}
    todo = []
    for k, (start, stop) in enumerate(ranges):
        entry = _finished_shard(out, k, start, stop)
        if entry is not None:
            entries[k] = entry
            if progress:
                progress(stop - start)
        else:
            todo.append((k, start, stop))
    reused = len(entries)
    jobs = [(index, root, out, config, read, dtype, k, start, stop) for k, start, stop in todo]
    for k, entry in _run(jobs, workers):
        entries[k] = entry
        if progress:
            progress(entry["frames"][1] - entry["frames"][0])
    manifest = {**head, "shards": [entries[k] for k in range(len(ranges))]}
    _write_json(out / MANIFEST, manifest)
    total_bytes = sum(f["bytes"] for e in manifest["shards"] for f in e["files"].values())
    return BuildReport(out, len(index), sum(e["points"] for e in manifest["shards"]), total_bytes, len(todo), reused)


def _head(index: FrameIndex, config: SweepConfig, dtype: str, frames_per_shard: int) -> dict[str, Any]:
    return {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        "settings": _settings(config, dtype),
        "columns": len(_stored_columns(config)),
        "frames_per_shard": frames_per_shard,
        "frames": {"tokens": list(index.meta["sample_tokens"]), "digests": frame_digests(index)},
    }


def _claim(out: Path, head: dict[str, Any], rebuild: bool) -> None:
    """Make ``out`` a cache of ``head``: keep finished shards of the same build, refuse or clear others.

    Only a folder that is empty or holds a sweep cache (a ``build.json`` or ``manifest.json`` of our format) is
    written to; ``rebuild`` deletes the files of the cache there (see :func:`_remove_cache`) and nothing else.
    """
    records = _cache_records(out)
    if records:
        previous = records[0]  # build.json (the build under way) before manifest.json (the finished one)
        same = all(previous.get(k) == head[k] for k in ("format", "version", "settings", "frames", "frames_per_shard"))
        if not same and not rebuild:
            raise DataError(
                f"holds a sweep cache of other settings or frames ({_differences(previous, head)}); pass "
                "--rebuild to replace it, or choose another --out",
                out,
            )
        if not same:
            _remove_cache(out, records)
    elif any(out.iterdir()):
        raise DataError(
            "is not empty and holds no sweep cache (no build.json or manifest.json); choose an empty or new --out "
            "(--rebuild replaces only a sweep cache)",
            out,
        )
    (out / MANIFEST).unlink(missing_ok=True)  # the manifest is rewritten once every shard is there
    _write_json(out / BUILD, head)


def _cache_records(out: Path) -> list[dict[str, Any]]:
    """The ``build.json`` and ``manifest.json`` in ``out`` (those present, in that order); DataError naming one
    that is not a sweep-cache record of ours (unreadable, or without our format marker)."""
    records = []
    for name in (BUILD, MANIFEST):
        path = out / name
        if not (path.exists() or path.is_symlink()):
            continue
        try:
            record = json_files.load(path)
        except (OSError, ValueError) as err:
            raise DataError(
                f"is not a drivetrain sweep-cache file (unreadable: {err}); not touching its folder", path
            ) from None
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        if found != CACHE_FORMAT:
            raise DataError(
                f"is not a drivetrain sweep-cache file (format {found!r}, expected {CACHE_FORMAT!r}); not touching "
                "its folder",
                path,
            )
        records.append(record)
    return records


def _remove_cache(out: Path, records: list[dict[str, Any]]) -> None:
    """Delete the files of the cache in ``out`` that ``records`` describe, and nothing else: each shard's files
    the manifest lists, the shards ``frames`` / ``frames_per_shard`` imply (an unfinished build), our temporary
    files, and the records themselves. Only names of our own pattern are deleted; a link is unlinked, never
    followed; a folder of such a name is left alone."""
    names = {BUILD, MANIFEST}
    for record in records:
        shards = record.get("shards")
        for entry in shards if isinstance(shards, list) else []:
            files = entry.get("files") if isinstance(entry, dict) else None
            if isinstance(files, dict):
                names.add(f"{entry.get('name')}.json")
                names.update(str(name) for name in files)
        frames, per_shard = record.get("frames"), record.get("frames_per_shard")
        tokens = frames.get("tokens") if isinstance(frames, dict) else None
        if isinstance(tokens, list) and isinstance(per_shard, int) and per_shard > 0:
            for k in range(-(-len(tokens) // per_shard)):
                names.update(f"shard-{k:05d}{suffix}" for suffix in (".points", ".npz", ".json"))
    for path in out.iterdir():
        listed = path.name in names and (path.name in (BUILD, MANIFEST) or _SHARD.match(path.name))
        if (listed or _TEMP.match(path.name)) and (path.is_symlink() or path.is_file()):
            path.unlink()


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    diffs = []
    for key, value in new.get("settings", {}).items():
        if old.get("settings", {}).get(key) != value:
            diffs.append(f"{key}: {old.get('settings', {}).get(key)!r} in the cache, {value!r} asked for")
    if old.get("frames") != new.get("frames"):
        diffs.append("the frames or their sweeps differ from the index")
    if old.get("frames_per_shard") != new.get("frames_per_shard"):
        old_fps, new_fps = old.get("frames_per_shard"), new.get("frames_per_shard")
        diffs.append(f"frames_per_shard {old_fps} in the cache, {new_fps} asked for")
    if old.get("format") != new.get("format") or old.get("version") != new.get("version"):
        diffs.append(f"format {old.get('format')} v{old.get('version')}")
    return "; ".join(diffs) or "unknown difference"


def _finished_shard(out: Path, k: int, start: int, stop: int) -> dict[str, Any] | None:
    """The manifest entry of shard ``k`` if it was finished and its files still hash to it."""
    path = out / f"shard-{k:05d}.json"
    if not path.is_file():
        return None
    try:
        entry = _read_json(path)
        if entry["frames"] != [start, stop]:
            return None
        for name, meta in entry["files"].items():
            if _file_digest(out / name) != (meta["bytes"], meta["sha256"]):
                return None
    except (DataError, KeyError, OSError):
        return None
    return entry


def _run(jobs: list[tuple[Any, ...]], workers: int) -> Iterator[tuple[int, dict[str, Any]]]:
    if workers == 1 or len(jobs) <= 1:
        for job in jobs:
            yield _build_shard(*job)
        return
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    # An executor, not multiprocessing.Pool: a worker that dies (killed, out of memory) breaks the pool and is
    # reported here, where Pool would wait for its result forever. Finished shards stay: a rerun resumes.
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx) as pool:
        pending = {pool.submit(_build_shard, *job) for job in jobs}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        except BrokenProcessPool:
            raise DataError(
                "a cache worker process died (killed or out of memory); the shards written so far are kept — run the "
                "same command again to finish the cache",
                None,
            ) from None
        finally:
            for future in pending:
                future.cancel()


def _build_shard(
    index: FrameIndex,
    root: Path,
    out: Path,
    config: SweepConfig,
    read: Callable[[Path], np.ndarray],
    dtype: str,
    k: int,
    start: int,
    stop: int,
) -> tuple[int, dict[str, Any]]:
    """Merge frames ``[start, stop)`` and write shard ``k`` (each file atomically, its entry last)."""
    columns = _stored_columns(config)
    point_offset, part_offset, part_count, part_dt = [0], [0], [], []
    name = f"shard-{k:05d}"
    tmp = out / f"{name}.points.tmp"
    tmp.unlink(missing_ok=True)  # a leftover (or a link: writing would go into its target)
    with open(tmp, "xb") as fh:
        for f in range(start, stop):
            points, parts = merge_sweeps(index, f, root, config, read)
            fh.write(np.ascontiguousarray(points[:, columns], dtype=np.dtype(dtype).newbyteorder("<")).tobytes())
            point_offset.append(point_offset[-1] + len(points))
            part_offset.append(part_offset[-1] + len(parts))
            part_count.extend(int(c) for c in parts[:, 0])
            part_dt.extend(parts[:, 1])
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out / f"{name}.points")
    tmp_npz = out / f"{name}.tmp.npz"
    with open_output(tmp_npz, "wb") as fh:  # a link at the temporary name is replaced, never written through
        np.savez(
            fh,
            point_offset=np.asarray(point_offset, np.int64),
            part_offset=np.asarray(part_offset, np.int64),
            part_count=np.asarray(part_count, np.int64),
            part_dt=np.asarray(part_dt, np.float32),
        )
    os.replace(tmp_npz, out / f"{name}.npz")
    files = {}
    for suffix in (".points", ".npz"):
        size, digest = _file_digest(out / f"{name}{suffix}")
        files[f"{name}{suffix}"] = {"bytes": size, "sha256": digest}
    entry = {"name": name, "frames": [start, stop], "points": point_offset[-1], "files": files}
    _write_json(out / f"{name}.json", entry)
    return k, entry


def _file_digest(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open_regular(path) as fh:  # a FIFO planted among the shards would block the digest forever
        while chunk := fh.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    replace_text(path, json.dumps(obj, indent=1))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json_files.load(path)
    except (OSError, ValueError) as err:
        raise DataError(f"unreadable cache file ({err})", path) from None


def verify_cache(path: Path) -> list[str]:
    """Problems of the cache at ``path``: missing files, wrong sizes or SHA-256 (empty if sound)."""
    manifest = _read_json(path / MANIFEST) if (path / MANIFEST).is_file() else None
    if manifest is None:
        return [f"{path / MANIFEST}: missing (an unfinished build; run `drivetrain data cache` again)"]
    if not isinstance(manifest, dict) or manifest.get("format") != CACHE_FORMAT:
        return [f"{path / MANIFEST}: not a drivetrain sweep-cache manifest (no format {CACHE_FORMAT!r})"]
    problems = []
    for entry in manifest["shards"]:
        for name, meta in entry["files"].items():
            file = path / name
            if not file.is_file():
                problems.append(f"{file}: missing")
                continue
            size, digest = _file_digest(file)
            if size != meta["bytes"]:
                problems.append(f"{file}: {size} bytes, the manifest says {meta['bytes']}")
            elif digest != meta["sha256"]:
                problems.append(f"{file}: SHA-256 differs from the manifest (corrupt)")
    return problems


class SweepCache:
    """Read side of a sweep cache: ``cache.points(token)`` → the merged ``(P, len(use_dim))`` float32 points.

    Args:
        path: the cache folder.
        index: the index in use (a split's subset is fine): every frame of it must be in the cache with the
            same digest.
        config: the merge settings asked for; the cache must have been built with them.

    Raises:
        DataError: naming the folder: unfinished build, other settings, frames missing or changed, or a
            shard file whose size differs from the manifest.
    """

    def __init__(self, path: str | Path, index: FrameIndex, config: SweepConfig) -> None:
        self.path = Path(path)
        if not (self.path / MANIFEST).is_file():
            raise DataError(
                "is not a finished sweep cache (no manifest.json); build or finish it with `drivetrain data cache`",
                self.path,
            )
        manifest = _read_json(self.path / MANIFEST)
        if manifest.get("format") != CACHE_FORMAT or manifest.get("version") != CACHE_VERSION:
            raise DataError(f"not a {CACHE_FORMAT} v{CACHE_VERSION} manifest", self.path / MANIFEST)
        asked = config.settings()
        stored = {k: v for k, v in manifest["settings"].items() if k != "dtype"}
        if stored != asked:
            diffs = [
                f"{k}: {stored.get(k)!r} in the cache, {v!r} asked for" for k, v in asked.items() if stored.get(k) != v
            ]
            raise DataError(
                f"sweep cache built with other settings ({'; '.join(diffs)}); rebuild it with `drivetrain data "
                "cache ... --rebuild` or point the loader at a matching cache",
                self.path,
            )
        self.config = config
        self.dtype = np.dtype(manifest["settings"]["dtype"]).newbyteorder("<")
        self.columns = int(manifest["columns"])
        row = {t: i for i, t in enumerate(manifest["frames"]["tokens"])}
        digests = manifest["frames"]["digests"]
        mine = frame_digests(index)
        missing = [t for t in index.meta["sample_tokens"] if t not in row]
        if missing:
            raise DataError(
                f"{len(missing)} frames of the index are not in the sweep cache (e.g. {missing[0]}); build the cache "
                "from this index",
                self.path,
            )
        changed = [t for t, d in zip(index.meta["sample_tokens"], mine, strict=True) if digests[row[t]] != d]
        if changed:
            raise DataError(
                f"stale sweep cache: {len(changed)} frames changed since it was built (e.g. {changed[0]}: its files "
                "or sweep transforms differ); rebuild it with `drivetrain data cache ... --rebuild`",
                self.path,
            )
        self._row = row
        self._shards = manifest["shards"]
        self._per_shard = int(manifest["frames_per_shard"])
        for entry in self._shards:
            for name, meta in entry["files"].items():
                file = self.path / name
                if not file.is_file() or file.stat().st_size != meta["bytes"]:
                    size = meta["bytes"]
                    raise DataError(f"shard file missing or of the wrong size (the manifest says {size} bytes)", file)
        self._open: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
        stored_cols = _stored_columns(config)
        self._dt_at = config.use_dim.index(DT_COLUMN) if DT_COLUMN in config.use_dim else None
        self._scatter = stored_cols

    def _shard(self, k: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if k not in self._open:  # opened lazily, so each loader worker maps its own view
            name = self._shards[k]["name"]
            path = self.path / f"{name}.npz"
            try:  # a regular file whose arrays declare no more than it holds (np.savez stores them uncompressed)
                declared, _ = zip_members_size(path)
                if declared > path.stat().st_size:
                    raise ValueError(f"its arrays declare {declared} bytes uncompressed, more than the file holds")
                with np.load(path, allow_pickle=False) as z:
                    meta = {key: z[key] for key in z.files}
                total = int(meta["point_offset"][-1])
            except (*NPZ_ERRORS, KeyError, IndexError, TypeError) as err:  # pickled, bad
                raise DataError(
                    f"unreadable sweep-cache shard ({type(err).__name__}: {err}); rebuild the cache with "
                    "drivetrain data cache --rebuild",
                    path,
                ) from None
            if total:
                data = np.memmap(self.path / f"{name}.points", dtype=self.dtype, mode="r", shape=(total, self.columns))
            else:
                data = np.zeros((0, self.columns), self.dtype)
            self._open[k] = (data, meta)
        return self._open[k]

    def points(self, token: str) -> np.ndarray:
        """The merged points of the frame with sample token ``token``: ``(P, len(use_dim))`` float32."""
        row = self._row[token]
        k, i = divmod(row, self._per_shard)
        data, meta = self._shard(k)
        lo, hi = int(meta["point_offset"][i]), int(meta["point_offset"][i + 1])
        out = np.empty((hi - lo, len(self.config.use_dim)), np.float32)
        out[:, self._scatter] = data[lo:hi]
        if self._dt_at is not None:
            p0, p1 = int(meta["part_offset"][i]), int(meta["part_offset"][i + 1])
            out[:, self._dt_at] = np.repeat(meta["part_dt"][p0:p1], meta["part_count"][p0:p1])
        return out
