"""Run under ``torchrun --nproc_per_node 2``: the data-parallel scenarios of test_engine_distributed.py.

Usage: ``torchrun ... tests/engine_dist_worker.py OUT_ROOT``. Every scenario trains the smoke model in
the same process group and writes its run directory under OUT_ROOT.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from drivetrain.engine import Trainer, load_config
from helpers.engine import FLOAT64, NO_BATCH_COUPLING, ON_CPU, SMOKE, overrides

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


if __name__ == "__main__":
    main(Path(sys.argv[1]))
