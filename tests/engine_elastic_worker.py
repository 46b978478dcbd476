"""Run under ``torchrun``: the multi-rank legs of tests/test_engine_elastic.py (helpers.elastic trains them).

Usage: ``torchrun --nproc_per_node 2 tests/engine_elastic_worker.py ROOT`` trains, in one process group:

- ``ROOT/two_to_one``: steps 1–3 on 2 ranks × 8 (FSDP2); the test continues them on one process × 8 ×
  accumulation 2 (strategy none);
- ``ROOT/one_to_two``: continues the test's steps 1–3 (one process × 8 × 2) on 2 ranks × 8 (DDP) to step 6;
- ``ROOT/same_command``: continues the test's steps 1–3 (one process) on 2 ranks with the same overrides
  (``train.global_batch=16``, ``data.batch_size=8``: accumulation 2 there, 1 here) to step 6;
- ``ROOT/ddp_to_fsdp``: steps 1–5 on 2 ranks × 4 × 2 under DDP, then 6 under FSDP2 with 2 ranks × 8.

``... ROOT streampetr INDEX`` trains StreamPETR tiny on 2 ranks × 1 scene stream (DDP) for 2 steps in ``ROOT``.
``... ROOT two_to_four`` (2 ranks) trains ``ROOT/two_to_four`` to step 4 (2 × 4 × 2, DDP), and ``... ROOT
four`` (4 ranks) continues it on 4 ranks × 4 (DDP) to step 6.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from drivetrain.engine import Trainer, load_config
from helpers.elastic import GLOBAL, STEPS, split, streampetr_overrides, train_leg
from helpers.engine import ROOT

STREAMS = ["train.steps=2", "data.batch_size=1", "distributed.strategy=ddp"]


def main(root: Path, scenario: str = "two", index: str = "") -> None:
    if scenario == "two":
        train_leg(root / "two_to_one", "a", 3, *split(8, 1, "fsdp"))
        train_leg(root / "one_to_two", "b", STEPS, *split(8, 1, "ddp"), resume=True)
        train_leg(root / "same_command", "b", STEPS, *GLOBAL, "distributed.strategy=ddp", resume=True)
        train_leg(root / "ddp_to_fsdp", "a", 5, *split(4, 2, "ddp"))
        trainer = train_leg(root / "ddp_to_fsdp", "b", STEPS, *split(8, 1, "fsdp"), resume=True)
    elif scenario == "streampetr":  # ... ROOT streampetr INDEX: 2 ranks × 1 stream, 2 steps
        cfg = load_config(ROOT / "configs" / "streampetr_tiny.yaml", streampetr_overrides(root, index, *STREAMS))
        trainer = Trainer(cfg)
        trainer.fit()
    elif scenario == "two_to_four":
        trainer = train_leg(root / "two_to_four", "a", 4, *split(4, 2, "ddp"))
    elif scenario == "four":
        trainer = train_leg(root / "two_to_four", "b", STEPS, *split(4, 1, "ddp"), resume=True)
    else:
        raise SystemExit(f"engine_elastic_worker.py: unknown scenario {scenario!r}")
    trainer.close()  # the legs share the process group: it ends with the last


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
