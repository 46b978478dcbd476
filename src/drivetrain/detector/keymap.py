"""Key maps: a weights file's state dict renamed into a model's names (``model.init_from``), model-neutral parts.

A model's spec (:class:`drivetrain.detector.spec.ModelSpec`) lists the :class:`~drivetrain.detector.spec.WeightFormat` s
it can import; each format's map reads a state dict in the original's names and returns a :class:`KeyMap` in ours.
This module holds what every map shares — the :class:`KeyMap` record, rename rules, the class-order permutation of
class channels, a checkpoint ``meta``'s class names — and the one format every model reads: ``drivetrain`` (our
own names, :func:`map_drivetrain`). The maps of the originals' formats live in each model's folder
(``models/<name>/weights.py``), each citing the original definitions it reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = [
    "CONSTANT_RTOL",
    "KeyMap",
    "KeyMapError",
    "Rule",
    "class_order",
    "file_classes",
    "map_drivetrain",
    "permute_classes",
    "rename",
    "rules",
    "short",
]

# Relative agreement of the original's float32 geometry constants with ours: each side computes the value in at
# most five float32 roundings of ½ ulp (coords_d: difference, division, two products and a sum), so the two
# differ by at most 5 ulp; 8 ulp leaves room and is still far below any real change of a range or depth.
CONSTANT_RTOL = 8 * torch.finfo(torch.float32).eps


class KeyMapError(ValueError):
    """The file's format does not apply to this model (one line saying why)."""


@dataclass
class KeyMap:
    """A file's state dict in our model's names.

    Attributes:
        tensors: our name → tensor in our layout.
        sources: our name → the file's name it came from.
        unexpected: file names the map does not know.
        ignored: ``(file name, why)`` of known entries that have nothing to load (a classifier, loss constants,
            copies of a shared module, a run's extra state).
        mismatched: ``(name, why)`` of values the map checked and found different (a constant, a class set);
            the name is ours where the entry maps to a tensor of the model (which then counts as mismatched, not
            missing), else the file's.
        scope: the part of the model the format initialises: a module-path prefix (``""``: all of it), or None
            (nothing: the model lacks what the format holds).
        notes: conversions made and other facts the report should say.
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    mismatched: list[tuple[str, str]] = field(default_factory=list)
    scope: str | None = ""
    notes: list[str] = field(default_factory=list)

    def add(self, ours: str, theirs: str, value: torch.Tensor) -> None:
        """Record ``value`` for our ``ours``, read from the file's ``theirs``."""
        self.tensors[ours], self.sources[ours] = value, theirs


Rule = tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]


def rules(*pairs: tuple[str, str | Callable[[re.Match[str]], str]]) -> tuple[Rule, ...]:
    """Compile ``(pattern, target)`` pairs: a target is a ``re`` template or a function of the match."""
    return tuple((re.compile(pattern), target) for pattern, target in pairs)


def rename(items: dict[str, torch.Tensor], rules: Sequence[Rule], out: KeyMap) -> None:
    """Map every entry by the first rule whose pattern matches its whole name; the rest are unexpected."""
    for key, value in items.items():
        for pattern, target in rules:
            match = pattern.fullmatch(key)
            if match:
                out.add(match.expand(target) if isinstance(target, str) else target(match), key, value)
                break
        else:
            out.unexpected.append(key)


def class_order(file_classes: Sequence[str], model_classes: Sequence[str]) -> list[int] | str | None:
    """Per model class, its index in the file's class axis; None when the orders agree; a reason when the class
    sets differ."""
    file_classes, model_classes = tuple(file_classes), tuple(model_classes)
    if file_classes == model_classes:
        return None
    if sorted(file_classes) != sorted(model_classes):
        return f"the file's classes {file_classes} are not the model's {model_classes}"
    return [file_classes.index(name) for name in model_classes]


def permute_classes(out: KeyMap, names: Sequence[str], order: list[int] | str | None, what: str) -> None:
    """Reorder the class axis (dim 0, ``anchor · C + class``) of ``out.tensors[name]`` for each of ``names``."""
    if order is None:
        return
    present = [name for name in names if name in out.tensors]
    if not present:
        return
    if isinstance(order, str):
        out.mismatched += [(name, order) for name in present]
        for name in present:
            del out.tensors[name]
        return
    num = len(order)
    index = torch.tensor(order)
    for name in present:
        value = out.tensors[name]
        if value.shape[0] % num == 0:  # otherwise its shape differs from the model's and the report says so
            grouped = value.reshape(value.shape[0] // num, num, *value.shape[1:])  # (A, C, ...)
            out.tensors[name] = grouped[:, index].reshape(value.shape)
    out.notes.append(f"{what}: class channels reordered from the file's class order to the model's")


def short(value: torch.Tensor, limit: int = 6) -> str:
    """A tensor's first ``limit`` values for a message, with the count when there are more."""
    flat = [round(v, 4) for v in value.detach().flatten()[:limit].tolist()]
    more = f", ... ({value.numel()} values)" if value.numel() > limit else ""
    return f"[{', '.join(map(str, flat))}{more}]"


def file_classes(meta: dict | None) -> tuple[str, ...] | None:
    """The class names a checkpoint's ``meta`` records (mmcv/mmdet3d 0.x ``CLASSES``; mmengine ``dataset_meta``)."""
    if not isinstance(meta, dict):
        return None
    names = meta.get("CLASSES")
    dataset_meta = meta.get("dataset_meta")
    if names is None and isinstance(dataset_meta, dict):
        names = dataset_meta.get("classes")
    if isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names):
        return tuple(names)
    return None


# --------------------------------------------------------------------------------------------- drivetrain
def map_drivetrain(model: nn.Module, state: dict[str, torch.Tensor], meta: dict | None = None) -> KeyMap:
    """Our own names (a drivetrain checkpoint): everything but modules' extra state, which belongs to the run that
    saved it (a temporal memory bank, a generator), not to the weights."""
    out = KeyMap(scope="")
    for key, value in state.items():
        if key == "_extra_state" or key.endswith("._extra_state"):
            out.ignored.append((key, "module extra state of the run that saved it"))
        else:
            out.add(key, key, value)
    return out
