"""Training memory and step time per precision mode: fp32 / bf16 / fp16, activation checkpointing, FSDP2 offload.

Each variant trains the built-in conv model (``configs/smoke.yaml`` made larger: width 64, depth 4,
64×64 images, batch 32) with the real trainer, in its own child process so that memory peaks do not
mix. Memory is the peak CUDA allocation on a GPU, and on the CPU the growth of the process's peak RSS
over its size before the model was built (activations, gradients, optimizer state, allocator caches).
Step time is the median of the trainer's per-step time minus its data wait, after warm-up. The table has
the published layout: memory, improvement, time, improvement, each against fp32.

Run: ``drivetrain bench precision [--device cpu|cuda] [--repeat N] [--warmup N] [--save]``.
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

from drivetrain.profile import BenchResult, ResourceMonitor, Row, add_bench_arguments, device_name, emit, setup_bench

DESCRIPTION = __doc__.splitlines()[0]

MODEL = [
    "model.args={channels: 3, width: 64, depth: 4, dims: 2, dropout: 0.0, memory: false}",
    "data.args={num_samples: 256, channels: 3, size: 64, dims: 2, seed: 0}",
    "data.batch_size=32",
    "log.tensorboard=false",
    "log.progress=false",
    "checkpoint.every=100000",
]
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


def child(variant: str, device: str, steps: int, warmup: int, seed: int) -> dict[str, float]:
    """Train one variant in this process; return its median compute time per step and its memory."""
    import psutil

    from drivetrain.engine import Trainer, load_config

    config = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
    out = tempfile.mkdtemp(prefix="drivetrain-bench-precision-")
    extra = [f"run.out_dir={out}", f"run.seed={seed}", f"train.steps={steps}", f"train.device={device}"]
    if "distributed.strategy=fsdp" in VARIANTS[variant]:  # a one-rank process group
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29731")
    baseline_mb = psutil.Process().memory_info().rss / 2**20
    with ResourceMonitor(device, interval=0.01) as mon:
        trainer = Trainer(load_config(config, [*MODEL, *VARIANTS[variant], *extra]))
        trainer.fit()
    trainer.close()
    records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()][warmup:]
    usage = mon.result
    memory = usage.peak_device_mb if usage.peak_device_mb is not None else usage.peak_rss_mb - baseline_mb
    return {
        "step_ms": statistics.median(1000 * (r["step_time_s"] - r["data_wait_s"]) for r in records),
        "memory_mb": memory,
        "cpu_cores": usage.cpu_cores,
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=15, warmup=5)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset (default: all)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    steps = args.warmup + args.repeat
    if args.child is not None:
        setup_bench(args)  # the variant runs here: the same allocator setting as the parent asked for
        print(json.dumps(child(args.child, args.device, steps, args.warmup, args.seed)))
        return 0
    device = setup_bench(args)
    names = [v.strip() for v in args.variants.split(",")]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or "fp32" not in names:
        raise SystemExit(f"--variants: need fp32 (the baseline) and known names; unknown: {unknown}")

    measured: dict[str, dict[str, float]] = {}
    for name in names:
        cmd = [sys.executable, __file__, "--child", name, "--device", args.device, "--repeat", str(args.repeat),
               "--warmup", str(args.warmup), "--seed", str(args.seed), "--malloc", args.malloc]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"variant {name!r} failed:\n{proc.stderr[-3000:]}")
        measured[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {measured[name]}", file=sys.stderr)

    base = measured["fp32"]
    memory = "peak CUDA allocation" if device.type == "cuda" else "peak RSS growth"
    config = {"model": MODEL[0], "data": MODEL[1], "batch": 32, "repeat": args.repeat, "warmup": args.warmup,
              "seed": args.seed, "memory": memory}  # fmt: skip
    result = BenchResult("precision", device_name(device), config)
    for name, m in measured.items():
        result.add(Row(name=f"step: {name} vs fp32", reference_ms=base["step_ms"], batched_ms=m["step_ms"]))
    table = ["| mode | memory (MB) | improvement | time per step (ms) | improvement |", "|---|---:|---:|---:|---:|"]
    for name, m in measured.items():
        mem_gain = 100 * (m["memory_mb"] - base["memory_mb"]) / base["memory_mb"]
        time_gain = 100 * (m["step_ms"] - base["step_ms"]) / base["step_ms"]
        table.append(f"| {name} | {m['memory_mb']:.0f} | {mem_gain:+.1f}% | {m['step_ms']:.1f} | {time_gain:+.1f}% |")
    result.extra["measured"] = {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in measured.items()}
    result.notes.append(
        "Each variant ran in its own process with the real trainer; negative improvements are reductions. "
        "On a CPU, fp16/bf16 autocast has no tensor cores to gain from and FSDP CPU offload has nowhere to "
        "offload to; the GPU table is the one that corresponds to the published V100 numbers."
    )
    written = emit(result, args)
    print("\n".join(table))
    for path in written:
        if path.suffix == ".md":
            with open(path, "a") as f:
                f.write("\n## Memory and time per precision mode (published layout)\n\n" + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
