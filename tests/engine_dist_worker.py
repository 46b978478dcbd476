"""Run under ``torchrun --nproc_per_node 2``: the data-parallel scenarios of test_engine_distributed.py.

Usage: ``torchrun ... tests/engine_dist_worker.py OUT_ROOT``. Every scenario trains the smoke model in
the same process group and writes its run directory under OUT_ROOT. ``... OUT_ROOT lidar INDEX`` instead trains
PointPillars tiny on the frame index INDEX under DDP with the lidar augmentation on, straight and stopped +
resumed, and writes each rank's augmentation draws to ``OUT_ROOT/draws-<run>-rank<r>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from drivetrain.engine import Trainer, load_config
from helpers.engine import FLOAT64, NO_BATCH_COUPLING, ON_CPU, ROOT, SMOKE, overrides

# Per rank batch 8 × 2 micro-batches (the test's single process uses batch 16 × 2), in float64.
PARALLEL = ["train.steps=10", "train.accumulation=2", "data.batch_size=8", *NO_BATCH_COUPLING, *FLOAT64, *ON_CPU]
SCENARIOS = {
    "ddp": [*PARALLEL, "distributed.strategy=ddp"],
    "ddp_static": [*PARALLEL, "distributed.strategy=ddp", "distributed.static_graph=true"],
    "fsdp": [*PARALLEL, "distributed.strategy=fsdp"],
    "fsdp_offload": [*PARALLEL, "distributed.strategy=fsdp", "distributed.fsdp_cpu_offload=true"],
}
# Resume under DDP with dropout and the streaming memory on: per-rank RNG and buffers must round-trip.
RESUME = ["train.steps=12", "checkpoint.every=3", "distributed.strategy=ddp", *ON_CPU]


def main(root: Path) -> None:
    trainer = None
    for name, extra in SCENARIOS.items():
        trainer = Trainer(load_config(SMOKE, overrides(root / name, *extra)))
        trainer.fit()
    Trainer(load_config(SMOKE, overrides(root / "ddp_full", *RESUME))).fit()
    Trainer(load_config(SMOKE, overrides(root / "ddp_resumed", *RESUME, "train.steps=5"))).fit()
    trainer = Trainer(load_config(SMOKE, overrides(root / "ddp_resumed", *RESUME)), resume="auto")
    assert trainer.state.iteration == 5, trainer.state
    trainer.fit()
    trainer.close()


def lidar_overrides(out: Path, index: str, *extra: str) -> list[str]:
    """PointPillars tiny on the test set's frames, one frame per rank and step, DDP on the CPU."""
    return [
        f"run.out_dir={out}", "run.threads=1", "run.deterministic=true", "log.progress=false",
        "log.tensorboard=false", "log.every=1", "data.name=drivetrain.data.sources:frames",
        f"data.args={{index: {index}, split: mini_train, load_images: false, load_points: true, num_sweeps: 1, "
        "use_dim: [0, 1, 2, 4]}", "data.batch_size=1", "model.args.max_voxels=2000", "train.steps=4",
        "checkpoint.every=2", "eval.every=0", "eval.at_start=false", "distributed.strategy=ddp", *ON_CPU, *extra,
    ]  # fmt: skip


def train_recording_draws(trainer: Trainer, path: Path) -> None:
    """Train, keeping the lidar augmentation's draws of every batch (position, angle, scale, flips) of this rank."""
    draws, params = [], trainer.augment.params

    def recording(batch, position):
        drawn = params(batch, position)
        draws.append({"epoch": position["epoch"], "step": position["step"], "matrix": drawn.lidar.matrix.clone()})
        return drawn

    trainer.augment.params = recording  # the prefetcher's transform calls augment(batch, position) → params
    trainer.fit()
    torch.save(draws, path)


def lidar(root: Path, index: str) -> None:
    config = ROOT / "configs" / "pointpillars_tiny.yaml"
    trainer = Trainer(load_config(config, lidar_overrides(root / "full", index)))
    train_recording_draws(trainer, root / f"draws-full-rank{trainer.ctx.rank}.pt")
    Trainer(load_config(config, lidar_overrides(root / "resumed", index, "train.steps=2"))).fit()
    trainer = Trainer(load_config(config, lidar_overrides(root / "resumed", index)), resume="auto")
    assert trainer.state.iteration == 2, trainer.state
    train_recording_draws(trainer, root / f"draws-resumed-rank{trainer.ctx.rank}.pt")
    trainer.close()


if __name__ == "__main__":
    if sys.argv[2:3] == ["lidar"]:
        lidar(Path(sys.argv[1]), sys.argv[3])
    else:
        main(Path(sys.argv[1]))
