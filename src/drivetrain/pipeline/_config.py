"""Validation shared by the pipeline's frozen configs (ranges and sizes given as YAML lists or tuples)."""

from __future__ import annotations

import math

__all__ = ["finite_numbers"]


def finite_numbers(config: object, name: str, length: int) -> tuple[float, ...]:
    """Field ``name`` of a frozen dataclass as a tuple of ``length`` finite floats, stored back on it.

    Raises:
        ValueError: naming the field when it is not ``length`` finite numbers (bools are not numbers).
    """
    value = getattr(config, name)
    ok = isinstance(value, (tuple, list)) and len(value) == length
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if not ok or not all(math.isfinite(v) for v in value):
        raise ValueError(f"{name}: expected {length} finite numbers, got {value!r}")
    converted = tuple(float(v) for v in value)
    object.__setattr__(config, name, converted)  # YAML gives lists; keep the frozen config hashable
    return converted
