"""Helpers of the engine tests: configs for short smoke runs, reading a run's metrics and final weights."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"

# Small, fast and deterministic: one thread, deterministic algorithms, no TensorBoard or progress bar.
FAST = [
    "run.threads=1",
    "run.deterministic=true",
    "log.progress=false",
    "log.tensorboard=false",
    "log.every=1",
    "model.args.width=8",
    "data.args.num_samples=64",
    "data.batch_size=8",
    "schedule.total_steps=40",
]
# Data-parallel equivalence needs per-sample independence: no dropout, no batch-statistics memory.
NO_BATCH_COUPLING = ["model.args.dropout=0.0", "model.args.memory=false"]


def overrides(out_dir: Path, *extra: str) -> list[str]:
    return [*FAST, f"run.out_dir={out_dir}", *extra]


def metrics(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


def losses(out_dir: Path) -> list[float]:
    return [m["loss"] for m in metrics(out_dir)]


def final_state(out_dir: Path) -> dict:
    """The newest committed checkpoint's full state (loaded with weights_only=True)."""
    from drivetrain.engine import Checkpointer

    _, path = Checkpointer(Path(out_dir) / "checkpoints").committed()[-1]
    return torch.load(path / "state.pt", weights_only=True)


def assert_same_weights(a: dict, b: dict, atol: float = 0.0) -> None:
    """Model tensors equal (bit for bit when atol is 0)."""
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            if atol == 0:
                assert torch.equal(value, b[key]), f"{key} differs"
            else:
                torch.testing.assert_close(value, b[key], atol=atol, rtol=0, msg=f"{key} differs")


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "drivetrain.cli.main", "train", "--config", str(SMOKE), *args]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        train_cmd(*args), env=env or cli_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node 2 ARGS`` on a free port; ``env`` extends cli_env."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           *args]  # fmt: skip
    return subprocess.run(cmd, env=cli_env(**env), capture_output=True, text=True, timeout=timeout, check=False)


def train_single_double_batch(out: Path) -> Path:
    """One process with the double batch per micro-batch: what two data-parallel ranks must match."""
    from drivetrain.engine import Trainer, load_config

    extra = ["train.steps=10", "train.accumulation=2", "data.batch_size=16", *NO_BATCH_COUPLING]
    Trainer(load_config(SMOKE, overrides(out, *extra))).fit()
    return out
