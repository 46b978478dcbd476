"""The trainer on CUDA: mixed-precision steps (bf16 and fp16 with the loss scaler) of the smoke model and the two
detectors, forward in the low precision, losses finite, fp32 master weights updated; a CUDA run stopped at a
checkpoint and resumed ends bit-identical to the uninterrupted run (fp32 and fp16, whose scaler state lives on the
device); and ``drivetrain train --device cuda``-style runs as a subprocess, the way users start them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drivetrain.engine import Trainer, load_config
from helpers.engine import SMOKE, assert_same_weights, cli_env, final_state, losses, metrics, overrides, run_cli
from helpers.streampetr import SMALL

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICE = "cuda"
ROOT = Path(__file__).resolve().parents[1]
QUIET = ["run.threads=1", "log.progress=false", "log.tensorboard=false", "log.every=1", "eval.every=0",
         "eval.at_start=false"]  # fmt: skip
LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _lidar_args(synth_root: Path) -> list[str]:
    data = {"index": str(synth_root / "drivetrain_index.npz"), "split": "mini_train", "load_images": False,
            "load_points": True, "num_sweeps": 1, "use_dim": [0, 1, 2, 4]}  # fmt: skip
    return ["data.name=frames", f"data.args={json.dumps(data)}", "data.batch_size=2"]


def _camera_args(synth_root: Path) -> list[str]:
    model = ", ".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items())
    data = f"data.args={{index: {synth_root / 'drivetrain_index.npz'}, split: mini_train}}"
    return [f"model.args={{{model}}}", "data.name=frames", data]


def _case(name: str, out: Path, synth_root: Path, *extra: str):
    """The config of one AMP case: smoke (the engine's own model), PointPillars tiny, the tests' small StreamPETR."""
    steps = ["train.steps=4", "checkpoint.every=4", f"train.device={DEVICE}", *extra]
    if name == "smoke":
        return load_config(SMOKE, overrides(out, *steps))
    if name == "pointpillars":
        return load_config(ROOT / "configs" / "pointpillars_tiny.yaml",
                           [f"run.out_dir={out}", *QUIET, *_lidar_args(synth_root), *steps])  # fmt: skip
    return load_config(ROOT / "configs" / "streampetr_tiny.yaml",
                       [f"run.out_dir={out}", *QUIET, *_camera_args(synth_root), *steps])  # fmt: skip


def _first_float(value):
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return next((t for t in map(_first_float, value) if t is not None), None)
    return None


@pytest.mark.parametrize(
    ("model", "mode"),
    [("smoke", "bf16"), ("smoke", "fp16"), ("pointpillars", "bf16"), ("streampetr", "fp16")],
    ids=["smoke-bf16", "smoke-fp16", "pointpillars-bf16", "streampetr-fp16"],
)
def test_amp_steps_on_cuda_run_the_forward_in_low_precision_with_finite_losses(
    model, mode, synth_index, synth_root, tmp_path
):
    # fp16 starts at a scale of 2^7: 2^16 (the default) overflows a fresh detector's fp16 gradients for more steps
    # than the four run here (every step skipped, correctly) and would leave no update to check
    cfg = _case(model, tmp_path, synth_root, f"precision.mode={mode}", "precision.init_scale=128")
    trainer = Trainer(cfg)
    seen: list[torch.dtype] = []
    # the backbone's convolutions, which autocast runs in the low precision on every device (not its output: CUDA's
    # autocast runs group_norm in float32, and the smoke backbone ends in GroupNorm and ReLU)
    for module in trainer.model.backbone.modules():
        if isinstance(module, torch.nn.modules.conv._ConvNd):
            module.register_forward_hook(lambda module, args, out: seen.append(_first_float(out).dtype))
    state = trainer.model.state_dict()
    initial = {k: v.detach().clone() for k, v in state.items() if torch.is_tensor(v) and v.is_floating_point()}
    trainer.fit()
    assert seen and set(seen) == {LOW[mode]}, seen  # the backbone ran under autocast on the device
    records = metrics(tmp_path)
    assert len(records) == 4 and all(math.isfinite(r["loss"]) for r in records)
    scale = records[-1]["loss_scale"]
    if mode == "bf16":
        assert scale == 1.0 and records[-1]["skipped_steps"] == 0
    else:  # the dynamic scaler: a power of two, no larger than it starts
        assert 0 < scale <= cfg.precision.init_scale and math.log2(scale).is_integer()
    assert records[-1]["opt_step"] >= 1  # at least one update went through
    weights = final_state(tmp_path)["model"]
    moved = [k for k, v in initial.items() if not torch.equal(weights[k].to(v.device), v)]
    assert moved and all(weights[k].dtype == initial[k].dtype for k in initial)  # fp32 master weights, updated
    assert all(torch.isfinite(weights[k]).all() for k in initial)


@pytest.mark.parametrize("mode", ["fp32", "fp16"])
def test_a_cuda_run_resumed_from_its_checkpoint_ends_bit_identical(mode, tmp_path):
    """Three steps on CUDA, a checkpoint, a new process state (a fresh Trainer) resuming to six: the same per-step
    losses and bit-identical weights, optimizer and scaler state as six steps in one go (deterministic kernels; the
    CUDA generator's state, the dropout masks' source, is in the checkpoint)."""
    run = [f"train.device={DEVICE}", f"precision.mode={mode}", "checkpoint.every=3", "checkpoint.keep=3"]
    Trainer(load_config(SMOKE, overrides(tmp_path / "full", *run, "train.steps=6"))).fit()
    Trainer(load_config(SMOKE, overrides(tmp_path / "resumed", *run, "train.steps=3"))).fit()
    assert len(losses(tmp_path / "resumed")) == 3
    resumed = Trainer(load_config(SMOKE, overrides(tmp_path / "resumed", *run, "train.steps=6")), resume="auto")
    assert resumed.state.iteration == 3
    resumed.fit()
    assert losses(tmp_path / "resumed") == losses(tmp_path / "full") and len(losses(tmp_path / "full")) == 6
    full, again = final_state(tmp_path / "full"), final_state(tmp_path / "resumed")
    assert full["train"] == again["train"]
    assert_same_weights(again["model"], full["model"])
    for key, value in full["scaler"].items():
        assert torch.equal(again["scaler"][key], value), key
    exp_avg = [s["exp_avg"] for s in full["optimizer"]["state"].values()]
    assert all(torch.equal(a["exp_avg"], b) for a, b in zip(again["optimizer"]["state"].values(), exp_avg, strict=True))


def test_drivetrain_train_on_cuda_as_a_subprocess(tmp_path):
    """The smoke model as users start a run (``python -m drivetrain.cli.main train``): exit 0, the summary line,
    finite metrics and a checkpoint of the last step, on a device the config can only name when CUDA is there."""
    done = run_cli(*overrides(tmp_path, "train.steps=3", "checkpoint.every=3", f"train.device={DEVICE}"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3/3 steps (3 updates, 0 skipped)" in done.stderr + done.stdout
    assert len(losses(tmp_path)) == 3 and all(math.isfinite(x) for x in losses(tmp_path))
    assert final_state(tmp_path)["train"]["iteration"] == 3


def test_pointpillars_train_on_cuda_as_a_subprocess(synth_index, synth_root, tmp_path):
    """PointPillars tiny through the command line on CUDA: the lidar batch (points, voxelization, anchor windows,
    the pair loss, rotated-NMS-free training) end to end, two steps with finite loss terms."""
    argv = ["--config", str(ROOT / "configs" / "pointpillars_tiny.yaml"), f"run.out_dir={tmp_path}", *QUIET,
            *_lidar_args(synth_root), "train.steps=2", "checkpoint.every=2", f"train.device={DEVICE}"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "drivetrain.cli.main", "train", *argv],
        env=cli_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = metrics(tmp_path)
    assert len(records) == 2
    terms = {k: v for k, v in records[-1].items() if k.startswith("loss")}
    assert len(terms) >= 3 and all(math.isfinite(v) for v in terms.values()), terms
