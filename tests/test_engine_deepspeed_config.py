"""The DeepSpeed config the engine builds, checked without DeepSpeed installed (``deepspeed_config`` is plain data):
under bf16 DeepSpeed's ZeRO-1/2 skip a step with non-finite gradients only when the ``bf16`` section sets
``check_grad_overflow`` (DeepSpeed 0.17.1 to 0.19.2 default it off), which the engine's non-finite-loss skip needs."""

from __future__ import annotations

from pathlib import Path

from drivetrain.engine import load_config
from drivetrain.engine.deepspeed_strategy import deepspeed_config
from helpers.engine import SMOKE, overrides


def test_bf16_asks_deepspeed_to_skip_steps_with_non_finite_gradients(tmp_path: Path) -> None:
    ds = deepspeed_config(load_config(SMOKE, overrides(tmp_path, "precision.mode=bf16")), world_size=2)
    assert ds["bf16"] == {"enabled": True, "check_grad_overflow": True}
    assert "fp16" not in ds
