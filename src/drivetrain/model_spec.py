"""What a detector is, said once: :class:`ModelSpec` — its builder, typed arguments, inputs and weight formats.

Each detector's folder (``models/<name>/spec.py``) exports one spec; the engine reads it and nothing else of the
model: the registry builds by it (``model.name`` → spec → :meth:`ModelSpec.build_model`), config loading reads
``model.args`` into :attr:`ModelSpec.args` (unknown keys and bad types are one line naming ``model.args.KEY``),
``model.init_from`` reads the :class:`WeightFormat` s it declares, and the benchmarks route by
:attr:`ModelSpec.modalities`. A plugin defines a spec the same way and registers it with
``drivetrain.engine.registry.register_model(spec)``.

This module sits at the bottom of the package (it imports torch only), so that a model folder can define its spec
without importing the engine, and the engine can read specs without importing a model.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class TinyArgs:
    ...     width: int = 8
    >>> spec = ModelSpec("tiny", build=lambda width: torch.nn.Linear(width, 1), args=TinyArgs,
    ...                  modalities=frozenset({"tensor"}))
    >>> spec.build_model(TinyArgs(width=4)).in_features
    4
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["MODALITIES", "ModelSpec", "WeightFormat"]

MODALITIES = frozenset({"camera", "lidar", "tensor"})
"""What a model's batches carry: camera images, lidar points, or plain tensors (the engine's smoke model)."""


@dataclass(frozen=True)
class WeightFormat:
    """A weights-file format a model can import (``model.init_from: {path, format: NAME}``).

    Attributes:
        name: the format's short name (``format:`` in a config), unique over all registered models.
        summary: one line for ``--help`` and errors (which file, from which code base).
        recognise: whether a state dict's names are this format's (``format: auto``); takes the names.
        map: ``map(model, state, meta) -> KeyMap`` (:class:`drivetrain.keymap.KeyMap`): the file's tensors in the
            model's names; raises :class:`drivetrain.keymap.KeyMapError` when the format does not apply to
            ``model``.
    """

    name: str
    summary: str
    recognise: Callable[[Collection[str]], bool]
    map: Callable[[nn.Module, dict[str, torch.Tensor], dict | None], Any]


@dataclass(frozen=True)
class ModelSpec:
    """One detector, as the engine sees it.

    Attributes:
        name: the short name configs use (``model.name``).
        build: the builder: an ``nn.Module`` class or function taking :attr:`args`' fields as keyword arguments
            (and returning a model that follows the engine's protocol).
        args: the frozen dataclass ``model.args`` maps onto (its fields and defaults are the builder's keyword
            arguments); None: the builder's signature is the only check (a plugin's choice).
        modalities: what its batches carry, a subset of :data:`MODALITIES`.
        summary: one line for ``drivetrain configs`` and errors.
        weight_formats: the originals' weight formats it imports (``drivetrain``, our own names, is always read).
    """

    name: str
    build: Callable[..., nn.Module]
    args: type | None
    modalities: frozenset[str]
    summary: str = ""
    weight_formats: tuple[WeightFormat, ...] = ()

    def __post_init__(self) -> None:
        if not self.modalities or not self.modalities <= MODALITIES:
            raise ValueError(f"ModelSpec {self.name!r}: modalities must be a non-empty subset of {sorted(MODALITIES)}")
        if self.args is not None and not dataclasses.is_dataclass(self.args):
            raise TypeError(f"ModelSpec {self.name!r}: args must be a dataclass, got {self.args!r}")
        if not callable(self.build):
            raise TypeError(f"ModelSpec {self.name!r}: build must be callable, got {self.build!r}")

    def build_model(self, args: Any = None, **command: Any) -> nn.Module:
        """Build the model from ``args`` (an instance of :attr:`args`, a mapping, or None for the defaults) plus
        the command's own keyword arguments (e.g. ``impl``)."""
        return self.build(**keywords(args), **command)


def keywords(args: Any) -> dict[str, Any]:
    """The builder's keyword arguments from ``args``: a dataclass instance's fields (shallow), a mapping's items,
    or nothing for None."""
    if args is None:
        return {}
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    return dict(args)
