"""Sharded checkpoints on two ranks (torchrun, gloo): FSDP writes each rank's own shards (no full-state gather on rank
0), a checkpoint is committed only once every rank wrote and hashed its files (a rank SIGKILLed while the others wait
leaves the previous checkpoint the newest: the slow set), asynchronous saves resume bit-exactly on the same ranks, a
save that only one rank's clock calls for is taken by both, and a 2-rank FSDP checkpoint reads whole in one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from drivetrain.engine import Checkpointer
from drivetrain.engine.checkpoint import MARKER, SHARD_DELAY_ENV
from helpers.engine import (
    ROOT,
    assert_same_weights,
    checkpoint_stalls,
    cli_env,
    final_state,
    free_port,
    losses,
    torchrun,
)

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
WORKER = str(ROOT / "tests" / "engine_ckpt_worker.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt-ranks")
    proc = torchrun(WORKER, str(root), "runs", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return root


def test_fsdp_ranks_write_their_own_shards_and_the_marker_covers_them(runs: Path) -> None:
    path = runs / "full" / "checkpoints" / "step-00000004"
    shards = {p.name: p.stat().st_size for p in (path / "weights").iterdir()}
    assert set(shards) == {".metadata.json", "__0_0.distcp", "__1_0.distcp"}
    total = shards["__0_0.distcp"] + shards["__1_0.distcp"]
    assert max(shards["__0_0.distcp"], shards["__1_0.distcp"]) < 0.75 * total  # each its half: no gather to rank 0
    listed = {e["file"] for e in json.loads((path / MARKER).read_text())["files"]}
    assert listed == {f"weights/{name}" for name in shards}


def test_async_fsdp_saves_resume_bit_exactly_on_the_same_ranks(runs: Path) -> None:
    assert losses(runs / "resumed") == losses(runs / "full") and len(losses(runs / "full")) == 4
    a, b = final_state(runs / "resumed"), final_state(runs / "full")  # each read whole in this process
    assert_same_weights(a["model"], b["model"])
    assert all(torch.equal(x["torch"], y["torch"]) for x, y in zip(a["rng"], b["rng"], strict=True))
    for key, value in a["optimizer"]["state"].items():
        assert torch.equal(value["exp_avg_sq"], b["optimizer"]["state"][key]["exp_avg_sq"]), key


def test_a_save_one_rank_clock_calls_for_is_taken_by_every_rank(runs: Path) -> None:
    assert [s for s, _ in Checkpointer(runs / "full" / "checkpoints").committed()] == [2, 3, 4]
    assert list(checkpoint_stalls(runs / "full")) == [2, 3, 4]


def test_a_two_rank_fsdp_checkpoint_reads_whole_in_one_process(runs: Path) -> None:
    state = final_state(runs / "full")
    assert state["world_size"] == 2 and len(state["rng"]) == 2
    weights = state["model"]
    tensors = [t for t in weights.values() if isinstance(t, torch.Tensor)]
    assert tensors and not any(hasattr(t, "placements") for t in tensors)  # plain tensors, no DTensor shards
    from drivetrain.engine import load_config
    from drivetrain.engine.build import build_model
    from helpers.engine import SMOKE, overrides

    model = build_model(load_config(SMOKE, overrides(runs / "x")).model)
    model.load_state_dict(weights)  # every tensor whole, of the model's shapes


# ~11 s; a SIGKILL during a save: tests/test_engine_checkpoint_async.py; a killed rank resumed:
# tests/test_engine_distributed.py
@pytest.mark.slow
def test_a_rank_killed_before_all_ranks_wrote_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           WORKER, str(tmp_path), "kill"]  # fmt: skip
    env = cli_env(**{SHARD_DELAY_ENV: "3"})
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    checkpoints = tmp_path / "run" / "checkpoints"
    try:
        end = time.monotonic() + 240
        while not list(checkpoints.glob(".step-00000004.tmp-*/weights/__1_0.distcp")):
            assert proc.poll() is None and time.monotonic() < end, proc.stdout.read().decode()[-4000:]
            time.sleep(0.02)
        assert (checkpoints / "step-00000002" / MARKER).is_file() and not (checkpoints / "step-00000004").exists()
        os.kill(int((tmp_path / "pid-rank1").read_text()), signal.SIGKILL)  # rank 1 has written, rank 0 waits
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert [s for s, _ in Checkpointer(checkpoints).committed()] == [2]
    assert not (checkpoints / "step-00000004").exists()  # never renamed into place, never committed
    Checkpointer(checkpoints).load(checkpoints / "step-00000002")  # the previous one is whole
