"""``drivetrain configs [NAME [KEY=VALUE ...]]``: the shipped run configs, or one of them resolved.

Without a name, lists the configs of the repository's ``configs/`` folder (or ``--dir``): each name, the file it
starts from (``base:``) and its purpose, the first comment line of the file. With a name (``ssn_tiny``, or the path
of any config file), prints that config resolved — its base chain merged, the overrides applied, every field with
its value, defaults included — as the YAML a run directory keeps in ``config.yaml``, the chain as a comment.
``drivetrain train --config FILE --print-config`` prints the same for a file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

import drivetrain

EPILOG = """\
examples:
  drivetrain configs                                   # every shipped config, its base and purpose
  drivetrain configs ssn_tiny                          # one, resolved (base chain merged, defaults filled in)
  drivetrain configs NAME optim.lr=2e-3               # with overrides, as `train` would run it
  drivetrain train --config configs/ssn_tiny.yaml --print-config > my_ssn.yaml   # a flat copy to edit
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``configs`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "configs",
        help="list the shipped configs with their purpose, or print one resolved (drivetrain configs NAME)",
        description=__doc__.split("\n\n", 1)[1].replace("``", "`"),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", nargs="?", default=None, metavar="NAME", help="a config to print resolved")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides applied after the base chain")
    parser.add_argument(
        "--dir", type=Path, default=None, help="the folder to list (default: the repository's configs/)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """List the configs, or print ``args.name`` resolved; 0, or 2 when the folder or the config is wrong."""
    folder = args.dir if args.dir is not None else configs_dir()
    if args.name is None or "=" in args.name:
        if args.overrides or args.name is not None:
            print(
                "drivetrain configs: overrides need a config name (drivetrain configs NAME KEY=VALUE)", file=sys.stderr
            )
            return 2
        if folder is None or not folder.is_dir():
            missing = folder if folder is not None else "configs/ (a source checkout has it)"
            print(f"drivetrain configs: no configs folder at {missing}; pass --dir", file=sys.stderr)
            return 2
        print(listing(folder), end="")
        return 0
    path = find_config(args.name, folder)
    if path is None:
        known = ", ".join(p.stem for p in shipped(folder)) if folder is not None and folder.is_dir() else "none found"
        print(f"drivetrain configs: {args.name}: no such config (known: {known})", file=sys.stderr)
        return 2
    return print_resolved(path, args.overrides, "configs")


def configs_dir() -> Path | None:
    """The repository's ``configs/`` folder (beside ``src/`` of this checkout, else in the working directory)."""
    for path in (Path(drivetrain.__file__).resolve().parents[2] / "configs", Path.cwd() / "configs"):
        if path.is_dir():
            try:  # shown as typed: configs/ssn_tiny.yaml from the checkout's root
                return path.relative_to(Path.cwd().resolve())
            except ValueError:
                return path
    return None


def shipped(folder: Path) -> list[Path]:
    """The runnable configs of ``folder``: its ``*.yaml`` files (the shared bases live in ``_base/``)."""
    return sorted(folder.glob("*.yaml"))


def find_config(name: str, folder: Path | None) -> Path | None:
    """``name`` as a file path, else as a config of ``folder`` (with or without ``.yaml``); None if neither."""
    given = Path(name)
    if given.is_file():
        return given
    if folder is None:
        return None
    candidate = folder / (name if name.endswith(".yaml") else f"{name}.yaml")
    return candidate if candidate.is_file() else None


def purpose(path: Path) -> str:
    """The first line of ``path`` if it is a comment (without ``#``), else a note that the file has none."""
    try:
        first = path.read_text(encoding="utf-8").lstrip().split("\n", 1)[0]
    except (OSError, UnicodeDecodeError) as err:
        return f"(unreadable: {err})"
    return first.lstrip("#").strip() if first.startswith("#") else "(no purpose line: the file starts with no comment)"


def base_of(path: Path) -> str:
    """The ``base:`` value of ``path`` as written, ``-`` without one (the file is read as YAML data only)."""
    from drivetrain.engine.config import ConfigError
    from drivetrain.engine.config_files import read_config_file

    try:
        chain = read_config_file(path).chain
    except ConfigError as err:
        return f"(error: {err})"
    return os.path.relpath(chain[1], path.parent) if len(chain) > 1 else "-"


def listing(folder: Path) -> str:
    """The table of ``folder``'s configs: name, base, purpose."""
    rows = [(p.stem, base_of(p), purpose(p)) for p in shipped(folder)]
    width = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(("config", "base"))]
    lines = [f"{len(rows)} configs in {folder}/ (drivetrain configs NAME prints one resolved; shared bases: _base/)"]
    lines.append(f"{'config':<{width[0]}}  {'base':<{width[1]}}  purpose")
    lines += [f"{name:<{width[0]}}  {base:<{width[1]}}  {text}" for name, base, text in rows]
    return "\n".join(lines) + "\n"


def resolved_yaml(config: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """``config`` resolved as YAML: the base chain and overrides as comments, then every field of the validated config
    (what the run directory's ``config.yaml`` holds; a file that trains the same run without its bases).

    Raises:
        ConfigError: the config (or a base, or an override) is wrong; the message names the file and key.
    """
    from drivetrain.engine.config import config_to_dict, load_config
    from drivetrain.engine.config_files import read_config_file

    chain = read_config_file(config).chain
    cfg = load_config(config, overrides)
    header = [f"# drivetrain: the resolved config of {config}"]
    if len(chain) > 1:
        header.append(f"# base chain: {' → '.join(str(p) for p in chain)}")
    if overrides:
        header.append(f"# overrides: {' '.join(overrides)}")
    header.append("# every field with its value, defaults included (a builder's args: all it declares, or as written)")
    body = yaml.dump(config_to_dict(cfg), Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
    return "\n".join(header) + "\n" + body


class _Dumper(yaml.SafeDumper):
    """Block mappings, and lists of plain values on one line (``voxel_size: [0.5, 0.5, 8.0]``), as configs/ writes."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flat = all(not isinstance(v, dict | list | tuple) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _represent_list)


def print_resolved(config: str | Path, overrides: list[str] | tuple[str, ...], command: str) -> int:
    """Print :func:`resolved_yaml` of ``config``; 0, or 2 (one line naming the file and key) on a config error.

    Args:
        config: the config file.
        overrides: ``KEY=VALUE`` overrides, applied after the base chain.
        command: the subcommand, for the error line (``train``, ``configs``, ``tune loader``).
    """
    from drivetrain.engine.config import ConfigError

    try:
        text = resolved_yaml(config, overrides)
    except ConfigError as err:
        print(f"drivetrain {command}: config error: {err}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0
