"""Helpers of the elastic-resume tests: smoke runs in float64 that record the dataset rows each rank reads.

One run directory is trained in legs (each leg a ``train.steps`` target, the later ones with ``--resume auto``) on
whatever number of ranks launches it; every rank writes the rows of each micro-batch it read to
``<run>/rows-<leg>-rank<r>.pt``, and :func:`rows_per_step` puts all ranks' rows of each optimizer step together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from helpers.engine import FLOAT64, NO_BATCH_COUPLING, ON_CPU, SMOKE, overrides

# The global batch of every elastic run: data.batch_size × ranks × train.accumulation = 16 of the 64 samples (FAST),
# so an epoch is 4 optimizer steps; the runs train 6, across the epoch boundary.
GLOBAL_BATCH = 16
STEPS = 6
ELASTIC = [*NO_BATCH_COUPLING, *FLOAT64, *ON_CPU, "checkpoint.every=100"]


# The same batch overrides for every leg: the accumulation follows from the global batch on each leg's ranks.
GLOBAL = ["train.global_batch=16", "data.batch_size=8"]


def split(batch_size: int, accumulation: int, strategy: str = "none") -> list[str]:
    """The overrides of one split of the global batch."""
    return [f"data.batch_size={batch_size}", f"train.accumulation={accumulation}", f"distributed.strategy={strategy}"]


def train_leg(run: Path, leg: str, steps: int, *extra: str, resume: bool = False) -> Any:
    """Train the smoke model in ``run`` up to ``steps`` iterations (continuing with ``resume``), recording this
    rank's rows of every micro-batch in ``run/rows-<leg>-rank<r>.pt``; returns the trainer (under torchrun the
    legs share one process group: close only the last one)."""
    from drivetrain.engine import Trainer, load_config

    cfg = load_config(SMOKE, overrides(run, *ELASTIC, f"train.steps={steps}", *extra))
    trainer = Trainer(cfg, resume="auto" if resume else None)
    rows: list[torch.Tensor] = []
    read = trainer.data.next

    def recording():  # the trainer's one call per micro-batch
        batch, indices = read()
        rows.append(indices.clone())
        return batch, indices

    trainer.data.next = recording
    trainer.fit()
    accumulation = trainer.cfg.train.accumulation  # derived on this many ranks with train.global_batch
    torch.save(
        {"rows": rows, "accumulation": accumulation, "start": steps - len(rows) // accumulation},
        run / f"rows-{leg}-rank{trainer.ctx.rank}.pt",
    )
    return trainer


def rows_per_step(run: Path) -> dict[int, list[int]]:
    """Every optimizer step's rows, read by all ranks in all legs of ``run`` (sorted): ``{iteration: rows}``."""
    steps: dict[int, list[int]] = {}
    for path in sorted(run.glob("rows-*-rank*.pt")):
        record = torch.load(path, weights_only=True)
        accumulation, rows = record["accumulation"], record["rows"]
        for i in range(0, len(rows), accumulation):
            step = record["start"] + i // accumulation + 1
            steps.setdefault(step, []).extend(int(r) for micro in rows[i : i + accumulation] for r in micro)
    return {step: sorted(rows) for step, rows in sorted(steps.items())}


def streampetr_overrides(out: Path, index: str, *extra: str) -> list[str]:
    """StreamPETR tiny on the test set's frames (its synthetic scenes), on the CPU, without evaluation."""
    return [
        f"run.out_dir={out}", "run.threads=1", "run.deterministic=true", "log.progress=false", "log.tensorboard=false",
        "eval.every=0", "eval.at_start=false", "data.name=frames", f"data.args={{index: {index}, split: mini_train}}",
        "checkpoint.every=100", *ON_CPU, *extra,
    ]  # fmt: skip
