"""The training loop: accumulation, precision and skipped steps, non-finite losses, switches, param groups."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from drivetrain.engine import NonFiniteLossError, Trainer, load_config
from drivetrain.engine.build import lr_factor
from helpers.engine import (
    FLOAT64,
    NO_BATCH_COUPLING,
    SMOKE,
    assert_same_training,
    final_state,
    grad_norms,
    losses,
    metrics,
    overrides,
)


def train(out_dir: Path, *extra: str) -> Trainer:
    trainer = Trainer(load_config(SMOKE, overrides(out_dir, *extra)))
    trainer.fit()
    return trainer


def test_run_directory_holds_config_metrics_and_checkpoints(tmp_path: Path) -> None:
    train(tmp_path, "train.steps=6", "checkpoint.every=2", "checkpoint.keep=2", "log.tensorboard=true")
    assert load_config(tmp_path / "config.yaml") == load_config(SMOKE, overrides(tmp_path, "train.steps=6",
        "checkpoint.every=2", "checkpoint.keep=2", "log.tensorboard=true"))  # fmt: skip
    records = metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "lr", "grad_norm", "loss_scale", "loss/cls", "loss/box", "samples_per_s", "data_wait_s"):
        assert key in records[0]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000004", "step-00000006"]
    assert any((tmp_path / "tensorboard").iterdir())


def test_smoke_model_learns(tmp_path: Path) -> None:
    train(tmp_path, "train.steps=40", "optim.lr=0.01")
    first, last = losses(tmp_path)[:5], losses(tmp_path)[-5:]
    assert sum(last) < 0.8 * sum(first)


def test_accumulating_k_micro_batches_equals_one_k_times_batch(tmp_path: Path) -> None:
    common = ["train.steps=6", "data.shuffle=false", *NO_BATCH_COUPLING, *FLOAT64]
    train(tmp_path / "acc", *common, "data.batch_size=4", "train.accumulation=4")
    train(tmp_path / "big", *common, "data.batch_size=16", "train.accumulation=1")
    assert_same_training(tmp_path / "acc", tmp_path / "big")


def test_lr_follows_schedule_and_group_multiplier(tmp_path: Path) -> None:
    trainer = train(tmp_path, "train.steps=5", "schedule.kind=onecycle")
    cfg = trainer.cfg
    expected = [cfg.optim.lr * lr_factor(cfg.schedule, s, cfg.train.steps) for s in range(5)]
    assert [m["lr"] for m in metrics(tmp_path)] == pytest.approx(expected, rel=1e-12)
    backbone, rest = trainer.optimizer.param_groups
    assert backbone["lr"] == pytest.approx(0.5 * rest["lr"])


def test_fp16_overflow_skips_step_without_moving_schedule_or_optimizer(tmp_path: Path) -> None:
    # A loss scale of 2**40 overflows fp16 gradients; with hysteresis 2 and backoff 1/2**8 the first
    # three iterations are skipped, then the scale (2**24 → 2**16) lets steps through.
    trainer = train(
        tmp_path,
        "train.steps=8",
        "precision.mode=fp16",
        "precision.init_scale=1099511627776",
        "precision.backoff_factor=0.00390625",
        "schedule.kind=warmup_cosine",
        "schedule.warmup_steps=4",
    )
    records = metrics(tmp_path)
    skipped = [r["skipped_steps"] for r in records]
    assert skipped[0] == 1 and skipped[-1] < 8, skipped
    n_skipped = skipped[-1]
    assert [r["opt_step"] for r in records] == [max(i + 1 - n_skipped, 0) for i in range(8)]
    cfg = trainer.cfg
    lr_steps = [0] + [r["opt_step"] for r in records[:-1]]  # each iteration's lr: updates applied before it
    expected = [cfg.optim.lr * lr_factor(cfg.schedule, s, 40) for s in lr_steps]
    assert [r["lr"] for r in records] == pytest.approx(expected)
    adam_steps = {int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()}
    assert adam_steps == {8 - n_skipped} == {trainer.state.step}
    assert records[0]["loss_scale"] == 2.0**40 and records[-1]["loss_scale"] < 2.0**40


# A weight past float32's range (3.4e38) makes the fp32 loss ±inf; a non-finite weight itself is refused by the
# config (tests/test_safety_errors.py).
@pytest.mark.parametrize("weight", ["1.0e+39", "-1.0e+39"])
def test_nonfinite_loss_stop_names_the_batch(tmp_path: Path, weight: str) -> None:
    cfg = load_config(SMOKE, overrides(tmp_path, "train.steps=3", "precision.nonfinite=stop",
                                       f"model.loss_weights.cls={weight}"))  # fmt: skip
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 1: micro-batch 0 .* dataset indices \["):
        Trainer(cfg).fit()


def test_nonfinite_loss_skip_counts_and_leaves_weights(tmp_path: Path) -> None:
    trainer = train(tmp_path, "train.steps=3", "model.loss_weights.box=1.0e+39", "model.args.dropout=0.0")
    before = final_state(tmp_path)["model"]
    records = metrics(tmp_path)
    assert [r["nonfinite_losses"] for r in records] == [1, 2, 3]
    assert [r["opt_step"] for r in records] == [0, 0, 0]
    assert trainer.state.step == 0
    fresh = Trainer(load_config(SMOKE, overrides(tmp_path / "fresh", "train.steps=3"))).model.state_dict()
    for key, value in before.items():
        if isinstance(value, torch.Tensor) and key != "memory":
            assert torch.equal(value, fresh[key].cpu()), key  # the checkpoint is read onto the CPU


def test_activation_checkpointing_recomputes_the_same_arithmetic(tmp_path: Path) -> None:
    train(tmp_path / "plain", "train.steps=4")
    train(tmp_path / "switched", "train.steps=4", "speed.activation_checkpointing=[backbone]")
    # The backbone's forward runs again in backward with the same kernels on the same inputs: bit-identical.
    assert losses(tmp_path / "switched") == losses(tmp_path / "plain")
    assert grad_norms(tmp_path / "switched") == grad_norms(tmp_path / "plain")


def test_channels_last_trains_the_same_model(tmp_path: Path) -> None:
    # Channels-last convolutions reduce in another order: compared in float64 (helpers.engine.FLOAT64).
    train(tmp_path / "plain", "train.steps=4", *FLOAT64)
    train(tmp_path / "switched", "train.steps=4", "speed.channels_last=2d", *FLOAT64)
    assert_same_training(tmp_path / "switched", tmp_path / "plain")


def test_channels_last_3d_computes_the_same_first_loss(tmp_path: Path) -> None:
    # The CPU has channels-last 3D convolution kernels only in float32 (float64 falls back to the contiguous
    # one), so compare the first step's loss, before any update can amplify rounding. Each of the 3 conv
    # layers sums K = 8 channels × 27 taps = 216 products in another order: ≤ K·eps32 relative each.
    volume = ["model.args.dims=3", "data.args.dims=3", "data.args.size=8", "train.steps=1"]
    train(tmp_path / "plain", *volume)
    train(tmp_path / "switched", *volume, "speed.channels_last=3d")
    bound = 3 * 216 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(losses(tmp_path / "switched"), losses(tmp_path / "plain"), rtol=bound, atol=0)


def test_bf16_trains_with_fp32_losses(tmp_path: Path) -> None:
    train(tmp_path / "fp32", "train.steps=4")
    train(tmp_path / "bf16", "train.steps=4", "precision.mode=bf16")
    fp32, bf16 = losses(tmp_path / "fp32"), losses(tmp_path / "bf16")
    assert fp32 != bf16  # autocast really ran in bf16
    # bf16 keeps 8 significant bits (eps 2⁻⁸ ≈ 0.4%); the 5 layers' inputs and weights are rounded in each of
    # the 4 steps' forwards, and AdamW follows the perturbed gradients: ~10 roundings' worth, 5%, is "the same
    # training" here, while a broken autocast or loss scaling (fp32 losses computed from garbage) is far off.
    torch.testing.assert_close(bf16, fp32, atol=0.05, rtol=0.05)


def test_loader_workers_give_the_same_batches(tmp_path: Path) -> None:
    train(tmp_path / "main", "train.steps=4")
    workers = ["data.num_workers=2", "data.persistent_workers=true", "data.prefetch_factor=2"]
    train(tmp_path / "workers", "train.steps=4", *workers)
    assert losses(tmp_path / "workers") == losses(tmp_path / "main")


@pytest.mark.slow
def test_compiled_backbone_trains_the_same_model(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    counters.clear()
    train(tmp_path / "eager", "train.steps=3", *FLOAT64)  # fused kernels reduce in another order: float64
    train(tmp_path / "compiled", "train.steps=3", "speed.compile=[backbone]", *FLOAT64)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo really traced the backbone
    assert_same_training(tmp_path / "compiled", tmp_path / "eager")
