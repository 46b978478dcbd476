"""A failure on one rank of a torchrun run (training, or ``drivetrain eval`` sharing the frames) ends the run, not a
wait for the process group's timeout.

A rank that fails alone (a frame only it reads is corrupt) may not enter another collective on its way out: the other
ranks are in the step's collectives, and a different one there waits until ``distributed.timeout_s`` on gloo (a barrier
against an all-reduce) and on NCCL (which does not check that ranks call the same collective; a different size there
may also read or write past a buffer). The failing rank says why and leaves; torchrun stops the others.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from drivetrain.data.index import load_index
from drivetrain.engine.eval_shards import EVAL_DELAY_ENV
from helpers.engine import ROOT, cli_env, free_port, torchrun, wait_for
from helpers.streampetr import SMALL

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

CONFIG = ROOT / "configs" / "synth_tiny.yaml"
CAMERA = ROOT / "configs" / "streampetr_tiny.yaml"
TIMEOUT_S = 600  # the process group's timeout: far beyond the run's own time, so a wait for it fails the test


def test_a_frame_one_rank_cannot_read_ends_the_run_with_its_line(synth_root: Path, synth_index, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(synth_root, data)
    index = load_index(data / "drivetrain_index.npz")
    late = int((index.arrays["frame_in_scene"] == 2).nonzero()[0][0])  # a scene's third frame: one stream reads it
    image = data / index.meta["image_files"][late][3]
    image.write_bytes(image.read_bytes()[:100])  # truncated JPEG
    args = ["train", "--config", str(CONFIG), f"run.out_dir={tmp_path / 'run'}", "run.threads=1",
            "log.progress=false", "log.tensorboard=false", "log.every=1", "model.args.width=8",
            "data.name=drivetrain.data.sources:frames", f"data.args={{index: {data / 'drivetrain_index.npz'}}}",
            "train.steps=30", "checkpoint.every=100", "eval.every=0", "distributed.strategy=ddp",
            "train.device=cpu", f"distributed.timeout_s={TIMEOUT_S}"]  # fmt: skip
    started = time.monotonic()
    proc = torchrun("-m", "drivetrain.cli.main", *args, timeout=180)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "drivetrain train: data error:" in line]
    assert len(lines) == 1 and str(image) in lines[0], proc.stderr[-4000:]
    assert time.monotonic() - started < 180 < TIMEOUT_S


@pytest.mark.slow  # ~40 s: a one-step StreamPETR run, then two ranks of `drivetrain eval` until one is interrupted
def test_an_interrupt_to_one_rank_of_a_shared_evaluation_ends_both(
    synth_index, synth_root: Path, tmp_path: Path
) -> None:
    """Rank 1 of ``drivetrain eval --checkpoint`` under torchrun's environment is interrupted while both predict
    (each waits 10 s after a frame): it exits 130 at once, rank 0 on the closed connection, neither at
    ``distributed.timeout_s``."""
    run = tmp_path / "run"
    model = ", ".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items())
    train = [sys.executable, "-m", "drivetrain.cli.main", "train", "--config", str(CAMERA), f"run.out_dir={run}",
             "run.threads=1", "log.progress=false", "log.tensorboard=false", f"model.args={{{model}}}",
             "data.name=drivetrain.data.sources:frames",
             f"data.args={{index: {synth_root / 'drivetrain_index.npz'}, split: mini_train}}", "train.device=cpu",
             "train.steps=1", "eval.every=0", f"distributed.timeout_s={TIMEOUT_S}"]  # fmt: skip
    done = subprocess.run(train, env=cli_env(), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    cmd = [sys.executable, "-m", "drivetrain.cli.main", "eval", "--checkpoint", str(run), "--device", "cpu",
           "--out", str(tmp_path / "eval")]  # fmt: skip
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", EVAL_DELAY_ENV: "10"}
    ranks = [
        subprocess.Popen(cmd, env=cli_env(**rendezvous, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]  # fmt: skip
    header = tmp_path / "header"
    try:
        wait_for(lambda: _predicting(ranks[0], header), ranks[0], timeout=120)
        time.sleep(3)  # both in their first frame's wait
        ranks[1].send_signal(signal.SIGINT)
        errs = [rank.communicate(timeout=60)[1] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    assert ranks[1].returncode == 130, errs[1][-3000:]
    assert "KeyboardInterrupt" in errs[1]
    assert ranks[0].returncode != 0


def _predicting(rank0: subprocess.Popen, seen: Path) -> bool:
    """Whether rank 0 printed its ``eval: ... → OUT`` line (it then predicts); the line is kept in ``seen``."""
    line = rank0.stdout.readline()
    if line.startswith("eval: "):
        seen.write_text(line)
    return seen.exists()
