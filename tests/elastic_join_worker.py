"""Run under ``drivetrain launch --nnodes 1:2 --nproc_per_node 1 tests/elastic_join_worker.py OUT`` (two agents):
join the process group as the trainer does (:func:`drivetrain.engine.distributed.setup`), all-reduce ``rank + 1``
and write the sum to ``OUT/world<W>-rank<R>.txt``. Alone (world 1) it then waits for the second agent's arrival to
restart it; in a world of 2 it exits 0.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from drivetrain.engine import load_config
from drivetrain.engine.distributed import setup, teardown
from helpers.engine import ON_CPU, SMOKE


def main(out: Path) -> None:
    ctx = setup(load_config(SMOKE, ["distributed.strategy=ddp", *ON_CPU]))
    total = torch.tensor([ctx.rank + 1.0])
    dist.all_reduce(total)
    (out / f"world{ctx.world_size}-rank{ctx.rank}.txt").write_text(f"{total.item():g}")
    if ctx.world_size == 1:
        time.sleep(600)  # torchrun stops this worker when the second node joins
    teardown(ctx)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
