"""Reading the inputs of a loss: model outputs and targets come as mappings or as batch objects with fields
(:class:`drivetrain.batch.Batch`); both are read the same way, and a missing field is named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

from drivetrain.batch import Batch

__all__ = ["Targets", "field"]

# The ground truth a loss reads: a collated Batch, or a mapping with the same field names (``gt_boxes``,
# ``gt_labels``, ``gt_boxes_2d``, ...; a test's or a plugin's targets).
Targets: TypeAlias = Batch | Mapping[str, Any]


def field(container: Batch | Mapping[str, Any], name: str) -> Any:
    """``container[name]`` or ``container.name``, with an error naming the missing field."""
    if isinstance(container, Mapping):
        if name not in container:
            raise KeyError(f"{name}: missing from the loss inputs (have {sorted(container)})")
        return container[name]
    if not hasattr(container, name):
        raise KeyError(f"{name}: missing from the loss inputs ({type(container).__name__} has no such field)")
    return getattr(container, name)
