"""The DeepSpeed config the engine builds, checked without DeepSpeed installed (``deepspeed_config`` is plain data):
under bf16 DeepSpeed's ZeRO-1/2 skip a step with non-finite gradients only when the ``bf16`` section sets
``check_grad_overflow`` (DeepSpeed 0.17.1 to 0.19.2 default it off), which the engine's non-finite-loss skip needs;
its schema takes only a whole ``min_loss_scale``; a DeepSpeed older than the version run here is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from drivetrain.engine import ConfigError, load_config
from drivetrain.engine.deepspeed_strategy import deepspeed_config
from helpers.engine import SMOKE, overrides


def test_bf16_asks_deepspeed_to_skip_steps_with_non_finite_gradients(tmp_path: Path) -> None:
    ds = deepspeed_config(load_config(SMOKE, overrides(tmp_path, "precision.mode=bf16")), world_size=2)
    assert ds["bf16"] == {"enabled": True, "check_grad_overflow": True}
    assert "fp16" not in ds


def test_a_fractional_fp16_min_scale_is_refused_for_deepspeed_in_one_line(tmp_path: Path, monkeypatch) -> None:
    """DeepSpeed's ``fp16.min_loss_scale`` is an integer (its schema, from 0.17.1, rejects 0.5 at initialize)."""
    monkeypatch.setattr("drivetrain.engine.config.module_available", lambda name: True)  # the config, not the package
    extra = ["distributed.strategy=deepspeed", "precision.mode=fp16", "precision.min_scale=0.5"]
    with pytest.raises(ConfigError, match=r"precision\.min_scale: must be a whole number .*deepspeed.*got 0\.5$"):
        load_config(SMOKE, overrides(tmp_path, *extra))
    ds = deepspeed_config(load_config(SMOKE, overrides(tmp_path, *extra[:2], "precision.min_scale=2")), world_size=1)
    assert ds["fp16"]["min_loss_scale"] == 2 and isinstance(ds["fp16"]["min_loss_scale"], int)


VERSIONS = [("0.16.0", True), ("0.19.6", True), ("0.19.8", False), ("0.19.8+cu124", False), ("0.20.0rc1", False),
            ("1.0", False)]  # fmt: skip


@pytest.mark.parametrize(("found", "refused"), VERSIONS)
def test_deepspeed_older_than_the_version_run_here_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found: str, refused: bool
) -> None:
    """Before 0.19.8 DeepSpeed skipped non-finite steps under fp16 only: a NaN gradient reached AdamW under fp32. An
    older installed version is one line naming the key and the version, not a run that trains on NaN."""
    monkeypatch.setattr("drivetrain.engine.config.module_available", lambda name: True)
    monkeypatch.setattr("drivetrain.engine.config.installed_version", lambda name: found)
    args = overrides(tmp_path, "distributed.strategy=deepspeed")
    if refused:
        with pytest.raises(ConfigError, match=rf"distributed\.strategy: .*needs deepspeed >= 0\.19\.8, found {found}"):
            load_config(SMOKE, args)
    else:
        assert load_config(SMOKE, args).distributed.strategy == "deepspeed"
