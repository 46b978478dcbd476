"""``drivetrain report RUN [RUN ...] [--out DIR]``: a run's curves as PNGs and one Markdown page."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser"]

EPILOG = """\
examples:
  drivetrain report runs/my-run                                   # → runs/my-run/report.md + PNGs
  drivetrain report runs/plain runs/aug --out runs/compare        # two runs overlaid

Works on a running run (it reads what metrics.jsonl holds so far). The PNGs: loss, loss terms, learning rate,
loss scale and skipped steps, samples/s, step time vs data wait, peak memory, evaluation metrics.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``report`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "report",
        help="a run's curves (loss, terms, lr, loss scale, throughput, data wait, memory, eval) as PNGs + report.md",
        description="Write PNGs of one or more runs' metrics.jsonl and a report.md that embeds them with each run's "
        "last values, config and versions; several runs are overlaid for comparison.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories (hold metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: the first run's)")
    parser.add_argument("--smooth", type=int, default=10, help="moving-average window in steps (default: 10)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the report; 0, or 2 when a run cannot be read."""
    from drivetrain.viz.report import write_report

    try:
        path = write_report(args.runs, args.out, smooth=args.smooth)
    except (FileNotFoundError, ValueError, ImportError) as err:
        raise SystemExit(f"report: {err}") from None
    except OSError as err:  # a run on a read-only mount (or a full disk): the pictures go elsewhere
        where = err.filename or args.out or args.runs[0]
        raise SystemExit(
            f"report: cannot write {where} ({err.strerror or err}); pass --out DIR to write the report elsewhere"
        ) from None
    print(f"report: {path}")
    return 0
