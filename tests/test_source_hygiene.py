"""Source states what holds, not when it was measured: no calendar date in the comments, docstrings or other strings
of ``src/drivetrain``, the benchmarks' code (``benchmarks/**/*.py``) and ``scripts/``, read from the source (nothing
is imported).

A measured figure lives in a result file under ``benchmarks/results/`` (which carries its device, versions and date)
or in a docs page; source cites the file. Data values that happen to be dates are listed in :data:`DATA_DATES`, by
file and value.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import drivetrain

ROOT = Path(drivetrain.__file__).resolve().parents[2]  # the checkout: src/drivetrain → .
DATE = re.compile(r"\b(?:19|20)\d{2}-[01]\d(?:-[0-3]\d)?\b")  # a day, or a month (2026-11)
# Dates that are data, not a statement of when something was measured: (path from the checkout, value).
DATA_DATES = frozenset({("src/drivetrain/data/synth/generate.py", "2018-08-01")})  # nuScenes' date_captured field


def sources() -> list[Path]:
    """The files checked: the package's modules, the benchmarks (not their results) and the scripts."""
    package = (ROOT / "src" / "drivetrain").rglob("*.py")
    return sorted([*package, *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "scripts").glob("*")])


def python_dates(text: str) -> list[tuple[int, str]]:
    """Every date in a Python source's comments and string literals (docstrings included).

    Args:
        text: the module's source.

    Returns:
        ``(line, date)`` pairs, in the order they occur.
    """
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            found += [(token.start[0], date) for date in DATE.findall(token.string)]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a docstring's line: where the string starts, plus the line breaks before the date in it
            value = node.value
            found += [(node.lineno + value.count("\n", 0, m.start()), m.group()) for m in DATE.finditer(value)]
    return sorted(found)


def dates(path: Path) -> list[tuple[int, str]]:
    """The dates in one file: a Python module's comments and strings, any other script's whole text."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return python_dates(text)
    return [(number, date) for number, line in enumerate(text.splitlines(), 1) for date in DATE.findall(line)]


def test_the_reader_finds_dates_in_comments_docstrings_and_strings_only():
    text = '"""Measured 2026-11-26."""\n# on 2025-01-02\nx = 1  # seen 2024-03-04\n'
    text += 'y = f"at {x} 2023-05-06"\nz = 20260101  # H100, 2026-11; 1920-1080 px\n'
    found = [(1, "2026-11-26"), (2, "2025-01-02"), (3, "2024-03-04"), (4, "2023-05-06"), (5, "2026-11")]
    assert python_dates(text) == found


@pytest.mark.parametrize("path", sources(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_date_in_source(path: Path):
    relative = str(path.relative_to(ROOT))
    found = [(line, date) for line, date in dates(path) if (relative, date) not in DATA_DATES]
    assert not found, f"{relative}: a date in source, line(s) {found}: cite the result file or docs page instead"


def test_every_listed_data_date_is_still_there():
    for relative, date in DATA_DATES:
        assert date in (ROOT / relative).read_text(encoding="utf-8"), f"{relative} no longer holds {date}: unlist it"
