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

Before timing, each variant's pairs are checked on every batch against the per-problem solve: an assignment of
``min(Q, M)`` pairs whose total cost is the optimum's within float32 rounding (:func:`cost_tolerance`; the GPU kernel
solves in float32, where costs that differ in float64 may tie, and may then return the other pairs); the JSON's
``config.checked`` counts the problems solved with other pairs at an equal cost, ``config.gpu_solver`` the solver's
fallbacks to SciPy and its calls through the package's public wrapper. Anything else stops the benchmark.

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
from drivetrain.profile.results import BenchResult, Row, device_name
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


def cost_tolerance(num_pairs: int, largest_cost: float) -> float:
    """How much more than the optimum a float32 solver's assignment of ``num_pairs`` pairs may cost.

    The GPU kernel works in float32 where SciPy works in float64; where two assignments' totals differ by less than
    float32 rounding (an exact tie in float32 of costs that differ in float64), either may come out. Each reduced cost
    ``c − u − v`` the kernel compares is a sum of three terms; a potential is a sum of at most ``n`` cost differences
    along an alternating path, so ``|u| + |v| ≤ 4 n M`` (``M``: the largest cost magnitude the kernel sees, its
    padding cost included), and each reduced cost is off by at most ``δ = 3 ε (1 + 4 n) M`` (ε: float32's). The
    assignment found is then optimal for costs each within ``δ`` of the true ones, so its true total is within
    ``2 n δ`` of the optimum.
    """
    eps = float(np.finfo(np.float32).eps)
    return 2 * num_pairs * 3 * eps * (1 + 4 * num_pairs) * largest_cost


def check_assignments(costs: RaggedBatch, got: RaggedBatch, expected: list[torch.Tensor]) -> dict[str, float]:
    """Check a solver's pairs against the per-problem solve: per problem ``min(Q, M)`` pairs of distinct predictions
    and real targets, of a total cost (float64) at most :func:`cost_tolerance` above the per-problem optimum.

    Returns:
        ``problems`` checked, ``other_pairs``: problems whose pairs differ from the per-problem ones at an equal cost
        (within the tolerance), and ``max_excess``: the largest cost above the optimum (≥ 0 up to rounding).

    Raises:
        ValueError: naming the problem, for pairs that are not an assignment or cost more than the tolerance allows.
    """
    flat_costs = costs.tensor.reshape(-1, *costs.shape[-2:]).double().cpu()  # (P, Q, G)
    flat = got.tensor.reshape(-1, *got.shape[-2:]).cpu()  # (P, G, 2)
    sizes = got.sizes.reshape(-1).tolist()  # host lists: a check, not a timed path
    counts = {"problems": 0, "other_pairs": 0, "max_excess": 0.0}
    for p, (n, want) in enumerate(zip(sizes, expected, strict=True)):
        pairs, want = flat[p, :n], want.cpu()
        if n != len(want):
            raise ValueError(f"problem {p}: {n} pairs, the per-problem solve has {len(want)}")
        counts["problems"] += 1
        if torch.equal(pairs, want):
            continue
        rows, cols = pairs[:, 0], pairs[:, 1]
        m = int(costs.sizes.reshape(-1)[p])
        if len(set(rows.tolist())) != n or len(set(cols.tolist())) != n or bool((cols >= m).any()):
            raise ValueError(f"problem {p}: the pairs are not an assignment of distinct predictions and real targets")
        block = torch.nan_to_num(flat_costs[p, :, :m], nan=NAN_COST, posinf=POSINF_COST, neginf=NEGINF_COST)
        total, optimum = float(block[rows, cols].sum()), float(block[want[:, 0], want[:, 1]].sum())
        largest = 2 * float(block.abs().max()) + 1  # the gpu backend's padding cost, above every real cost
        if total - optimum > cost_tolerance(n, largest):
            raise ValueError(f"problem {p}: total cost {total:.9g} exceeds the optimum {optimum:.9g} by more than "
                             f"float32 rounding allows ({cost_tolerance(n, largest):.3g})")  # fmt: skip
        counts["other_pairs"] += 1
        counts["max_excess"] = max(counts["max_excess"], total - optimum)
    return counts


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
    checked = {name: {"problems": 0, "other_pairs": 0, "max_excess": 0.0} for name in variants if name != "per problem"}
    for i, batch in enumerate(problems):  # every variant's assignment is as cheap as the per-problem solve's
        for head, costs in batch.items():
            expected = per_problem(costs)
            for name in checked:
                got = variants[name](costs)
                try:
                    found = check_assignments(costs, got, expected)
                except ValueError as err:
                    raise SystemExit(f"batch {i}, {head}: the {name} solve: {err}") from None
                total = checked[name]
                total["problems"] += found["problems"]
                total["other_pairs"] += found["other_pairs"]
                total["max_excess"] = max(total["max_excess"], found["max_excess"])
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
    solver = gpu_solver_shapes()
    fallbacks = solver["fallbacks"] - fallbacks_before
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
        "checked": checked,
        "gpu_solver": {key: solver[key] for key in ("fallbacks", "wrapper_calls")} | {"fallbacks_timed": fallbacks},
    }
    notes = [
        "Each repeat is one batch of the config's data (its own G); warm-up batches first. Costs: tie-free random "
        "numbers of the batch's shapes, NaN in the padding.",
        "Before timing, every variant's pairs were checked on every batch: an assignment of min(Q, M) pairs whose "
        "total cost is the per-problem optimum's within float32 rounding (config.checked: problems whose pairs "
        "differ at an equal cost, and the largest excess). "
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
