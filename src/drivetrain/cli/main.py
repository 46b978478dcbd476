"""Entry point of the ``drivetrain`` console script."""

from __future__ import annotations

import argparse
import sys

import drivetrain
from drivetrain.cli import bench, configs, data, doctor, launch, predict, report, train, tune, viz
from drivetrain.cli import eval as eval_cli


def build_parser() -> argparse.ArgumentParser:
    """The ``drivetrain`` argument parser with its subcommands (bench, train, launch, configs, data, eval, predict,
    viz, tune, report, doctor)."""
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
    launch.add_parser(sub)
    configs.add_parser(sub)
    data.add_parser(sub)
    eval_cli.add_parser(sub)
    predict.add_parser(sub)
    viz.add_parser(sub)
    tune.add_parser(sub)
    report.add_parser(sub)
    doctor.add_parser(sub)
    # --plugin goes anywhere a user types it: before the command, after it, or after its sub-action
    # (`drivetrain viz frame --plugin X` and `drivetrain viz --plugin X frame` alike). Each level has its own
    # destination: argparse copies a sub-parser's values over its parent's, so one shared name would lose one level's.
    _add_plugin_option(parser, 0)
    for name, command in sub.choices.items():
        if name == "launch":  # its arguments are torchrun's; the workers' command takes --plugin
            continue
        _add_plugin_option(command, 1)
        for action in _sub_actions(command):
            _add_plugin_option(action, 2)
    return parser


PLUGIN_HELP = (
    "import this Python module first so that it registers its models/datasets (repeatable; before or after the "
    "command and its sub-action; the only way besides installed entry points: a config or run directory never names "
    "code; docs/engine.md)"
)


def _add_plugin_option(parser: argparse.ArgumentParser, level: int) -> None:
    parser.add_argument(
        "--plugin", metavar="MODULE", action="append", dest=f"plugin_{level}", default=argparse.SUPPRESS,
        help=PLUGIN_HELP,
    )  # fmt: skip


def _sub_actions(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The sub-action parsers of a command (``viz frame``, ``data synth``, ...), none for a command without."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [p for a in subs for p in a.choices.values()]


def plugins(args: argparse.Namespace) -> list[str]:
    """Every ``--plugin`` module typed, in the order of the levels (before the command, after it, after its
    sub-action), and, for ``bench``, those among the benchmark's options (taken out of them)."""
    found = [m for level in range(3) for m in getattr(args, f"plugin_{level}", [])]
    if args.command == "bench":
        more, args.args = bench.take_plugins(args.args)
        found += more
    return found


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the chosen subcommand and return its exit code.

    ``KEY=VALUE`` arguments that argparse leaves over go to the ``train`` overrides; any other leftover
    argument is a usage error. ``launch`` hands everything after it to torchrun as it is (``launch --help`` aside).
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["launch"] and argv[1:2] not in (["-h"], ["--help"]):
        return launch.launch(argv[1:])  # torchrun's options and the worker command, which parses its own
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `train` takes KEY=VALUE overrides anywhere (also after --resume auto); argparse collects positionals
    # only up to the first option, so the later ones arrive here.
    overrides = [a for a in extra if "=" in a and not a.startswith("-")]
    if overrides and hasattr(args, "overrides"):
        args.overrides = [*args.overrides, *overrides]
        extra = [a for a in extra if a not in overrides]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _one_line_warnings()
    modules = plugins(args)
    if modules:
        from drivetrain.engine.config import ConfigError
        from drivetrain.engine.registry import load_plugins

        try:
            load_plugins(modules)
        except ConfigError as err:
            print(f"drivetrain {args.command}: {err}", file=sys.stderr)
            return 2
    from drivetrain.batch import BatchFieldError

    try:
        return args.run(args)
    except BatchFieldError as err:  # a model's code read a field a Batch does not have: where, and which exist
        print(f"drivetrain {args.command}: {err.located()}", file=sys.stderr)
        return 1


def _one_line_warnings() -> None:
    """Warnings print as ``drivetrain: CATEGORY: message`` without echoing a line of our source code."""
    import warnings

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"drivetrain: {category.__name__}: {message}", file=file or sys.stderr)

    warnings.showwarning = show


if __name__ == "__main__":
    raise SystemExit(main())
