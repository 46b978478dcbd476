"""Typed data arguments: every reading option of ``DatasetConfig`` is a ``data.args`` key of the ``frames`` and
``synthetic`` sources, settable from YAML and as an override, reaching the dataset — and checked when the config
is loaded, a wrong one named in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from drivetrain.cli.main import main
from drivetrain.data import DatasetConfig
from drivetrain.data.io import read_points
from drivetrain.data.sources import FramesArgs, SyntheticArgs
from drivetrain.data.sweeps import merge_sweeps
from drivetrain.engine import registry
from drivetrain.engine.build import build_dataset
from drivetrain.engine.config import ConfigError, DataConfig, load_config
from drivetrain.engine.config_files import read_config_file

ROOT = Path(__file__).resolve().parents[1]
LIDAR = ROOT / "configs" / "pointpillars_tiny.yaml"  # data.name synthetic
READING = [f.name for f in dataclasses.fields(DatasetConfig)]
# The reading options the sources did not take before they were typed (only from Python, DatasetConfig(...)).
UNREACHABLE = ("sweep_cache", "sweep_choice", "remove_close", "pad_empty_sweeps", "filter_empty", "sweep_seed")


def test_every_reading_option_is_a_data_arg_of_both_sources():
    assert len(READING) == 13
    for args in (FramesArgs, SyntheticArgs):
        assert set(READING) <= {f.name for f in dataclasses.fields(args)}
    assert {name: table[1] for name, table in registry.ARGS["data"].items()} == {
        "frames": "FramesArgs",
        "synthetic": "SyntheticArgs",
    }


def test_every_shipped_config_loads_with_its_typed_data_args():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        load_config(path)


def test_the_options_reach_the_dataset_from_yaml_and_overrides(synth_root, synth_index, tmp_path, capsys):
    index = synth_root / "drivetrain_index.npz"
    cache = tmp_path / "cache"
    # `data cache` prints the overrides that read what it built: they are what this run is given.
    build = ["data", "cache", "--index", str(index), "--sweeps", "1", "--use-dim", "0,1,2,4", "--choice", "nearest",
             "--remove-close", "--pad-empty-sweeps", "--seed", "3", "--out", str(cache), "--quiet"]  # fmt: skip
    assert main(build) == 0
    printed = capsys.readouterr().out.splitlines()[-1]
    overrides = [word for word in printed.split() if word.startswith("data.args.")]
    assert {o.split("=")[0].removeprefix("data.args.") for o in overrides} >= {*UNREACHABLE} - {"filter_empty"}
    config = read_config_file(LIDAR).data  # its base chain merged: a file that stands alone in tmp_path
    config["data"] = {"name": "frames", "batch_size": 2, "args": {
        "index": str(index), "split": "mini_val", "load_images": False,
        "filter_empty": False, "min_depth": 0.5, "min_size": 3.0,  # from the YAML file
    }}  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    dataset = build_dataset(load_config(path, overrides).data)
    expected = DatasetConfig(
        load_images=False, load_points=True, num_sweeps=1, use_dim=(0, 1, 2, 4), sweep_choice="nearest",
        remove_close=True, pad_empty_sweeps=True, sweep_seed=3, sweep_cache=str(cache), filter_empty=False,
        min_depth=0.5, min_size=3.0,
    )  # fmt: skip
    assert dataset.frames.config == expected
    sample = dataset[0]
    # The points come from the cache, and equal what merging the files with these settings gives.
    merged, _ = merge_sweeps(dataset.index, 0, synth_root, expected.sweep_config, read_points)
    np.testing.assert_array_equal(sample.points, merged)
    boxes = dataset.index.boxes_of(0)
    assert (dataset.index.arrays["num_lidar_pts"][boxes] == 0).any()  # boxes the default filter would drop ...
    assert len(sample.gt_labels) == boxes.stop - boxes.start  # ... kept: filter_empty=false


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "data.args.sweep_choice=sideways",
            "data.args.sweep_choice: expected one of 'random', 'nearest', got 'sideways'",
        ),
        ("data.args.sweep_cahce=/x", "data.args.sweep_cahce: unknown key; known keys: filter_empty, frames_per_scene"),
        ("data.args.remove_close=maybe", "data.args.remove_close: expected true or false, got str 'maybe'"),
        ("data.args.pad_empty_sweeps=2", "data.args.pad_empty_sweeps: expected true or false, got int 2"),
        ("data.args.num_sweeps=-1", "data.args.num_sweeps: must be ≥ 0, got -1"),
        ("data.args.use_dim=[0,1,7]", "data.args.use_dim: columns must lie in 0..4"),
        ("data.args.image_size=[320]", "data.args.image_size: expected a list of 2, got list [320]"),
        ("data.args.size=huge", "data.args.size: expected one of ['full', 'tiny'], got 'huge'"),
    ],
)
def test_a_wrong_data_arg_is_one_line_naming_it_before_anything_is_built(override, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", str(LIDAR), override, f"run.out_dir={run}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not run.exists()


def test_the_frames_source_names_a_missing_index():
    with pytest.raises(ConfigError, match=r"^data\.args\.index: required"):
        DataConfig(name="frames", args={"split": "val"})
    with pytest.raises(ConfigError, match=r"^data\.args\.sweep_cache: needs load_points=True"):
        DataConfig(name="drivetrain.data.sources:frames", args={"index": "i.npz", "sweep_cache": "c"})  # old spelling


@dataclasses.dataclass(frozen=True)
class _PluginArgs:
    size: int = 4  # samples


def test_a_plugin_dataset_may_declare_its_typed_args():
    registry.register_dataset("test-typed-data", lambda size=4: list(range(size)), args=_PluginArgs)
    try:
        with pytest.raises(ConfigError, match=r"^data\.args\.size: expected an integer, got str 'x'"):
            DataConfig(name="test-typed-data", args={"size": "x"})
        with pytest.raises(ConfigError, match=r"^data\.args\.sizes: unknown key; known keys: size"):
            DataConfig(name="test-typed-data", args={"sizes": 1})
        assert len(build_dataset(DataConfig(name="test-typed-data", args={"size": 3}))) == 3
    finally:
        registry._REGISTERED["data"].pop("test-typed-data")


def test_a_builder_without_typed_args_is_checked_when_built():
    cfg = DataConfig(name="smoke", args={"nope": 1})  # nothing declared: loading does not check
    with pytest.raises(ConfigError, match=r"^data\.args\.nope: unknown argument of smoke"):
        build_dataset(cfg)


def test_the_tiny_presets_focal_matches_the_one_its_image_size_gives(tmp_path):
    """The tiny preset records focal 1266.0 * 0.2 = 253.20000000000002; asking for its image size explicitly gives
    1266.0 * 320 / 1600 = 253.2: one setting, spelt two ways, not a different dataset. Another size still is."""
    from drivetrain.data.sources import synthetic

    small = {"root": str(tmp_path), "size": "tiny", "scenes": 1, "frames_per_scene": 1, "sweeps_per_sample": 0}
    first = synthetic(**small, generate=True)
    assert (tmp_path / "drivetrain_synth.json").read_text().count('"focal": 253.20000000000002') == 1
    assert len(synthetic(**small, image_size=[320, 180])) == len(first) == 1
    with pytest.raises(ValueError, match=r"focal: the data has 253\.20000000000002, asked for 265\.86"):
        synthetic(**small, image_size=[336, 189])


def test_generating_a_new_synthetic_set_says_so_and_names_a_set_beside_it_with_the_same_settings(tmp_path, capsys):
    """A typo in data.args.root (synth-tinny) would write a whole new set there unannounced: the run says it is
    generating one, and which finished set beside it has the very settings asked for; a set reused says nothing."""
    from drivetrain.data.sources import synthetic

    small = {"size": "tiny", "scenes": 1, "frames_per_scene": 1, "sweeps_per_sample": 0, "image_size": [160, 90]}
    synthetic(root=str(tmp_path / "synth-tiny"), **small, generate=True)
    first = capsys.readouterr().err
    there = tmp_path / "synth-tiny"
    assert f"{there} holds no finished synthetic dataset; generating a new set there (scenes: 1, key frames: 1" in first
    assert "beside it" not in first  # nothing like it there yet
    synthetic(root=str(tmp_path / "synth-tiny"), **small, generate=True)
    assert "generating" not in capsys.readouterr().err  # reused: nothing generated, nothing said
    synthetic(root=str(tmp_path / "synth-tinny"), **small, generate=True)
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("data.args.root:"))
    assert line.endswith(f"; {there} beside it holds one with these settings: data.args.root={there} uses it"), line
    synthetic(root=str(tmp_path / "other"), **{**small, "frames_per_scene": 2}, generate=True)
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("data.args.root:"))
    assert "beside it" not in line  # the sets there were generated with other settings
