"""A failure on one rank of a torchrun run ends the run, not a wait for the process group's timeout.

A rank that fails alone (a frame only it reads is corrupt) may not enter another collective on its way out: the other
ranks are in the step's collectives, and a different one there waits until ``distributed.timeout_s`` on gloo (a barrier
against an all-reduce) and on NCCL (which does not check that ranks call the same collective; a different size there
may also read or write past a buffer). The failing rank says why and leaves; torchrun stops the others.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch

from drivetrain.data.index import load_index
from helpers.engine import ROOT, torchrun

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

CONFIG = ROOT / "configs" / "synth_tiny.yaml"
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
