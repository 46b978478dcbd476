"""Typed configs: YAML + overrides map onto the dataclasses; bad keys, types, syntax and files fail clearly."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest

from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.engine.config import TrainConfig, config_diff, config_to_dict, from_dict
from helpers.engine import SMOKE, overrides


def test_smoke_config_loads_with_typed_values() -> None:
    cfg = load_config(SMOKE)
    assert isinstance(cfg, TrainConfig)
    assert cfg.model.name == "smoke" and cfg.optim.groups[0].modules == ["backbone"]
    assert isinstance(cfg.optim.lr, float)


def test_overrides_set_nested_values_parsed_as_yaml() -> None:
    cfg = load_config(SMOKE, ["optim.lr=1e-4", "precision.mode=bf16", "speed.activation_checkpointing=[backbone]"])
    assert cfg.optim.lr == 1e-4  # YAML 1.1 reads 1e-4 as a string; float fields accept it
    assert cfg.precision.mode == "bf16"
    assert cfg.speed.activation_checkpointing == ["backbone"]


def test_defaults_round_trip_through_a_plain_dict() -> None:
    cfg = load_config(SMOKE)
    assert from_dict(TrainConfig, config_to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lrr=0.1", "optim.lrr: unknown key"),
        ("nosuch.key=1", "nosuch: unknown key"),
        ("optim.lr=fast", "optim.lr: expected a number"),
        ("train.steps=2.5", "train.steps: expected an integer"),
        ("train.steps=0", "train.steps: must be ≥ 1"),
        ("log.tensorboard=maybe", "log.tensorboard: expected true or false"),
        ("precision.mode=fp8", "precision.mode: expected one of"),
        ("optim.groups=[{modules: [backbone], lr_multt: 2}]", "optim.groups[0].lr_multt: unknown key"),
        ("speed.compile=backbone", "speed.compile: expected a list"),
        ("data.persistent_workers=true", "data.persistent_workers: needs data.num_workers > 0"),
    ],
)
def test_bad_keys_and_values_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        load_config(SMOKE, [override])
    assert str(info.value).startswith(f"override {override}: "), info.value  # typed here: no file holds it


@pytest.mark.parametrize("override", ["optim.lr", "=3", "optim..lr=1", "optim.lr=[unclosed"])
def test_bad_override_syntax_is_an_error(override: str) -> None:
    with pytest.raises(ConfigError, match="override"):
        load_config(SMOKE, [override])


def test_missing_and_malformed_files_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(scalar)


def test_unknown_model_argument_is_an_error(tmp_path: Path) -> None:
    cfg = load_config(SMOKE, overrides(tmp_path, "model.args.widht=4"))
    with pytest.raises(ConfigError, match=r"model.args.widht: unknown argument"):
        Trainer(cfg)


def test_unknown_module_in_switches_is_an_error(tmp_path: Path) -> None:
    cfg = load_config(SMOKE, overrides(tmp_path, "speed.activation_checkpointing=[neck]"))
    with pytest.raises(ConfigError, match=r"speed\.activation_checkpointing: the model has no module 'neck'"):
        Trainer(cfg)
    cfg = load_config(SMOKE, overrides(tmp_path, "optim.groups=[{modules: [neck]}]"))
    with pytest.raises(ConfigError, match=r"optim.groups\[0\].modules: no trainable parameter under 'neck'"):
        Trainer(cfg)


def test_resume_with_a_different_config_names_the_keys_and_both_ways_forward_work(tmp_path: Path) -> None:
    Trainer(load_config(SMOKE, overrides(tmp_path, "train.steps=2"))).fit()
    changed = load_config(SMOKE, overrides(tmp_path, "train.steps=4", "optim.lr=0.5", "optim.groups=[]"))
    with pytest.raises(ConfigError, match=r"optim.lr: 0.01 → 0.5") as info:
        Trainer(changed, resume="auto")
    message = str(info.value)
    undo = re.search(r"drop the change \(or override (.*?)\);", message)
    assert undo is not None, message  # the saved values, as overrides that undo the change
    groups = 'optim.groups=[{"modules": ["backbone"], "lr_mult": 0.5, "weight_decay": null}]'  # the saved groups
    assert shlex.split(undo.group(1)) == [groups, "optim.lr=0.01"], message
    init = re.search(r"model\.init_from=(\S+) run\.out_dir=NEW_DIR", message)
    assert init is not None, message
    # Each way it names works: the undo resumes, the change trains a new run from the checkpoint's weights.
    Trainer(
        load_config(SMOKE, [*overrides(tmp_path, "train.steps=4", "optim.lr=0.5"), *shlex.split(undo.group(1))]),
        resume="auto",
    )
    fresh = overrides(
        tmp_path / "new", "train.steps=1", "optim.lr=0.5", f"model.init_from={shlex.split(init.group(1))[0]}"
    )
    Trainer(load_config(SMOKE, fresh)).fit()
    Trainer(load_config(SMOKE, overrides(tmp_path, "train.steps=4", "log.every=2")), resume="auto")  # allowed


def test_fresh_start_into_a_run_with_checkpoints_is_refused(tmp_path: Path) -> None:
    Trainer(load_config(SMOKE, overrides(tmp_path, "train.steps=1"))).fit()
    with pytest.raises(ConfigError, match="already holds checkpoints; pass --resume auto"):
        Trainer(load_config(SMOKE, overrides(tmp_path, "train.steps=1")))


def test_config_diff_ignores_resume_safe_keys() -> None:
    a = config_to_dict(load_config(SMOKE))
    b = config_to_dict(load_config(SMOKE, ["train.steps=999", "log.every=3", "data.num_workers=2", "run.seed=1"]))
    assert config_diff(a, b) == ["run.seed: 0 → 1"]


def test_cli_train_reports_config_errors_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    from drivetrain.cli.main import main

    assert main(["train", "--config", str(SMOKE), "optim.lrr=1"]) == 2
    assert "optim.lrr: unknown key" in capsys.readouterr().err
    assert main(["train", "--config", "no/such.yaml"]) == 2
    assert "no/such.yaml: config file not found" in capsys.readouterr().err


def test_cli_train_help_explains_overrides_and_resume(capsys: pytest.CaptureFixture[str]) -> None:
    from drivetrain.cli.main import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--resume auto|DIR" in out and "KEY=VALUE" in out and "torchrun" in out


def test_cli_train_runs_the_smoke_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from drivetrain.cli.main import main

    assert main(["train", "--config", str(SMOKE), *overrides(tmp_path, "train.steps=3")]) == 0
    assert "3/3 steps (3 updates, 0 skipped)" in capsys.readouterr().out
    assert (tmp_path / "config.yaml").is_file() and (tmp_path / "checkpoints" / "step-00000003").is_dir()


def _builder_with_containers(ranges: Sequence[float] = (0.0,), sizes: tuple[int, ...] = (1,), n: int | None = None):
    return ranges, sizes, n


def test_container_annotations_are_left_to_the_builder_and_unions_still_checked() -> None:
    from drivetrain.engine.build import _check_arg_types

    # Sequence[float] / tuple[int, ...] are containers: a list is fine (their arguments are element types)
    _check_arg_types("model", _builder_with_containers, {"ranges": [1.0, 2.0], "sizes": [1, 2], "n": None})
    with pytest.raises(ConfigError, match=r"model\.args\.n: expected int or null, got 'abc'"):
        _check_arg_types("model", _builder_with_containers, {"n": "abc"})


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml")), ids=str)
def test_every_shipped_config_loads_and_validates(path):
    """Every config in configs/ parses into the typed config (unknown keys, bad values and a bad
    ``data.augment`` section would raise here, before anyone starts a run with it)."""
    cfg = load_config(path)
    assert cfg.model.name and cfg.train.steps >= 1
