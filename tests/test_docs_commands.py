"""Every ``drivetrain`` command in a fenced block of README.md and docs/*.md still parses: its subcommand and
options exist, the configs it names exist, and its ``KEY=VALUE`` overrides name real config keys with values of
the right type — so the manual cannot drift from the code again (what the commands do is tested where each
command is tested; the README's two set-up commands run in CI as they are).

Placeholders written in capitals (``CFG``, ``RUN``, ``DIR``, ``N``) stand for the reader's own values: options
taking them are parsed, overrides with them are checked for their key only.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from drivetrain.cli.main import build_parser
from drivetrain.engine.config import ConfigError, TrainConfig, apply_overrides, from_dict, load_config
from helpers.cli import benchmark_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\|[A-Z0-9_]+)*$")


def _commands(page: Path) -> list[tuple[int, list[str]]]:
    """``(line, argv after 'drivetrain')`` of each drivetrain command in the page's fenced bash blocks."""
    found, block, start, fenced = [], [], 0, False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if fenced:
                found += _parse_block(block, start)
            fenced, block, start = (not fenced and stripped in ("```bash", "```sh")), [], number + 1
            continue
        if fenced:
            block.append(line)
    return found


def _parse_block(lines: list[str], start: int) -> list[tuple[int, list[str]]]:
    out, joined, first = [], "", start
    for offset, line in enumerate(lines):
        if not joined:
            first = start + offset
        joined += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        tokens = shlex.split(joined, comments=True)
        joined = ""
        for i, token in enumerate(tokens):  # the command ends at a shell operator (`&`, `&&`, `;`, `|`)
            if token in ("&", "&&", ";", "|", "||"):
                tokens = tokens[:i]
                break
        if "-m" in tokens and "drivetrain.cli.main" in tokens:  # torchrun ... -m drivetrain.cli.main ...
            tokens = tokens[tokens.index("drivetrain.cli.main") + 1 :]
        elif "--no-python" in tokens and "drivetrain" in tokens:  # torchrun ... --no-python drivetrain ...
            tokens = tokens[tokens.index("drivetrain", tokens.index("--no-python")) + 1 :]
        elif tokens[:1] == ["drivetrain"]:
            tokens = tokens[1:]
        else:
            continue
        out.append((first, tokens))
    return out


CASES = [(page, line, argv) for page in PAGES for line, argv in _commands(page)]


def test_the_manual_has_commands_to_check():
    assert len(CASES) >= 30
    assert {argv[0] for _, _, argv in CASES} >= {"train", "eval", "data", "bench", "report", "viz", "doctor"}


@pytest.mark.parametrize(("page", "line", "argv"), CASES, ids=[f"{p.name}:{n}" for p, n, _ in CASES])
def test_a_documented_command_parses_with_existing_configs_and_keys(page: Path, line: int, argv: list[str]):
    where = f"{page.relative_to(REPO)}:{line}: drivetrain {' '.join(argv)}"
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: does not parse (drivetrain {argv[0]} --help)")
    overrides = [a for a in extra if "=" in a and not a.startswith("-")]
    assert not [a for a in extra if a not in overrides], f"{where}: unknown arguments"
    if args.command == "bench":  # benchmark scripts parse their own options: with the script's own parser
        from drivetrain.cli.bench import available, take_plugins

        assert args.what in available(), f"{where}: no benchmark {args.what!r}"
        options = take_plugins(args.args)[1]
        try:
            benchmark_parser(args.what, options).parse_args(options)
        except SystemExit:
            pytest.fail(f"{where}: the benchmark's options do not parse (drivetrain bench {args.what} --help)")
        return
    # a YAML run config (eval's --config is the devkit's detection config); one of ours lives in configs/
    config = getattr(args, "config", None) if args.command in ("train", "tune") else None
    if config is not None and not str(config).startswith("configs/"):
        config = None  # the reader's own file (my.yaml) or a placeholder (CFG)
    if config is not None:
        assert (REPO / config).is_file(), f"{where}: {config} does not exist"
    overrides += list(getattr(args, "overrides", []))
    concrete = [o for o in overrides if not PLACEHOLDER.match(o.partition("=")[2])]
    for override in [o for o in overrides if o not in concrete]:  # a placeholder value: the key must exist
        key = override.partition("=")[0]
        try:
            from_dict(TrainConfig, apply_overrides({}, [f"{key}=null"]))
        except ConfigError as err:
            assert "unknown key" not in str(err), f"{where}: {err}"
    if config is not None:
        try:
            load_config(REPO / config, concrete)
        except ConfigError as err:
            pytest.fail(f"{where}: {err}")
