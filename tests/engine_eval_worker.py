"""Run under ``torchrun --nproc_per_node 2``: evaluation during training over both ranks
(test_engine_eval_shards.py).

Usage: ``torchrun ... tests/engine_eval_worker.py OUT_ROOT INDEX camera,lidar`` trains, in one process group, a
small StreamPETR (``camera``: streaming memory, whole scenes per rank) and PointPillars tiny (``lidar``: batch
norms, rank 0's statistics must be used) on the test set's frames for 2 steps under DDP on the CPU with an
evaluation at step 2, into ``OUT_ROOT/<run>``, writing the sample tokens each rank detected and digests of its
buffers then and after the run to ``OUT_ROOT/<run>/detected-rank<r>.json``. ``...,broken BROKEN_INDEX`` trains the
StreamPETR run again on BROKEN_INDEX's copy of the set, one of whose evaluation images is missing.

``... OUT_ROOT timeout`` joins a group with ``distributed.timeout_s=2``; rank 0 arrives at a barrier 8 s late and
rank 1 writes what its barrier did to ``OUT_ROOT/timeout-rank1.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from drivetrain.engine import Trainer, load_config
from drivetrain.engine.distributed import setup
from helpers.engine import ON_CPU, ROOT, SMOKE
from helpers.streampetr import SMALL

BASE = ["run.threads=1", "run.deterministic=true", "log.progress=false", "log.tensorboard=false", "log.every=1",
        "data.name=drivetrain.data.sources:frames", "train.steps=2", "eval.every=2", "eval.at_start=false",
        "eval.split=mini_val", "distributed.strategy=ddp", "distributed.timeout_s=300", *ON_CPU]  # fmt: skip


def camera_overrides(out: Path, index: str) -> list[str]:
    """The small StreamPETR of the evaluation tests on the test set's camera frames."""
    args = ", ".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items())
    return [*BASE, f"run.out_dir={out}", f"model.args={{{args}}}", f"data.args={{index: {index}, split: mini_train}}",
            "data.batch_size=1"]  # fmt: skip


def lidar_overrides(out: Path, index: str) -> list[str]:
    """PointPillars tiny on the test set's lidar frames."""
    return [*BASE, f"run.out_dir={out}", "data.batch_size=1", "model.args.max_voxels=2000",
            f"data.args={{index: {index}, split: mini_train, load_images: false, load_points: true, num_sweeps: 1, "
            "use_dim: [0, 1, 2, 4]}"]  # fmt: skip


def buffer_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the model's buffers (batch norm statistics, ...), in order."""
    digest = hashlib.sha256()
    for buffer in model.buffers():
        digest.update(buffer.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def train_recording_frames(trainer: Trainer, out: Path) -> None:
    """Train, writing to ``out/detected-rank<r>.json`` the sample tokens this rank's model detected (in order), the
    digests of its buffers while it detected them and its buffers' digest after the run."""
    tokens: list[str] = []
    digests: set[str] = set()
    detect = trainer.model.detect

    def recording(batch):
        tokens.extend(batch.sample_tokens)
        digests.add(buffer_digest(trainer.model))
        return detect(batch)

    trainer.model.detect = recording
    trainer.fit()
    record = {"tokens": tokens, "buffers_at_detect": sorted(digests), "buffers_after": buffer_digest(trainer.model)}
    (out / f"detected-rank{trainer.ctx.rank}.json").write_text(json.dumps(record))


def main(root: Path, index: str, runs: list[str], broken_index: str | None = None) -> None:
    trainer = None
    for run in runs:  # one process group for all
        if run == "camera":
            config, args = ROOT / "configs" / "streampetr_tiny.yaml", camera_overrides(root / run, index)
        elif run == "broken":
            config, args = ROOT / "configs" / "streampetr_tiny.yaml", camera_overrides(root / run, broken_index)
        else:
            config, args = ROOT / "configs" / "pointpillars_tiny.yaml", lidar_overrides(root / run, index)
        trainer = Trainer(load_config(config, args))
        train_recording_frames(trainer, root / run)
    trainer.close()


def timeout(root: Path) -> None:
    ctx = setup(load_config(SMOKE, ["distributed.strategy=ddp", "distributed.timeout_s=2", *ON_CPU]))
    import torch.distributed as dist

    if ctx.rank == 0:
        time.sleep(8)
    try:
        dist.barrier()
        outcome = "passed"
    except RuntimeError as err:
        outcome = f"raised: {err}"
    if ctx.rank == 1:
        (root / "timeout-rank1.json").write_text(json.dumps(outcome))
    os._exit(0)  # the group is broken: no teardown


if __name__ == "__main__":
    if sys.argv[2] == "timeout":
        timeout(Path(sys.argv[1]))
    else:
        main(Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), *sys.argv[4:5])
