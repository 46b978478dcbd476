"""The Hungarian solve of StreamPETR's two heads at the published shapes, with G varying per batch as the data gives it.

What a training step's matcher solves, batch after batch: the 3D head's ``L × B`` problems of ``Q = num_query +
num_propagated`` queries against the batch's padded ground-truth count ``G`` (the largest of its samples), and the
focal head's ``B × N`` problems of ``Q = (H / 16) · (W / 16)`` tokens per image against the largest per-image
count. The target counts of each problem are read from ``--warmup`` + ``--repeat`` consecutive batches (every repeat
is one batch) of the config's synthetic set (``configs/streampetr_full.yaml``: ``data/synth-full-704``, generated on
first use), as the trainer's sampler walks it; the costs are tie-free random numbers of those shapes (a solver's run
time depends on the sizes; what an untrained network's costs would change is the number of augmenting steps, not the
shapes — saved costs of a real forward are ~9 MB a batch, too large to commit as test data).

Variants per head, each timed on every batch (medians and maxima over the batches; CUDA events on a GPU):

- ``per problem`` (the reference): as the original assigners do, each problem's matrix to the host on its own,
  NaN/inf mapped, ``scipy.optimize.linear_sum_assignment``, the pairs back;
- ``scipy``: :func:`drivetrain.match.solve` with ``backend="scipy"`` (one transfer, the problems in a thread pool);
- ``gpu`` (CUDA with Triton only): ``backend="auto"`` after :func:`~drivetrain.match.warm_gpu_solver` compiled the
  head's buckets (the compile seconds are reported apart); a shape not compiled would fall back to SciPy, and the
  count of such fallbacks is printed (0 expected).

Device-independent, so printed on any machine: ``kernel shapes over N batches: K`` per head — how many kernel
shapes the batches reach with the target buckets (:func:`~drivetrain.match.solve.padded_target_count`) against
the distinct raw ``G`` values a per-shape kernel would have compiled for.

Run: ``drivetrain bench solve [--config CFG] [--repeat N] [--warmup N] [--device cpu|cuda] [--save]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from drivetrain.match import gpu_solver_available, gpu_solver_shapes, solve, warm_gpu_solver
from drivetrain.match.solve import NAN_COST, NEGINF_COST, POSINF_COST, TARGET_BUCKETS, padded_target_count
from drivetrain.profile import Profiler
from drivetrain.profile.bench import add_bench_arguments, emit, setup_bench
from drivetrain.profile.report import BenchResult, Row, device_name
from drivetrain.profile.timer import synchronize
from drivetrain.ragged import RaggedBatch

DESCRIPTION = "StreamPETR's Hungarian solves at the published shapes: per problem vs SciPy batch vs GPU kernel"
ROOT = Path(__file__).resolve().parents[1]
STRIDE = 16  # the focal head's tokens per image: the backbone's stride (models.streampetr.recipe.STRIDE)


def _iteration_module() -> Any:
    """``iteration.py`` of this folder (its config and dataset helpers), loaded as ``drivetrain bench`` loads it."""
    path = Path(__file__).parent / "iteration.py"
    spec = importlib.util.spec_from_file_location("drivetrain_bench_iteration_for_solve", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def target_counts(args: argparse.Namespace, batches: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per batch the target counts of each head's problems, and what the config says of the shapes."""
    it = _iteration_module()
    args.model, args.size = "streampetr", "full"
    _, raw = it.load_config(args)
    ds, data_args = it.build_dataset(args, raw["data"].get("args", {}))
    model_args = raw["model"].get("args", {})
    layers = int(model_args.get("num_layers", 6))
    queries = int(model_args.get("num_query", 644)) + int(model_args.get("num_propagated", 256))
    out, tokens = [], None
    t0 = time.perf_counter()
    for i, keys in enumerate(it.batch_keys(ds, args.batch, batches, args.seed)):
        batch = ds.collate([ds[k] for k in keys])
        h, w = batch.images.shape[-2:]
        tokens = math.ceil(h / STRIDE) * math.ceil(w / STRIDE)
        per_sample = batch.gt_boxes.sizes  # (B,)
        out.append(
            {
                "3D head": per_sample.expand(layers, -1).clone(),  # (L, B): every decoder layer solves its samples
                "focal head": batch.gt_boxes_2d.sizes.clone(),  # (B, N)
            }
        )
        print(f"\r  read {i + 1}/{batches} batches ({time.perf_counter() - t0:.1f} s)", end="", flush=True)
    print(flush=True)
    shapes = {"3D head": queries, "focal head": tokens}
    info = {
        "config": str(Path(args.config).resolve().relative_to(ROOT))
        if ROOT in Path(args.config).resolve().parents
        else str(args.config),
        "data": f"synthetic {data_args.get('size')} ({data_args.get('split')}), root {data_args['root']}",
        "layers": layers,
        "batch": args.batch,
        "queries": shapes,
    }
    return out, info


def random_costs(sizes: torch.Tensor, q: int, gen: torch.Generator, device: torch.device) -> RaggedBatch:
    """Tie-free costs ``(*batch, Q, G)`` for the target counts ``sizes``, ``G`` their maximum; padding NaN."""
    g = int(sizes.max()) if sizes.numel() else 0
    tensor = torch.rand((*sizes.shape, q, g), generator=gen)  # (*batch, Q, G)
    tensor = torch.where(torch.arange(g) < sizes[..., None, None], tensor, float("nan"))
    return RaggedBatch(tensor.to(device), sizes.to(device), ragged_dim=sizes.dim() + 1)


def per_problem(costs: RaggedBatch) -> list[torch.Tensor]:
    """The original assigners' solve: one problem at a time, its matrix to the host, mapped, SciPy, pairs back."""
    flat = costs.tensor.reshape(-1, *costs.shape[-2:])  # (P, Q, G)
    pairs = []
    for p, m in enumerate(costs.sizes.reshape(-1).tolist()):  # sync: the original's sizes are host lists
        host = torch.nan_to_num(flat[p, :, :m].cpu(), nan=NAN_COST, posinf=POSINF_COST, neginf=NEGINF_COST)
        rows, cols = linear_sum_assignment(host.numpy())
        pairs.append(torch.from_numpy(np.stack([rows, cols], -1)).to(costs.device))
    return pairs


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=20, warmup=1)
    parser.add_argument(
        "--config", type=Path, default=ROOT / "configs" / "streampetr_full.yaml", help="StreamPETR run config"
    )
    parser.add_argument("--batch", type=int, default=8, help="batch slots B (default: 8)")
    parser.add_argument("--data-root", type=Path, default=None, help="dataset folder (default: the config's root)")
    parser.add_argument("--scenes", type=int, default=None, help="only the first N scenes of the preset")
    parser.add_argument(
        "--max-targets", type=int, default=TARGET_BUCKETS[-1], help="GPU warm-up: compile the buckets up to this G"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.warmup < 0 or args.batch < 1:
        raise SystemExit("--repeat and --batch must be ≥ 1, --warmup ≥ 0")
    device = setup_bench(args)
    batches = args.warmup + args.repeat  # every batch is one repeat: warm-up batches first, then the timed ones
    counts, info = target_counts(args, batches)
    gen = torch.Generator().manual_seed(args.seed)
    problems = [{head: random_costs(sizes, info["queries"][head], gen, device) for head, sizes in c.items()}
                for c in counts]  # fmt: skip

    gpu = gpu_solver_available(device)
    warm_seconds = {}
    if gpu:
        for head, q in info["queries"].items():
            warm = warm_gpu_solver(q, args.max_targets, device)
            warm_seconds[head] = round(warm.seconds, 3)
            print(f"{head}: {warm.describe()}", flush=True)
    variants = {
        "per problem": per_problem,
        "scipy": lambda costs: solve(costs, backend="scipy"),
        **({"gpu": lambda costs: solve(costs, backend="auto")} if gpu else {}),
    }
    for i, batch in enumerate(problems):  # every variant gives the original's pairs on every batch
        for head, costs in batch.items():
            expected = per_problem(costs)
            for name, fn in variants.items():
                got = fn(costs) if name != "per problem" else None
                if got is None:
                    continue
                flat = got.tensor.reshape(-1, *got.shape[-2:]).cpu()  # (P, G, 2)
                sizes = got.sizes.reshape(-1).tolist()
                if any(
                    not torch.equal(flat[p, :n], e.cpu()) for p, (n, e) in enumerate(zip(sizes, expected, strict=True))
                ):
                    raise SystemExit(f"batch {i}, {head}: the {name} pairs differ from the per-problem solve")
    profiler = Profiler(device, warmup=args.warmup, count=False)
    fallbacks_before = gpu_solver_shapes()["fallbacks"]
    for batch in problems:
        for head, costs in batch.items():
            for name, fn in variants.items():
                synchronize(device)
                with profiler.region(f"{head}: {name}"):
                    fn(costs)
                synchronize(device)
        profiler.step()
    fallbacks = gpu_solver_shapes()["fallbacks"] - fallbacks_before
    summary = profiler.summary()

    rows, shapes_line = [], {}
    for head, q in info["queries"].items():
        timed = [c[head] for c in counts[args.warmup :]]
        raw_g = [int(s.max()) if s.numel() else 0 for s in timed]
        shapes_line[head] = {
            "queries": q,
            "problems": int(timed[0].numel()) if timed else 0,
            "padded_gt_per_batch": raw_g,
            "distinct_gt": len(set(raw_g)),
            "kernel_shapes": len({padded_target_count(g) for g in raw_g if g}),
        }
        stats = {name: summary[f"{head}: {name}"] for name in variants}
        batched = "gpu" if gpu else "scipy"
        rows.append(
            Row(
                name=f"{head} solve (Q {q}, {shapes_line[head]['problems']} problems)",
                reference_ms=stats["per problem"].median,
                batched_ms=stats[batched].median,
                reference_max_ms=stats["per problem"].max,
                batched_max_ms=stats[batched].max,
                variants={name: s.median for name, s in stats.items()},
                variants_max={name: s.max for name, s in stats.items()},
                baseline="per problem",
            )
        )
    config = {
        **info,
        "backend_batched": "gpu (auto, warmed)" if gpu else "scipy (no GPU solver here)",
        "repeat": args.repeat,
        "warmup": args.warmup,
        "seed": args.seed,
        "shapes": shapes_line,
    }
    notes = [
        "Each repeat is one batch of the config's data (its own G); warm-up batches first. Costs: tie-free random "
        "numbers of the batch's shapes, NaN in the padding.",
        "Before timing, every variant's pairs equaled the per-problem solve's on every batch. "
        "per problem = the original assigners' loop (each matrix to the host, SciPy, pairs back); scipy = one "
        "transfer and a thread pool; gpu = backend auto after warm_gpu_solver (CUDA with Triton only).",
    ]
    if gpu:
        notes.append(
            f"GPU warm-up (compile) seconds per head: {warm_seconds}; SciPy fallbacks while timed: {fallbacks}"
        )
    result = BenchResult("solve", device_name(device), config, rows=rows, notes=notes)
    for head, line in shapes_line.items():
        print(
            f"{head}: kernel shapes over {len(line['padded_gt_per_batch'])} batches: {line['kernel_shapes']} "
            f"(distinct G: {line['distinct_gt']}, a per-shape kernel would compile each)"
        )
    if gpu:
        print(f"GPU compile seconds (before timing): {warm_seconds}; SciPy fallbacks while timed: {fallbacks}")
    emit(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
