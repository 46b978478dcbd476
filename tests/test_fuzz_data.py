"""Fuzzed data files: a mutated frame index, nuScenes tables, camera images and lidar files each end in a
DataError naming the file (or, with ``on_error="skip"``, in a skipped frame that the batch counts) — or they
load into samples that are complete and finite. Never another exception, never NaN matrices or points."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from drivetrain.data import DataError, DatasetConfig, FrameDataset, collate
from drivetrain.data.dataset import Sample, Skipped
from drivetrain.data.formats.schema import TABLES
from drivetrain.data.index import ARRAYS, build_index, load_index
from drivetrain.data.index_check import check_index
from drivetrain.data.sweeps import choose_sweeps, sample_key
from helpers.fuzz import BUDGETS, Tally, fuzz_settings, mutated_bytes, mutated_document

INDEX = "drivetrain_index.npz"


@pytest.fixture(scope="module")
def root(synth_root, synth_index, tmp_path_factory) -> Path:
    """A private copy of the indexed synthetic dataset; each example restores what it changed."""
    copy = tmp_path_factory.mktemp("fuzz-data") / "data"
    shutil.copytree(synth_root, copy)
    return copy


def check_samples(dataset: FrameDataset, tally: Tally) -> None:
    """Every frame loads completely and finitely, or the first bad one raises DataError."""
    try:
        for i in range(len(dataset)):
            sample = dataset[i]
            assert np.isfinite(sample.lidar2img).all() and np.isfinite(sample.ego_pose).all()
            assert np.isfinite(sample.gt_boxes).all()
            if sample.images is not None:
                width, height = sample.image_size
                assert sample.images.shape == (dataset.index.num_cameras, height, width, 3)
            if sample.points is not None:
                assert sample.points.shape[1] == 5 and np.isfinite(sample.points[:, :3]).all()
    except DataError as err:
        assert err.path, err  # names the file
        tally("DataError")
        return
    tally("loaded")


@st.composite
def index_mutation(draw: st.DrawFn, arrays: dict[str, np.ndarray], meta: dict) -> tuple[dict, dict]:
    arrays, meta = dict(arrays), json.loads(json.dumps(meta))
    name = draw(st.sampled_from(ARRAYS))
    value = arrays[name]
    op = draw(st.sampled_from(["drop", "dtype", "rows", "nonfinite", "range", "meta"]))
    if op == "drop":
        del arrays[name]
    elif op == "dtype":
        arrays[name] = value.astype(draw(st.sampled_from([np.float32, np.int64, np.bool_, np.uint8])))
    elif op == "rows":
        arrays[name] = value[:-1] if draw(st.booleans()) and len(value) else np.concatenate([value, value[:1]])
    elif op in ("nonfinite", "range") and value.size:
        flat = value.astype(np.float64 if op == "nonfinite" else value.dtype).reshape(-1).copy()
        pos = draw(st.integers(0, flat.size - 1))
        bad = [np.nan, np.inf, -np.inf] if op == "nonfinite" else [-1, 10**6, -(10**6)]
        flat[pos] = draw(st.sampled_from(bad))
        arrays[name] = flat.reshape(value.shape).astype(value.dtype if op == "range" else np.float64)
    elif op == "meta":
        meta = draw(mutated_document(meta))
    return arrays, meta


def write_index(path: Path, arrays: dict[str, np.ndarray], meta: object) -> None:
    blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with path.open("wb") as f:
        np.savez(f, meta_json=blob, **arrays)


@pytest.mark.parametrize("examples", BUDGETS)
def test_mutated_index(root: Path, examples: int) -> None:
    tally = Tally("frame index")
    with np.load(root / INDEX, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "meta_json"}
        meta = json.loads(npz["meta_json"].tobytes().decode())
    original = (root / INDEX).read_bytes()
    fuzzed = root / "fuzzed_index.npz"

    @fuzz_settings(examples)
    @given(st.one_of(index_mutation(arrays, meta), mutated_bytes(original)))
    def case(mutation):
        if isinstance(mutation, bytes):
            fuzzed.write_bytes(mutation)
        else:
            write_index(fuzzed, *mutation)
        try:
            dataset = FrameDataset(fuzzed)
        except DataError as err:
            assert str(fuzzed) in str(err), err
            tally("DataError")
            return
        check_samples(dataset, tally)

    case()
    tally.report()


@pytest.mark.parametrize("examples", BUDGETS)
def test_mutated_tables(root: Path, examples: int) -> None:
    tally = Tally("nuScenes tables")
    originals = {name: (root / "v1.0-mini" / f"{name}.json").read_bytes() for name in TABLES}

    @fuzz_settings(examples)
    @given(st.sampled_from(TABLES), st.data())
    def case(name, data):
        path = root / "v1.0-mini" / f"{name}.json"
        rows = json.loads(originals[name])
        if data.draw(st.booleans()) and rows:  # edit records (a field's type or value, a key, a token)
            changed = data.draw(mutated_document(rows[: min(len(rows), 3)]))
            path.write_text(json.dumps(changed + rows[3:] if isinstance(changed, list) else changed))
        else:
            path.write_bytes(data.draw(mutated_bytes(originals[name])))
        try:
            index = build_index(root, progress=False, check_files=False)
        except DataError as err:
            assert err.path and str(root) in err.path, err
            tally("DataError")
        else:
            check_index(index.arrays, index.meta, "built")  # a built index is always consistent
            tally("indexed")
        finally:
            path.write_bytes(originals[name])

    case()
    tally.report()


def sensor_files(root: Path, kind: str) -> list[str]:
    meta = load_index(root / INDEX).meta
    if kind == "image":
        return sorted({f for row in meta["image_files"] for f in row})
    return sorted(set(meta["lidar_files"]) | set(meta["sweep_files"]))


@pytest.mark.parametrize("kind", ["image", "lidar"])
@pytest.mark.parametrize("examples", BUDGETS)
def test_mutated_sensor_files(root: Path, examples: int, kind: str) -> None:
    tally = Tally(f"{kind} files")
    files = sensor_files(root, kind)
    load = {"load_images": kind == "image", "load_points": kind == "lidar", "num_sweeps": int(kind == "lidar")}
    strict = FrameDataset(root / INDEX, DatasetConfig(**load))
    skipping = FrameDataset(root / INDEX, DatasetConfig(**load, on_error="skip"))

    @fuzz_settings(examples)
    @given(st.sampled_from(files), st.data())
    def case(name, data):
        path = root / name
        original = path.read_bytes()
        path.write_bytes(data.draw(mutated_bytes(original)))
        try:
            frames = [i for i in range(len(strict)) if name in _files_of(strict, i, kind)]
            for frame in frames:
                sub = Tally("frame")
                check_samples(_one(strict, frame), sub)
                tally(next(iter(sub.counts)))
                item = skipping[frame]  # the documented policy: warn, drop from the batch, count
                assert isinstance(item, Skipped) == ("DataError" in sub.counts)
                if isinstance(item, Skipped):
                    assert name in item.reason
                    other = skipping[(frame + 1) % len(skipping)]
                    if isinstance(other, Sample):
                        assert len(collate([item, other]).skipped) == 1
                else:
                    assert isinstance(item, Sample)
        finally:
            path.write_bytes(original)

    case()
    tally.report()


def _files_of(dataset: FrameDataset, frame: int, kind: str) -> list[str]:
    meta = dataset.index.meta
    if kind == "image":
        return meta["image_files"][frame]
    sweeps = dataset.index.sweeps_of(frame)
    key = sample_key(meta["sample_tokens"][frame])
    chosen = choose_sweeps(sweeps.stop - sweeps.start, key, dataset.config.sweep_config)
    return [meta["lidar_files"][frame], *(meta["sweep_files"][sweeps.start + int(c)] for c in chosen)]


class _one:
    """A one-frame view of a dataset for check_samples."""

    def __init__(self, dataset: FrameDataset, frame: int) -> None:
        self.dataset, self.frame, self.index = dataset, frame, dataset.index

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> Sample:
        return self.dataset[self.frame]
