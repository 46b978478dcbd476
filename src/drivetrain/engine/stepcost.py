"""Kernels and host syncs of one step of the real trainer, for benchmarks whose variants are training runs.

A step is the trainer's ``step`` region (forward, loss, backward, clipping, optimizer) without ``step/data``:
fetching and collating the batch is host work, kept out of the count (a :class:`~drivetrain.profile.Profiler`'s
``host_regions``; ``data=True`` counts it, for batches finished on the device). It is counted in the run's last
warm-up step, as every profiled benchmark does (:mod:`drivetrain.profile.costmodel`), so a benchmark that trains
in-process passes :func:`step_profiler` to ``active`` around ``Trainer.fit`` and reads :func:`step_cost`; one that
trains in a ``drivetrain train`` process calls :func:`count_step` (or ``python -m drivetrain.engine.stepcost``): a
separate run of the same config that counts its third step (the first builds the optimizer's state, DDP's static
graph settles in the second), with ``torch.compile`` off, as compiled code runs eagerly while counted anyway.

Run: ``python -m drivetrain.engine.stepcost CONFIG [KEY=VALUE ...] [--device cpu|cuda]``: prints
``{"kernels": ..., "syncs": ...}`` (under ``torch.distributed.run``, rank 0 prints).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch

from drivetrain.engine.config import load_config
from drivetrain.engine.trainer import Trainer
from drivetrain.profile.costmodel import Cost
from drivetrain.profile.timer import Profiler, active

__all__ = ["DATA", "STEP", "count_step", "step_cost", "step_profiler"]

STEP, DATA = "step", "step/data"  # the trainer's regions


def step_profiler(device: torch.device | str, warmup: int, *, data: bool = False) -> Profiler:
    """A profiler for ``active(...)`` around ``Trainer.fit``: counts step ``warmup - 1``.

    Args:
        device: the trainer's device.
        warmup: the run's warm-up steps (≥ 1 to count).
        data: count the data region too, for runs whose batches are finished on the device (an augmentation
            after the copy); the loader's workers are not seen either way.
    """
    return Profiler(device, warmup=warmup, host_regions=() if data else (DATA,))


def step_cost(profiler: Profiler) -> Cost | None:
    """Kernels and host syncs of the counted training step (data excluded); None if none was counted."""
    return profiler.cost(STEP)


def count_step(config: str | Path, overrides: list[str], device: str = "cpu", steps: int = 3) -> Cost | None:
    """Train ``steps`` steps of ``config`` with ``overrides`` in a scratch folder; the last one's cost.

    Args:
        config: a run config (YAML).
        overrides: ``key=value`` overrides, as ``drivetrain train`` takes them.
        device: ``train.device``.
        steps: steps to run; the last is counted.
    """
    with tempfile.TemporaryDirectory(prefix="drivetrain-stepcost-") as tmp:
        keys = [
            f"run.out_dir={Path(tmp) / 'run'}", "log.progress=false", "log.tensorboard=false", "eval.every=0",
            "eval.at_start=false", f"train.steps={steps}", f"checkpoint.every={steps}", "checkpoint.keep=1",
            f"train.device={device}", "speed.compile=[]",
        ]  # fmt: skip
        trainer = Trainer(load_config(Path(config), [*overrides, *keys]))
        profiler = step_profiler(trainer.device, steps)
        try:
            with active(profiler):
                trainer.fit()
        finally:
            trainer.close()
    return step_cost(profiler)


def main(argv: list[str] | None = None) -> int:
    """``python -m drivetrain.engine.stepcost``: print the counted step's kernels and syncs as JSON."""
    parser = argparse.ArgumentParser(prog="python -m drivetrain.engine.stepcost", description=__doc__.split("\n")[0])
    parser.add_argument("config", type=Path, help="run config (YAML)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--device", default="cpu", help="train.device (default: cpu)")
    parser.add_argument("--steps", type=int, default=3, help="steps to run; the last is counted (default: 3)")
    args = parser.parse_args(argv)
    cost = count_step(args.config, args.overrides, args.device, args.steps)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(None if cost is None else {"kernels": cost.kernels, "syncs": cost.syncs}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
