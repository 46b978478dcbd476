"""Run under ``torchrun --nproc_per_node 2``: the detection losses on each rank's own batch, in one gloo group.

Usage: ``torchrun ... tests/losses_dist_worker.py OUT``. Writes ``OUT/rank{r}.pt``: for each loss, path and
``sync_cls_avg_factor`` setting, the loss terms as floats. test_losses_distributed.py compares them with the
one-process terms of the same batches.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from helpers.heads import path, rank_cases


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {}
    for name, (loss_of, outputs, targets) in rank_cases(rank).items():
        for sync in (False, True):
            for impl in ("reference", "batched"):
                terms = path(loss_of(sync), impl)(outputs, targets)
                results[f"{name}/{impl}/sync={sync}"] = {k: float(v) for k, v in terms.items()}
    out.mkdir(parents=True, exist_ok=True)
    torch.save(results, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
