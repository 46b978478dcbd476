"""DeepSpeed ZeRO under torchrun (2 processes, gloo, CPU accelerator): ZeRO-1, ZeRO-2 with optimizer offload,
ZeRO-3 and ZeRO-3 with optimizer and parameter offload each match one process with the double batch; a
stopped and resumed ZeRO-2-offload run matches an uninterrupted one bit for bit; non-finite losses skip
steps; config errors name their key. Skipped when deepspeed is not installed (CI does not install it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.engine.config import module_available
from drivetrain.engine.deepspeed_strategy import deepspeed_config
from helpers.engine import (
    ON_CPU,
    ROOT,
    SMOKE,
    assert_same_weights,
    final_state,
    losses,
    metrics,
    overrides,
    train_single_double_batch,
)
from helpers.engine import torchrun as launch

pytestmark = pytest.mark.skipif(
    not module_available("deepspeed"), reason="deepspeed is not installed (pip install 'drivetrain[deepspeed]')"
)
# DeepSpeed trains in float32 only (it casts the model), so rounding differences of its other summation order
# (flat gradient buckets averaged over ranks, a micro-batch of 8 instead of 16 in each conv kernel, DeepSpeed's
# clip coefficient divides where torch's multiplies) are amplified by AdamW past any fixed bound after a few
# steps (see helpers.engine.FLOAT64). What is guaranteed is the first step: loss and gradient norm agree to
# float32 rounding of the longest reduction in the step, the first conv's weight gradient over 16 samples ×
# 16 × 16 positions = 4096 terms: ≤ 4096·eps32 ≈ 5e-4 relative. A wrong 1/world scale, a micro-batch reduced
# twice or missed, or a wrong accumulation scale moves them by ≥ 1/3; lr, lr multipliers, step counts and
# the optimizer layout are compared exactly after all 10 steps.
FIRST_STEP_RTOL = 4096 * torch.finfo(torch.float32).eps
STAGES = ["zero1", "zero2_offload", "zero3", "zero3_offload"]


def torchrun(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return launch(*args, timeout=timeout, DS_ACCELERATOR="cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("deepspeed")
    proc = torchrun(str(ROOT / "tests" / "engine_deepspeed_worker.py"), str(root), *STAGES, "nonfinite", "resume")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return root


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, the double batch per micro-batch (as in test_engine_distributed.py), in float32."""
    return train_single_double_batch(tmp_path_factory.mktemp("single"), float64=False)


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_zero_stages_match_one_process_with_double_batch(runs: Path, single: Path, stage: str) -> None:
    (ours_first, *_), (ref_first, *_) = metrics(runs / stage), metrics(single)
    for key in ("loss", "grad_norm"):
        assert ours_first[key] == pytest.approx(ref_first[key], rel=FIRST_STEP_RTOL, abs=0), key
    assert [m["lr"] for m in metrics(runs / stage)] == [m["lr"] for m in metrics(single)]
    ours, ref = final_state(runs / stage), final_state(single)
    # The gathered optimizer state has the 1-process AdamW layout: same groups (lr set by the schedule
    # × lr_mult), step counts and moments. DeepSpeed's keys the parameters by number (torch.optim's own
    # state_dict: a DeepSpeed checkpoint resumes only under DeepSpeed), the 1-process run's by name (DCP's
    # get_state_dict), both in the optimizer's parameter order.
    names = [name for group in ref["optimizer"]["param_groups"] for name in group["params"]]
    by_name = [{**group, "params": [names[i] for i in group["params"]]} for group in ours["optimizer"]["param_groups"]]
    assert by_name == ref["optimizer"]["param_groups"]
    assert [names[i] for i in ours["optimizer"]["state"]] == list(ref["optimizer"]["state"])
    for index, name in enumerate(names):
        state = ref["optimizer"]["state"][name]
        assert torch.equal(ours["optimizer"]["state"][index]["step"], state["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            assert ours["optimizer"]["state"][index][key].shape == state[key].shape
    assert ours["world_size"] == 2 and len(ours["rng"]) == 2


@pytest.mark.slow
def test_zero2_offload_resume_is_exact(runs: Path) -> None:
    assert losses(runs / "resume_stopped") == losses(runs / "resume_full")
    ours, ref = final_state(runs / "resume_stopped"), final_state(runs / "resume_full")
    assert_same_weights(ours["model"], ref["model"])  # incl. the streaming-memory buffer
    for index, state in ref["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(ours["optimizer"]["state"][index][key], value), (index, key)
    assert not torch.equal(ref["rng"][0]["torch"], ref["rng"][1]["torch"])  # ranks draw different dropout masks


@pytest.mark.slow
def test_nonfinite_losses_skip_steps(runs: Path) -> None:
    records = metrics(runs / "nonfinite")
    assert [r["nonfinite_losses"] for r in records] == [1, 2]
    assert [r["skipped_steps"] for r in records] == [1, 2]
    assert [r["opt_step"] for r in records] == [0, 0]
    assert final_state(runs / "nonfinite")["optimizer"]["state"] == {}  # AdamW never stepped


def test_cli_trains_with_zero2_offload_under_torchrun(tmp_path: Path) -> None:
    proc = torchrun("-m", "drivetrain.cli.main", "train", "--config", str(SMOKE),
                    *overrides(tmp_path, "train.steps=2", "distributed.strategy=deepspeed",
                               "distributed.deepspeed_offload_optimizer=true", *ON_CPU), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("2/2 steps") == 1  # only rank 0 reports
    assert len(losses(tmp_path)) == 2
    assert final_state(tmp_path)["optimizer"]["state"][0]["step"].item() == 2


# ---------------------------------------------------------------------- config (no torchrun, no deepspeed import)
@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["distributed.deepspeed_zero_stage=4"], r"distributed\.deepspeed_zero_stage: must be 1, 2 or 3, got 4"),
        (["distributed.deepspeed_offload_params=true"], r"distributed\.deepspeed_offload_params: needs .*stage=3"),
        (["distributed.strategy=deepspeed", "precision.mode=fp16", "precision.init_scale=1000"],
         r"precision\.init_scale: must be a power of two"),
        (["distributed.strategy=deepspeed", "precision.mode=fp16", "precision.growth_factor=4"],
         r"precision\.growth_factor: DeepSpeed's fp16 loss scaler"),
    ],
)  # fmt: skip
def test_config_errors_name_the_key(tmp_path: Path, extra: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(SMOKE, overrides(tmp_path, *extra))


def test_missing_deepspeed_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("drivetrain.engine.config.module_available", lambda name: name != "deepspeed")
    with pytest.raises(ConfigError, match=r"distributed\.strategy: 'deepspeed' needs the deepspeed package"):
        load_config(SMOKE, overrides(tmp_path, "distributed.strategy=deepspeed"))


def test_deepspeed_without_torchrun_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a torchrun launch"):
        Trainer(load_config(SMOKE, overrides(tmp_path, "distributed.strategy=deepspeed")))


def test_deepspeed_config_maps_engine_settings(tmp_path: Path) -> None:
    extra = ["distributed.strategy=deepspeed", "train.accumulation=3", "distributed.deepspeed_zero_stage=3",
             "distributed.deepspeed_offload_params=true", "distributed.deepspeed_offload_optimizer=true",
             "precision.mode=fp16", "precision.init_scale=4294967296", "precision.hysteresis=3"]  # fmt: skip
    cfg = load_config(SMOKE, overrides(tmp_path, *extra))
    ds = deepspeed_config(cfg, world_size=4)
    batch = (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"])
    assert batch == (8, 3, 96)
    assert ds["gradient_clipping"] == cfg.optim.clip_norm
    assert ds["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                       "offload_param": {"device": "cpu"}}  # fmt: skip
    assert ds["fp16"] == {"enabled": True, "initial_scale_power": 32, "loss_scale_window": 1000, "hysteresis": 3,
                          "min_loss_scale": 1.0}  # fmt: skip
    assert "bf16" not in ds
    bf16 = deepspeed_config(load_config(SMOKE, overrides(tmp_path, "precision.mode=bf16", "optim.clip_norm=null")), 1)
    assert bf16["bf16"] == {"enabled": True, "check_grad_overflow": True}  # DeepSpeed skips non-finite steps (ZeRO-1/2)
    assert bf16["gradient_clipping"] == 0.0 and "fp16" not in bf16
