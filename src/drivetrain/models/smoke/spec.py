"""The smoke model as the engine sees it: :data:`SPEC` (``model.name: smoke``)."""

from __future__ import annotations

from drivetrain.detector.spec import ModelSpec
from drivetrain.models.smoke.model import SmokeModel

__all__ = ["SPEC"]

SPEC = ModelSpec(
    "smoke",
    build=SmokeModel,
    args=None,
    modalities=frozenset({"tensor"}),
    summary="a small conv net on generated tensors",
)
"""The registry's entry for ``model.name: smoke``; it declares no args dataclass: ``model.args`` stays the mapping a
config writes and :class:`~.model.SmokeModel`'s signature checks it."""
