"""Training memory and step time per precision mode: fp32 / bf16 / fp16, activation checkpointing, FSDP2 offload.

Each variant trains a model with the real trainer, in its own child process so that memory peaks do not
mix: ``--model smoke`` the built-in conv model (``configs/smoke.yaml`` made larger: width 64, depth 4, 64×64
images, batch 32); ``--model ssn`` / ``pointpillars`` the lidar detector of ``configs/<model>_tiny.yaml``
(``--size full``: ``configs/<model>_nus.yaml``) on its synthetic lidar, the lidar paper's table 8 on our model
(activation checkpointing of the SECOND backbone). Every variant starts from the same seed and data, and the
mean loss of its last 5 steps is reported beside its memory and time (the same trajectory within noise is
what a precision mode must keep). Memory is the peak CUDA allocation on a GPU, and on the CPU the growth of
the process's peak RSS over its size before the model was built (activations, gradients, optimizer state,
allocator caches). Step time is the median of the trainer's per-step time minus its data wait, after warm-up
(its max, the slowest such step, beside it).
The table has the published layout: memory, improvement, time, improvement, each against fp32; and the loss.

Run: ``drivetrain bench precision [--model smoke|ssn|pointpillars] [--size tiny|full] [--device cpu|cuda]
[--repeat N] [--warmup N] [--save]`` (results: ``precision-<device>`` for smoke, ``precision-<model>-<size>-<device>``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from drivetrain.engine import registry
from drivetrain.engine.stepsplit import step_cost, step_profiler
from drivetrain.profile import (
    BenchResult,
    ResourceMonitor,
    Row,
    active,
    add_bench_arguments,
    device_name,
    emit,
    setup_bench,
)
from drivetrain.profile.costmodel import Cost
from drivetrain.safeio.files import open_output, save_figure

DESCRIPTION = __doc__.splitlines()[0]

MODEL = [
    "model.args={channels: 3, width: 64, depth: 4, dims: 2, dropout: 0.0, memory: false}",
    "data.args={num_samples: 256, channels: 3, size: 64, dims: 2, seed: 0}",
    "data.batch_size=32",
    "log.tensorboard=false",
    "log.progress=false",
    "checkpoint.every=100000",
]
LIDAR = ["log.tensorboard=false", "log.progress=false", "checkpoint.every=100000", "eval.every=0",
         "eval.at_start=false", "data.num_workers=0"]  # fmt: skip
LIDAR_SUFFIX = {"tiny": "tiny", "full": "nus"}  # --size → configs/<model>_<suffix>.yaml
VARIANTS: dict[str, list[str]] = {
    "fp32": ["precision.mode=fp32"],
    "bf16": ["precision.mode=bf16"],
    "fp16": ["precision.mode=fp16"],
    "fp32 + act. ckpt": ["precision.mode=fp32", "speed.activation_checkpointing=[backbone]"],
    "bf16 + act. ckpt": ["precision.mode=bf16", "speed.activation_checkpointing=[backbone]"],
    "fp16 + act. ckpt": ["precision.mode=fp16", "speed.activation_checkpointing=[backbone]"],
    "fp32 + FSDP2 CPU offload": [
        "precision.mode=fp32",
        "distributed.strategy=fsdp",
        "distributed.fsdp_cpu_offload=true",
    ],
}


def model_config(model: str, size: str) -> tuple[Path, list[str]]:
    """The config file and overrides of ``--model``/``--size``."""
    configs = Path(__file__).resolve().parents[1] / "configs"
    if model == "smoke":
        return configs / "smoke.yaml", MODEL
    return configs / f"{model}_{LIDAR_SUFFIX[size]}.yaml", LIDAR


def lidar_models() -> list[str]:
    """The registered models whose batches carry lidar points only (their specs' modalities)."""
    return [n for n in registry.known_names("model") if registry.model_spec(n).modalities == frozenset({"lidar"})]


def child(variant: str, device: str, steps: int, warmup: int, seed: int, model: str, size: str) -> dict[str, float]:
    """Train one variant in this process; return its median compute time per step, memory and final loss."""
    import psutil

    from drivetrain.engine import Trainer, load_config

    config, base = model_config(model, size)
    out = tempfile.mkdtemp(prefix="drivetrain-bench-precision-")
    extra = [f"run.out_dir={out}", f"run.seed={seed}", f"train.steps={steps}", f"train.device={device}"]
    if "distributed.strategy=fsdp" in VARIANTS[variant]:  # a one-rank process group
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29731")
    baseline_mb = psutil.Process().memory_info().rss / 2**20
    with ResourceMonitor(device, interval=0.01) as mon:
        trainer = Trainer(load_config(config, [*base, *VARIANTS[variant], *extra]))
        profiler = step_profiler(trainer.device, warmup)  # counts the last warm-up step's kernels and syncs
        with active(profiler):
            trainer.fit()
    trainer.close()
    logged = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in logged if "step_time_s" in r]  # training steps (not evaluation records)
    records = logged[warmup:]
    usage = mon.result
    memory = usage.peak_device_mb if usage.peak_device_mb is not None else usage.peak_rss_mb - baseline_mb
    cost = step_cost(profiler)
    compute_ms = [1000 * (r["step_time_s"] - r["data_wait_s"]) for r in records]
    return {
        "step_ms": statistics.median(compute_ms),
        "step_max_ms": max(compute_ms),
        "memory_mb": memory,
        "cpu_cores": usage.cpu_cores,
        "final_loss": statistics.fmean(r["loss"] for r in logged[-5:]),
        **({"kernels": cost.kernels, "syncs": cost.syncs} if cost is not None else {}),
    }


def write_png(measured: dict[str, dict[str, float]], path: Path, title: str) -> Path | None:
    """Memory and time per variant, each as a bar with its change against fp32; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: matplotlib is not installed; no chart written to {path} (pip install 'drivetrain[viz]')")
        return None
    names = list(measured)
    base = measured["fp32"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.42 * len(names) + 1.8))
    for ax, key, label in ((axes[0], "memory_mb", "memory (MB)"), (axes[1], "step_ms", "time per step (ms)")):
        values = [measured[n][key] for n in names]
        ax.barh(names, values, color=["#7f7f7f" if n == "fp32" else "#1f77b4" for n in names])
        for y, v in enumerate(values):
            ax.text(v, y, f" {100 * (v - base[key]) / base[key]:+.1f}%", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.set_xlim(0, max(values) * 1.3)
        ax.grid(axis="x", alpha=0.3)
    axes[1].set_yticks([])
    fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)  # a link at the name is replaced, its target never written
    plt.close(fig)
    return path


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=15, warmup=5)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset (default: all)")
    parser.add_argument("--model", default="smoke", choices=("smoke", *lidar_models()), help="(default: smoke)")
    parser.add_argument("--size", default="tiny", choices=("tiny", "full"), help="lidar config size (default: tiny)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    steps = args.warmup + args.repeat
    if args.child is not None:
        setup_bench(args)  # the variant runs here: the same allocator setting as the parent asked for
        print(json.dumps(child(args.child, args.device, steps, args.warmup, args.seed, args.model, args.size)))
        return 0
    device = setup_bench(args)
    names = [v.strip() for v in args.variants.split(",")]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or "fp32" not in names:
        raise SystemExit(f"--variants: need fp32 (the baseline) and known names; unknown: {unknown}")

    measured: dict[str, dict[str, float]] = {}
    for name in names:
        cmd = [sys.executable, __file__, "--child", name, "--device", args.device, "--repeat", str(args.repeat),
               "--warmup", str(args.warmup), "--seed", str(args.seed), "--malloc", args.malloc,
               "--model", args.model, "--size", args.size]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"variant {name!r} failed:\n{proc.stderr[-3000:]}")
        measured[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {measured[name]}", file=sys.stderr)

    base = measured["fp32"]
    memory = "peak CUDA allocation" if device.type == "cuda" else "peak RSS growth"
    if args.model == "smoke":
        config = {"model": MODEL[0], "data": MODEL[1], "batch": 32, "repeat": args.repeat, "warmup": args.warmup,
                  "seed": args.seed, "memory": memory}  # fmt: skip
        name = "precision"
    else:
        path, _ = model_config(args.model, args.size)
        config = {"model": args.model, "size": args.size, "config": f"configs/{path.name}", "repeat": args.repeat,
                  "warmup": args.warmup, "seed": args.seed, "memory": memory}  # fmt: skip
        name = f"precision-{args.model}-{args.size}"
    result = BenchResult(name, device_name(device), config)
    for label, m in measured.items():
        result.add(Row(name=f"step: {label} vs fp32", reference_ms=base["step_ms"], batched_ms=m["step_ms"],
                       reference_cost=Cost.from_dict(base), batched_cost=Cost.from_dict(m),
                       reference_max_ms=base["step_max_ms"], batched_max_ms=m["step_max_ms"]))  # fmt: skip
    table = [
        "| mode | memory (MB) | improvement | time per step (ms) | improvement "
        f"| loss, last {min(5, steps)} of {steps} steps |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, m in measured.items():
        mem_gain = 100 * (m["memory_mb"] - base["memory_mb"]) / base["memory_mb"]
        time_gain = 100 * (m["step_ms"] - base["step_ms"]) / base["step_ms"]
        table.append(
            f"| {label} | {m['memory_mb']:.0f} | {mem_gain:+.1f}% | {m['step_ms']:.1f} | {time_gain:+.1f}% "
            f"| {m['final_loss']:.4f} |"
        )
    result.extra["measured"] = {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in measured.items()}
    result.notes.append(
        "Each variant ran in its own process with the real trainer; negative improvements are reductions. "
        "On a CPU, fp16/bf16 autocast has no tensor cores to gain from and FSDP CPU offload has nowhere to "
        "offload to; the GPU table is the one that corresponds to the published V100 numbers."
    )
    written = emit(result, args, chart=False)
    print("\n".join(table))
    for path in written:
        if path.suffix == ".md":
            with open_output(path, "a") as f:  # the file emit just wrote (never through a link)
                f.write("\n## Memory and time per precision mode (published layout)\n\n" + "\n".join(table) + "\n")
            args.png = args.png or (path.with_suffix(".png") if args.save else None)
    title = f"{name} on {device_name(device)}: {memory} and median step time per variant (change vs fp32)"
    if args.png is not None and write_png(measured, args.png, title) is not None:
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
