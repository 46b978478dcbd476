"""Help that matches the parser: every ``drivetrain ... --help`` of the command tree and of every benchmark prints,
names only options that exist where it names them, and its examples parse; ``--plugin`` is taken before and after every
command and sub-action. (docs/*.md's commands: tests/test_docs_commands.py.)"""

from __future__ import annotations

import argparse
import math
import re
import shlex
from pathlib import Path

import pytest

from drivetrain.cli.bench import available, take_plugins
from drivetrain.cli.main import build_parser, main, plugins
from helpers.cli import benchmark_parser, option_strings, walk

REPO = Path(__file__).resolve().parents[1]
PARSER = build_parser()  # built once: building reads every benchmark script's docstring
TREE = dict(walk(PARSER))
BENCHMARKS = sorted(available())
# what `drivetrain bench --help` says every benchmark takes
COMMON = ("--device", "--repeat", "--warmup", "--seed", "--json", "--md", "--save")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
FRAGMENT = re.compile(r"`+(drivetrain [^`]+?)`+")  # `drivetrain viz frame --ply` in a sentence


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0, argv
    return capsys.readouterr().out


def _is_example(line: str) -> bool:
    """Whether ``line`` starts an example: ``drivetrain ...``, or ``torchrun ...`` that runs drivetrain (a sentence
    that starts with the word torchrun is prose)."""
    return line.startswith("drivetrain ") or (line.startswith("torchrun ") and " drivetrain " in f"{line} ")


def _examples(text: str) -> tuple[list[list[str]], str]:
    """The example command lines of a help text (``drivetrain ...``, ``torchrun ... --no-python drivetrain ...``;
    continuations joined, comments dropped), as argv after ``drivetrain``, and the text without them."""
    examples, rest, pending = [], [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if pending or _is_example(stripped):
            pending += " " + stripped.rstrip("\\")
            if stripped.endswith("\\"):
                continue
            words = [w for w in shlex.split(pending, comments=True) if w != "..."]
            pending = ""
            examples.append(words[words.index("drivetrain") + 1 :])
            continue
        rest.append(line)
    return examples, "\n".join(rest)


def _target(words: list[str]) -> tuple[tuple[str, ...], argparse.ArgumentParser | None, list[str]]:
    """The command path of the words after ``drivetrain``, its parser (a benchmark's for ``bench WHAT``; None for a
    placeholder such as ``bench WHAT``) and the words after the path."""
    path: tuple[str, ...] = ()
    while words and (*path, words[0]) in TREE:
        path, words = (*path, words[0]), words[1:]
    if path == ("bench",):
        what, args = (words[0], words[1:]) if words else (None, [])
        if what not in available():
            return path, None, words
        return (*path, what), benchmark_parser(what, take_plugins(args)[1]), args
    return path, TREE[path], words


def _parse(words: list[str]) -> None:
    """A whole example parses as ``drivetrain`` parses it: the command's parser (leftovers only ``KEY=VALUE``), and a
    benchmark's own parser for ``bench WHAT ...``; ``launch ...`` as torchrun parses it (drivetrain hands it over
    unparsed), and its worker command, when that is ``drivetrain``, as drivetrain parses it."""
    if words[:1] == ["launch"]:
        from torch.distributed.run import get_args_parser

        try:
            torchrun = get_args_parser().parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"drivetrain {shlex.join(words)}: torchrun's options do not parse")
        if torchrun.no_python and torchrun.training_script == "drivetrain":
            _parse(torchrun.training_script_args)
        return
    args, extra = PARSER.parse_known_args(words)
    assert all("=" in a and not a.startswith("-") for a in extra), f"drivetrain {shlex.join(words)}: {extra}"
    plugins(args)
    if args.command == "bench":
        try:
            benchmark_parser(args.what, args.args).parse_args(args.args)
        except SystemExit:
            pytest.fail(f"drivetrain {shlex.join(words)}: the benchmark's options do not parse")


def _check(text: str, allowed: set[str], where: str) -> None:
    examples, prose = _examples(text)
    for words in examples:
        _parse(words)
    for fragment in FRAGMENT.findall(prose):  # a command named in a sentence: its options are that command's
        words = [w for w in re.sub(r"[\[\]]", " ", fragment).split()[1:] if w != "..."]
        path, parser, rest = _target(words)
        if parser is not None:
            unknown = set(OPTION.findall(" ".join(rest))) - option_strings(parser) - {"--help"}
            assert not unknown, (
                f"{where}: `{fragment}` names {sorted(unknown)}, which drivetrain {' '.join(path)} lacks"
            )
    named = set(OPTION.findall(FRAGMENT.sub(" ", prose)))
    assert named <= allowed, f"{where} names {sorted(named - allowed)}, which it does not take"


@pytest.mark.parametrize("path", list(TREE), ids=[" ".join(p) or "drivetrain" for p in TREE])
def test_every_commands_help_names_options_that_exist_and_its_examples_parse(path, capsys):
    text = _help(list(path), capsys)
    allowed = option_strings(TREE[path])
    if path == ("bench",):  # it says what every benchmark takes, and which ones do not: so they do
        excepted = set(re.findall(r"except `bench (\w+)`", text.replace("\n", " ")))
        lacking = {name for name in BENCHMARKS if not set(COMMON) <= option_strings(benchmark_parser(name, []))}
        assert lacking == excepted, f"drivetrain bench --help: {sorted(lacking)} lack {COMMON}, it excepts {excepted}"
        allowed |= set(COMMON)
    if path == ("launch",):  # it hands its options to torchrun, and says so
        from torch.distributed.run import get_args_parser

        allowed |= option_strings(get_args_parser()) | {"--signal"}  # and names sbatch's --signal
    _check(text, allowed, f"drivetrain {' '.join(path)} --help")


BENCH_CASES = [(name, []) for name in BENCHMARKS] + [("iteration", ["--model", "ssn"])]  # its lidar parser too


@pytest.mark.parametrize(("name", "argv"), BENCH_CASES, ids=[" ".join([n, *a]) for n, a in BENCH_CASES])
def test_every_benchmarks_help_names_options_it_takes(name, argv, capsys):
    parser = benchmark_parser(name, argv)
    assert _help(["bench", name, *argv], capsys) == parser.format_help()
    _check(parser.format_help(), option_strings(parser), f"drivetrain bench {name} {' '.join(argv)} --help")


def test_the_help_check_catches_an_option_that_is_not_there():
    with pytest.raises(AssertionError, match=r"names \['--batches'\]"):
        _check("reads --batches N consecutive batches", {"--repeat"}, "a help")
    with pytest.raises(AssertionError, match=r"--batches.*which drivetrain bench solve lacks"):
        _check("Run: ``drivetrain bench solve [--config CFG] [--batches N]``.", set(), "a help")


def test_plugin_is_taken_before_and_after_every_command_and_sub_action(capsys):
    for path, parser in TREE.items():
        if path[:1] == ("launch",):  # everything after `launch` is torchrun's; its worker command takes --plugin
            continue
        assert "--plugin" in parser._option_string_actions, f"drivetrain {' '.join(path)} takes no --plugin"
    examples = [words for path in TREE for words in _examples(_help(list(path), capsys))[0]]
    assert {w[0] for w in examples} >= {"train", "configs", "data", "eval", "predict", "viz", "tune", "report"}
    for words in examples:  # each example with a plugin at every level a user might type it
        path, _, rest = _target(words)
        if path[:1] == ("launch",):
            continue
        typed = ["--plugin", "p0", path[0], "--plugin", "p1", *path[1:], *(["--plugin", "p2"] if len(path) > 1 else []),
                 *rest, "--plugin", "p3"]  # fmt: skip
        args, extra = PARSER.parse_known_args(typed)
        assert all("=" in a for a in extra), typed
        found = plugins(args)
        assert sorted(found) == sorted(["p0", "p1", "p3"] + (["p2"] if len(path) > 1 else [])), (typed, found)
    args, _ = PARSER.parse_known_args(["bench", "train", "--plugin", "a", "--config", "x", "--plugin=b"])
    assert plugins(args) == ["a", "b"] and args.args == ["--config", "x"]  # taken out of the benchmark's options


def test_the_demo_banner_says_the_time_the_readme_records():
    banner = re.search(r"~(\d+) min", (REPO / "scripts" / "demo.sh").read_text())
    recorded = re.search(r"(\d+(?:\.\d+)?) min\s+in all", (REPO / "README.md").read_text())
    assert banner and recorded, "the demo's banner or the README's recorded time is gone"
    assert int(banner.group(1)) == math.ceil(float(recorded.group(1))), (banner.group(0), recorded.group(0))
