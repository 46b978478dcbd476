"""Reading the inputs of a loss: model outputs and targets come as mappings or as batch objects with fields
(``drivetrain.data.Batch``); both are read the same way, and a missing field is named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["field"]


def field(container: Any, name: str) -> Any:
    """``container[name]`` or ``container.name``, with an error naming the missing field."""
    if isinstance(container, Mapping):
        if name not in container:
            raise KeyError(f"{name}: missing from the loss inputs (have {sorted(container)})")
        return container[name]
    if not hasattr(container, name):
        raise KeyError(f"{name}: missing from the loss inputs ({type(container).__name__} has no such field)")
    return getattr(container, name)
