"""Run under ``torchrun --nproc_per_node 2``: the DeepSpeed scenarios of test_engine_deepspeed.py.

Usage: ``torchrun ... tests/engine_deepspeed_worker.py OUT_ROOT SCENARIO [SCENARIO ...]``. Every scenario
trains the smoke model in the same process group and writes its run directory under OUT_ROOT.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).parent))

from drivetrain.engine import Trainer, load_config
from helpers.engine import NO_BATCH_COUPLING, ON_CPU, SMOKE, overrides

# Per rank batch 8 × 2 micro-batches (the test's single process uses batch 16 × 2), as engine_dist_worker.py,
# but in float32: DeepSpeed casts the model to float32 (no float64 training).
PARALLEL = ["train.steps=10", "train.accumulation=2", "data.batch_size=8", *NO_BATCH_COUPLING]
DS = ["distributed.strategy=deepspeed", *ON_CPU]  # DS_ACCELERATOR=cpu: the CPU accelerator, gloo
SCENARIOS = {
    "zero1": [*PARALLEL, *DS, "distributed.deepspeed_zero_stage=1"],
    "zero2_offload": [*PARALLEL, *DS, "distributed.deepspeed_offload_optimizer=true"],
    "zero3": [*PARALLEL, *DS, "distributed.deepspeed_zero_stage=3"],
    "zero3_offload": [
        *PARALLEL,
        *DS,
        "distributed.deepspeed_zero_stage=3",
        "distributed.deepspeed_offload_optimizer=true",
        "distributed.deepspeed_offload_params=true",
    ],
}
# A loss weight past float32's range makes every loss infinite (a NaN weight is refused by the config): each step must
# be skipped and counted.
NONFINITE = ["train.steps=2", *DS, "distributed.deepspeed_offload_optimizer=true", "model.loss_weights.box=1.0e+39"]
# Resume with dropout and the streaming memory on: per-rank RNG, buffers and ZeRO state must round-trip.
RESUME = ["train.steps=12", "checkpoint.every=3", *DS, "distributed.deepspeed_offload_optimizer=true"]


def run(root: Path, name: str) -> None:
    if name in SCENARIOS:
        Trainer(load_config(SMOKE, overrides(root / name, *SCENARIOS[name]))).fit()
    elif name == "nonfinite":
        Trainer(load_config(SMOKE, overrides(root / name, *NONFINITE))).fit()
    elif name == "resume":
        Trainer(load_config(SMOKE, overrides(root / "resume_full", *RESUME))).fit()
        Trainer(load_config(SMOKE, overrides(root / "resume_stopped", *RESUME, "train.steps=5"))).fit()
        trainer = Trainer(load_config(SMOKE, overrides(root / "resume_stopped", *RESUME)), resume="auto")
        assert trainer.state.iteration == 5, trainer.state
        trainer.fit()
    else:
        raise SystemExit(f"unknown scenario {name!r}; known: {', '.join([*SCENARIOS, 'nonfinite', 'resume'])}")


if __name__ == "__main__":
    for scenario in sys.argv[2:]:
        run(Path(sys.argv[1]), scenario)
