"""What bounds a run's training step, and which drivetrain switch addresses it: ``drivetrain doctor RUN_DIR``.

Two sources of numbers:

1. the run's own ``metrics.jsonl`` (every step it trained): median step time, the data wait within it (the time
   ``next(batch)`` blocked), samples/s, peak memory (CUDA allocator peak, or the process's peak RSS on a CPU),
   fp16 loss scale and skipped steps;
2. a short **profiled window**: the run's config trained again for ``--steps`` steps (after ``--warmup``) in a
   scratch directory, with a :class:`~drivetrain.profile.Profiler` receiving the trainer's regions — ``step`` →
   ``data``, ``forward``, ``loss``, ``backward``, ``optimizer`` (and the models' and losses' own regions inside
   them) — and, on CUDA, ``torch.cuda.set_sync_debug_mode`` counting the host syncs per step.

Findings, each stated with the numbers behind it (thresholds are parameters of :func:`diagnose`):

- **data-bound**: the data wait is ≥ 20 % of the step → ``data.num_workers`` (more, up to the cores),
  ``data.augment_on=device`` (augmenting in the workers), ``data.loader=dali``, ``data.prefetch=true`` (CUDA),
  and ``drivetrain tune loader`` to measure them;
- **loss-bound**: the loss is ≥ 25 % of the step → ``model.args.impl=batched`` when the run uses the reference
  (per-sample) loss path, otherwise the loss's largest part is named;
- **memory-heavy**: peak memory ≥ 85 % of the budget (``--memory-budget-mb``; default the GPU's memory, or the
  machine's RAM) → ``speed.activation_checkpointing`` and ``precision.mode=bf16`` (fp32 runs); a CUDA run at
  ≤ 30 % has room for a larger ``data.batch_size``;
- **host syncs**: more than the one documented sync per step (CUDA only);
- otherwise **network-bound**: forward + backward dominate → ``precision.mode=bf16`` on a GPU,
  ``speed.compile``, ``speed.channels_last``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import warnings
from pathlib import Path
from typing import Any

__all__ = ["Finding", "diagnose", "memory_budget_mb", "profile_window", "render", "run_summary", "to_json"]

PARTS = ("data", "forward", "loss", "backward", "optimizer")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One statement of the report: what (``kind``), the numbers behind it, and the switches that address it."""

    kind: str  # data-bound | loss-bound | memory-heavy | memory-room | host-syncs | network-bound
    statement: str
    switches: tuple[str, ...]


def run_summary(run_dir: str | Path) -> dict[str, Any]:
    """Medians of the run's metrics.jsonl (see the module docstring) and its config.

    Raises:
        FileNotFoundError: no metrics.jsonl or config.yaml in ``run_dir``.
        ValueError: no training step recorded yet.
    """
    import yaml

    from drivetrain.viz.curves import read_metrics

    run_dir = Path(run_dir)
    train, _ = read_metrics(run_dir)
    if not train:
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: no training step recorded yet")
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir / 'config.yaml'}: not found (is {run_dir} a run directory?)")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())

    def median(key: str) -> float:
        values = [float(r[key]) for r in train if isinstance(r.get(key), (int, float))]
        return statistics.median(values) if values else float("nan")

    shares = [r["data_wait_s"] / r["step_time_s"] for r in train if r.get("step_time_s") and "data_wait_s" in r]
    return {
        "steps": len(train),
        "step_ms": median("step_time_s") * 1e3,
        "data_wait_ms": median("data_wait_s") * 1e3,
        "data_share": statistics.median(shares) if shares else float("nan"),
        "samples_per_s": median("samples_per_s"),
        "peak_memory_mb": max((float(r.get("peak_memory_mb", 0)) for r in train), default=float("nan")),
        "skipped_steps": int(train[-1].get("skipped_steps", 0)),
        "config": config,
    }


def profile_window(
    run_dir: str | Path, *, steps: int = 5, warmup: int = 2, overrides: list[str] | None = None
) -> dict[str, Any]:
    """Train the run's config ``warmup + steps`` steps in a scratch directory under the profiler (see the module).

    Returns:
        ``{"step_ms", "parts": {part: ms}, "inner": {region path: ms}, "syncs_per_step" (None on a CPU),
        "device"}``: medians over the timed steps.
    """
    import torch

    from drivetrain.engine import Trainer, load_config
    from drivetrain.profile import Profiler
    from drivetrain.profile.timer import active
    from drivetrain.safe_files import remove_path

    run_dir = Path(run_dir)
    with tempfile.TemporaryDirectory() as tmp:
        keys = [
            f"run.out_dir={Path(tmp) / 'run'}", "log.progress=false", "log.tensorboard=false", "eval.every=0",
            "eval.at_start=false", f"train.steps={warmup + steps}", f"checkpoint.every={warmup + steps}",
            "checkpoint.keep=1",
        ]  # fmt: skip
        cfg = load_config(run_dir / "config.yaml", [*(overrides or []), *keys])
        trainer = Trainer(cfg)
        profiler = Profiler(trainer.device, warmup=warmup)
        cuda = trainer.device.type == "cuda"
        syncs = 0
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                try:
                    with active(profiler):
                        trainer.fit()
                finally:
                    if cuda:
                        torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
        finally:
            trainer.close()
            remove_path(Path(tmp) / "run", ignore_errors=True)
    summary = profiler.summary()
    inner = {name: stats.median for name, stats in summary.items() if name.startswith("step/")}
    parts = {part: inner.get(f"step/{part}", 0.0) for part in PARTS}
    return {
        "step_ms": summary["step"].median if "step" in summary else float("nan"),
        "parts": parts,
        "inner": inner,
        "syncs_per_step": syncs / (warmup + steps) if cuda else None,
        "device": str(trainer.device),
    }


def diagnose(
    summary: dict[str, Any],
    window: dict[str, Any] | None,
    *,
    memory_budget_mb: float,
    data_share: float = 0.2,
    loss_share: float = 0.25,
    memory_high: float = 0.85,
    memory_low: float = 0.30,
) -> list[Finding]:
    """The findings of the module docstring from :func:`run_summary` and :func:`profile_window` numbers."""
    config = summary["config"]
    data_cfg, model_cfg = config.get("data", {}), config.get("model", {})
    cuda = window is not None and window["device"].startswith("cuda")
    findings: list[Finding] = []
    wait = summary["data_share"]
    window_wait = window["parts"]["data"] / window["step_ms"] if window and window["step_ms"] > 0 else float("nan")
    worst_wait = max(v for v in (wait, window_wait, 0.0) if v == v)  # NaN-free
    if worst_wait >= data_share:
        switches = []
        workers = int(data_cfg.get("num_workers", 0))
        cores = os.cpu_count() or 1
        if workers < cores:
            switches.append(f"data.num_workers={min(cores, max(2, 2 * workers))} (now {workers}; {cores} cores)")
        if data_cfg.get("augment") is not None and data_cfg.get("augment_on") == "worker":
            switches.append("data.augment_on=device (the augmentation runs in the loader workers now)")
        if data_cfg.get("loader", "torch") != "dali" and (data_cfg.get("augment") or {}).get("camera") is not None:
            switches.append("data.loader=dali")
        if cuda and not data_cfg.get("prefetch", False):
            switches.append("data.prefetch=true")
        switches.append("drivetrain tune loader --config RUN/config.yaml (measures these)")
        findings.append(Finding(
            "data-bound",
            f"the step waits for data: {wait:.0%} of the step in the run (median {summary['data_wait_ms']:.1f} of "
            f"{summary['step_ms']:.1f} ms)" + (f", {window_wait:.0%} in the profiled window" if window else ""),
            tuple(switches),
        ))  # fmt: skip
    if window and window["step_ms"] > 0:
        share = window["parts"]["loss"] / window["step_ms"]
        if share >= loss_share:
            impl = (model_cfg.get("args") or {}).get("impl")
            inner = {k.removeprefix("step/loss/"): v for k, v in window["inner"].items() if k.count("/") == 2
                     and k.startswith("step/loss/")}  # fmt: skip
            largest = max(inner, key=inner.get) if inner else None
            detail = f"; its largest part is {largest!r} ({inner[largest]:.1f} ms)" if largest else ""
            switches = ["model.args.impl=batched (the batched loss path)"] if impl == "reference" else []
            findings.append(Finding(
                "loss-bound",
                f"the loss takes {share:.0%} of the step ({window['parts']['loss']:.1f} of {window['step_ms']:.1f} ms"
                f" in the profiled window){detail}" + (", on the reference (per-sample) path" if switches else ""),
                tuple(switches or ["the batched loss path is in use: see the largest part above"]),
            ))  # fmt: skip
    peak = summary["peak_memory_mb"]
    if peak == peak and memory_budget_mb > 0:
        used = peak / memory_budget_mb
        precision = (config.get("precision") or {}).get("mode", "fp32")
        if used >= memory_high:
            switches = ["speed.activation_checkpointing=[<the largest modules>] (recompute in backward)"]
            if precision == "fp32":
                switches.append("precision.mode=bf16 (or fp16 on GPUs without bf16)")
            findings.append(Finding(
                "memory-heavy", f"peak memory {peak:.0f} MB is {used:.0%} of the {memory_budget_mb:.0f} MB budget",
                tuple(switches),
            ))  # fmt: skip
        elif cuda and used <= memory_low:
            findings.append(Finding(
                "memory-room", f"peak memory {peak:.0f} MB is {used:.0%} of the {memory_budget_mb:.0f} MB budget",
                (f"data.batch_size larger than {data_cfg.get('batch_size')} (with the lr scaled along)",),
            ))  # fmt: skip
    if window and window["syncs_per_step"] is not None and window["syncs_per_step"] > 1:
        findings.append(Finding(
            "host-syncs", f"{window['syncs_per_step']:.1f} host syncs per step (one is documented)",
            ("run the profiled window under torch.cuda.set_sync_debug_mode('error') to find them",),
        ))  # fmt: skip
    if not any(f.kind in ("data-bound", "loss-bound") for f in findings) and window and window["step_ms"] > 0:
        net = (window["parts"]["forward"] + window["parts"]["backward"]) / window["step_ms"]
        switches = ["speed.compile=[<modules>]", "speed.channels_last=2d"]
        if cuda and (config.get("precision") or {}).get("mode", "fp32") == "fp32":
            switches.insert(0, "precision.mode=bf16")
        findings.append(Finding(
            "network-bound", f"forward + backward take {net:.0%} of the step ({window['step_ms']:.1f} ms)",
            tuple(switches),
        ))  # fmt: skip
    return findings


def render(summary: dict[str, Any], window: dict[str, Any] | None, findings: list[Finding], run: Path) -> str:
    """The Markdown report."""
    lines = [f"# drivetrain doctor: {run}", "", "## The run", ""]
    lines += [
        f"- {summary['steps']} steps; median step {summary['step_ms']:.1f} ms, data wait {summary['data_wait_ms']:.1f}"
        f" ms ({summary['data_share']:.0%}); {summary['samples_per_s']:.2f} samples/s; peak memory "
        f"{summary['peak_memory_mb']:.0f} MB; {summary['skipped_steps']} skipped steps",
        "",
    ]  # fmt: skip
    if window:
        lines += [f"## Profiled window ({window['device']})", "", "| part | ms (median) | share of the step |",
                  "|---|---:|---:|"]  # fmt: skip
        for part, ms in window["parts"].items():
            share = ms / window["step_ms"] if window["step_ms"] > 0 else float("nan")
            lines.append(f"| {part} | {ms:.1f} | {share:.0%} |")
        lines.append(f"| step | {window['step_ms']:.1f} | 100% |")
        if window["syncs_per_step"] is not None:
            lines.append(f"\nHost syncs per step: {window['syncs_per_step']:.1f}")
        lines.append("")
    lines += ["## Findings", ""]
    for finding in findings:
        lines.append(f"- **{finding.kind}**: {finding.statement}.")
        for switch in finding.switches:
            setting, _, why = switch.partition(" (")
            lines.append(f"  - try `{setting}`" + (f" ({why}" if why else ""))
    if not findings:
        lines.append("- nothing stands out.")
    return "\n".join(lines) + "\n"


def memory_budget_mb(device: str) -> float:
    """The default budget: the GPU's memory on CUDA, the machine's RAM otherwise."""
    import psutil
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**20
    return psutil.virtual_memory().total / 2**20


def to_json(summary: dict[str, Any], window: dict[str, Any] | None, findings: list[Finding]) -> str:
    """The numbers and findings as JSON (without the config)."""
    return json.dumps({
        "run": {k: v for k, v in summary.items() if k != "config"}, "window": window,
        "findings": [dataclasses.asdict(f) for f in findings],
    }, indent=1)  # fmt: skip
