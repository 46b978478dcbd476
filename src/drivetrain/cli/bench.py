"""``drivetrain bench <what>``: run a benchmark script from the ``benchmarks/`` folder of a source checkout.

Each ``benchmarks/<what>.py`` times a reference path against its fast path in one process and defines
``DESCRIPTION`` (one line) and ``main(argv) -> int``. The folder is found from ``$DRIVETRAIN_BENCHMARKS``,
then next to the installed sources (an editable install of a checkout), then in the working directory.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import drivetrain


def benchmarks_dir() -> Path | None:
    """The benchmarks folder, or None if there is none to be found."""
    candidates = []
    if env := os.environ.get("DRIVETRAIN_BENCHMARKS"):
        candidates.append(Path(env))
    candidates.append(Path(drivetrain.__file__).resolve().parents[2] / "benchmarks")
    candidates.append(Path.cwd() / "benchmarks")
    for path in candidates:
        if path.is_dir():
            return path
    return None


def available() -> dict[str, Path]:
    """Benchmark name → script path.

    A script ``<name>_bench.py`` is the benchmark ``<name>``: for names a module of that folder must not take,
    such as ``copy``, which would shadow the standard library's module whenever a script there runs directly.
    """
    folder = benchmarks_dir()
    if folder is None:
        return {}
    scripts = {}
    for path in sorted(folder.glob("*.py")):
        if not path.stem.startswith("_"):
            scripts[path.stem.removesuffix("_bench")] = path
    return scripts


def load(path: Path) -> ModuleType:
    """Import the benchmark script at ``path`` as a module.

    Raises:
        SystemExit: if it cannot be loaded or defines no callable ``main``.
    """
    spec = importlib.util.spec_from_file_location(f"drivetrain_bench_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "main", None)):
        raise SystemExit(f"{path}: a benchmark script must define main(argv) -> int")
    return module


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``bench`` subcommand on ``sub``; its epilog lists the benchmarks found."""
    scripts = available()
    lines = []
    for name, path in scripts.items():
        description = _first_docline(path)
        lines.append(f"  {name:<12} {description}")
    epilog = "benchmarks:\n" + ("\n".join(lines) if lines else "  (none found: run from a source checkout)")
    parser = sub.add_parser(
        "bench",
        help="time a fast path against its reference path and print where the time goes",
        description=(
            "Run one benchmark: both paths in one process on the same data, after warm-up, with device "
            "synchronisation; prints a breakdown table of medians. Every benchmark takes --device, --repeat, "
            "--warmup, --seed, --json, --md and --save (except `bench originals`, which counts kernels and times "
            "nothing: --seed and --json), and --plugin MODULE anywhere (a plugin's model, e.g. for `bench train`); "
            "`drivetrain bench WHAT --help` lists its own options."
        ),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("what", metavar="WHAT", help="benchmark name (see below)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="options passed to the benchmark")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run benchmark ``args.what`` with the options ``args.args``; return its exit code.

    Raises:
        SystemExit: if no benchmark of that name is found.
    """
    scripts = available()
    if args.what not in scripts:
        known = ", ".join(scripts) or "none (no benchmarks/ folder found; run from a source checkout)"
        raise SystemExit(f"bench: unknown benchmark {args.what!r}; available: {known}")
    module = load(scripts[args.what])
    return int(module.main(args.args, prog=f"drivetrain bench {args.what}") or 0)


def take_plugins(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(modules, rest)``: the ``--plugin MODULE`` / ``--plugin=MODULE`` options among a benchmark's options
    (``drivetrain bench train --plugin X ...``: imported by ``drivetrain`` itself, in the process that runs the
    benchmark) and the options left for the benchmark. A ``--plugin`` without a module is left for the benchmark's
    parser to refuse."""
    modules: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        item = argv[i]
        if item.startswith("--plugin=") and len(item) > len("--plugin="):
            modules.append(item.removeprefix("--plugin="))
        elif item == "--plugin" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            modules.append(argv[i + 1])
            i += 1
        else:
            rest.append(item)
        i += 1
    return modules, rest


def _first_docline(path: Path) -> str:
    """The first line of a script's module docstring, read without importing it."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except (OSError, SyntaxError):
        return ""
    return doc.splitlines()[0] if doc else ""
