"""``drivetrain doctor RUN_DIR``: what bounds the run's training step and which switch addresses it.

Two sources of numbers:

1. the run's own ``metrics.jsonl`` (every step it trained): median step time, the data wait within it (the time
   ``next(batch)`` blocked), samples/s, peak memory (CUDA allocator peak, or the process's peak RSS on a CPU),
   fp16 loss scale and skipped steps;
2. a short **profiled window**: the run's config trained again for ``--steps`` steps (after ``--warmup``) in a
   scratch directory by :func:`drivetrain.engine.stepsplit.measure_steps` — the split ``drivetrain bench train``
   reports: the ``step`` region's data wait (blocked on the loader), host → device copy, forward, loss, backward,
   optimizer and other (the models' and losses' own regions inside them), ``overhead_share`` = 1 − (forward +
   backward) / step, and the host syncs per step (counted on any device; on CUDA every synchronising call seen by
   ``torch.cuda.set_sync_debug_mode``).

Findings, each stated with the numbers behind it (thresholds are parameters of :func:`diagnose`):

- **data-bound**: the data wait (in the window: loader and copy) is ≥ 20 % of the step → ``data.num_workers``
  (more, up to the cores), ``data.augment_on=device`` (augmenting in the workers), ``data.loader=dali``,
  ``data.prefetch=true`` (CUDA), and ``drivetrain tune loader`` to measure them;
- **loss-bound**: the loss is ≥ 25 % of the step → ``model.args.impl=batched`` when the run uses the reference
  (per-sample) loss path, otherwise the loss's largest part is named;
- **memory-heavy**: peak memory ≥ 85 % of the budget (``--memory-budget-mb``; default the GPU's memory for a CUDA
  run, ``train.device: auto`` on a machine with a GPU included, or the machine's RAM) →
  ``speed.activation_checkpointing`` and ``precision.mode=bf16`` (fp32 runs); a CUDA run at ≤ 30 % has room for a
  larger ``data.batch_size``;
- **host syncs**: more than the trainer's one documented sync per step (the regions that read are named);
- otherwise **network-bound**: forward + backward dominate → ``precision.mode=bf16`` on a GPU,
  ``speed.compile``, ``speed.channels_last``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from pathlib import Path
from typing import Any

__all__ = [
    "Finding",
    "add_parser",
    "diagnose",
    "memory_budget_mb",
    "profile_window",
    "render",
    "run_summary",
    "to_json",
]

EPILOG = """\
examples:
  drivetrain doctor runs/my-run                               # the run's metrics + a 5-step profiled window
  drivetrain doctor runs/demo --no-profile                    # the run's metrics alone (no training)
  drivetrain doctor runs/x --memory-budget-mb 16000 train.device=cpu   # overrides for the profiled window

Writes RUN_DIR/doctor.md (and doctor.json): the run's medians, the profiled window's split of the trainer's step
(the one `drivetrain bench train` reports: data wait, copy, forward, loss, backward, optimizer, other; overhead
share = 1 - (forward + backward) / step; host syncs per step) and the findings with the switches to try.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``doctor`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "doctor",
        help="what bounds a run's step (data wait, loss, memory, host syncs) and which switch addresses it",
        description="Read a run's metrics, profile a few steps of its config, and say what bounds the step — data "
        "wait, the loss, memory, host syncs or the network — with the numbers and the drivetrain switches to try.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run directory (metrics.jsonl, config.yaml)")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (default: 5)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed steps before them, the last one counted (kernels, host syncs); at least 2 run (default: 2)",
    )
    parser.add_argument("--no-profile", action="store_true", help="the run's metrics only; train nothing")
    parser.add_argument("--memory-budget-mb", type=float, default=None,
                        help="memory the run may use (default: the GPU's memory, or the machine's RAM)")  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for the profiled window")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Diagnose ``args.run_dir``; print and write the report."""
    from drivetrain.engine import ConfigError
    from drivetrain.safeio.files import replace_text

    if not args.no_profile and args.steps < 1:
        raise SystemExit(f"doctor: --steps must be ≥ 1, got {args.steps}")
    if not args.no_profile and args.warmup < 1:
        raise SystemExit(f"doctor: --warmup must be ≥ 1 (the last warm-up step is the counted one), got {args.warmup}")
    try:
        summary = run_summary(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"doctor: {err}") from None
    window = None
    if not args.no_profile:
        from drivetrain.engine.stepsplit import MIN_WARMUP

        warm = max(args.warmup, MIN_WARMUP)  # the counted step is never the run's first (measure_steps)
        print(f"doctor: profiling {warm}+{args.steps} steps of {args.run_dir / 'config.yaml'} ...", flush=True)
        try:
            window = profile_window(args.run_dir, steps=args.steps, warmup=args.warmup,
                                           overrides=args.overrides)  # fmt: skip
        except ConfigError as err:
            raise SystemExit(f"doctor: the run's config does not train here: {err}") from None
    device = window["device"] if window else str((summary["config"].get("train") or {}).get("device", "cpu"))
    budget = args.memory_budget_mb or memory_budget_mb(device)
    findings = diagnose(summary, window, memory_budget_mb=budget)
    text = render(summary, window, findings, args.run_dir)
    # Only these two files of the run directory are written, each replaced whole (a link there is replaced, not
    # written through: a run directory may come from someone else).
    try:
        replace_text(args.run_dir / "doctor.md", text)
        replace_text(args.run_dir / "doctor.json", to_json(summary, window, findings))
    except OSError as err:  # a run on a read-only mount, a full disk
        raise SystemExit(f"doctor: cannot write {err.filename or args.run_dir} ({err.strerror or err})") from None
    print(text, end="")
    print(f"doctor: wrote {args.run_dir / 'doctor.md'}")
    return 0


PARTS = ("data", "copy", "forward", "loss", "backward", "optimizer", "other")  # drivetrain.engine.stepsplit's


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
    from drivetrain.engine.config_files import read_yaml_file
    from drivetrain.viz.curves import read_metrics

    run_dir = Path(run_dir)
    train, _ = read_metrics(run_dir)
    if not train:
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: no training step recorded yet")
    if not ((run_dir / "config.yaml").exists() or (run_dir / "config.yaml").is_symlink()):
        raise FileNotFoundError(f"{run_dir / 'config.yaml'}: not found (is {run_dir} a run directory?)")
    config = read_yaml_file(run_dir / "config.yaml")  # bounded, a regular file: ConfigError (a ValueError) if not
    if not isinstance(config, dict):
        raise ValueError(f"{run_dir / 'config.yaml'}: not a run's config (a {type(config).__name__}, not a mapping)")

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
        "skipped_steps": _count(train[-1].get("skipped_steps", 0), run_dir / "metrics.jsonl", "skipped_steps"),
        "config": config,
    }


def _count(value: float, path: Path, key: str) -> int:
    """``value`` as the count it must be; ValueError naming the file and field for inf, NaN or a fraction."""
    if not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise ValueError(f"{path}: {key}: expected a count, got {value}")
    return int(value)


def profile_window(
    run_dir: str | Path, *, steps: int = 5, warmup: int = 2, overrides: list[str] | None = None
) -> dict[str, Any]:
    """Train the run's config ``warmup + steps`` steps in a scratch directory under the profiler (see the module):
    :func:`drivetrain.engine.stepsplit.measure_steps`, as ``drivetrain bench train`` does — but its data is only read:
    a dataset the config names that is not there is a ConfigError, never generated into the folder it names.

    Returns:
        :meth:`~drivetrain.engine.stepsplit.StepSplit.as_dict`: ``step_ms``, ``step_max_ms``, ``parts`` ({part:
        ``median_ms``, ``max_ms``, ``share``} for data, copy, forward, loss, backward, optimizer, other),
        ``data_wait_ms``, ``overhead_share``, ``syncs_per_step``, ``syncs_source``, ``kernels_per_step``,
        ``region_syncs``, ``logged``, ``inner_ms`` ({region path: median ms}), ``device``.
    """
    from drivetrain.engine.stepsplit import measure_steps

    split = measure_steps(Path(run_dir) / "config.yaml", overrides or [], steps=steps, warmup=warmup,
                          generate_data=False)  # fmt: skip
    return split.as_dict()


def _ms(window: dict[str, Any], part: str) -> float:
    return window["parts"][part]["median_ms"]


def _batched_loss_switch(model_cfg: dict[str, Any]) -> list[str]:
    """The switch to the batched loss path of a run's model on its per-sample path, as the model's spec declares it
    (:class:`~drivetrain.detector.spec.LossPath`); none for a model that declares no such switch or that the registry
    does not know here (a plugin the command was not given)."""
    from drivetrain.engine.config import ConfigError, ModelConfig
    from drivetrain.engine.registry import model_spec

    try:
        path = model_spec(model_cfg.get("name", ModelConfig.name)).loss_path
    except ConfigError:
        return []
    args = model_cfg.get("args") or {}
    if path is None or not isinstance(args, dict) or args.get(path.arg) != path.reference:
        return []
    return [f"model.args.{path.arg}={path.batched} (the batched loss path)"]


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
    waits = (_ms(window, "data") + _ms(window, "copy")) if window else float("nan")  # loader + host→device copy
    window_wait = waits / window["step_ms"] if window and window["step_ms"] > 0 else float("nan")
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
            f"{summary['step_ms']:.1f} ms)" + (f", {window_wait:.0%} in the profiled window (loader "
            f"{_ms(window, 'data'):.1f} ms, copy {_ms(window, 'copy'):.1f} ms)" if window else ""),
            tuple(switches),
        ))  # fmt: skip
    if window and window["step_ms"] > 0:
        share = _ms(window, "loss") / window["step_ms"]
        if share >= loss_share:
            inner = {k.removeprefix("step/loss/"): v for k, v in window["inner_ms"].items() if k.count("/") == 2
                     and k.startswith("step/loss/")}  # fmt: skip
            largest = max(inner, key=inner.get) if inner else None
            detail = f"; its largest part is {largest!r} ({inner[largest]:.1f} ms)" if largest else ""
            switches = _batched_loss_switch(model_cfg)
            findings.append(Finding(
                "loss-bound",
                f"the loss takes {share:.0%} of the step ({_ms(window, 'loss'):.1f} of {window['step_ms']:.1f} ms"
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
        where = ", ".join(f"{name} {n}" for name, n in window["region_syncs"].items())
        findings.append(Finding(
            "host-syncs",
            f"{window['syncs_per_step']:g} host syncs per step ({window['syncs_source']}"
            + (f"; host reads counted in {where}" if where else "") + "); the trainer's own is one, the skip decision",
            ("torch.cuda.set_sync_debug_mode('error') (on a GPU: raises at each; one kept needs a `# sync:` reason)",),
        ))  # fmt: skip
    if not any(f.kind in ("data-bound", "loss-bound") for f in findings) and window and window["step_ms"] > 0:
        net = 1.0 - window["overhead_share"]
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
        from drivetrain.engine.stepsplit import table_lines

        lines += [f"## Profiled window ({window['device']}, {window['warmup']} warm-up + {window['steps']} steps)", ""]
        lines += [*table_lines(window), ""]
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
    """The default budget: the GPU's memory on CUDA (``auto``, the config's default, is CUDA where there is one, as
    the trainer resolves it), the machine's RAM otherwise."""
    import psutil
    import torch

    if device == "auto":  # a run read with --no-profile names its config's device, not the one it trained on
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**20
    return psutil.virtual_memory().total / 2**20


def to_json(summary: dict[str, Any], window: dict[str, Any] | None, findings: list[Finding]) -> str:
    """The numbers and findings as JSON (without the config)."""
    return json.dumps({
        "run": {k: v for k, v in summary.items() if k != "config"}, "window": window,
        "findings": [dataclasses.asdict(f) for f in findings],
    }, indent=1)  # fmt: skip
