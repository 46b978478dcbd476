"""PointPillars' and SSN's specs: the builders take the typed ``model.args`` (one instance, keyword arguments
replacing its fields), every config of these models loads into them, bad keys and types are one line naming the
key, the moved keys are still refused with their pointer, and the declared modalities are the built models'."""

from __future__ import annotations

from pathlib import Path

import pytest

from drivetrain.engine.build import build_model
from drivetrain.engine.config import ConfigError, load_config
from drivetrain.engine.config_files import read_config_file
from drivetrain.engine.registry import check_args, model_spec
from drivetrain.models.pointpillars.args import PointPillarsArgs, SSNArgs
from drivetrain.models.pointpillars.paths import BatchedPath, ReferencePath
from drivetrain.models.pointpillars.spec import POINTPILLARS, SSN

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_the_specs_declare_their_args_and_the_built_models_modalities():
    for name, spec, args in (("pointpillars", POINTPILLARS, PointPillarsArgs), ("ssn", SSN, SSNArgs)):
        assert model_spec(name) is spec and spec.args is args
        model = spec.build_model(args())
        assert spec.modalities == frozenset(model.input_modalities), name


def test_ssn_built_from_its_args_defaults_is_ssn_with_its_own_defaults():
    explicit, implicit = SSN.build_model(SSNArgs()), SSN.build(**{})
    assert explicit.class_names == implicit.class_names and explicit.tasks == implicit.tasks
    assert explicit.assigners == implicit.assigners and explicit.anchor_config == implicit.anchor_config
    assert explicit.grid == implicit.grid


def test_the_builders_take_their_args_and_keyword_changes_to_its_fields():
    model = POINTPILLARS.build(PointPillarsArgs(max_voxels=7), max_points=3)
    assert model.args == PointPillarsArgs(max_voxels=7, max_points=3) and model.grid.max_voxels == 7
    assert SSN.build().args == SSNArgs() and SSN.build(max_points=5).args == SSNArgs(max_points=5)
    with pytest.raises(TypeError, match="'max_pointz'"):
        POINTPILLARS.build(max_pointz=3)
    # the spec builds from an instance, a mapping or None, its keyword arguments replacing fields
    built = POINTPILLARS.build_model({"max_voxels": 9}, impl="reference")
    assert built.args == PointPillarsArgs(max_voxels=9, impl="reference") and isinstance(built.path, ReferencePath)
    default = SSN.build_model(None)
    assert isinstance(default.path, BatchedPath) and default.args == SSNArgs()


def test_a_value_the_builder_refuses_is_one_line_naming_model_args():
    cfg = load_config(CONFIGS / "pointpillars_tiny.yaml", ["model.args.assigner=[0.6, 0.3]"]).model  # types fit
    with pytest.raises(ConfigError) as info:
        build_model(cfg)  # built through the spec, from the instance the config holds
    assert str(info.value) == (
        "model.args: pointpillars: assigner: expected (pos_iou_thr, neg_iou_thr, min_pos_iou), got (0.6, 0.3)"
    )


def test_every_config_of_these_models_loads_into_their_args():
    lidar = set()
    for config in sorted(CONFIGS.glob("*.yaml")):
        cfg = load_config(config, [])
        spec = model_spec(cfg.model.name)
        if spec not in (POINTPILLARS, SSN):
            continue
        lidar.add(config.name)
        args = cfg.model.args  # resolved when the config loaded
        assert isinstance(args, spec.args) and check_args("model", cfg.model.name, args) is args, config.name
        written = read_config_file(config).data["model"].get("args", {})
        for key, value in written.items():  # every value the config sets (its base chain's too), in its typed form
            assert _as_tuples(getattr(args, key)) == _as_tuples(value), (config.name, key)
    named = {p.name for pattern in ("pointpillars_*.yaml", "ssn_*.yaml") for p in CONFIGS.glob(pattern)}
    assert named and named <= lidar  # the configs named after the models are among them


def _as_tuples(value: object) -> object:
    """Lists and tuples, nested, as tuples (YAML writes lists; the typed args hold tuples)."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list | tuple) else value


def test_both_forms_of_the_assigner_and_the_classes_are_read():
    one = check_args("model", "pointpillars", {"assigner": [0.6, 0.3, 0.3], "dataset_classes": "lyft"})
    assert one.assigner == (0.6, 0.3, 0.3) and one.dataset_classes == "lyft"
    per_class = check_args("model", "ssn", {"assigner": [[0.5, 0.35, 0.35]] * 10, "dataset_classes": ["a", "b"]})
    assert per_class.assigner == ((0.5, 0.35, 0.35),) * 10 and per_class.dataset_classes == ("a", "b")
    assert check_args("model", "ssn", {"compile_loss": {"mode": "max-autotune"}}).compile_loss == {
        "mode": "max-autotune"
    }


@pytest.mark.parametrize("config", ["pointpillars_tiny.yaml", "ssn_tiny.yaml"])
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.args.max_pointz=3", "model.args.max_pointz: unknown key; known keys: anchor_ranges, anchor_sizes"),
        ("model.args.max_points=many", "model.args.max_points: expected an integer, got str 'many'"),
        ("model.args.assigner=high", "model.args.assigner: expected a list, got str 'high'"),
        ("model.args.assigner=[0.6, low, 0.3]", "model.args.assigner[1]: expected a number, got str 'low'"),
        ("model.args.window=2", "model.args.window: expected true or false, got int 2"),
        # the lidar models' own augmentation and seed before the trainer's stage: refused with a pointer
        ("model.args.augment={shuffle: false}", "model.args.augment: moved to data.augment.lidar"),
        ("model.args.seed=3", "model.args.seed: the lidar models draw no random numbers any more"),
    ],
)
def test_bad_and_moved_args_are_one_line_naming_the_key(config, override, message):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / config, [override])
    assert message in str(info.value) and "\n" not in str(info.value)
