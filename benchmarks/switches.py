"""Every speed/memory switch measured on our models: step time, peak memory and data wait, each switch alone vs the
baseline, the recommended combination, and the 3D CNN base_channels × activation-checkpointing table.

The performance guide (``../shared/reference/seeds/`` 004) promises AMP 1.5–2× and −30–40 % memory,
channels_last_3d +5–15 % for 3D CNNs, cuDNN benchmark +10–30 %, persistent workers +5–10 %, activation
checkpointing −30–40 % memory, DDP static graph +5–10 %, OneCycleLR 1.5–2× faster convergence — without a model.
Here each variant is one ``drivetrain train`` process (``--repeat`` processes per variant, same data and seed) of
the model's tiny config for ``--warmup`` + ``--steps`` steps; the rows give the median over the timed steps of each
process (the spread is the min–max of the process medians; the max beside the median is the slowest timed step
of all its processes), peak memory (CUDA allocator peak, or peak RSS on a CPU) and the median data wait.

- ``--model streampetr|pointpillars|ssn|voxelnet``: configs/{streampetr,pointpillars,ssn,voxelnet}_tiny.yaml;
- switches: ``bf16``, ``fp16`` (precision.mode), ``channels_last`` (2d; voxelnet also ``channels_last_3d``),
  ``cudnn_benchmark`` (CUDA; on a ROCm build it also sets ``MIOPEN_FIND_MODE=FAST``), ``tf32`` (CUDA),
  ``compile`` (``torch.compile`` of the backbone), ``act_ckpt`` (activation checkpointing of the backbone — of the
  3D middle encoder for voxelnet), ``loader`` (2 persistent workers, prefetch 4, pinned on CUDA),
  ``ddp_static`` (two processes, DDP with ``static_graph`` vs DDP without: its own baseline);
- ``recommended``: every switch that made the step ≥ 3 % faster, together (run after the others);
- ``--schedule``: OneCycleLR vs warm-up + cosine, ``--schedule-steps`` steps each: the first step at which the
  20-step mean loss reaches the cosine run's final value;
- voxelnet: base_channels 16 / 32 / 64 × activation checkpointing off / on of the middle encoder.

``--write-config OUT.yaml`` writes the fastest measured variant whose peak memory fits ``--memory-budget-gb`` as a
config overlay (the ``speed``/``precision``/``data`` keys to merge into the model's config).

On a CPU several switches cost time (bf16/fp16 autocast has no fast kernels, channels_last can be slower, CUDA-only
switches are skipped) — the table says what they do *here*.

Run: ``drivetrain bench switches --model voxelnet [--device cpu|cuda] [--variants a,b] [--save]``.
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
from typing import Any

import torch
import yaml

from drivetrain.engine import load_config, stepsplit
from drivetrain.engine.config_files import load_yaml
from drivetrain.profile import BenchResult, Row, add_bench_arguments, device_name, emit, setup_bench
from drivetrain.profile.costmodel import Cost
from drivetrain.safeio.files import open_output, replace_text

DESCRIPTION = __doc__.splitlines()[0]
ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {m: ROOT / "configs" / f"{m}_tiny.yaml" for m in ("streampetr", "pointpillars", "ssn", "voxelnet")}
CKPT_MODULE = {"streampetr": "backbone", "pointpillars": "backbone", "ssn": "backbone", "voxelnet": "middle"}
GUIDE = {  # the guide's promise per switch (for the closing table)
    "bf16": "1.5–2× faster, −30–40 % memory", "fp16": "1.5–2× faster, −30–40 % memory",
    "channels_last": "faster convolutions (can be slower on CPU)", "channels_last_3d": "+5–15 % for 3D CNNs",
    "cudnn_benchmark": "+10–30 %", "tf32": "faster matmuls/convs on Ampere+", "compile": "faster steps",
    "act_ckpt": "−30–40 % memory", "loader": "+5–10 % (persistent workers)", "ddp_static": "+5–10 %",
}  # fmt: skip


def variants(model: str, cuda: bool) -> dict[str, list[str]]:
    """Variant name → config overrides, those that apply on this device and model."""
    out: dict[str, list[str]] = {
        "baseline": [],
        "bf16": ["precision.mode=bf16"],
        "fp16": ["precision.mode=fp16"],
        "channels_last": ["speed.channels_last=2d"],
    }
    if model == "voxelnet":
        out["channels_last_3d"] = ["speed.channels_last=3d"]
    if cuda:
        out["cudnn_benchmark"] = ["speed.cudnn_benchmark=true"]
        out["tf32"] = ["speed.tf32=true"]
    out["compile"] = ["speed.compile=[backbone]"]
    out["act_ckpt"] = [f"speed.activation_checkpointing=[{CKPT_MODULE[model]}]"]
    loader = ["data.num_workers=2", "data.persistent_workers=true", "data.prefetch_factor=4"]
    out["loader"] = loader + (["data.pin_memory=true"] if cuda else [])
    return out


def train_once(config: Path, overrides: list[str], steps: int, warmup: int, device: str, folder: Path,
               nproc: int = 1, env: dict[str, str] | None = None) -> dict[str, float]:  # fmt: skip
    """One training process; medians over the timed steps (see the module docstring)."""
    out = folder / f"run-{len(list(folder.iterdir()))}"
    keys = [
        f"run.out_dir={out}", "log.progress=false", "log.tensorboard=false", "log.every=1", "eval.every=0",
        "eval.at_start=false", f"train.steps={warmup + steps}", f"checkpoint.every={warmup + steps}",
        "checkpoint.keep=1", f"train.device={device}",
    ]  # fmt: skip
    command = [sys.executable, "-m", "drivetrain.cli.main", "train", "--config", str(config), *keys, *overrides]
    if nproc > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
                   str(29500 + os.getpid() % 1000), "-m", "drivetrain.cli.main", *command[3:]]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(overrides) or 'baseline'}: training failed: {' | '.join(tail)}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if "step_time_s" in r][warmup:]
    return {
        "step_ms": statistics.median(r["step_time_s"] for r in timed) * 1e3,
        "step_max_ms": max(r["step_time_s"] for r in timed) * 1e3,
        "wait_ms": statistics.median(r["data_wait_s"] for r in timed) * 1e3,
        "memory_mb": max(r["peak_memory_mb"] for r in records if "peak_memory_mb" in r),
        "losses": [r["loss"] for r in records if "loss" in r],
    }


def count_step(config: Path, overrides: list[str], device: str, nproc: int = 1) -> dict[str, float] | None:
    """Kernels and host syncs of one training step of a variant: the third step of a short run of its own
    (``drivetrain.engine.stepsplit``: data excluded, torch.compile off as it counts eagerly anyway), here or, for
    DDP, in ``nproc`` processes; None (with a note) if it fails. Nothing is timed here."""
    name = " ".join(overrides) or "baseline"
    if nproc == 1:
        try:
            cost = stepsplit.count_step(config, overrides, device)
        except Exception as err:  # the variant's timed runs passed: a failure here only loses its counts
            print(f"  counting {name}: failed ({type(err).__name__}: {err})", flush=True)
            return None
        return None if cost is None else {"kernels": cost.kernels, "syncs": cost.syncs}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(29500 + (os.getpid() + 7) % 1000), "-m", "drivetrain.engine.stepsplit", str(config), *overrides,
               "--device", device]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        print(f"  counting {name}: failed ({(done.stderr or '').strip()[-300:]})", flush=True)
        return None
    return json.loads(lines[0])


def measure(
    config: Path, overrides: list[str], args: argparse.Namespace, folder: Path, *, count: bool = True, **kw: Any
) -> dict[str, Any]:
    """``--repeat`` processes of one variant: the median of their medians and the spread; with ``count`` (and
    ``--count``) the kernels and host syncs of one step."""
    runs = [
        train_once(config, overrides, args.steps, args.warmup, args.device, folder, **kw) for _ in range(args.repeat)
    ]
    steps = [r["step_ms"] for r in runs]
    cost = count_step(config, overrides, args.device, kw.get("nproc", 1)) if count and args.count else None
    return {
        "step_ms": statistics.median(steps), "spread_ms": [min(steps), max(steps)],
        "step_max_ms": max(r["step_max_ms"] for r in runs),
        "wait_ms": statistics.median(r["wait_ms"] for r in runs),
        "memory_mb": statistics.median(r["memory_mb"] for r in runs), "overrides": overrides, "cost": cost,
    }  # fmt: skip


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=2, warmup=3)
    parser.add_argument("--model", choices=sorted(CONFIGS), default="voxelnet", help="the model (default: voxelnet)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per process (default: 8)")
    parser.add_argument("--variants", default=None, help="comma-separated subset of the variants (default: all)")
    parser.add_argument("--ddp", action=argparse.BooleanOptionalAction, default=True,
                        help="also DDP with vs without static_graph, 2 processes (default: on)")  # fmt: skip
    parser.add_argument("--schedule", action=argparse.BooleanOptionalAction, default=True,
                        help="also OneCycleLR vs cosine: steps to a fixed loss (default: on)")  # fmt: skip
    parser.add_argument("--schedule-steps", type=int, default=120, help="steps of each schedule run (default: 120)")
    parser.add_argument("--channels-table", action=argparse.BooleanOptionalAction, default=True,
                        help="voxelnet: base_channels 16/32/64 × checkpointing (default: on)")  # fmt: skip
    parser.add_argument(
        "--write-config", type=Path, default=None, metavar="OUT.yaml", help="the fastest fitting variant"
    )
    parser.add_argument("--memory-budget-gb", type=float, default=None, help="memory the written config may use")
    parser.add_argument("--count", action=argparse.BooleanOptionalAction, default=True,
                        help="count each variant's kernels and host syncs per step in a short run of its own "
                        "(default: on)")  # fmt: skip
    args = parser.parse_args(argv)
    device = setup_bench(args)
    args.device = device.type
    cuda = device.type == "cuda"
    config = CONFIGS[args.model]
    table = variants(args.model, cuda)
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = sorted(set(wanted) - set(table) - {"recommended"})
        if unknown:
            raise SystemExit(f"bench switches: --variants: {unknown} do not apply here; known: {sorted(table)}")
        table = {k: v for k, v in table.items() if k in wanted or k == "baseline"}
        recommend = "recommended" in wanted
    else:
        recommend = True
    env = {"MIOPEN_FIND_MODE": "FAST"} if getattr(torch.version, "hip", None) else None
    result = BenchResult(f"switches-{args.model}", device_name(device), {
        "model": args.model, "config": str(config.relative_to(ROOT)), "steps": args.steps, "warmup": args.warmup,
        "repeat": args.repeat, "variants": list(table)})  # fmt: skip
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, overrides in table.items():
            try:
                measured[name] = measure(
                    config, overrides, args, folder, env=env if name == "cudnn_benchmark" else None
                )
            except RuntimeError as err:
                print(f"  {name}: {err}", flush=True)
                continue
            m = measured[name]
            print(f"  {name}: step {m['step_ms']:.1f} ms (spread {m['spread_ms'][0]:.1f}–{m['spread_ms'][1]:.1f}), "
                  f"memory {m['memory_mb']:.0f} MB, data wait {m['wait_ms']:.1f} ms", flush=True)  # fmt: skip
        base = measured["baseline"]
        faster = [n for n, m in measured.items() if n != "baseline" and m["step_ms"] <= 0.97 * base["step_ms"]]
        faster = [n for n in faster if not (n == "fp16" and "bf16" in faster)]  # one precision mode
        if recommend and faster:
            combo = [o for n in faster for o in table[n]]
            measured["recommended"] = measure(config, combo, args, folder)
            measured["recommended"]["switches"] = faster
        if args.ddp:  # two processes (gloo on a CPU): DDP with vs without static_graph
            ddp = ["distributed.strategy=ddp"]
            try:
                measured["ddp"] = measure(config, ddp, args, folder, nproc=2)
                measured["ddp_static"] = measure(config, [*ddp, "distributed.static_graph=true"], args, folder, nproc=2)
            except RuntimeError as err:
                print(f"  ddp: {err}", flush=True)
        for name, m in measured.items():
            if name in ("baseline", "ddp"):
                continue
            reference = measured["ddp"] if name == "ddp_static" else base
            costs = {"reference_cost": Cost.from_dict(reference["cost"]), "batched_cost": Cost.from_dict(m["cost"])}
            slowest = {"reference_max_ms": reference["step_max_ms"], "batched_max_ms": m["step_max_ms"]}
            result.add(Row(f"{name}: step ms", reference["step_ms"], m["step_ms"], **costs, **slowest))
        memory = {n: round(m["memory_mb"] / (measured["ddp"] if n == "ddp_static" else base)["memory_mb"] - 1, 4)
                  for n, m in measured.items() if n not in ("baseline", "ddp")}  # fmt: skip
        result.extra["measured"] = {n: {k: _rounded(v) for k, v in m.items()} for n, m in measured.items()}
        result.extra["memory_change"] = memory
        result.extra["guide"] = {n: GUIDE[n] for n in measured if n in GUIDE}
        if args.schedule:
            result.extra["schedule"] = schedule_race(config, args, folder)
        if args.model == "voxelnet" and args.channels_table:
            result.extra["base_channels"] = channels_table(config, args, folder)
    # The flags the reference column ran under: the baseline's process applied the config's speed section. Not those
    # in effect here (emit's default): each variant is counted in this process after its runs (stepsplit.count_step
    # builds a Trainer, which sets the flags from its speed section and leaves them so), so they are the last counted
    # variant's (tf32 on CUDA: TF32 on). A variant's own settings are its overrides (measured[...].overrides).
    # (torch reports the matmul TF32 flag as the float32 matmul precision: "high" with it, "highest" without.)
    speed = load_config(config, []).speed
    result.config["backends"] = {"tf32_matmul": speed.tf32, "tf32_cudnn": speed.tf32,
                                 "cudnn_benchmark": speed.cudnn_benchmark,
                                 "float32_matmul_precision": "high" if speed.tf32 else "highest"}  # fmt: skip
    result.notes.append(
        "reference = the baseline config (DDP without static_graph for ddp_static), batched = the switch; one process "
        "per run, --repeat runs per variant; 'measured' holds the spread (min–max of the run medians), memory and "
        "data wait; 'memory_change' the peak memory change vs the baseline."
    )
    written = emit(result, args)
    lines = summary_table(measured)
    print("\n".join(lines))
    for path in written:
        if path.suffix == ".md":
            with open_output(path, "a") as f:  # the file emit just wrote (never through a link)
                f.write("\n## Switches (the performance guide's table, measured)\n\n" + "\n".join(lines) + "\n")
                if "base_channels" in result.extra:
                    f.write("\n## base_channels × activation checkpointing (voxelnet middle encoder)\n\n"
                            + "\n".join(channels_lines(result.extra["base_channels"])) + "\n")  # fmt: skip
    if args.write_config is not None:
        write_config(measured, args)
    return 0


def _rounded(value: Any) -> Any:
    """Floats (also inside lists) to 3 decimals, for the JSON."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def summary_table(measured: dict[str, dict[str, Any]]) -> list[str]:
    """The guide's table: each switch's step time and memory change beside what the guide promises."""
    base = measured["baseline"]
    lines = ["| switch | step ms (spread) | vs baseline | peak memory | vs baseline | data wait ms | the guide says |",
             "|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for name, m in measured.items():
        ref = measured["ddp"] if name == "ddp_static" else base
        lines.append(
            f"| {name} | {m['step_ms']:.1f} ({m['spread_ms'][0]:.1f}–{m['spread_ms'][1]:.1f}) | "
            f"{m['step_ms'] / ref['step_ms'] - 1:+.1%} | {m['memory_mb']:.0f} MB | "
            f"{m['memory_mb'] / ref['memory_mb'] - 1:+.1%} | {m['wait_ms']:.1f} | {GUIDE.get(name, '')} |"
        )
    return lines


def schedule_race(config: Path, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """OneCycleLR vs warm-up + cosine over ``--schedule-steps``: steps until the 20-step mean loss reaches the
    cosine run's final 20-step mean."""
    runs = {}
    for kind in ("warmup_cosine", "onecycle"):
        r = train_once(config, [f"schedule.kind={kind}"], args.schedule_steps - 1, 1, args.device, folder)
        losses = r["losses"]
        runs[kind] = [statistics.fmean(losses[max(0, i - 19) : i + 1]) for i in range(len(losses))]
    target = runs["warmup_cosine"][-1]
    reached = {k: next((i + 1 for i, v in enumerate(curve) if v <= target), None) for k, curve in runs.items()}
    print(f"  schedules: the 20-step mean loss reaches {target:.4f} at step {reached}", flush=True)
    return {"target_loss": round(target, 4), "steps_to_target": reached, "steps": args.schedule_steps}


def channels_table(config: Path, args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    """base_channels 16 / 32 / 64 × activation checkpointing of the middle encoder: step time and peak memory."""
    rows = []
    for channels in (16, 32, 64):
        for ckpt in (False, True):
            overrides = [f"model.args.middle.base_channels={channels}"]
            if ckpt:
                overrides.append("speed.activation_checkpointing=[middle]")
            m = measure(config, overrides, args, folder, count=False)
            rows.append({"base_channels": channels, "checkpointing": ckpt, "step_ms": round(m["step_ms"], 2),
                         "memory_mb": round(m["memory_mb"], 1)})  # fmt: skip
            print(f"  base_channels {channels}, checkpointing {ckpt}: {m['step_ms']:.1f} ms, {m['memory_mb']:.0f} MB",
                  flush=True)  # fmt: skip
    return rows


def channels_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| base_channels | checkpointing | step ms | peak memory MB |", "|---:|---|---:|---:|"]
    lines += [f"| {r['base_channels']} | {'on' if r['checkpointing'] else 'off'} | {r['step_ms']:.1f} | "
              f"{r['memory_mb']:.0f} |" for r in rows]  # fmt: skip
    return lines


def write_config(measured: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    """The fastest variant within the memory budget, as a config overlay of its overrides."""
    budget = args.memory_budget_gb * 1024 if args.memory_budget_gb is not None else float("inf")
    fitting = {n: m for n, m in measured.items() if m["memory_mb"] <= budget and n not in ("ddp", "ddp_static")}
    if not fitting:
        raise SystemExit(f"bench switches: no variant fits {args.memory_budget_gb} GB")
    name = min(fitting, key=lambda n: fitting[n]["step_ms"])
    overlay: dict[str, Any] = {}
    for item in fitting[name]["overrides"]:
        key, value = item.split("=", 1)
        node = overlay
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = load_yaml(value)  # as drivetrain train parses an override's value
    args.write_config.parent.mkdir(parents=True, exist_ok=True)
    replace_text(  # a link at the name is replaced, its target never written
        args.write_config,
        f"# drivetrain bench switches --model {args.model}: the fastest variant ({name}, "
        f"{fitting[name]['step_ms']:.1f} ms/step, {fitting[name]['memory_mb']:.0f} MB) within "
        f"{args.memory_budget_gb if args.memory_budget_gb is not None else 'any'} GB; merge into the model's config\n"
        + yaml.safe_dump(overlay, sort_keys=False),
    )
    print(f"wrote {args.write_config} ({name})")


if __name__ == "__main__":
    raise SystemExit(main())
