"""Initialise a model from weights on disk: ``model.init_from`` and :func:`load_weights`.

A source is read as data, never as code: ``torch.load(..., weights_only=True)`` only, so a file holding pickled
Python objects is refused (one line naming the file and the object), as is anything that is not a mapping of
names to tensors. The file must be a regular one (a FIFO would block the load), and a zip archive's members may
not declare more bytes than the file holds (:mod:`~drivetrain.safeio.torch_files`). Sources:

* ``drivetrain``: a run directory (its newest committed checkpoint that loads), a checkpoint directory
  ``checkpoints/step-N`` or its ``state.pt`` (marker and checksum verified by :class:`~.checkpoint.Checkpointer`),
  or a bare state dict in our names; any of our models;
* the originals' formats each model's spec declares (:class:`drivetrain.detector.spec.WeightFormat`, read through
  :func:`drivetrain.engine.registry.weight_formats`; the list is in docs/engine.md): our
  camera detector reads a torchvision ResNet-50 state dict and its original repository's checkpoints, our lidar
  detectors mmdetection3d's.

mmcv / mmengine checkpoints keep the weights under ``state_dict`` (beside ``meta``, whose class names are read);
a ``module.`` prefix (DDP) is removed. ``format: auto`` tells the format by the names (each format's
``recognise``; our checkpoint layout or our names: drivetrain). The names are mapped by each format's ``map``,
which lives in the model's folder (``models/<name>/weights.py``) and cites the original definitions.

The result is a :class:`LoadReport`: tensors loaded, missing (of the part of the model the format covers: all of
it, or the ResNet-50 trunk for torchvision), unexpected (file names with no place in the model), mismatched (shape,
dtype kind or a checked value) and ignored (known entries with nothing to load). ``strict`` refuses any missing,
unexpected or mismatched entry before anything is copied; otherwise what fits is loaded and the rest reported.
A BatchNorm ``num_batches_tracked`` absent from the file (saved before torch 0.4.1) keeps its value, as torch's
own BatchNorm loader does. In training, ``model.init_from`` is applied to a fresh run only: a resumed run restores
its own checkpoint and never reads the source.

Example:
    >>> report = load_weights(model, "resnet50-0676ba61.pth")  # doctest: +SKIP
    >>> print(report.table())  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from drivetrain.detector.keymap import map_drivetrain
from drivetrain.engine.checkpoint import MARKER, STATE_FILE, Checkpointer, CheckpointError
from drivetrain.engine.registry import weight_formats
from drivetrain.engine.typed import ConfigError
from drivetrain.safeio.torch_files import TorchFileError, load_torch_file

__all__ = [
    "InitFrom",
    "InitFromError",
    "LoadReport",
    "format_names",
    "init_model",
    "load_weights",
    "starts_fresh",
]
_SPEC_KEYS = ("path", "format", "strict")
_SHOWN = 4  # names shown per category in a one-line error


class InitFromError(ValueError):
    """A weights source that cannot initialise the model; one line naming the file and why."""


@dataclass
class LoadReport:
    """What :func:`load_weights` did.

    Attributes:
        source: the file or directory read.
        format: the format it was read as.
        scope: the part of the model the format covers (a module path, ``""`` all of it, None nothing).
        loaded: our names, loaded.
        missing: our names in scope that the file does not provide.
        unexpected: file names with no place in the model.
        mismatched: ``name: file … model …`` of shapes, dtype kinds and checked values that differ.
        ignored: ``name (why)`` of file entries with nothing to load.
        notes: conversions made and other facts.
    """

    source: str
    format: str
    scope: str | None
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """Nothing missing, unexpected or mismatched."""
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        """One line: counts per category."""
        into = "the whole model" if self.scope == "" else "nothing" if self.scope is None else self.scope.rstrip(".")
        return (
            f"{self.source} ({self.format}) into {into}: {len(self.loaded)} loaded, {len(self.missing)} missing, "
            f"{len(self.unexpected)} unexpected, {len(self.mismatched)} mismatched, {len(self.ignored)} ignored"
        )

    def problems(self, limit: int = _SHOWN) -> str:
        """The mismatched, missing and unexpected entries on one line, the first ``limit`` of each with a count."""
        parts = []
        for what, names in (
            ("mismatched", self.mismatched),
            ("missing", self.missing),
            ("unexpected", self.unexpected),
        ):
            if names:
                more = f", … {len(names) - limit} more" if len(names) > limit else ""
                parts.append(f"{len(names)} {what} ({'; '.join(names[:limit])}{more})")
        return "; ".join(parts + self.notes)

    def table(self, limit: int = _SHOWN) -> str:
        """The report as a short table: one row per category with its count and first names."""
        rows = [f"init_from {self.summary()}"]
        for what, names in (
            ("loaded", self.loaded),
            ("missing", self.missing),
            ("unexpected", self.unexpected),
            ("mismatched", self.mismatched),
            ("ignored", self.ignored),
        ):
            shown = ", ".join(names[:limit]) + (f", … {len(names) - limit} more" if len(names) > limit else "")
            rows.append(f"  {what:<11}{len(names):>6}  {shown}".rstrip())
        rows += [f"  note: {note}" for note in self.notes]
        return "\n".join(rows)


# ----------------------------------------------------------------------------------------------------- reading
def _torch_load(path: Path) -> Any:
    """A weights file through :func:`~.torch_files.load_torch_file` (a regular file, members that do not expand,
    tensors only; torch's pre-zip format too), every failure one InitFromError line naming ``path``."""
    try:
        return load_torch_file(path, legacy=True)
    except TorchFileError as err:
        raise InitFromError(f"{path}: {err}") from None
    except OSError as err:
        raise InitFromError(f"{path}: cannot be read ({err.strerror or type(err).__name__})") from None


def _read(source: str | Path) -> tuple[Any, Path, bool]:
    """The loaded object, the path it came from and whether it is one of our checkpoints (already unwrapped)."""
    path = Path(source)
    if not path.exists():
        raise InitFromError(f"{path}: no such file or directory")
    try:
        if path.is_dir():
            if (path / "checkpoints").is_dir():  # a run directory: its newest committed checkpoint that loads
                found = Checkpointer(path / "checkpoints").load_latest()
                if found is None:
                    raise InitFromError(f"{path}: the run has no committed checkpoint that loads")
                return found[1], found[0], True
            if (path / STATE_FILE).exists() or (path / MARKER).exists():
                return Checkpointer(path.parent).load(path), path, True
            raise InitFromError(
                f"{path}: a directory that is neither a run (no checkpoints/) nor a checkpoint (no {STATE_FILE})"
            )
        if path.name in (STATE_FILE, MARKER) and (path.parent / MARKER).is_file():  # a committed checkpoint's file
            return Checkpointer(path.parent.parent).load(path.parent), path.parent, True
    except CheckpointError as err:
        raise InitFromError(str(err)) from None
    return _torch_load(path), path, False


def _unwrap(obj: Any, path: Path, ours: bool) -> tuple[dict[str, Any], dict | None, bool]:
    """The state dict inside a loaded object, its ``meta`` and whether it is in drivetrain's layout."""
    if not isinstance(obj, Mapping):
        raise InitFromError(
            f"{path}: not a state dict (a {type(obj).__name__}, expected a mapping of names to tensors)"
        )
    meta = obj.get("meta") if isinstance(obj.get("meta"), Mapping) else None
    if isinstance(obj.get("state_dict"), Mapping):  # mmcv / mmengine: {meta, state_dict, optimizer, ...}
        obj = obj["state_dict"]
    elif ours or (isinstance(obj.get("model"), Mapping) and ("config" in obj or "format" in obj)):  # our layout
        if not isinstance(obj.get("model"), Mapping):
            raise InitFromError(f"{path}: the checkpoint holds no model state dict")
        obj, ours = obj["model"], True
    state = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            raise InitFromError(f"{path}: not a state dict (a key {key!r} is not a name)")
        if not isinstance(value, torch.Tensor) and not key.endswith("_extra_state"):
            raise InitFromError(
                f"{path}: not a state dict ({key} holds a {type(value).__name__}, expected a tensor); for a training "
                "checkpoint of another library, keep its state_dict"
            )
        state[key] = value
    if state and all(key.startswith("module.") for key in state):  # saved from a DDP wrapper
        state = {key[len("module.") :]: value for key, value in state.items()}
    return state, dict(meta) if meta is not None else None, ours


def format_names() -> tuple[str, ...]:
    """``auto``, ``drivetrain`` and every format the registered models' specs declare."""
    return ("auto", "drivetrain", *(fmt.name for fmt in weight_formats()))


def _detect(state: dict[str, Any], model: nn.Module, path: Path) -> str:
    """The format the names say (``format: auto``)."""
    keys = list(state)
    for fmt in weight_formats():
        if fmt.recognise(keys):
            return fmt.name
    if set(keys) & set(model.state_dict()):
        return "drivetrain"
    shown = ", ".join(keys[:3]) + (", …" if len(keys) > 3 else "")
    raise InitFromError(
        f"{path}: cannot tell the format from its names ({shown or 'no entries'}); pass one of "
        f"{', '.join(format_names()[1:])}"
    )


def _map_state(model: nn.Module, state: dict[str, torch.Tensor], fmt: str, meta: dict | None) -> Any:
    """``state`` in ``model``'s names by format ``fmt``'s map (a KeyMap; ValueError when it does not apply)."""
    if fmt == "drivetrain":
        return map_drivetrain(model, state, meta)
    return next(f for f in weight_formats() if f.name == fmt).map(model, state, meta)


# ------------------------------------------------------------------------------------------------------ loading
def load_weights(model: nn.Module, source: str | Path, *, format: str = "auto", strict: bool = False) -> LoadReport:
    """Load ``source`` into ``model`` in place (see the module docstring) and report what was loaded.

    Args:
        model: the model to initialise (before it is wrapped for DDP/FSDP).
        source: a drivetrain run directory, checkpoint directory or ``state.pt``; or a weights file.
        format: ``auto`` (told by the names), ``drivetrain`` or a format a model's spec declares
            (:func:`format_names`).
        strict: refuse (load nothing) when anything is missing, unexpected or mismatched.

    Returns:
        the :class:`LoadReport`.

    Raises:
        InitFromError: the source cannot be read, is not a state dict, its format is unknown or does not apply
            to the model, or (``strict``) it does not fit exactly; one line naming the source.
    """
    names = format_names()  # the models' specs, through the registry (the engine imports no model)
    if format not in names:
        raise InitFromError(f"format: expected one of {', '.join(names)}, got {format!r}")
    obj, path, ours = _read(source)
    state, meta, ours = _unwrap(obj, path, ours)
    fmt = format if format != "auto" else "drivetrain" if ours else _detect(state, model, path)
    try:
        mapped = _map_state(model, state, fmt, meta)
    except ValueError as err:  # the maps' KeyMapError: the format does not apply to this model
        raise InitFromError(f"{path}: {err}") from None
    own = {k: v for k, v in model.state_dict(keep_vars=True).items() if not k.endswith("_extra_state")}
    report = LoadReport(str(path), fmt, mapped.scope, notes=list(mapped.notes))
    report.ignored = [f"{name} ({why})" for name, why in mapped.ignored]
    report.mismatched = [f"{name}: {why}" for name, why in mapped.mismatched]
    claimed = {name for name, _ in mapped.mismatched}
    report.unexpected = list(mapped.unexpected)
    todo = []
    for name, value in mapped.tensors.items():
        theirs = mapped.sources[name]
        label = name if theirs == name else f"{name} ← {theirs}"
        if name not in own:
            report.unexpected.append(theirs if theirs == name else f"{theirs} (→ {name})")
        elif value.shape != own[name].shape:
            report.mismatched.append(f"{label}: file {tuple(value.shape)}, model {tuple(own[name].shape)}")
        elif value.is_floating_point() != own[name].is_floating_point():
            report.mismatched.append(f"{label}: file {value.dtype}, model {own[name].dtype}")
        else:
            todo.append(name)
    claimed |= set(mapped.tensors)
    in_scope = [] if mapped.scope is None else [k for k in own if k.startswith(mapped.scope)]
    loading = set(todo)
    kept = [  # a BatchNorm whose statistics load but whose batch counter the file lacks
        k
        for k in in_scope
        if k not in claimed
        and k.endswith(".num_batches_tracked")
        and f"{k[: -len('num_batches_tracked')]}running_mean" in loading
    ]
    if kept:
        report.notes.append(
            f"{len(kept)} BatchNorm num_batches_tracked not in the file: kept, as torch's BatchNorm loader"
        )
    report.missing = [k for k in in_scope if k not in claimed and k not in kept]
    if strict and not report.exact:
        raise InitFromError(f"{path}: does not fit the {type(model).__name__} as {fmt} (strict): {report.problems()}")
    with torch.no_grad():
        for name in todo:
            own[name].copy_(mapped.tensors[name])
    report.loaded = todo
    return report


# --------------------------------------------------------------------------------------------- the config field
@dataclass(frozen=True)
class InitFrom:
    """``model.init_from``: the weights a fresh run starts from (:func:`load_weights`' arguments).

    In YAML a bare path means ``{path: PATH}``; :meth:`from_dict` reads either spelling. Every field is checked when
    the config loads (a format none of the registered models declares included): ConfigError naming
    ``model.init_from.KEY``.

    Attributes:
        path: a drivetrain run, checkpoint or ``state.pt``, or a weights file of a format a model's spec declares.
        format: ``auto`` (told by the names), ``drivetrain`` or a declared format (:func:`format_names`).
        strict: refuse (load nothing) when anything is missing, unexpected or mismatched.
    """

    path: str
    format: str = "auto"
    strict: bool = False

    def __post_init__(self) -> None:
        key = "model.init_from"
        if not isinstance(self.path, str) or not self.path.strip():
            raise ConfigError(f"{key}.path: expected a path (a non-empty string), got {self.path!r}")
        names = format_names()
        if self.format not in names:
            raise ConfigError(f"{key}.format: expected one of {', '.join(names)}, got {self.format!r}")
        if not isinstance(self.strict, bool):
            raise ConfigError(f"{key}.strict: expected true or false, got {self.strict!r}")

    @classmethod
    def from_dict(cls, value: Any) -> InitFrom:
        """From the YAML value: a path, or a mapping ``{path, format, strict}`` (ConfigError naming the key)."""
        key = "model.init_from"
        if isinstance(value, str):
            if not value.strip():
                raise ConfigError(f"{key}: must not be empty (a path, or leave it out)")
            return cls(value)
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{key}: expected a path or a mapping {{path, format, strict}}, got {type(value).__name__}"
            )
        unknown = [str(k) for k in value if k not in _SPEC_KEYS]
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}: unknown key; known keys: {', '.join(_SPEC_KEYS)}")
        return cls(value.get("path"), value.get("format", "auto"), value.get("strict", False))


def starts_fresh(resume: str | None, checkpointer: Checkpointer) -> bool:
    """Whether a run with this ``--resume`` starts from new weights (so ``model.init_from`` applies): no resume,
    or ``auto`` where the run has no committed checkpoint yet. A run that resumes restores its own weights."""
    return resume is None or (resume == "auto" and not checkpointer.committed())


def init_model(model: nn.Module, source: InitFrom, *, verbose: bool = True) -> LoadReport:
    """Apply ``model.init_from`` to ``model``; with ``verbose`` print the report's table on stderr. Raises
    ConfigError naming ``model.init_from`` when it cannot be applied."""
    try:
        report = load_weights(model, source.path, format=source.format, strict=source.strict)
    except InitFromError as err:
        raise ConfigError(f"model.init_from: {err}") from None
    if verbose:
        print(report.table(), file=sys.stderr, flush=True)
    return report
