"""Sweep merging (mmdetection3d's LoadPointsFromMultiSweeps) and the sweep cache built from it."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from drivetrain.cli.main import main
from drivetrain.data import DataError, DatasetConfig, FrameDataset, collate
from drivetrain.data.index import FrameIndex, build_index
from drivetrain.data.io import read_points
from drivetrain.data.sweep_cache import SweepCache, build_cache, verify_cache
from drivetrain.data.sweeps import SweepConfig, choose_sweeps, merge_sweeps, sample_key

PP = SweepConfig(num_sweeps=2, use_dim=(0, 1, 2, 4))  # PointPillars' columns: x, y, z, Δt


def mmdet3d_multisweep(
    key: np.ndarray, sweeps: list[dict], sweeps_num: int, use_dim: list[int], remove_close: bool, choices: np.ndarray
) -> np.ndarray:
    """A port of ``LoadPointsFromMultiSweeps.transform`` (mmdet3d/datasets/transforms/loading.py) over plain
    arrays, with the sweep transform of mmdetection3d 0.x (``p @ sensor2lidar_rotation.T + translation``) and
    the random draw handed in (``choices``)."""
    points = key.copy()
    points[:, 4] = 0
    out = [points]
    for idx in choices:
        sweep = sweeps[idx]
        pts = sweep["points"].copy()
        if remove_close:
            not_close = ~((np.abs(pts[:, 0]) < 1.0) & (np.abs(pts[:, 1]) < 1.0))
            pts = pts[not_close]
        pts[:, :3] = pts[:, :3] @ sweep["sensor2lidar_rotation"].T
        pts[:, :3] += sweep["sensor2lidar_translation"]
        pts[:, 4] = sweep["ts"]
        out.append(pts)
    return np.concatenate(out)[:, use_dim]


def port_inputs(index: FrameIndex, root: Path, frame: int) -> tuple[np.ndarray, list[dict]]:
    arr, meta = index.arrays, index.meta
    sl = index.sweeps_of(frame)
    sweeps = [
        {
            "points": read_points(root / meta["sweep_files"][s]),
            "sensor2lidar_rotation": arr["sweep2lidar"][s][:3, :3].astype(np.float32),
            "sensor2lidar_translation": arr["sweep2lidar"][s][:3, 3].astype(np.float32),
            "ts": np.float32(arr["sweep_dt"][s]),
        }
        for s in range(sl.start, sl.stop)
    ]
    return read_points(root / meta["lidar_files"][frame]), sweeps


@pytest.mark.parametrize("choice", ["random", "nearest"])
@pytest.mark.parametrize("remove_close", [False, True])
def test_merge_matches_a_port_of_load_points_from_multi_sweeps(synth_root, synth_index, choice, remove_close):
    config = replace(PP, choice=choice, remove_close=remove_close)
    for frame in range(len(synth_index)):
        key, sweeps = port_inputs(synth_index, synth_root, frame)
        choices = choose_sweeps(len(sweeps), sample_key(synth_index.meta["sample_tokens"][frame]), config)
        expected = mmdet3d_multisweep(key, sweeps, 2, [0, 1, 2, 4], remove_close, choices)
        points, parts = merge_sweeps(synth_index, frame, synth_root, config, read_points)
        np.testing.assert_array_equal(points, expected)
        assert parts[:, 0].sum() == len(points) and parts[0, 1] == 0.0
        np.testing.assert_array_equal(points[:, 3], np.repeat(parts[:, 1], parts[:, 0].astype(int)).astype(np.float32))


def test_sweep_choice_follows_the_original_rules():
    nearest = SweepConfig(num_sweeps=3, choice="nearest")
    random = SweepConfig(num_sweeps=3, choice="random", seed=7)
    np.testing.assert_array_equal(choose_sweeps(2, 0, random), [0, 1])  # at most N available: all, in order
    np.testing.assert_array_equal(choose_sweeps(10, 0, nearest), [0, 1, 2])  # test mode: the N most recent
    draws = [choose_sweeps(10, f, random) for f in range(20)]
    for d in draws:
        assert len(set(d.tolist())) == 3 and d.min() >= 0 and d.max() < 10  # without replacement
    np.testing.assert_array_equal(draws[5], choose_sweeps(10, 5, random))  # a function of (seed, frame)
    assert len({tuple(d) for d in draws}) > 1
    assert any(not np.array_equal(choose_sweeps(10, f, replace(random, seed=8)), draws[f]) for f in range(20))
    assert len(choose_sweeps(10, 0, SweepConfig(num_sweeps=0))) == 0


def test_sweep_points_land_in_the_key_frame_ground_plane(synth_root, synth_index):
    frame = int(np.argmax(np.diff(synth_index.arrays["sweep_offset"])))  # the frame with the most sweeps
    points, parts = merge_sweeps(synth_index, frame, synth_root, SweepConfig(num_sweeps=10), read_points)
    assert len(parts) > 2 and np.all(np.diff(parts[1:, 1]) > 0)  # older sweeps, larger Δt
    swept = points[points[:, 4] > 0]
    ground = swept[swept[:, 3] < 10]  # intensity of ground returns is 5–8 in the simulator
    np.testing.assert_allclose(ground[:, 2], -1.84, atol=1e-3)


def test_remove_close_drops_only_sweep_points_near_the_sensor(synth_root, synth_index, tmp_path):
    arrays = dict(synth_index.arrays)
    meta = dict(synth_index.meta)
    index = FrameIndex(arrays, meta)
    frame = 2
    sl = index.sweeps_of(frame)
    close = np.array([[0.5, -0.5, 0.0, 1.0, 0.0], [3.0, 0.2, 0.0, 1.0, 0.0]], np.float32)
    bin_path = tmp_path / "close.pcd.bin"
    close.tofile(bin_path)
    meta["sweep_files"] = list(meta["sweep_files"])
    meta["sweep_files"][sl.start] = str(bin_path)  # absolute: root / absolute == absolute
    meta["lidar_files"] = list(meta["lidar_files"])
    meta["lidar_files"][frame] = str(bin_path)
    kept, _ = merge_sweeps(index, frame, synth_root, SweepConfig(num_sweeps=1, choice="nearest"), read_points)
    dropped, _ = merge_sweeps(
        index, frame, synth_root, SweepConfig(num_sweeps=1, choice="nearest", remove_close=True), read_points
    )
    assert len(kept) == 4 and len(dropped) == 3  # the key frame keeps its close point; the sweep loses it
    assert np.abs(dropped[2:, :2]).max() >= 1.0


def test_pad_empty_sweeps_repeats_the_key_frame(synth_root):
    index = build_index(synth_root, max_sweeps=0, progress=False)
    config = SweepConfig(num_sweeps=3, pad_empty_sweeps=True)
    points, parts = merge_sweeps(index, 0, synth_root, config, read_points)
    key, _ = merge_sweeps(index, 0, synth_root, SweepConfig(), read_points)
    assert len(parts) == 4 and np.all(parts[:, 1] == 0)
    np.testing.assert_array_equal(points, np.concatenate([key] * 4))


def test_bad_sweep_settings_are_named():
    for kwargs, field in [
        ({"num_sweeps": -1}, "num_sweeps"),
        ({"use_dim": (0, 5)}, "use_dim"),
        ({"use_dim": (0, 0)}, "use_dim"),
        ({"choice": "first"}, "choice"),
    ]:
        with pytest.raises(ValueError, match=field):
            SweepConfig(**kwargs)
    with pytest.raises(ValueError, match="sweep_cache"):
        DatasetConfig(sweep_cache="x")


# ---- the cache ------------------------------------------------------------------------------------------


def _build(synth_root, synth_index, out, config=PP, **kw):
    return build_cache(synth_index, synth_root, out, config, read_points, frames_per_shard=5, **kw)


def _dataset(synth_root, config=PP, cache=None, split=None):
    dc = DatasetConfig(
        load_images=False,
        load_points=True,
        num_sweeps=config.num_sweeps,
        use_dim=config.use_dim,
        sweep_choice=config.choice,
        remove_close=config.remove_close,
        sweep_cache=None if cache is None else str(cache),
    )
    return FrameDataset(synth_root / "drivetrain_index.npz", dc, split=split)


def test_cached_points_equal_merging_on_the_fly(synth_root, synth_index, tmp_path):
    report = _build(synth_root, synth_index, tmp_path / "c")
    assert report.frames == len(synth_index) and report.shards_built == 3 and report.shards_reused == 0
    fly, cached = _dataset(synth_root), _dataset(synth_root, cache=tmp_path / "c")
    total = 0
    for f in range(len(fly)):
        a, b = fly[f].points, cached[f].points
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_array_equal(a, b)
        total += len(a)
    assert total == report.points
    # 12 bytes a point (x, y, z) instead of the merged array's 16: Δt is stored once per sweep
    points_bytes = sum(p.stat().st_size for p in (tmp_path / "c").glob("*.points"))
    assert points_bytes == 12 * total
    assert verify_cache(tmp_path / "c") == []


def test_a_split_reads_its_frames_from_a_cache_of_the_whole_index(synth_root, synth_index, tmp_path):
    _build(synth_root, synth_index, tmp_path / "c")
    fly = _dataset(synth_root, split="mini_val")
    cached = _dataset(synth_root, cache=tmp_path / "c", split="mini_val")
    assert len(cached) < len(synth_index)
    for f in range(len(fly)):
        np.testing.assert_array_equal(fly[f].points, cached[f].points)


def test_float16_cache_rounds_only_the_coordinates(synth_root, synth_index, tmp_path):
    _build(synth_root, synth_index, tmp_path / "h", dtype="float16")
    fly, cached = _dataset(synth_root), _dataset(synth_root, cache=tmp_path / "h")
    for f in range(len(fly)):
        a, b = fly[f].points, cached[f].points
        # float16 keeps 11 significant bits: the rounding error is at most half a unit in the last place
        half_ulp = np.spacing(np.abs(a[:, :3]).astype(np.float16)).astype(np.float32) / 2
        assert np.all(np.abs(a[:, :3] - b[:, :3]) <= half_ulp)
        np.testing.assert_array_equal(a[:, 3], b[:, 3])  # Δt is stored per sweep in float32
    assert sum(p.stat().st_size for p in (tmp_path / "h").glob("*.points")) == 6 * sum(
        len(fly[f].points) for f in range(len(fly))
    )


def test_cache_of_other_settings_is_refused_with_the_difference(synth_root, synth_index, tmp_path):
    _build(synth_root, synth_index, tmp_path / "c")
    with pytest.raises(DataError, match="num_sweeps: 2 in the cache, 3 asked for"):
        _dataset(synth_root, config=replace(PP, num_sweeps=3), cache=tmp_path / "c")
    with pytest.raises(DataError, match="other settings"):
        _build(synth_root, synth_index, tmp_path / "c", config=replace(PP, choice="nearest"))
    report = _build(synth_root, synth_index, tmp_path / "c", config=replace(PP, choice="nearest"), rebuild=True)
    assert report.shards_built == 3 and report.shards_reused == 0
    _dataset(synth_root, config=replace(PP, choice="nearest"), cache=tmp_path / "c")


def test_stale_cache_is_refused_when_the_index_changes(synth_root, synth_index, tmp_path):
    _build(synth_root, synth_index, tmp_path / "c")
    arrays = dict(synth_index.arrays, sweep_dt=synth_index.arrays["sweep_dt"] + 0.01)
    changed = FrameIndex(arrays, synth_index.meta)
    with pytest.raises(DataError, match="stale sweep cache"):
        SweepCache(tmp_path / "c", changed, PP)
    with pytest.raises(DataError, match="other settings or frames"):
        build_cache(changed, synth_root, tmp_path / "c", PP, read_points, frames_per_shard=5)


def test_interrupted_build_resumes_from_finished_shards(synth_root, synth_index, tmp_path):
    out = tmp_path / "c"
    _build(synth_root, synth_index, out)
    reference = {p.name: p.read_bytes() for p in out.glob("shard-*")}
    # as if killed while writing shard 1: its entry is missing, a temporary file is left, no manifest
    (out / "shard-00001.json").unlink()
    (out / "shard-00001.points").rename(out / "shard-00001.points.tmp")
    (out / "manifest.json").unlink()
    with pytest.raises(DataError, match="not a finished sweep cache"):
        _dataset(synth_root, cache=out)
    report = _build(synth_root, synth_index, out)
    assert report.shards_built == 1 and report.shards_reused == 2
    assert {p.name: p.read_bytes() for p in out.glob("shard-*")} == reference


def test_corrupt_shard_is_found_and_rebuilt(synth_root, synth_index, tmp_path):
    out = tmp_path / "c"
    _build(synth_root, synth_index, out)
    path = out / "shard-00002.points"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    problems = verify_cache(out)
    assert len(problems) == 1 and "shard-00002.points" in problems[0] and "SHA-256" in problems[0]
    report = _build(synth_root, synth_index, out)
    assert report.shards_built == 1 and verify_cache(out) == []
    path.write_bytes(path.read_bytes()[:-4])  # truncated after the build
    with pytest.raises(DataError, match="wrong size"):
        _dataset(synth_root, cache=out)


def test_a_shard_holding_pickled_objects_is_a_data_error_naming_it(synth_root, synth_index, tmp_path):
    out = tmp_path / "c"
    _build(synth_root, synth_index, out)
    shard = out / "shard-00000.npz"
    size = shard.stat().st_size
    with open(shard, "wb") as f:  # what a hostile or broken writer could leave: an object array
        np.savez(f, point_offset=np.array([{"not": "numbers"}], dtype=object))
    assert shard.stat().st_size <= size
    with open(shard, "ab") as f:  # padded to the size the manifest records (a zip tolerates trailing bytes)
        f.write(b"\0" * (size - shard.stat().st_size))
    dataset = _dataset(synth_root, cache=out)
    with pytest.raises(DataError, match=r"shard-00000\.npz: unreadable sweep-cache shard"):
        dataset[0]


def test_cache_refuses_a_folder_that_holds_something_else(synth_root, synth_index, tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not empty"):
        _build(synth_root, synth_index, tmp_path / "c")
    assert (tmp_path / "c" / "notes.txt").read_text() == "mine"


def test_parallel_build_writes_the_same_bytes(synth_root, synth_index, tmp_path):
    _build(synth_root, synth_index, tmp_path / "one")
    _build(synth_root, synth_index, tmp_path / "two", workers=2)
    for p in sorted((tmp_path / "one").glob("shard-*")):
        assert p.read_bytes() == (tmp_path / "two" / p.name).read_bytes(), p.name


def test_a_cache_worker_that_dies_is_reported_not_waited_for(synth_root, synth_index, tmp_path):
    from helpers.dying import read_points_then_die

    with pytest.raises(DataError, match="a cache worker process died"):
        build_cache(synth_index, synth_root, tmp_path / "c", PP, read_points_then_die, frames_per_shard=5, workers=2)
    _build(synth_root, synth_index, tmp_path / "c")  # the same command again finishes the cache


def test_loader_batches_points_from_the_cache(synth_root, synth_index, tmp_path):
    _build(synth_root, synth_index, tmp_path / "c")
    dataset = _dataset(synth_root, cache=tmp_path / "c")
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, collate_fn=collate, num_workers=1)
    batch = next(iter(loader))
    assert batch.points.tensor.shape[-1] == 4 and batch.points.sizes.tolist() == [
        len(dataset[i].points) for i in range(3)
    ]


def test_cli_builds_verifies_and_reports(synth_root, tmp_path, capsys):
    out = tmp_path / "cli"
    index = synth_root / "drivetrain_index.npz"
    args = ["data", "cache", "--index", str(index), "--sweeps", "2", "--use-dim", "0,1,2,4", "--out", str(out)]
    assert main([*args, "--quiet", "--frames-per-shard", "5"]) == 0
    printed = capsys.readouterr().out
    assert "12 frames" in printed and "KiB per frame" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["num_sweeps"] == 2 and manifest["settings"]["use_dim"] == [0, 1, 2, 4]
    assert main(["data", "cache", "--out", str(out), "--verify"]) == 0
    shutil.copy(out / "shard-00000.npz", out / "shard-00001.npz")
    assert main(["data", "cache", "--out", str(out), "--verify"]) == 1
    assert "shard-00001.npz" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="use_dim"):
        main(["data", "cache", "--index", str(index), "--use-dim", "0,7", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="--index is required"):
        main(["data", "cache", "--out", str(tmp_path / "x")])
