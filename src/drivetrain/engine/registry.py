"""The registry: every model and dataset a config may name, looked up by short name — never imported by path.

Configs, run directories and checkpoints come from other people, so a name in them is data: it is looked up
here and nothing else. Three sources fill the registry, all chosen by whoever installs or types, never by a file:

1. drivetrain's own builders (:data:`MODELS`, :data:`DATASETS`): a fixed table of short names, each bound to one
   of our modules, imported only when that name is built;
2. installed packages' entry points in the groups ``drivetrain.models`` and ``drivetrain.datasets`` (their names
   are read from the installed metadata without importing anything; an entry point is loaded only when its name
   is built);
3. ``--plugin MODULE`` typed on the command line: the module is imported before the command runs and calls
   :func:`register_model` / :func:`register_dataset`.

A name in none of them is a one-line :class:`ConfigError` listing the known names, raised before anything is
imported for it. A dataset builder may declare the type of its ``data.args`` (a frozen dataclass, :data:`ARGS` for
ours, ``register_dataset(..., args=...)`` for a plugin's): a config's ``data.args`` is then checked against it when
the config is loaded (:func:`check_args`: unknown keys, types, values, each error naming ``data.args.KEY``).

Older configs spelled our builders as ``package.module:Name``; those spellings map through the fixed :data:`ALIASES`
table (no import is derived from the text), any other ``a.b:c`` is refused.

Example (a plugin module the user passes as ``drivetrain train --plugin mypkg.detectors ...``)::

    from drivetrain.engine.registry import register_model

    @register_model("mydet")
    class MyDetector(torch.nn.Module): ...
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from drivetrain.engine.errors import ConfigError
from drivetrain.engine.typed import from_dict

__all__ = [
    "ALIASES",
    "DATASETS",
    "MODELS",
    "canonical_name",
    "check_args",
    "known_names",
    "load_plugins",
    "lookup",
    "register_dataset",
    "register_model",
]

# kind → entry-point group
GROUPS = {"model": "drivetrain.models", "data": "drivetrain.datasets"}

# Our own builders: short name → (module, attribute, one-line purpose). The module is imported only when built.
MODELS: dict[str, tuple[str, str, str]] = {
    "smoke": ("drivetrain.engine.smoke", "SmokeModel", "a two-layer MLP on generated tensors (engine tests)"),
    "focal2d": ("drivetrain.models.focal2d", "FocalDetector2D", "a small 2D detector with StreamPETR's focal head"),
    "streampetr": ("drivetrain.models.streampetr", "StreamPETR", "StreamPETR camera 3D detector"),
    "pointpillars": ("drivetrain.models.pointpillars", "PointPillars", "PointPillars lidar 3D detector"),
    "ssn": ("drivetrain.models.pointpillars", "SSN", "SSN (shape signature network) lidar 3D detector"),
}
DATASETS: dict[str, tuple[str, str, str]] = {
    "smoke": ("drivetrain.engine.smoke", "SmokeDataset", "generated regression tensors (engine tests)"),
    "synthetic": ("drivetrain.data.sources", "synthetic", "the built-in synthetic nuScenes-format set"),
    "frames": (
        "drivetrain.data.sources",
        "frames",
        "frames of an indexed nuScenes- or Lyft-format root (drivetrain data index)",
    ),
}
_BUILTIN = {"model": MODELS, "data": DATASETS}
# The typed arguments of our builders: short name → (module, dataclass); data.args maps onto it (check_args).
ARGS: dict[str, dict[str, tuple[str, str]]] = {
    "model": {},
    "data": {
        "frames": ("drivetrain.data.sources", "FramesArgs"),
        "synthetic": ("drivetrain.data.sources", "SyntheticArgs"),
    },
}

# The spellings configs and run directories used before the registry, mapped to short names (a fixed table).
ALIASES: dict[str, dict[str, str]] = {
    "model": {
        "drivetrain.models:StreamPETR": "streampetr",
        "drivetrain.models.streampetr:StreamPETR": "streampetr",
        "drivetrain.models.streampetr.detector:StreamPETR": "streampetr",
        "drivetrain.models:PointPillars": "pointpillars",
        "drivetrain.models.pointpillars:PointPillars": "pointpillars",
        "drivetrain.models.pointpillars.model:PointPillars": "pointpillars",
        "drivetrain.models:SSN": "ssn",
        "drivetrain.models.pointpillars:SSN": "ssn",
        "drivetrain.models.pointpillars.model:SSN": "ssn",
        "drivetrain.models:FocalDetector2D": "focal2d",
        "drivetrain.models.focal2d:FocalDetector2D": "focal2d",
        "drivetrain.engine.smoke:SmokeModel": "smoke",
    },
    "data": {
        "drivetrain.data.sources:synthetic": "synthetic",
        "drivetrain.data.sources:frames": "frames",
        "drivetrain.engine.smoke:SmokeDataset": "smoke",
    },
}

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class _Registered:
    builder: Callable[..., Any]
    origin: str  # "plugin MODULE" or "entry point DIST"
    summary: str
    args: type | None = None  # the dataclass its args map onto (checked at config load), None: its signature


_REGISTERED: dict[str, dict[str, _Registered]] = {"model": {}, "data": {}}
_LOADING_PLUGIN: list[str] = []  # the --plugin module being imported (names registered outside one are refused)


def canonical_name(kind: str, name: str) -> str:
    """``name`` with an old ``package.module:Name`` spelling of our builders mapped to its short name."""
    return ALIASES[kind].get(name, name)


def _entry_points(kind: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The installed packages' entry points of ``kind`` by name (metadata only: nothing is imported)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=GROUPS[kind]):
        found.setdefault(ep.name, ep)  # the first distribution on sys.path wins, as importlib resolves it
    return found


def known_names(kind: str) -> list[str]:
    """Every name ``kind`` (``"model"`` or ``"data"``) can be built under: ours, plugins', entry points'."""
    return sorted({*_BUILTIN[kind], *_REGISTERED[kind], *_entry_points(kind)})


def describe(kind: str) -> list[tuple[str, str, str]]:
    """``(name, origin, purpose)`` of every known name of ``kind`` (entry points are described without loading)."""
    rows = [(name, "drivetrain", summary) for name, (_, _, summary) in _BUILTIN[kind].items()]
    rows += [(name, r.origin, r.summary) for name, r in _REGISTERED[kind].items()]
    eps = _entry_points(kind)
    rows += [
        (name, f"entry point {ep.dist.name if ep.dist else '?'}", ep.value)
        for name, ep in eps.items()
        if name not in _BUILTIN[kind] and name not in _REGISTERED[kind]
    ]
    return sorted(rows)


def origin(kind: str, name: str) -> str:
    """Where the builder of ``name`` comes from, for messages: ``drivetrain``, ``plugin MODULE``, ``entry point
    DIST`` (or ``unknown``)."""
    short = canonical_name(kind, name)
    return next((where for found, where, _ in describe(kind) if found == short), "unknown")


def check_args(kind: str, name: str, args: dict[str, Any]) -> None:
    """Check ``args`` against the dataclass the builder of ``name`` declares (:data:`ARGS`, or ``args=`` when it
    was registered): ConfigError naming ``SECTION.args.KEY`` for an unknown key (listing the known ones), a wrong
    type or a bad value. Nothing is checked (nor imported) for a name without declared arguments: its builder's
    signature is checked when it is built."""
    section = "model" if kind == "model" else "data"
    short = canonical_name(kind, name) if isinstance(name, str) else name
    if short in ARGS[kind]:
        module, attr = ARGS[kind][short]
        args_type = getattr(importlib.import_module(module), attr)
    elif short in _REGISTERED[kind] and _REGISTERED[kind][short].args is not None:
        args_type = _REGISTERED[kind][short].args
    else:
        return
    try:
        from_dict(args_type, args, f"{section}.args")
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:  # a value the dataclass refuses names its field first
        raise ConfigError(f"{section}.args.{err}") from None


WEIGHT_MAPS = ("drivetrain.models.published", "map_state")
"""Where our models' published-weights key maps live (``model.init_from``): the engine reaches model code only
through this registry, imported when a run asks for it."""


def weight_maps() -> Callable[..., Any]:
    """``map_state(model, state, fmt, meta)`` of :data:`WEIGHT_MAPS` (raises ``ValueError`` — its ``KeyMapError``
    — when a format does not apply to a model)."""
    module, attr = WEIGHT_MAPS
    return getattr(importlib.import_module(module), attr)


def lookup(kind: str, name: str) -> Callable[..., Any]:
    """The builder registered as ``name``; ConfigError naming the field and the known names otherwise.

    Nothing is imported unless ``name`` is in the registry: our own module for a built-in name, the installed
    package for an entry-point name.
    """
    section = "model" if kind == "model" else "data"
    if not isinstance(name, str):
        raise ConfigError(f"{section}.name: expected a registered name, got {type(name).__name__}")
    short = canonical_name(kind, name)
    if short in _BUILTIN[kind]:
        module, attr, _ = _BUILTIN[kind][short]
        return getattr(importlib.import_module(module), attr)
    if short in _REGISTERED[kind]:
        return _REGISTERED[kind][short].builder
    eps = _entry_points(kind)
    if short in eps:
        try:
            return eps[short].load()
        except Exception as err:  # an installed package that fails to import: say which
            raise ConfigError(
                f"{section}.name: {name!r} is the entry point {eps[short].value!r} of an installed package, "
                f"which failed to load ({type(err).__name__}: {err})"
            ) from None
    what = "models" if kind == "model" else "datasets"
    hint = "; names are looked up in the registry, never imported from a config" if ":" in name or "." in name else ""
    raise ConfigError(
        f"{section}.name: unknown {'model' if kind == 'model' else 'dataset'} {name!r}; known {what}: "
        f"{', '.join(known_names(kind))} (others come from installed packages' '{GROUPS[kind]}' entry points "
        f"or --plugin MODULE on the command line{hint})"
    )


def _register(kind: str, name: str, builder: Callable[..., Any] | None, summary: str, args: type | None = None) -> Any:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"register: {name!r} is not a short name (lower-case letters, digits, '_' or '-')")
    if name in _BUILTIN[kind]:
        raise ValueError(f"register: {name!r} is one of drivetrain's own {kind} names; choose another")

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise TypeError(f"register: the builder of {name!r} must be a class or function, got {fn!r}")
        origin = f"plugin {_LOADING_PLUGIN[-1]}" if _LOADING_PLUGIN else f"module {getattr(fn, '__module__', '?')}"
        previous = _REGISTERED[kind].get(name)
        if previous is not None and previous.builder is not fn:
            raise ValueError(f"register: {kind} {name!r} is already registered by {previous.origin}")
        purpose = summary or ((fn.__doc__ or "").strip().splitlines() or [""])[0]
        _REGISTERED[kind][name] = _Registered(fn, origin, purpose, args)
        return fn

    return add if builder is None else add(builder)


def register_model(name: str, builder: Callable[..., Any] | None = None, *, summary: str = "") -> Any:
    """Register a model builder (an ``nn.Module`` class or a function returning one) as ``model.name: name``.

    Use as ``register_model("mydet", MyDetector)`` or as a decorator ``@register_model("mydet")``; call it from a
    module passed with ``--plugin`` (or from your own script before building a Trainer). Built-in names cannot be
    replaced. Returns the builder.
    """
    return _register("model", name, builder, summary)


def register_dataset(
    name: str, builder: Callable[..., Any] | None = None, *, summary: str = "", args: type | None = None
) -> Any:
    """Register a dataset builder (returning a map-style dataset) as ``data.name: name``; as :func:`register_model`.

    ``args``: a frozen dataclass of the builder's keyword arguments; a config's ``data.args`` is then checked against
    it when the config is loaded (:func:`check_args`), not only when the dataset is built.
    """
    return _register("data", name, builder, summary, args)


def load_plugins(modules: Iterable[str]) -> None:
    """Import the ``--plugin`` modules the user typed (each registers its builders); ConfigError if one fails."""
    for module in modules:
        _LOADING_PLUGIN.append(module)
        try:
            importlib.import_module(module)
        except Exception as err:
            raise ConfigError(f"--plugin {module}: cannot import it ({type(err).__name__}: {err})") from None
        finally:
            _LOADING_PLUGIN.pop()
