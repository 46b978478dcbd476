"""Helpers of the engine tests: configs for short smoke runs, reading a run's metrics and final weights."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
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
# The two-process tests run gloo on the CPU: with train.device=auto on a machine with one GPU, the second
# rank would ask for a GPU that is not there (and the one-process comparison must use the same device).
ON_CPU = ["train.device=cpu"]
# Data-parallel equivalence needs per-sample independence: no dropout, no batch-statistics memory.
NO_BATCH_COUPLING = ["model.args.dropout=0.0", "model.args.memory=false"]

# Runs that must compute the same function in another order (two ranks vs one process with the double batch,
# k micro-batches vs one k-times batch, another kernel) are compared in float64. In float32 their rounding
# differences are amplified past any fixed bound: AdamW divides by √v, and a perturbation of one ulp can flip
# the argmax of the model's max-pool or a ReLU, changing a gradient by O(1) — DDP static graph (which reduces
# the first iteration's micro-batches in another order) drifted by 2.2e-5 in 10 steps on one CPU and 4e-8 on
# another. In float64 the same mechanisms start from eps64 = 2.2e-16: reductions of n ≤ 4096 terms differ by
# ≤ n·eps64 ≈ 1e-12 relative, and even a flip amplified as in float32 (≈ 200 ulp) stays near 1e-13.
FLOAT64 = ["model.args.dtype=float64", "data.args.dtype=float64"]
# Weights after a float64 equivalence run: 1e-9 leaves four orders of magnitude above that rounding, while a
# real difference is far larger (a 1e-4 relative change of one loss weight moves weights by 4e-6 and grad norms
# by 7e-5 relative in the 10-step runs; a missing or doubled reduction by ≥ 1e-2).
F64_ATOL = 1e-9
# Losses and grad norms are logged in float32: two float64 values that agree to ~1e-13 round to float32 values
# at most one ulp (2⁻²³ relative) apart; 2⁻²² adds the float64 difference itself.
LOGGED_RTOL = 2.0**-22


def overrides(out_dir: Path, *extra: str) -> list[str]:
    return [*FAST, f"run.out_dir={out_dir}", *extra]


def metrics(out_dir: Path) -> list[dict]:
    """metrics.jsonl's records but the checkpoint stalls (``{"step", "checkpoint/stall_s"}`` after each save)."""
    records = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "checkpoint/stall_s" not in r]


def checkpoint_stalls(out_dir: Path) -> dict[int, float]:
    """metrics.jsonl's ``checkpoint/stall_s`` by step."""
    records = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["checkpoint/stall_s"] for r in records if "checkpoint/stall_s" in r}


def losses(out_dir: Path) -> list[float]:
    return [m["loss"] for m in metrics(out_dir)]


def grad_norms(out_dir: Path) -> list[float]:
    return [m["grad_norm"] for m in metrics(out_dir)]


def assert_same_training(run: Path, reference: Path) -> None:
    """Two float64 equivalence runs (``FLOAT64``) agree in per-step losses and grad norms and in final weights."""
    torch.testing.assert_close(losses(run), losses(reference), rtol=LOGGED_RTOL, atol=0)
    torch.testing.assert_close(grad_norms(run), grad_norms(reference), rtol=LOGGED_RTOL, atol=0)
    model = final_state(run)["model"]
    assert model["backbone.0.weight"].dtype == torch.float64, "not a float64 run"
    assert_same_weights(model, final_state(reference)["model"], atol=F64_ATOL)


def final_state(out_dir: Path) -> dict:
    """The newest committed checkpoint's full state (marker verified, its shards read whole, weights_only)."""
    from drivetrain.engine import Checkpointer

    checkpointer = Checkpointer(Path(out_dir) / "checkpoints")
    return checkpointer.load(checkpointer.committed()[-1][1])


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


def wait_for(predicate: Callable[[], bool], proc: subprocess.Popen, timeout: float = 60) -> None:
    """Poll ``predicate`` until it holds; an AssertionError when ``proc`` exits first (with its stderr) or after
    ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"run exited early (rc {proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.005)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Set in the environment of a torchrun launch (inherited by its agent and ranks) to find every process of it.
LAUNCH_ENV = "DRIVETRAIN_TEST_LAUNCH"


def kill_launch(tag: str) -> None:
    """SIGKILL every process whose environment has ``LAUNCH_ENV=tag``: torchrun starts each rank in a process
    group of its own, so killing the launcher's group would leave the ranks running (and holding its pipes)."""
    import psutil

    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(LAUNCH_ENV) == tag:
                proc.kill()


def torchrun(*args: str, timeout: float = 600, nproc: int = 2, **env: str) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node NPROC ARGS`` on a free port; ``env`` extends cli_env.

    On a timeout the launcher and its ranks are killed (:func:`kill_launch`) and the error shows their output.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_port", str(free_port()), *args]  # fmt: skip
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(
        cmd, env=cli_env(**env, **{LAUNCH_ENV: tag}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_launch(tag)
        out, err = proc.communicate()
        raise AssertionError(f"torchrun timed out after {timeout} s: {cmd}\n{out[-3000:]}\n{err[-6000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun_nodes(cwds: list[Path], *args: str, timeout: float = 120, **env: str) -> list[subprocess.CompletedProcess]:
    """One ``torchrun --nnodes N --node_rank k --nproc_per_node 1 ARGS`` per folder of ``cwds`` (node k runs in
    ``cwds[k]``), all at once with static rendezvous on one free port: N "nodes" on this machine, each with its own
    working directory (a relative ``run.out_dir`` is then a node-local folder). ``env`` extends cli_env.

    On a timeout (shared by all nodes) every launcher and its ranks are killed (:func:`kill_launch`) and the error
    shows their output.
    """
    port, tag = str(free_port()), uuid.uuid4().hex
    procs = []
    for rank, cwd in enumerate(cwds):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(cwds)), "--node_rank", str(rank),
               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", port, *args]  # fmt: skip
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "start_new_session": True}
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=cli_env(**env, **{LAUNCH_ENV: tag}), **pipes))
    deadline, done = time.monotonic() + timeout, []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        kill_launch(tag)
        outputs = []
        for rank, proc in enumerate(procs):
            out, err = (done[rank].stdout, done[rank].stderr) if rank < len(done) else proc.communicate()
            outputs.append(f"node {rank} (status {proc.returncode}): {out[-2000:]}\n{err[-4000:]}")
        raise AssertionError(f"torchrun nodes timed out after {timeout} s: {args}\n" + "\n".join(outputs)) from None
    return done


def train_single_double_batch(out: Path, float64: bool = True) -> Path:
    """One process with the double batch per micro-batch: what two data-parallel ranks must match."""
    from drivetrain.engine import Trainer, load_config

    extra = ["train.steps=10", "train.accumulation=2", "data.batch_size=16", *NO_BATCH_COUPLING, *ON_CPU]
    extra += FLOAT64 if float64 else []
    Trainer(load_config(SMOKE, overrides(out, *extra))).fit()
    return out
