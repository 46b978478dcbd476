"""Shared pieces of the fuzz tests: example counts, byte and JSON mutations, outcome tallies.

Every fuzz test runs ``CI_EXAMPLES`` cases in the default set and ``SLOW_EXAMPLES`` in the slow set
(``DRIVETRAIN_FUZZ_EXAMPLES`` overrides both). Runs are derandomized: the same cases every time, so a
failure in CI replays locally; the slow set explores further cases with its larger budget.
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

CI_EXAMPLES = int(os.environ.get("DRIVETRAIN_FUZZ_EXAMPLES", 100))
SLOW_EXAMPLES = int(os.environ.get("DRIVETRAIN_FUZZ_EXAMPLES", 1000))
BUDGETS = [
    pytest.param(CI_EXAMPLES, id="ci"),
    pytest.param(SLOW_EXAMPLES, id="slow", marks=pytest.mark.slow),
]

# Files are written and restored inside each example, so function-scoped fixtures are safe here.
_CHECKS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, suppress_health_check=_CHECKS)


class Tally:
    """Counts how each case ended; ``report`` prints one line (visible with ``pytest -s``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.counts: collections.Counter[str] = collections.Counter()

    def __call__(self, outcome: str) -> None:
        self.counts[outcome] += 1

    def report(self) -> str:
        line = f"fuzz {self.kind}: {sum(self.counts.values())} cases: " + ", ".join(
            f"{k} {v}" for k, v in sorted(self.counts.items())
        )
        print(line)
        return line


@st.composite
def mutated_bytes(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` after 1-4 edits: bit flips, truncation, deleted or inserted runs, or other bytes entirely."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "delete", "insert", "replace"]))
        if op == "replace" or not data:
            data = bytearray(draw(st.binary(max_size=64)))
        elif op == "flip":
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del data[draw(st.integers(0, len(data) - 1)) :]
        elif op == "delete":
            pos = draw(st.integers(0, len(data) - 1))
            del data[pos : pos + draw(st.integers(1, 64))]
        else:
            pos = draw(st.integers(0, len(data)))
            data[pos:pos] = draw(st.binary(min_size=1, max_size=32))
    return bytes(data)


JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:20]):  # enough of a long list to reach every kind of entry
            out += _paths(item, (*prefix, i))
    return out


@st.composite
def mutated_document(draw: st.DrawFn, document: Any) -> Any:
    """A deep copy of a JSON-like ``document`` with 1-3 edits at random paths: a value replaced by another
    (of any type, NaN and ±inf included), a key or list entry deleted, or a key added."""
    doc = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        if not path:
            doc = draw(JSON_VALUES)
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        op = draw(st.sampled_from(["replace", "delete", "add"]))
        if op == "delete":
            del parent[path[-1]]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(JSON_VALUES)
        else:
            parent[path[-1]] = draw(JSON_VALUES)
    return doc


def finite(values: Any) -> bool:
    """True if every number in a nested structure is finite."""
    if isinstance(values, float):
        return math.isfinite(values)
    if isinstance(values, dict):
        return all(finite(v) for v in values.values())
    if isinstance(values, list | tuple):
        return all(finite(v) for v in values)
    return True
