"""Lidar sweeps per frame vs cost and accuracy: points, data time, step time and mAP after a fixed budget.

The lidar paper's table 7 (SSN on Lyft: 0 / 5 / 10 sweeps → score 0.113 / 0.141 / 0.175 for 21 / 48 / 92 hours
of training) reproduced in minutes on our model: for each N in ``--sweeps`` (default 0, 5, 10) a child process
trains the tiny detector of ``configs/<model>_tiny.yaml`` with the real trainer for ``--steps`` steps from the
same seed on the same frames, with each key frame merged with its N previous sweeps, then evaluates mini_val
with the nuScenes devkit. The synthetic tiny set is generated once into ``data/synth-tiny-sweeps10`` with 9
sweeps recorded between key frames, as nuScenes' 20 Hz lidar between 2 Hz key frames (the tiny preset records
2); 10 sweeps reach back to the previous key frame's scan, as nuScenes' sweep lists do.

Columns: points per frame (mean over mini_train, after the merge), data time (the trainer's median wait per
batch: reading and merging the sweeps in the loop, ``num_workers`` 0), step time (median compute per step, data
wait excluded), mAP and NDS after the budget, and the whole run's wall time. The rows give each median with the
slowest timed step (or wait) beside it.

Run: ``drivetrain bench sweeps [--model ssn|pointpillars] [--sweeps 0,5,10] [--steps 300] [--save]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from drivetrain.engine import registry
from drivetrain.engine.stepsplit import step_cost, step_profiler
from drivetrain.profile import BenchResult, Row, active, add_bench_arguments, device_name, emit, setup_bench
from drivetrain.profile.costmodel import Cost
from drivetrain.safeio.files import open_output, save_figure

DESCRIPTION = __doc__.splitlines()[0]

ROOT = Path(__file__).resolve().parents[1]
DATA_ROOT = "data/synth-tiny-sweeps10"
RECORDED = 9  # sweeps recorded between key frames in the benchmark's dataset (20 Hz between 2 Hz key frames)
MAX_SWEEPS = 10  # the published count: the 9 sweeps and the previous key frame's scan
PUBLISHED = {0: (0.113, 21), 5: (0.141, 48), 10: (0.175, 92)}  # sweeps → (public score, training hours)


def data_args(root: str, sweeps: int, scenes: int | None) -> dict:
    """The ``synthetic`` source's arguments: the tiny set recorded with 10 sweeps, ``sweeps`` of them merged."""
    return {
        "root": root, "size": "tiny", "seed": 0, "split": "mini_train", "load_images": False, "load_points": True,
        "num_sweeps": sweeps, "use_dim": [0, 1, 2, 4], "sweeps_per_sample": RECORDED, "scenes": scenes,
    }  # fmt: skip


def lidar_models() -> list[str]:
    """The registered models whose batches carry lidar points only (their specs' modalities)."""
    return [n for n in registry.known_names("model") if registry.model_spec(n).modalities == frozenset({"lidar"})]


def child(args: argparse.Namespace, sweeps: int, root: str) -> dict:
    """Train and evaluate one sweep count in this process; return its measurements."""
    from drivetrain.data.sources import synthetic
    from drivetrain.engine import Trainer, load_config

    out = tempfile.mkdtemp(prefix="drivetrain-bench-sweeps-")
    source = data_args(root, sweeps, args.scenes)
    frames = synthetic(generate=True, **source)
    points = [int(frames[i].points.shape[0]) for i in range(len(frames))]
    steps = args.steps
    overrides = [
        f"run.out_dir={out}", f"run.seed={args.seed}", f"train.steps={steps}", f"train.device={args.device}",
        f"data.args={json.dumps(source)}", "data.num_workers=0", "log.tensorboard=false", "log.progress=false",
        "log.every=1", "checkpoint.every=100000", f"eval.every={steps}", "eval.at_start=false", "eval.split=mini_val",
    ]  # fmt: skip
    start = time.perf_counter()
    trainer = Trainer(load_config(ROOT / "configs" / f"{args.model}_tiny.yaml", overrides))
    profiler = step_profiler(trainer.device, args.warmup)  # counts the last warm-up step's kernels and syncs
    with active(profiler):
        trainer.fit()
    trainer.close()
    cost = step_cost(profiler)
    wall = time.perf_counter() - start
    logged = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in logged if "step_time_s" in r][args.warmup :]
    evals = [r for r in logged if "eval/mAP" in r]
    if not evals:
        raise SystemExit(f"{sweeps} sweeps: the run logged no evaluation")
    data_ms = [1000 * r["data_wait_s"] for r in train]
    step_ms = [1000 * (r["step_time_s"] - r["data_wait_s"]) for r in train]
    return {
        "points_per_frame": statistics.fmean(points),
        "data_ms": statistics.median(data_ms),
        "data_max_ms": max(data_ms),
        "step_ms": statistics.median(step_ms),
        "step_max_ms": max(step_ms),
        "mAP": evals[-1]["eval/mAP"],
        "NDS": evals[-1]["eval/NDS"],
        "wall_s": wall,
        **({"kernels": cost.kernels, "syncs": cost.syncs} if cost is not None else {}),
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=1, warmup=5)
    parser.add_argument("--model", default="ssn", choices=lidar_models(), help="tiny detector (default: ssn)")
    parser.add_argument(
        "--sweeps", default="0,5,10", help=f"comma-separated sweep counts ≤ {RECORDED} (default: 0,5,10)"
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps per sweep count (default: 300)")
    parser.add_argument("--data-root", default=None, help=f"dataset folder (default: {DATA_ROOT})")
    parser.add_argument("--scenes", type=int, default=None, help="only the first N scenes of the preset (quick runs)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = str(args.data_root or ROOT / DATA_ROOT)
    if args.child is not None:
        setup_bench(args)
        print(json.dumps(child(args, args.child, root)))
        return 0
    try:
        counts = [int(v) for v in args.sweeps.split(",")]
    except ValueError:
        raise SystemExit(f"--sweeps: expected comma-separated integers, got {args.sweeps!r}") from None
    if not counts or any(not 0 <= n <= MAX_SWEEPS for n in counts):
        raise SystemExit(f"--sweeps: each count must be in [0, {MAX_SWEEPS}], got {args.sweeps!r}")
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps must exceed --warmup ({args.warmup}), got {args.steps}")
    device = setup_bench(args)
    if not (Path(root) / "drivetrain_index.npz").is_file():
        from drivetrain.data.sources import synthetic

        print(
            f"generating the synthetic tiny set with {RECORDED} sweeps a key frame into {root} (once) ...", flush=True
        )
        synthetic(generate=True, **data_args(root, 0, args.scenes))

    measured: dict[int, dict] = {}
    for n in counts:
        cmd = [sys.executable, __file__, "--child", str(n), "--model", args.model, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--seed", str(args.seed), "--device", args.device,
               "--malloc", args.malloc, "--data-root", root]  # fmt: skip
        cmd += ["--scenes", str(args.scenes)] if args.scenes is not None else []
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{n} sweeps failed:\n{proc.stderr[-3000:]}")
        measured[n] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{n} sweeps: {measured[n]}", file=sys.stderr)

    base_n = counts[0]
    base = measured[base_n]
    config = {"model": args.model, "config": f"configs/{args.model}_tiny.yaml", "steps": args.steps,
              "warmup": args.warmup, "seed": args.seed, "sweeps": counts,
              "data": f"synthetic tiny, {RECORDED} sweeps between key frames, root {Path(root).name}"}  # fmt: skip
    result = BenchResult(f"sweeps-{args.model}", device_name(device), config)
    for n, m in measured.items():
        result.add(Row(name=f"step: {n} vs {base_n} sweeps", reference_ms=base["step_ms"], batched_ms=m["step_ms"],
                       reference_cost=Cost.from_dict(base), batched_cost=Cost.from_dict(m),
                       reference_max_ms=base["step_max_ms"], batched_max_ms=m["step_max_ms"]))  # fmt: skip
        result.add(Row(name=f"data: {n} vs {base_n} sweeps", reference_ms=base["data_ms"], batched_ms=m["data_ms"],
                       reference_max_ms=base["data_max_ms"], batched_max_ms=m["data_max_ms"]))  # fmt: skip
    table = [
        f"| sweeps | points / frame | data (ms / batch) | step (ms) | mAP after {args.steps} steps | NDS | run (s) "
        "| published: score, training time |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n, m in measured.items():
        pub = f"{PUBLISHED[n][0]:.3f}, {PUBLISHED[n][1]} h" if n in PUBLISHED else "—"
        table.append(
            f"| {n} | {m['points_per_frame']:.0f} | {m['data_ms']:.1f} | {m['step_ms']:.1f} | {m['mAP']:.4f} "
            f"| {m['NDS']:.4f} | {m['wall_s']:.0f} | {pub} |"
        )
    result.extra["measured"] = {str(k): {kk: round(vv, 4) for kk, vv in v.items()} for k, v in measured.items()}
    result.extra["published"] = {
        "source": "the lidar paper's table 7 (SSN, Lyft, one V100)",
        "rows": {str(k): {"score": v[0], "hours": v[1]} for k, v in PUBLISHED.items()},
    }
    result.notes.append(
        "Each sweep count trained in its own process from the same seed on the same key frames; rows compare step "
        "and data time against the first count. Published: Lyft leaderboard score and training time for the "
        "full schedule; ours: the tiny model's mini_val mAP after a fixed budget (a trade-off, not the same "
        "numbers)."
    )
    written = emit(result, args, chart=False)
    print("\n".join(table))
    for path in written:
        if path.suffix == ".md":
            with open_output(path, "a") as f:  # the file emit just wrote (never through a link)
                f.write("\n## Sweeps trade-off (the paper's table 7 layout)\n\n" + "\n".join(table) + "\n")
            args.png = args.png or path.with_suffix(".png")
    if args.png is not None and write_png(measured, args, device_name(device)):
        print(f"wrote {args.png}")
    return 0


def write_png(measured: dict[int, dict], args: argparse.Namespace, device: str) -> bool:
    """Time per step (compute and data) and mAP per sweep count; False (with a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: matplotlib is not installed; no chart written to {args.png} (pip install 'drivetrain[viz]')")
        return False
    counts = list(measured)
    labels = [str(n) for n in counts]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    step = [measured[n]["step_ms"] for n in counts]
    data = [measured[n]["data_ms"] for n in counts]
    left.bar(labels, step, label="compute", color="#1f77b4")
    left.bar(labels, data, bottom=step, label="data", color="#ff7f0e")
    left.set_xlabel("sweeps merged per key frame")
    left.set_ylabel("ms per step (median)")
    left.legend(frameon=False, fontsize=8)
    right.plot(labels, [measured[n]["mAP"] for n in counts], marker="o", label="ours: mini_val mAP")
    pub = [n for n in counts if n in PUBLISHED]
    if pub:
        right.plot([str(n) for n in pub], [PUBLISHED[n][0] for n in pub], marker="s", ls="--", color="gray",
                   label="published: Lyft score")  # fmt: skip
    right.set_xlabel("sweeps merged per key frame")
    right.set_ylabel(f"accuracy after {args.steps} steps")
    right.legend(frameon=False, fontsize=8)
    fig.suptitle(f"{args.model} tiny: sweeps vs cost and accuracy on {device}", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, args.png, dpi=120)  # a link at the name is replaced, its target never written
    plt.close(fig)
    return True


if __name__ == "__main__":
    raise SystemExit(main())
