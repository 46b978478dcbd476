"""``drivetrain doctor RUN_DIR``: what bounds the run's training step and which switch addresses it."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser"]

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
    from drivetrain import doctor
    from drivetrain.engine import ConfigError
    from drivetrain.safeio.files import replace_text

    if not args.no_profile and args.steps < 1:
        raise SystemExit(f"doctor: --steps must be ≥ 1, got {args.steps}")
    if not args.no_profile and args.warmup < 1:
        raise SystemExit(f"doctor: --warmup must be ≥ 1 (the last warm-up step is the counted one), got {args.warmup}")
    try:
        summary = doctor.run_summary(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"doctor: {err}") from None
    window = None
    if not args.no_profile:
        from drivetrain.engine.stepsplit import MIN_WARMUP

        warm = max(args.warmup, MIN_WARMUP)  # the counted step is never the run's first (measure_steps)
        print(f"doctor: profiling {warm}+{args.steps} steps of {args.run_dir / 'config.yaml'} ...", flush=True)
        try:
            window = doctor.profile_window(args.run_dir, steps=args.steps, warmup=args.warmup,
                                           overrides=args.overrides)  # fmt: skip
        except ConfigError as err:
            raise SystemExit(f"doctor: the run's config does not train here: {err}") from None
    device = window["device"] if window else str((summary["config"].get("train") or {}).get("device", "cpu"))
    budget = args.memory_budget_mb or doctor.memory_budget_mb(device)
    findings = doctor.diagnose(summary, window, memory_budget_mb=budget)
    text = doctor.render(summary, window, findings, args.run_dir)
    # Only these two files of the run directory are written, each replaced whole (a link there is replaced, not
    # written through: a run directory may come from someone else).
    try:
        replace_text(args.run_dir / "doctor.md", text)
        replace_text(args.run_dir / "doctor.json", doctor.to_json(summary, window, findings))
    except OSError as err:  # a run on a read-only mount, a full disk
        raise SystemExit(f"doctor: cannot write {err.filename or args.run_dir} ({err.strerror or err})") from None
    print(text, end="")
    print(f"doctor: wrote {args.run_dir / 'doctor.md'}")
    return 0
