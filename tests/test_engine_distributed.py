"""Two processes on the gloo backend (torchrun): DDP, DDP static graph, FSDP2 and FSDP2 with CPU offload each match one
process with the double batch (in float64: see helpers.engine.FLOAT64); a DDP run stopped and resumed matches an
uninterrupted one exactly — the smoke model, and (slow set) PointPillars with its lidar augmentation, whose ranks draw
different parameters — and continues in one process when the global batch is kept; torchrun's own restart after a killed
worker resumes exactly."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.engine.trainer import STEP_DELAY_ENV
from engine_dist_worker import RESUME
from helpers.engine import (
    ON_CPU,
    ROOT,
    SMOKE,
    assert_same_training,
    assert_same_weights,
    final_state,
    losses,
    overrides,
    torchrun,
    train_single_double_batch,
)
from helpers.launch import finish, kill, rendezvous, start, train_args, wait_for_checkpoint, worker_pid

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dist")
    proc = torchrun(str(ROOT / "tests" / "engine_dist_worker.py"), str(root), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return root


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, the double batch per micro-batch."""
    return train_single_double_batch(tmp_path_factory.mktemp("single"))


@pytest.mark.parametrize("strategy", ["ddp", "ddp_static", "fsdp", "fsdp_offload"])
def test_two_ranks_match_one_process_with_double_batch(runs: Path, single: Path, strategy: str) -> None:
    assert_same_training(runs / strategy, single)
    assert final_state(runs / strategy)["world_size"] == 2
    assert len(final_state(runs / strategy)["rng"]) == 2  # one RNG state per rank


def test_ddp_resume_is_exact(runs: Path) -> None:
    assert losses(runs / "ddp_resumed") == losses(runs / "ddp_full")
    assert_same_weights(final_state(runs / "ddp_resumed")["model"], final_state(runs / "ddp_full")["model"])
    rng = final_state(runs / "ddp_full")["rng"]
    assert not torch.equal(rng[0]["torch"], rng[1]["torch"])  # ranks draw different dropout masks


@pytest.fixture(scope="module")
def lidar_runs(tmp_path_factory: pytest.TempPathFactory, synth_index, synth_root) -> Path:
    root = tmp_path_factory.mktemp("dist-lidar")
    index = str(synth_root / "drivetrain_index.npz")
    proc = torchrun(str(ROOT / "tests" / "engine_dist_worker.py"), str(root), "lidar", index, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return root


@pytest.mark.slow  # ~8 s (its own torchrun run); a DDP resume: test_ddp_resume_is_exact
def test_lidar_ranks_draw_their_own_augmentation_and_resume_bit_exactly(lidar_runs: Path) -> None:
    """PointPillars tiny under DDP (2 gloo ranks, 4 steps): each rank draws its own lidar augmentation for each
    batch; stopped after 2 steps and resumed, the draws of steps 3–4 and the final weights are the straight run's."""
    draws = {
        (run, rank): torch.load(lidar_runs / f"draws-{run}-rank{rank}.pt", weights_only=True)
        for run in ("full", "resumed")
        for rank in (0, 1)
    }
    for rank in (0, 1):
        assert [(d["epoch"], d["step"]) for d in draws["full", rank]] == [(0, 1), (0, 2), (0, 3), (1, 1)]
        for a, b in zip(draws["full", rank][2:], draws["resumed", rank], strict=True):
            assert (a["epoch"], a["step"]) == (b["epoch"], b["step"]) and torch.equal(a["matrix"], b["matrix"])
    for a, b in zip(draws["full", 0], draws["full", 1], strict=True):  # the same positions, other parameters
        assert not torch.equal(a["matrix"], b["matrix"])
    assert losses(lidar_runs / "resumed") == losses(lidar_runs / "full")
    assert_same_weights(final_state(lidar_runs / "resumed")["model"], final_state(lidar_runs / "full")["model"])


def test_a_ddp_run_continues_in_one_process_when_the_global_batch_is_kept(runs: Path, tmp_path: Path) -> None:
    """ddp_full (2 ranks × 8, DDP) continues under strategy none in one process × 8 × accumulation 2 (the exact
    continuation of such a change is tests/test_engine_elastic.py's); × 8 × 1 is refused naming the accumulation."""
    run = tmp_path / "ddp_full"
    shutil.copytree(runs / "ddp_full", run)  # the other tests read the original
    with pytest.raises(ConfigError, match=r"global batch of 16 .* set train\.accumulation=2 to keep it$"):
        Trainer(load_config(SMOKE, overrides(run, "train.steps=14", "checkpoint.every=3", *ON_CPU)), resume="auto")
    cfg = load_config(SMOKE, overrides(run, "train.steps=14", "checkpoint.every=3", "train.accumulation=2", *ON_CPU))
    trainer = Trainer(cfg, resume="auto")  # the checkpoint's config says ddp on 2 ranks; this one none on 1
    assert trainer.state.iteration == 12
    trainer.fit()
    assert len(losses(run)) == 14 and final_state(run)["world_size"] == 1


def test_data_parallel_strategy_without_torchrun_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a torchrun launch"):
        Trainer(load_config(SMOKE, overrides(tmp_path, "distributed.strategy=ddp")))


@pytest.mark.slow  # ~5 s; the CLI under torchrun: the restart test below
def test_cli_runs_under_torchrun(tmp_path: Path) -> None:
    args = overrides(tmp_path, "train.steps=3", "distributed.strategy=ddp", *ON_CPU)
    proc = torchrun("-m", "drivetrain.cli.main", "train", "--config", str(SMOKE), *args, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("3/3 steps") == 1  # only rank 0 reports
    assert len(losses(tmp_path)) == 3


@pytest.mark.parametrize(
    ("extra", "cuda", "expected"),
    [
        ([], True, "nccl"),
        ([], False, "gloo"),
        (["distributed.strategy=fsdp"], True, "nccl"),
        (["distributed.strategy=fsdp", "distributed.fsdp_cpu_offload=true"], False, "gloo"),
        (["distributed.strategy=fsdp", "distributed.fsdp_cpu_offload=true"], True, "cuda:nccl,cpu:gloo"),
        (["distributed.strategy=fsdp", "distributed.fsdp_cpu_offload=true", "distributed.backend=nccl"], True,
         "cuda:nccl,cpu:gloo"),
    ],
)  # fmt: skip
def test_fsdp_cpu_offload_on_cuda_reduces_its_cpu_tensors_with_gloo_beside_nccl(
    tmp_path: Path, extra: list[str], cuda: bool, expected: str
) -> None:
    """An NCCL group reduces no CPU tensor, and FSDP2 CPU offload's gradient norm is one (a partial norm of CPU
    shards, all-reduced): the process group gets a gloo backend for the CPU beside NCCL (the CUDA half,
    tests/test_cuda_distributed.py, needs a GPU)."""
    from drivetrain.engine.distributed import process_group_backend

    cfg = load_config(SMOKE, overrides(tmp_path, "distributed.strategy=ddp", *extra))
    assert process_group_backend(cfg, use_cuda=cuda) == expected


def test_more_ranks_than_gpus_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A second torchrun rank on a machine with one visible GPU (seen on an H100 machine): the error must say
    # so before CUDA's "invalid device ordinal". Only the device count is faked; no process group starts.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"LOCAL_RANK=1 but 1 CUDA device\(s\) are visible.*train.device=cpu"):
        Trainer(load_config(SMOKE, overrides(tmp_path, "distributed.strategy=ddp")))


def test_torchrun_restart_after_a_killed_worker_resumes_bit_exactly(runs: Path, tmp_path: Path) -> None:
    """``torchrun --max-restarts 1`` with its default c10d agent store; rank 1 SIGKILLed by PID after the first
    committed checkpoint: the group restarts, resumes (``--resume auto``) and ends bit-equal to ``ddp_full``, the
    same run uninterrupted (before drivetrain kept each attempt's process-group keys apart, the restarted ranks read
    the killed attempt's gloo addresses: "Connection refused", or a hang in gloo's connect)."""
    deadline = time.monotonic() + 240
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1", *rendezvous("c10d")]
    proc = start([*launcher, *train_args(tmp_path, *RESUME)], **{STEP_DELAY_ENV: "0.3"})
    try:
        assert wait_for_checkpoint(tmp_path, proc, deadline) < 12, "the run ended before the kill"
        os.kill(worker_pid(proc.pid, 1, deadline), signal.SIGKILL)
    except BaseException:
        kill(proc)
        raise
    done = finish(proc, deadline)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    assert "(exitcode: -9) local_rank: 1" in log, log[-6000:]  # torchrun saw the killed worker ...
    assert log.count("resumed from") == 1, log[-6000:]  # ... and rank 0 of the second attempt resumed
    assert losses(tmp_path) == losses(runs / "ddp_full")
    state, expected = final_state(tmp_path), final_state(runs / "ddp_full")
    assert state["train"] == expected["train"]
    assert_same_weights(state["model"], expected["model"])
    for a, b in zip(state["rng"], expected["rng"], strict=True):  # every rank's generators continue exactly
        assert torch.equal(a["torch"], b["torch"])
