"""Entry point of the ``drivetrain`` console script."""

from __future__ import annotations

import argparse
import sys

import drivetrain
from drivetrain.cli import bench, data, train
from drivetrain.cli import eval as eval_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drivetrain",
        description=(
            "Fast, faithful training of autonomous-driving 3D perception models. Every fast path has a "
            "reference path beside it; `drivetrain bench` times the two on the same data; `drivetrain train` trains "
            "a model from a YAML config."
        ),
    )
    parser.add_argument("--version", action="version", version=f"drivetrain {drivetrain.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench.add_parser(sub)
    train.add_parser(sub)
    data.add_parser(sub)
    eval_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
