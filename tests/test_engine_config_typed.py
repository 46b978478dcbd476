"""Each config section has one typed form: ``model.args`` is the spec's dataclass after loading, ``data.args`` the
source's, ``data.augment`` the augmentation recipe and ``model.init_from`` an :class:`InitFrom`; config.yaml holds
them as plain YAML, and a run saved with an older, partial spelling of the same values still resumes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from drivetrain.data.sources import SyntheticArgs
from drivetrain.detector.spec import ModelSpec, keywords
from drivetrain.engine import Checkpointer, ConfigError, Trainer, load_config
from drivetrain.engine.build import build_model
from drivetrain.engine.config import TrainConfig, config_diff, config_to_dict, from_dict
from drivetrain.engine.config_files import read_config_file
from drivetrain.engine.init_from import InitFrom
from drivetrain.engine.registry import _REGISTERED, register_model
from drivetrain.models.smoke import SmokeModel
from drivetrain.pipeline.augment.stage import AugmentConfig
from helpers.engine import SMOKE, overrides

ROOT = Path(__file__).resolve().parents[1]
TYPED = "test-typed-smoke"


@dataclass(frozen=True)
class _SmokeArgs:
    """SmokeModel's keyword arguments, declared (the built-in smoke spec declares none)."""

    channels: int = 3
    width: int = 32
    depth: int = 3
    dims: int = 2
    dropout: float = 0.1
    memory: bool = True
    dtype: str = "float32"


def _typed_smoke(args: _SmokeArgs) -> SmokeModel:
    """The smoke model built from its typed args (a builder whose spec declares them takes the one instance)."""
    return SmokeModel(**keywords(args))


@pytest.fixture
def typed_smoke():
    """The smoke model registered under a spec with typed arguments, for the length of one test."""
    register_model(ModelSpec(TYPED, build=_typed_smoke, args=_SmokeArgs, modalities=frozenset({"tensor"})))
    yield TYPED
    _REGISTERED["model"].pop(TYPED)


def test_model_args_load_as_the_specs_dataclass_with_every_field(typed_smoke):
    cfg = load_config(SMOKE, [f"model.name={typed_smoke}", "model.args={width: 8, dropout: 0}"])
    assert cfg.model.args == _SmokeArgs(width=8, dropout=0.0)  # the fields not given take the dataclass's defaults
    assert isinstance(cfg.model.args.dropout, float)  # YAML's 0 as the declared float
    model = build_model(cfg.model)  # the builder gets the instance
    assert model.head[0].out_features == 8 and model.dropout.p == 0.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.args.widht=8", "model.args.widht: unknown key; known keys: channels, depth, dims, dropout, dtype"),
        ("model.args.width=wide", "model.args.width: expected an integer, got str 'wide'"),
        ("model.args.memory=1", "model.args.memory: expected true or false, got int 1"),
    ],
)
def test_bad_model_args_are_one_line_naming_the_key(typed_smoke, override, message):
    with pytest.raises(ConfigError) as info:
        load_config(SMOKE, [f"model.name={typed_smoke}", override])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_builder_without_declared_args_keeps_the_mapping_as_written():
    cfg = load_config(SMOKE, ["model.args={width: 8}"])
    assert cfg.model.args == {"width": 8}  # the built-in smoke spec declares none: its signature checks them


def test_data_args_and_the_augmentation_load_as_their_dataclasses():
    cfg = load_config(ROOT / "configs" / "streampetr_tiny_aug.yaml", ["data.args.image_size=[320, 180]"])
    assert isinstance(cfg.data.args, SyntheticArgs) and cfg.data.args.image_size == (320, 180)
    assert isinstance(cfg.data.augment, AugmentConfig) and cfg.data.augment.camera is not None
    lidar = load_config(ROOT / "configs" / "pointpillars_tiny.yaml")
    assert lidar.data.augment.lidar is not None and lidar.data.args.use_dim == (0, 1, 2, 4)


def test_init_from_is_typed_and_a_bare_path_means_the_path():
    assert load_config(SMOKE, ["model.init_from=w.pt"]).model.init_from == InitFrom("w.pt", "auto", False)
    cfg = load_config(SMOKE, ["model.init_from={path: w.pt, strict: true}"])
    assert cfg.model.init_from == InitFrom("w.pt", strict=True)


@pytest.mark.parametrize("name", ["streampetr_tiny_aug", "pointpillars_tiny", "ssn_lyft", "smoke"])
def test_config_yaml_is_plain_data_that_loads_back_into_the_same_config(name, tmp_path):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml", ["model.init_from=w.pt"])
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False)  # tuples and nested dataclasses are plain YAML
    (tmp_path / "config.yaml").write_text(text)
    assert load_config(tmp_path / "config.yaml") == cfg
    assert from_dict(TrainConfig, yaml.safe_load(text)) == cfg


def test_a_saved_partial_args_mapping_is_no_difference_from_its_resolved_dataclass(typed_smoke):
    """config.yaml of an older drivetrain kept only the args keys a run set, and the augmentation as written."""
    config = ROOT / "configs" / "streampetr_tiny_aug.yaml"
    current = config_to_dict(load_config(config))
    written = read_config_file(config).data["data"]  # the keys its files set, with the base chain
    old = yaml.safe_load(yaml.safe_dump(current))
    old["data"]["args"], old["data"]["augment"] = written["args"], written["augment"]
    assert old["data"]["args"] != current["data"]["args"] and old["data"]["augment"] != current["data"]["augment"]
    assert config_diff(old, current) == []
    old["data"]["args"]["split"] = "mini_val"
    assert config_diff(old, current) == ["data.args.split: 'mini_val' → 'mini_train'"]

    typed = config_to_dict(load_config(SMOKE, [f"model.name={typed_smoke}", "model.args={width: 8}"]))
    old = {**typed, "model": {**typed["model"], "args": {"width": 8}}}
    assert config_diff(old, typed) == []
    assert config_diff({**typed, "model": {**typed["model"], "args": {"width": 9}}}, typed) == [
        "model.args.width: 9 → 8"
    ]


def test_a_run_saved_with_partial_model_args_resumes_and_a_changed_one_is_refused(typed_smoke, tmp_path):
    run = tmp_path / "run"
    fresh = load_config(SMOKE, overrides(run, f"model.name={typed_smoke}", "train.steps=2", "checkpoint.every=2"))
    Trainer(fresh).fit()
    ckpts = Checkpointer(run / "checkpoints")
    path, state = ckpts.load_latest()
    assert state["config"]["model"]["args"] == config_to_dict(fresh)["model"]["args"]  # every field saved
    state["config"]["model"]["args"] = {"width": 8}  # as an older drivetrain saved the same arguments
    ckpts.save(int(path.name.split("-")[1]), state)  # in its place
    resumed = Trainer(load_config(SMOKE, overrides(run, f"model.name={typed_smoke}", "train.steps=3")), resume="auto")
    assert resumed.fit().iteration == 3
    changed = overrides(run, f"model.name={typed_smoke}", "train.steps=4", "model.args.depth=2")
    with pytest.raises(ConfigError) as info:
        Trainer(load_config(SMOKE, changed), resume="auto")
    assert "was written with:\n  model.args.depth: 3 → 2\nto resume exactly" in str(info.value)  # that key alone
