"""The model protocol: what each reference model declares, what the engine asks through it, and the one-line
refusal of a registered model that lacks a required member."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from drivetrain.cli.main import main
from drivetrain.engine import registry
from drivetrain.engine.build import build_model
from drivetrain.engine.config import ConfigError, ModelConfig, load_config
from drivetrain.engine.eval_run import predict
from drivetrain.engine.protocol import (
    Detector,
    FrozenEncoder,
    LossCounts,
    MatchedQueries,
    Model,
    Sensors,
    StaticStep,
    StepCompileOptions,
    TTADetector,
    VoxelModel,
    WeightedLoss,
    input_modalities,
    missing_members,
)
from drivetrain.models.smoke import SmokeModel

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
CAPABILITIES = (
    Model, WeightedLoss, LossCounts, Detector, Sensors, FrozenEncoder, TTADetector, VoxelModel, MatchedQueries,
    StaticStep, StepCompileOptions,
)  # fmt: skip


DETECTOR = (Model, WeightedLoss, Detector, Sensors, StaticStep)  # what every reference detector declares (and more)


def _model(config: str, *overrides: str) -> torch.nn.Module:
    return build_model(load_config(REPO / "configs" / config, list(overrides)).model)


@pytest.mark.parametrize(
    ("config", "overrides", "declared"),
    [
        ("smoke.yaml", (), {Model, WeightedLoss}),
        (
            "streampetr_tiny.yaml",
            (),
            {*DETECTOR, LossCounts, FrozenEncoder, MatchedQueries, StepCompileOptions},
        ),
        ("pointpillars_tiny.yaml", (), {Model, WeightedLoss, Detector, Sensors, TTADetector, VoxelModel, StaticStep}),
        ("ssn_tiny.yaml", (), {Model, WeightedLoss, Detector, Sensors, TTADetector, VoxelModel, StaticStep}),
    ],
)
def test_each_reference_model_declares_exactly_its_capabilities(config, overrides, declared):
    model = _model(config, *overrides)
    assert {p for p in CAPABILITIES if isinstance(model, p)} == declared


def test_capabilities_answer_what_the_engine_used_to_probe():
    petr = _model("streampetr_tiny.yaml", "model.args.freeze_backbone=true")
    assert isinstance(petr, FrozenEncoder) and petr.frozen_encoder  # the trainer may overlap its encoder
    assert not _model("streampetr_tiny.yaml").frozen_encoder
    assert petr.matched_queries == (petr.num_query + petr.num_propagated,)  # the 3D head's queries
    assert input_modalities(petr) == ("camera",)
    lidar = _model("pointpillars_tiny.yaml")
    assert input_modalities(lidar) == ("lidar",)
    assert input_modalities(SmokeModel()) == ("camera",)  # undeclared: the documented default
    assert lidar.grid_test.point_cloud_range == tuple(lidar.grid_test.point_cloud_range)  # what viz draws


def test_enable_tta_turns_the_models_own_views_on_or_its_defaults():
    from drivetrain.models.pointpillars.tta import TTAConfig

    plain = _model("pointpillars_tiny.yaml")
    assert plain.tta_config is None
    plain.enable_tta()
    assert plain.tta_config == TTAConfig()
    configured = _model("pointpillars_tiny.yaml", "model.args.tta={scales: [1.0, 1.1]}")
    configured.enable_tta()
    assert tuple(configured.tta_config.scales) == (1.0, 1.1)  # the run's own views are kept


def test_missing_members_names_the_calls_a_model_lacks():
    assert missing_members(SmokeModel()) == []
    assert missing_members(torch.nn.Linear(2, 2)) == ["loss(outputs, batch)"]
    assert missing_members(object()) == ["forward(batch)", "loss(outputs, batch)"]


def test_predict_refuses_a_model_without_detect():
    with pytest.raises(TypeError, match="SmokeModel has no detect"):
        predict(SmokeModel(), [], "cpu", progress=False)


def test_engine_and_cli_never_probe_a_model_for_a_member():
    probe = re.compile(r"\b(getattr|hasattr)\((self\.)?model\b")
    sources = [
        *(REPO / "src" / "drivetrain" / "engine").glob("*.py"),
        *(REPO / "src" / "drivetrain" / "cli").glob("*.py"),
    ]
    found = [
        f"{p.name}:{i}" for p in sources for i, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)
    ]
    assert found == []


# ------------------------------------------------------------------ a third-party model lacking a member
LOSSLESS_SOURCE = """
import torch


class NoLoss(torch.nn.Module):
    '''Has forward but no loss.'''

    def forward(self, batch):
        return batch
"""


@pytest.fixture
def lossless_entry_point(tmp_path, monkeypatch):
    """An installed package whose ``drivetrain.models`` entry point ``lossless`` builds a model without loss."""
    site = tmp_path / "site"
    (site / "dtlossless").mkdir(parents=True)
    (site / "dtlossless" / "__init__.py").write_text(LOSSLESS_SOURCE)
    info = site / "dtlossless-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dtlossless\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[drivetrain.models]\nlossless = dtlossless:NoLoss\n")
    monkeypatch.syspath_prepend(str(site))
    yield "lossless"
    sys.modules.pop("dtlossless", None)


def test_an_entry_point_model_without_loss_is_refused_in_one_line_naming_it(lossless_entry_point):
    assert "lossless" in registry.known_names("model")
    with pytest.raises(ConfigError) as err:
        build_model(ModelConfig(name="lossless"))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("model.name: 'lossless' (entry point dtlossless) builds a NoLoss without loss(outputs")
    assert "drivetrain.engine.protocol.Model" in message


def test_train_refuses_it_before_making_the_run_directory(lossless_entry_point, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", str(SMOKE), "model.name=lossless", "model.args={}", f"run.out_dir={run}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "builds a NoLoss without loss(outputs, batch)" in lines[0]
    assert not run.exists()


def test_a_builder_that_returns_no_module_is_named():
    registry.register_model("test-nomodule", lambda: {"not": "a module"})
    try:
        with pytest.raises(ConfigError, match=r"'test-nomodule' \(module .*\) builds a dict that is not an nn.Module"):
            build_model(ModelConfig(name="test-nomodule"))
    finally:
        registry._REGISTERED["model"].pop("test-nomodule")
