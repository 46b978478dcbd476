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
    >>> spec = ModelSpec("tiny", build=lambda args: torch.nn.Linear(args.width, 1), args=TinyArgs,
    ...                  modalities=frozenset({"tensor"}))
    >>> spec.build_model(TinyArgs(width=4)).in_features
    4
    >>> spec.build_model({"width": 2}).in_features, spec.build_model(None, width=3).in_features
    (2, 3)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["MODALITIES", "LossPath", "ModelSpec", "WeightFormat", "changed", "keywords"]

MODALITIES = frozenset({"camera", "lidar", "tensor"})
"""What a model's batches carry: camera images, lidar points, or plain tensors (the engine's smoke model)."""


@dataclass(frozen=True)
class WeightFormat:
    """A weights-file format a model can import (``model.init_from: {path, format: NAME}``).

    Attributes:
        name: the format's short name (``format:`` in a config), unique over all registered models.
        summary: one line for ``--help`` and errors (which file, from which code base).
        recognise: whether a state dict's names are this format's (``format: auto``); takes the names.
        map: ``map(model, state, meta) -> KeyMap`` (:class:`~drivetrain.detector.keymap.KeyMap`): the file's
            tensors in the model's names; raises :class:`drivetrain.detector.keymap.KeyMapError` when the format does
            not apply to ``model``.
    """

    name: str
    summary: str
    recognise: Callable[[Collection[str]], bool]
    map: Callable[[nn.Module, dict[str, torch.Tensor], dict | None], Any]


@dataclass(frozen=True)
class LossPath:
    """The argument of ``model.args`` that chooses a model's loss path, and its two values: what ``drivetrain doctor``
    advises for a loss-bound run on the per-sample path (``model.args.{arg}={batched}``).

    Attributes:
        arg: the field of the model's args dataclass.
        reference: its value on the per-sample (original's) path.
        batched: its value on the batched path.
    """

    arg: str
    reference: object
    batched: object


@dataclass(frozen=True)
class ModelSpec:
    """One detector, as the engine sees it.

    Attributes:
        name: the short name configs use (``model.name``).
        build: the builder: an ``nn.Module`` class or function returning a model that follows the engine's
            protocol. With :attr:`args` it takes one positional argument, an instance of :attr:`args` (where each
            argument's type, default and meaning are declared, once): ``build(args)``; the built-in models' also take
            keyword arguments replacing its fields (``PointPillars(max_voxels=100)``, by :func:`changed`). Without,
            it takes the config's ``model.args`` as keyword arguments.
        args: the frozen dataclass ``model.args`` maps onto, and the builder takes; None: the builder takes
            keyword arguments and its signature is the only check (a plugin's choice).
        modalities: what its batches carry, a subset of :data:`MODALITIES`.
        summary: one line for ``drivetrain configs`` and errors.
        weight_formats: the originals' weight formats it imports (``drivetrain``, our own names, is always read).
        augment: the model's published training augmentation, a
            :class:`drivetrain.pipeline.augment.stage.AugmentConfig` (not imported here: this module sits below the
            pipeline; config loading checks the type): the sections of ``data.augment`` a config gives fill the fields
            they leave out from it (it never turns a section on). None: the types' defaults (every step off).
        loss_path: the argument that switches its loss between the per-sample and the batched path (None: it has
            no such switch, and ``drivetrain doctor`` advises none).
    """

    name: str
    build: Callable[..., nn.Module]
    args: type | None
    modalities: frozenset[str]
    summary: str = ""
    weight_formats: tuple[WeightFormat, ...] = ()
    augment: object | None = None
    loss_path: LossPath | None = None

    def __post_init__(self) -> None:
        if not self.modalities or not self.modalities <= MODALITIES:
            raise ValueError(f"ModelSpec {self.name!r}: modalities must be a non-empty subset of {sorted(MODALITIES)}")
        if self.args is not None and not dataclasses.is_dataclass(self.args):
            raise TypeError(f"ModelSpec {self.name!r}: args must be a dataclass, got {self.args!r}")
        if not callable(self.build):
            raise TypeError(f"ModelSpec {self.name!r}: build must be callable, got {self.build!r}")

    def build_model(self, args: Any = None, **changes: Any) -> nn.Module:
        """Build the model by the protocol of :attr:`build`.

        Args:
            args: an instance of :attr:`args`, a mapping of its fields (``args(**mapping)``) or None (its defaults);
                for a spec without :attr:`args`, a mapping of the builder's keyword arguments (or a dataclass
                instance, its fields), or None.
            changes: fields replaced in ``args`` (``impl="reference"``; a name it lacks is a TypeError naming it);
                without :attr:`args`, more keyword arguments of the builder.
        """
        if self.args is None:
            return self.build(**keywords(args), **changes)
        if args is None:
            args = self.args()
        elif isinstance(args, Mapping):
            args = self.args(**args)
        elif not isinstance(args, self.args):
            raise TypeError(f"ModelSpec {self.name!r}: args must be a {self.args.__name__}, a mapping or None")
        return self.build(changed(args, **changes))


def changed(args: Any, **changes: Any) -> Any:
    """The frozen dataclass instance ``args`` with the fields ``changes`` names replaced (``args`` itself when there
    are none): how a builder applies its keyword arguments to its typed ``args``. TypeError naming a field that
    ``args`` does not have.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class TinyArgs:
        ...     width: int = 8
        >>> changed(TinyArgs(), width=4)
        TinyArgs(width=4)
    """
    if not changes:
        return args
    known = [f.name for f in dataclasses.fields(args)]
    for name in changes:
        if name not in known:
            raise TypeError(f"{type(args).__name__}: unknown argument {name!r}; known: {', '.join(known)}")
    return dataclasses.replace(args, **changes)


def keywords(args: Any) -> dict[str, Any]:
    """The keyword arguments of a builder without typed args (and a dataset's) from ``args``: a dataclass
    instance's fields (shallow), a mapping's items, or nothing for None."""
    if args is None:
        return {}
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    return dict(args)
