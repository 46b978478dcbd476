"""The smoke model as the engine sees it: :data:`SPEC` (``model.name: smoke``)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from drivetrain.model_spec import ModelSpec
from drivetrain.models.smoke.model import SmokeArgs, SmokeModel

__all__ = ["SPEC", "build"]


def build(**fields: Any) -> SmokeModel:
    """``SmokeModel(SmokeArgs(**fields))``: the builder of a spec without an args dataclass, whose signature (the
    fields of :class:`SmokeArgs`, read off the dataclass) the engine checks ``model.args`` against."""
    return SmokeModel(SmokeArgs(**fields))


build.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in dataclasses.fields(SmokeArgs)
    ],
    return_annotation=SmokeModel,
)
build.__annotations__ = {f.name: f.type for f in dataclasses.fields(SmokeArgs)}

SPEC = ModelSpec(
    "smoke",
    build=build,
    args=None,
    modalities=frozenset({"tensor"}),
    summary="a small conv net on generated tensors",
)
"""The registry's entry for ``model.name: smoke``. It declares no args dataclass: ``model.args`` stays the mapping a
config writes and :func:`build`'s signature checks it — the engine tests' model of a builder without one, as a plugin
may register it."""
