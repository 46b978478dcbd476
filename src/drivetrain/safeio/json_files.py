"""Parsing JSON that someone else wrote: nesting and integers bounded, a refusal is one line naming the place.

Tables, predictions, ``metrics.jsonl`` lines, cache records and run markers come from other people (see
docs/safety.md). Two things in well-formed JSON get past ``json.loads`` and then break whatever reads the result:

- **nesting**: the C decoder recurses once per ``[``/``{``, so 100,000 of them (200 KB of text) raise
  ``RecursionError`` — no ``ValueError``, so every ``except ValueError`` in the readers let it through as a
  traceback. :func:`loads` first measures the deepest nesting outside strings and refuses anything deeper than
  :data:`MAX_DEPTH` (every file drivetrain reads nests at most 5 deep: a table is a list of records holding
  lists) before the decoder starts;
- **integers**: an integer literal is parsed at any length, so ``10**4000`` in a table parses, and then
  ``float()`` or a NumPy array raise ``OverflowError`` where it is used (past 4,300 digits ``int()`` itself
  refuses, advising a Python setting). No field of ours holds an integer outside 64 bits (tokens are strings,
  microsecond timestamps need 51 bits), so such a literal is refused, naming its place in the document as
  ``[3].translation[0]`` (row 3, field ``translation``, element 0).

Both refusals are :class:`JSONLimitError`, a ``ValueError`` as the decoder's own ``JSONDecodeError`` is, so the
readers' existing handlers turn them into their one-line errors; jsonl readers tell them apart from a line cut
short by a kill (which they skip) with :func:`jsonl_records`.

Both checks are passes of C code over the bytes, before the decoder runs. The depth: escaped quotes blanked,
everything but quotes and brackets dropped, strings dropped, then a running sum of the brackets in NumPy. The
integers: digits mapped to one byte and what may precede a number to another, then a substring search for 19
digits (only a document holding such a run is decoded again with a checking ``parse_int``). On a 185 MB file of
300,000 ``sample_annotation``-like rows (CPU AMD EPYC, 2 cores shared with other jobs) they took 0.1 s and 0.2 s,
against 2.0-3.3 s for ``json.loads`` itself.

This module imports only :mod:`drivetrain.safeio.reads` (which imports nothing of drivetrain), so every package may
use it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from drivetrain.safeio.reads import read_bytes

__all__ = ["INT_LIMIT", "MAX_DEPTH", "JSONLimitError", "jsonl_records", "load", "loads", "nesting_depth"]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted: drivetrain's files nest at most 5 deep, the decoder itself fails
near 1,000 (the interpreter's recursion limit less the caller's frames)."""

INT_LIMIT = 2**63
"""Integer literals must lie in ``[-INT_LIMIT, INT_LIMIT)``: a signed 64-bit integer, what NumPy's int64 columns
hold (and exactly representable up to 2**53 in the float64 ones)."""

_KEEP = b'"[]{}'
_DROP = bytes(b for b in range(256) if b not in _KEEP)  # bytes.translate's delete set: all but quotes and brackets
_STRING = re.compile(rb'"[^"]*"')  # after escaped quotes are dropped, a string runs to the next quote
_TOKEN = re.compile(rb'"[^"]*"|[\[\]{}]')
# Where an integer literal of 19 digits or more may start: digits become 9, what may precede a number in JSON
# (and a minus sign) a comma, everything else an x; then `,999...` is a plain substring search.
_DIGIT_RUNS = bytes(
    ord("9") if chr(b).isdigit() and b < 128 else ord(",") if chr(b) in "[,:- \t\r\n" else ord("x") for b in range(256)
)
_LONG_INT = b"," + b"9" * 19
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
_CHUNK = 1 << 22  # brackets summed per NumPy pass: bounds the temporary arrays to ~60 MB


class JSONLimitError(ValueError):
    """Well-formed JSON beyond a bound of this module (nesting depth, integer size); the message names the file,
    the line of a jsonl file and the place in the document."""


def _unescaped(data: bytes) -> bytes:
    r"""``data`` with every ``\\`` and ``\"`` pair turned into two spaces (same length, so positions hold): the
    quotes left are exactly the ones that open and close strings (a valid document has backslashes only in
    escape pairs, read left to right as ``bytes.replace`` does)."""
    return data.replace(b"\\\\", b"  ").replace(b'\\"', b"  ") if b"\\" in data else data


def _brackets(data: bytes) -> bytes:
    """The brackets of the JSON text ``data`` that stand outside strings, in order (and a stray quote of invalid
    text, which counts for nothing)."""
    # Two adjacent quotes have nothing between them, and dropping them keeps the others alternating open/close:
    # most strings go this way (a table's hold no brackets); the regex takes the rest.
    marks = _unescaped(data).translate(None, _DROP).replace(b'""', b"")
    return _STRING.sub(b"", marks) if b'"' in marks else marks


def _deepest(marks: bytes) -> int:
    """The highest running count of opening less closing brackets in ``marks`` (see :func:`_brackets`)."""
    depth, deepest = 0, 0
    for start in range(0, len(marks), _CHUNK):
        chunk = np.frombuffer(marks, np.uint8, count=min(_CHUNK, len(marks) - start), offset=start)
        opens = (chunk == ord("[")) | (chunk == ord("{"))
        closes = (chunk == ord("]")) | (chunk == ord("}"))
        running = depth + np.cumsum(opens.astype(np.int32) - closes, dtype=np.int64)  # a stray quote: 0
        deepest = max(deepest, int(running.max()))
        depth = int(running[-1])
    return deepest


def nesting_depth(data: str | bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``data``, brackets inside strings not counted.

    For text that is not valid JSON the count holds for its valid beginning, as far as the decoder would read
    (the decoder recurses once per bracket counted there).

    Example: ``nesting_depth('{"a": [[1], "]"]}')`` → 3.
    """
    return _deepest(_brackets(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data))


def _too_deep(data: bytes) -> bool:
    """Whether ``data`` nests deeper than ``MAX_DEPTH`` (fewer opening brackets than that: no need to count)."""
    marks = _brackets(data)
    return marks.count(b"[") + marks.count(b"{") > MAX_DEPTH and _deepest(marks) > MAX_DEPTH


def _may_hold_long_int(data: bytes) -> bool:
    """Whether ``data`` may hold an integer literal of 19 digits or more (False: every integer fits in 64 bits)."""
    runs = data.translate(_DIGIT_RUNS)
    return runs.startswith(_LONG_INT[1:]) or _LONG_INT in runs


def _too_deep_at(data: bytes) -> int:
    """Byte offset of the first bracket that opens level ``MAX_DEPTH + 1`` (only called when there is one)."""
    depth = 0
    for token in _TOKEN.finditer(_unescaped(data)):
        mark = token.group()
        if mark in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH:
                return token.start()
        elif mark in (b"]", b"}"):
            depth -= 1
    return 0


class _OversizedInt:
    """Stands in for an integer literal outside ``INT_LIMIT`` until the document is parsed and its place found."""

    def __init__(self, literal: str) -> None:
        self.literal = literal

    def describe(self) -> str:
        digits = self.literal.lstrip("-")
        shown = self.literal if len(digits) <= 24 else f"{self.literal[:10]}…{self.literal[-6:]} ({len(digits)} digits)"
        return f"the integer {shown} does not fit in 64 bits"


def _parse_int(literal: str) -> int | _OversizedInt:
    # 2**63 has 19 digits: shorter literals always fit, and int() never sees more than 20 characters (so Python's
    # 4,300-digit limit, and its quadratic conversion, are never reached).
    if len(literal) < 19:
        return int(literal)
    if len(literal) <= 20 and -INT_LIMIT <= (value := int(literal)) < INT_LIMIT:
        return value
    return _OversizedInt(literal)


def _key(key: str) -> str:
    """``.name`` for a plain key, else ``["..."]`` escaped onto one line and cut to 40 characters."""
    if _PLAIN_KEY.fullmatch(key):
        return f".{key}"
    shown = json.dumps(key)
    return f'[{shown[:36]}…"]' if len(shown) > 40 else f"[{shown}]"


def _place_of(value: Any, path: str = "") -> tuple[str, _OversizedInt] | None:
    """The JSON path (``[3].translation[0]``) and stand-in of the first oversized integer in ``value``, if any.

    Recursive: the document nests at most ``MAX_DEPTH`` deep by now."""
    if isinstance(value, _OversizedInt):
        return path.removeprefix(".") or "the document", value
    if isinstance(value, dict):
        items: Any = ((f"{path}{_key(k)}", v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = _place_of(item, where)
        if found is not None:
            return found
    return None


def _where(source: str | Path | None, line: int | None) -> str:
    parts = [str(source)] if source is not None else []
    if line is not None:
        parts.append(f"line {line}")
    return ": ".join(parts) + ": " if parts else ""


def loads(data: str | bytes, *, source: str | Path | None = None, line: int | None = None) -> Any:
    """``json.loads(data)``, refusing nesting deeper than :data:`MAX_DEPTH` and integers outside 64 bits.

    Args:
        data: the JSON text (``bytes`` in UTF-8, -16 or -32, as ``json.loads`` takes them).
        source: the file, named in the messages (None: the caller names it).
        line: the line of ``source`` that ``data`` is (a jsonl record), named in the messages.

    Returns:
        The decoded value.

    Raises:
        JSONLimitError: naming ``source``, ``line`` and the place: "nested deeper than 64 levels at line 1
            column 65" or "[3].translation[0]: the integer ... does not fit in 64 bits".
        json.JSONDecodeError, UnicodeDecodeError: not JSON (both ``ValueError``; the message names no file).
    """
    raw = data
    if isinstance(raw, bytes) and json.detect_encoding(raw) not in ("utf-8", "utf-8-sig"):
        raw = raw.decode(json.detect_encoding(raw), "surrogatepass")  # UTF-16/32: count brackets in UTF-8
    encoded = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if _too_deep(encoded):
        offset = _too_deep_at(encoded)
        row = encoded.count(b"\n", 0, offset) + 1
        column = len(encoded[encoded.rfind(b"\n", 0, offset) + 1 : offset].decode("utf-8", "replace")) + 1
        at = f"at column {column}" if line is not None else f"at line {row} column {column}"
        raise JSONLimitError(f"{_where(source, line)}JSON nested deeper than {MAX_DEPTH} levels {at}")
    oversized: list[_OversizedInt] = []

    def parse_int(literal: str) -> int | _OversizedInt:
        value = _parse_int(literal)
        if isinstance(value, _OversizedInt):
            oversized.append(value)
        return value

    if not _may_hold_long_int(encoded):
        return json.loads(data)
    value = json.loads(data, parse_int=parse_int)
    if oversized:
        place, first = _place_of(value) or ("the document", oversized[0])
        raise JSONLimitError(f"{_where(source, line)}{place}: {first.describe()}")
    return value


def load(path: str | Path) -> Any:
    """:func:`loads` of the file ``path``, read as a regular file (:func:`drivetrain.safeio.reads.read_bytes`: a FIFO
    is refused, not waited on). As with ``json.load``, the caller names the file in its own error.

    Args:
        path: the JSON file.

    Returns:
        The decoded value.

    Raises:
        JSONLimitError: see :func:`loads`.
        json.JSONDecodeError, UnicodeDecodeError: not JSON.
        OSError: the file cannot be read, or is no regular file.
    """
    return loads(read_bytes(path))


def jsonl_records(text: str, *, source: str | Path) -> Iterator[tuple[int, str, Any]]:
    """``(line number, line, value)`` of each line of the JSON-lines ``text`` that decodes; lines that do not
    (cut short by a kill, empty) are skipped, as a log being written may end in one.

    Args:
        text: the file's content.
        source: the file, named in the refusals.

    Raises:
        JSONLimitError: a line nested too deep or holding an oversized integer, naming ``source`` and the line:
            no kill writes that, so the file is refused rather than read without it.
    """
    for number, line in enumerate(text.splitlines(), 1):
        try:
            value = loads(line, source=source, line=number)
        except JSONLimitError:
            raise
        except ValueError:
            continue
        yield number, line, value
