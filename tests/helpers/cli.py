"""The argument parsers of the command line and of the benchmark scripts, for tests that check what help and docs say
against what parses."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from unittest import mock


class _Captured(Exception):
    """Raised in place of parsing: the parser a benchmark's ``main`` built is caught before anything runs."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def benchmark_parser(name: str, argv: list[str]) -> argparse.ArgumentParser:
    """The parser benchmark ``name``'s ``main(argv)`` builds for ``argv`` (a script may choose its parser by an
    option, as ``bench iteration --model ssn`` does), taken at its ``parse_args`` call: nothing is benchmarked."""
    from drivetrain.cli.bench import available, load

    module = load(available()[name])

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Captured(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
        try:
            module.main(list(argv), prog=f"drivetrain bench {name}")
        except _Captured as caught:
            return caught.parser
    raise AssertionError(f"bench {name}: main() returned without parsing its options")


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the tree under ``parser`` with its path of command words (``("viz", "frame")``)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, (*path, name))


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """The options ``parser`` and the parsers below it take."""
    return {option for _, p in walk(parser) for option in p._option_string_actions}
