"""Full training iterations of PointPillars / SSN: reference vs batched anchor assignment and loss, same weights,
same batches. Run through ``drivetrain bench iteration --model pointpillars|ssn`` (``iteration.py`` hands over).

One process builds the model once from ``configs/{pointpillars,ssn}_{tiny,nus}.yaml`` (``--size full`` is the
published nuScenes config) through the engine (``build_model``, ``build_optimizer``: AdamW at the peak lr, no
schedule; gradients clipped to ``optim.clip_norm``), then deep-copies model and optimizer: the two paths run on
**identical copies**, alternating iteration by iteration (``reference`` then ``batched``) on the same batches.
The path is the model's (``model.path``, set on each copy by ``model.set_path(impl=...)``): HardVFE on the
original's ``(V, T)`` slot layout, per-sample (and, for SSN, per-class) max-IoU assignment and per-sample targets as
the originals, or HardVFE's compact path over the stored points, windowed assignment and the loss on the window
pairs, all samples and classes at once. The config's augmentation
(``data.augment.lidar``) runs as the trainer runs it by default, on the device after the copy
(:class:`drivetrain.pipeline.augment.stage.Augmentation`, drawn per batch from the seed and the batch's position),
so both copies see the same augmented points and boxes.

Data: the config's synthetic set (``data.args``); batches of ``--batch`` frames in scene order, a batch of its own
for every iteration (``gt_counts_timed`` in the config: the timed batches' padded ground-truth counts, as read,
before the augmentation's range filter), every batch read once before timing. **remaining (data wait)** is timed
inside each iteration as a loader without workers costs: read the frames with their sweeps, collate, pin (CUDA),
copy to the device and augment there.

Rows (medians over ``--repeat`` after ``--warmup``, each with its slowest timed iteration): iteration → forward
(input: voxelization; encoder: HardVFE + BEV scatter; backbone + neck; head) → loss (assignment; targets + loss) →
optimisation (backward, clip, step) → remaining (data wait). The regions inside forward and loss are the library's own
(``drivetrain.profile.region`` in ``PointPillars.forward`` / ``loss``). Before timing, a throw-away copy checks
that both paths assign identically and give the same loss terms (≤ 1e-4 relative). ``--compile`` adds a third copy
whose batched assignment and loss run under ``torch.compile`` in one graph (the model's ``compile_loss``), as in
``iteration.py``: its rows add ``"variants"`` (no assignment / targets rows inside the graph).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from drivetrain.batch import Batch
from drivetrain.detector.spec import keywords
from drivetrain.engine import load_config
from drivetrain.engine.build import build_model, build_optimizer
from drivetrain.losses.term_weights import resolve_weights, weighted_total
from drivetrain.pipeline.augment.stage import Augmentation
from drivetrain.profile import Profiler, active, device_name, device_slug, emit, rows_from_profilers, synchronize
from drivetrain.profile.bench import RESULTS_DIR, count_variation

ROOT = Path(__file__).resolve().parents[1]
CONFIG_SUFFIX = {"tiny": "tiny", "full": "nus"}  # --size → configs/<model>_<suffix>.yaml
PATHS = ("reference", "batched")
TOP = "iteration"
DATA = f"{TOP}/remaining (data wait)"
ASSIGN, LOSS = f"{TOP}/loss/assignment", f"{TOP}/loss/targets + loss"
CHECK_RTOL = 1e-4  # loss terms of the two paths on the same outputs (float32 sums in another order)
GOALS = {"assignment + targets + loss": 10.0, "iteration": 1.3}  # issue 13, on a GPU at the full config, batch 4


def _base() -> Any:
    """The StreamPETR iteration benchmark's module, for its shared helpers (data, sync counter, chart)."""
    path = Path(__file__).parent / "iteration.py"
    spec = importlib.util.spec_from_file_location("drivetrain_bench_iteration_shared", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Trainee:
    """One path's copy: model, optimizer, loss weights, clip norm and each iteration's detached total."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, weights: dict, clip: float | None):
        self.model, self.optimizer, self.weights, self.clip = model, optimizer, weights, clip
        self.totals: list[torch.Tensor] = []


def iteration(
    t: Trainee, base: Any, ds: Any, keys: list[Any], device: torch.device, timed: Any, augment: Any = None
) -> None:
    """One training iteration: data (and ``augment(batch)``), forward, loss, backward, clip, step (each a region of
    ``timed``)."""
    with timed(TOP):
        with timed("remaining (data wait)"):
            batch = base.fetch(ds, keys, device)
            if augment is not None:  # the trainer's stage, on the device (data.augment_on=device)
                batch = augment(batch)
        with timed("forward"):
            outputs = t.model(batch)
        with timed("loss"):
            total = weighted_total(t.model.loss(outputs, batch), t.weights)
        base.optimise(t, total, timed)
    t.totals.append(total.detach())


def check_paths(model: torch.nn.Module, batch: Batch, relative: Any) -> float:
    """On a throw-away copy: identical assignments and loss terms within ``CHECK_RTOL``; the worst difference."""
    probe = copy.deepcopy(model).train()
    with torch.no_grad():
        outputs = probe(batch)
        assigned, terms = {}, {}
        for impl in PATHS:
            probe.set_path(impl=impl)
            assigned[impl] = probe.assign(outputs["feature_size"], *probe.gt_targets(batch))
            terms[impl] = probe.loss(outputs, batch)
    if not torch.equal(assigned["reference"], assigned["batched"]):
        raise SystemExit("the batched anchor assignment differs from the reference")
    worst = max(relative(terms["reference"][k], terms["batched"][k]) for k in terms["reference"])
    if worst > CHECK_RTOL:
        raise SystemExit(f"the batched loss terms differ from the reference by {worst:.1e} (relative) > {CHECK_RTOL}")
    return worst


def goal_table(rows: dict[str, Any], syncs: dict[str, Any]) -> list[str]:
    """This run's ratios beside the issue's GPU goals (assignment + loss ≥ ×10, iteration ≥ ×1.3)."""
    ref = rows[ASSIGN].reference_ms + rows[LOSS].reference_ms
    bat = rows[ASSIGN].batched_ms + rows[LOSS].batched_ms
    lines = ["| row | this run: reference → batched (ms) | goal on a GPU, full config, batch 4 |", "|---|---|---|"]
    lines.append(f"| assignment + targets + loss | {ref:.1f} → {bat:.1f} (×{ref / bat:.2f}) | ≥ ×10 |")
    it = rows[TOP]
    lines.append(f"| iteration | {it.reference_ms:.1f} → {it.batched_ms:.1f} (×{it.speedup:.2f}) | ≥ ×1.3 |")
    r, b = syncs["reference"], syncs["batched"]
    shown = f"{r['step']} → {b['step']}" if isinstance(r, dict) else r
    lines.append(f"| host syncs per iteration (data excluded) | {shown} | — |")
    return lines


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    base = _base()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    base.add_bench_arguments(parser, repeat=10, warmup=2)
    parser.add_argument("--model", required=True, choices=base.lidar_models(), help="lidar detector")
    parser.add_argument("--size", default="tiny", help="tiny (configs/<model>_tiny.yaml) or full (<model>_nus.yaml)")
    parser.add_argument("--batch", type=int, default=4, help="frames per batch (default: 4, as published)")
    parser.add_argument("--config", type=Path, default=None, help="run config (default: by --model and --size)")
    parser.add_argument("--data-root", type=Path, default=None, help="dataset folder (default: the config's root)")
    parser.add_argument("--scenes", type=int, default=None, help="only the first N scenes of the preset (quick runs)")
    base.add_compile_arguments(parser)
    args = parser.parse_args(argv)
    if args.size not in ("tiny", "full"):
        raise SystemExit(f"--size: unknown size {args.size!r}; available: tiny, full")
    if args.batch < 1 or args.repeat < 1 or args.warmup < 0:
        raise SystemExit("--batch and --repeat must be ≥ 1, --warmup ≥ 0")
    if args.compile and args.warmup < 1:
        raise SystemExit("--compile needs --warmup ≥ 1: the first iteration compiles the loss")
    device = base.setup_bench(args)
    config_path = args.config or ROOT / "configs" / f"{args.model}_{CONFIG_SUFFIX[args.size]}.yaml"
    cfg = load_config(config_path, [])
    stage = Augmentation(cfg.data.augment, seed=args.seed) if cfg.data.augment is not None else None

    def augment_at(step: int) -> Any:
        """The stage for the batch taken at ``step`` (its sampler position after it: epoch 0, step + 1)."""
        return None if stage is None else (lambda batch: stage(batch, {"epoch": 0, "step": step + 1}))

    ds, data_args = base.build_dataset(args, keywords(cfg.data.args))
    count_syncs = device.type == "cuda"
    steps = args.warmup + args.repeat
    keys = base.batch_keys(ds, args.batch, steps + int(count_syncs), args.seed)
    print(f"reading {len(keys)} batches of {args.batch} frames once (warming the file cache) ...", flush=True)
    t0, gt_counts, point_counts, padded, first = time.perf_counter(), [], [], [], None
    for i, k in enumerate(keys):
        batch = base.fetch(ds, k, device)
        gt_counts.extend(batch.gt_boxes.sizes.tolist())
        padded.append(base.padded_gt_counts(batch, images=False))
        point_counts.extend(batch.points.sizes.tolist())
        first = batch if i == 0 else first
        print(f"\r  {i + 1}/{len(keys)} batches ({time.perf_counter() - t0:.1f} s)", end="", flush=True)
    print(flush=True)
    if stage is not None:  # the paths are checked on the first batch as it is trained on
        first = augment_at(0)(first)

    torch.manual_seed(args.seed)
    model = build_model(cfg.model).to(device).train()
    optimizer = build_optimizer(model, cfg.optim)
    for group in optimizer.param_groups:  # peak lr, no schedule
        group["lr"] = cfg.optim.lr * group.get("lr_mult", 1.0)
    weights = resolve_weights(model.loss_weights, cfg.model.loss_weights or {})
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    num_anchors = None
    trainees = {}
    variants = (*PATHS, "compiled") if args.compile else PATHS
    for impl in variants:  # identical copies (same weights, moments and augmentation seed), made before any forward
        m, opt = copy.deepcopy((model, optimizer))
        m.set_path(
            impl="batched" if impl == "compiled" else impl,
            compile_loss=base.compile_options(args) if impl == "compiled" else False,
        )
        trainees[impl] = Trainee(m, opt, weights, cfg.optim.clip_norm)
    print(f"checking the two paths on the first batch ({num_params / 1e6:.2f} M trainable parameters) ...", flush=True)
    worst_terms = check_paths(model, first, base.relative_difference)
    with torch.no_grad():
        num_anchors = int(copy.deepcopy(model).eval()(first)["anchors"].shape[0])
    del model, optimizer, first

    profilers = {  # the compiled copy's kernels are not ATen ops: not counted
        impl: Profiler(device, warmup=args.warmup, nvtx=args.nvtx, count=impl != "compiled") for impl in variants
    }
    t0, compile_seconds = time.perf_counter(), None
    for i in range(steps):
        for impl in variants:
            synchronize(device)
            start = time.perf_counter()
            with active(profilers[impl]):
                iteration(trainees[impl], base, ds, keys[i], device, profilers[impl].region, augment_at(i))
            synchronize(device)
            if impl == "compiled" and i == 0:  # a warm-up iteration: the loss compiles here
                compile_seconds = time.perf_counter() - start
            profilers[impl].step()
        done = "warm-up" if i < args.warmup else "timed"
        print(f"\r  iteration {i + 1}/{steps} ({done}) {time.perf_counter() - t0:.1f} s", end="", file=sys.stderr)
    print(file=sys.stderr)

    syncs: dict[str, Any] = {}
    for impl in variants:
        if not count_syncs:
            syncs[impl] = "n/a (CPU: no device to wait for)"
            continue
        counter = base.SyncCounter()
        synchronize(device)
        with counter.recording():
            iteration(trainees[impl], base, ds, keys[steps], device, counter.region, augment_at(steps))
        synchronize(device)
        c = counter.counts
        syncs[impl] = {"step": c[TOP] - c[DATA], "forward": c[f"{TOP}/forward"], "loss": c[f"{TOP}/loss"],
                       "optimisation": c[f"{TOP}/optimisation"], "data": c[DATA]}  # fmt: skip

    totals = {impl: torch.stack(trainees[impl].totals).double().cpu() for impl in variants}
    first_diff = base.relative_difference(totals["reference"][0], totals["batched"][0])
    if first_diff > CHECK_RTOL:
        raise SystemExit(f"first iteration: batched total loss differs from the reference by {first_diff:.1e}")
    compiled_diff = base.relative_difference(totals["compiled"][0], totals["batched"][0]) if args.compile else 0.0
    if compiled_diff > CHECK_RTOL:
        raise SystemExit(f"first iteration: compiled total loss differs from the batched one by {compiled_diff:.1e}")
    all_diff = max(base.relative_difference(a, b) for a, b in zip(totals["reference"], totals["batched"], strict=True))

    rows = rows_from_profilers(profilers["reference"], profilers["batched"])
    rows = [r for r in rows if not r.name.startswith(DATA)] + [r for r in rows if r.name.startswith(DATA)]
    if args.compile:
        base.add_compiled_variant(rows, profilers["compiled"])
    grid = keywords(cfg.model.args)
    config = {
        "model": args.model,
        "size": args.size,
        "config": base.shown(config_path),
        "batch": args.batch,
        "grid": f"range {list(grid.get('point_cloud_range', []))}, voxel {list(grid.get('voxel_size', []))}",
        "anchors": num_anchors,
        "data": f"synthetic {data_args.get('size')} ({data_args.get('split')}), {data_args.get('num_sweeps', 0)} "
        f"sweeps, root {base.shown(data_args['root'])}",
        "points_per_sample": {"min": min(point_counts), "median": statistics.median(point_counts),
                              "max": max(point_counts)},
        "gt_per_sample": {"min": min(gt_counts), "median": statistics.median(gt_counts), "max": max(gt_counts)},
        "gt_counts_timed": count_variation(padded[:steps], args.warmup),
        "trainable_params": num_params,
        "optimizer": f"AdamW lr {cfg.optim.lr:g}, weight decay {cfg.optim.weight_decay:g}, clip {cfg.optim.clip_norm}",
        "precision": "fp32",
        "compile": base.compile_options(args) if args.compile else False,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "seed": args.seed,
    }  # fmt: skip
    result = base.IterationResult("iteration", device_name(device), config)
    for row in rows:
        result.add(row)
    by_name = {r.name: r for r in result.rows}
    result.extra["host_syncs_per_iteration"] = syncs
    result.extra["goals"] = GOALS
    result.extra["published_layout"] = goal_table(by_name, syncs)
    result.notes += [
        "Both paths ran on identical deep copies of one model and optimizer, alternating iteration by iteration on "
        "the same batches, augmented on the device by the trainer's stage (data.augment.lidar, drawn from the seed "
        "and the batch position), so both trained on the same augmented points and boxes. The path is model.args.impl "
        "(HardVFE's slot layout, assignment and anchor-head targets/losses).",
        f"Before timing, the two paths assigned every anchor identically and their loss terms matched (worst "
        f"relative difference {worst_terms:.1e}); the first iteration's total loss matched within {first_diff:.1e}, "
        f"every iteration's within {all_diff:.1e} (the copies drift apart only by rounding).",
        "remaining (data wait) = reading the frames and their sweeps, collating, pinning, copying to the device and "
        "augmenting there (a loader without workers; every batch was read once before timing).",
        "Host syncs: counted on CUDA in one extra iteration per path with torch.cuda.set_sync_debug_mode('warn'); "
        "n/a on the CPU.",
    ]
    if args.compile:
        result.extra["compile_seconds"] = round(compile_seconds, 1)
        result.notes.append(base.compiled_note(base.compile_options(args), compile_seconds, compiled_diff))
    if args.save:
        stem = f"iteration-{args.model}-{args.size}-{device_slug(device)}"
        args.json = args.json or RESULTS_DIR / f"{stem}.json"
        args.md = args.md or RESULTS_DIR / f"{stem}.md"
        args.png = args.png or RESULTS_DIR / f"{stem}.png"
    emit(result, args, chart=False)
    print("\n".join(result.extra["published_layout"]))
    if args.png is not None and (path := base.write_png(result, args.png)) is not None:
        print(f"wrote {path}")
    return 0
