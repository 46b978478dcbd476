"""The registry: every model and dataset a config may name, looked up by short name — never imported by path.

Configs, run directories and checkpoints come from other people, so a name in them is data: it is looked up
here and nothing else. Three sources fill the registry, all chosen by whoever installs or types, never by a file:

1. drivetrain's own (:data:`MODELS`, :data:`DATASETS`): a fixed table of short names, each bound to one of our
   modules — a model to its folder's spec (:class:`~drivetrain.detector.spec.ModelSpec`), a dataset to its builder —,
   imported only when that name is used;
2. installed packages' entry points in the groups ``drivetrain.models`` and ``drivetrain.datasets`` (their names
   are read from the installed metadata without importing anything; an entry point is loaded only when its name
   is built);
3. ``--plugin MODULE`` typed on the command line: the module is imported before the command runs and calls
   :func:`register_model` / :func:`register_dataset`.

A name in none of them is a one-line :class:`ConfigError` listing the known names, raised before anything is
imported for it. A dataset builder may declare the type of its ``data.args`` (a frozen dataclass, :data:`ARGS` for
ours, ``register_dataset(..., args=...)`` for a plugin's), as a model's spec declares its ``model.args``: a config's
``args`` are then read into it when the config is loaded (:func:`check_args`: unknown keys, types, values, each error
naming ``SECTION.args.KEY``), and the loaded config holds that dataclass.

Older configs spelled our builders as ``package.module:Name``; those spellings map through the fixed table
:data:`drivetrain.engine.old_spellings.ALIASES` (no import is derived from the text), any other ``a.b:c`` is refused.

The engine reads a model only through its spec (builder, typed ``model.args``, modalities, weight formats) and the
protocol of :mod:`drivetrain.engine.protocol`; a model registered by a bare builder gets a spec without typed
arguments.

Example (a plugin module the user passes as ``drivetrain train --plugin mypkg.detectors ...``)::

    from drivetrain.engine.registry import register_model
    from drivetrain.detector.spec import ModelSpec

    register_model(ModelSpec("mydet", build=MyDetector, args=MyDetectorArgs, modalities=frozenset({"lidar"})))
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from drivetrain.detector.spec import MODALITIES, ModelSpec, WeightFormat
from drivetrain.engine.old_spellings import ALIASES, moved_args
from drivetrain.engine.typed import ConfigError, from_dict

__all__ = [
    "DATASETS",
    "MODELS",
    "args_type",
    "canonical_name",
    "check_args",
    "known_names",
    "load_plugins",
    "lookup",
    "model_spec",
    "register_dataset",
    "register_model",
    "weight_formats",
]

# kind → entry-point group
GROUPS = {"model": "drivetrain.models", "data": "drivetrain.datasets"}

# Our own models: short name → (module, attribute), imported only when the name is used. The attribute is the
# model's spec (drivetrain.detector.spec.ModelSpec, in models/<name>/spec.py), which says everything else about it, its
# one-line summary included: one line here per detector.
MODELS: dict[str, tuple[str, str]] = {
    "smoke": ("drivetrain.models.smoke.spec", "SPEC"),
    "focal2d": ("drivetrain.models.focal2d.spec", "SPEC"),
    "streampetr": ("drivetrain.models.streampetr.spec", "SPEC"),
    "pointpillars": ("drivetrain.models.pointpillars.spec", "POINTPILLARS"),
    "ssn": ("drivetrain.models.pointpillars.spec", "SSN"),
}
# Our own datasets: short name → (module, attribute, one-line purpose), imported only when the name is used.
DATASETS: dict[str, tuple[str, str, str]] = {
    "smoke": ("drivetrain.models.smoke.dataset", "SmokeDataset", "generated regression tensors (engine tests)"),
    "synthetic": ("drivetrain.data.sources", "synthetic", "the built-in synthetic nuScenes-format set"),
    "frames": (
        "drivetrain.data.sources",
        "frames",
        "frames of an indexed nuScenes- or Lyft-format root (drivetrain data index)",
    ),
}
_BUILTIN: dict[str, dict[str, tuple[str, ...]]] = {"model": MODELS, "data": DATASETS}
# The typed arguments of our builders: short name → (module, dataclass); data.args maps onto it (check_args).
# (A model's typed arguments are its spec's ``args``.)
ARGS: dict[str, dict[str, tuple[str, str]]] = {
    "data": {
        "frames": ("drivetrain.data.sources", "FramesArgs"),
        "synthetic": ("drivetrain.data.sources", "SyntheticArgs"),
    },
}

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class _Registered:
    builder: Callable[..., Any]
    origin: str  # "plugin MODULE" or "entry point DIST"
    summary: str
    args: type | None = None  # the dataclass its args map onto (checked at config load), None: its signature
    spec: ModelSpec | None = None  # a model's spec (a plugin's builder without one is given a plain spec)


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
    """``(name, origin, purpose)`` of every known name of ``kind``. Our models' purpose is their spec's summary (our
    model modules are imported); entry points are described without loading."""
    if kind == "model":
        rows = [(name, "drivetrain", model_spec(name).summary) for name in MODELS]
    else:
        rows = [(name, "drivetrain", summary) for name, (_, _, summary) in DATASETS.items()]
    rows += [(name, r.origin, r.summary) for name, r in _REGISTERED[kind].items()]
    eps = _entry_points(kind)
    rows += [(name, _entry_point_origin(ep), ep.value) for name, ep in eps.items() if name not in _origins(kind)]
    return sorted(rows)


def _entry_point_origin(ep: importlib.metadata.EntryPoint) -> str:
    return f"entry point {ep.dist.name if ep.dist else '?'}"


def _origins(kind: str) -> dict[str, str]:
    """Our names and the registered ones → where their builders come from (nothing is imported)."""
    return {**dict.fromkeys(_BUILTIN[kind], "drivetrain"), **{n: r.origin for n, r in _REGISTERED[kind].items()}}


def origin(kind: str, name: str) -> str:
    """Where the builder of ``name`` comes from, for messages: ``drivetrain``, ``plugin MODULE``, ``entry point
    DIST`` (or ``unknown``). Nothing is imported."""
    short = canonical_name(kind, name)
    found = _origins(kind).get(short)
    if found is None and short in (eps := _entry_points(kind)):
        found = _entry_point_origin(eps[short])
    return found or "unknown"


def args_type(kind: str, name: str) -> type | None:
    """The dataclass ``SECTION.args`` of ``name`` maps onto: a model spec's ``args``, :data:`ARGS` for our datasets,
    ``args=`` of a registered dataset; None when the builder declares none (or the name is unknown)."""
    short = canonical_name(kind, name) if isinstance(name, str) else name
    if kind == "model":
        if not isinstance(short, str) or short not in known_names(kind):
            return None  # unknown: building it says so, listing the known names
        return model_spec(short).args  # an entry point named by the config is loaded here, as it is to be built
    if short in ARGS[kind]:
        module, attr = ARGS[kind][short]
        return getattr(importlib.import_module(module), attr)
    if short in _REGISTERED[kind]:
        return _REGISTERED[kind][short].args
    return None


def check_args(kind: str, name: str, args: Any) -> Any:
    """Check ``args`` against the dataclass the builder of ``name`` declares (:func:`args_type`) and return it as
    that dataclass: ConfigError naming ``SECTION.args.KEY`` for an unknown key (listing the known ones, or saying
    where a moved key lives now), a wrong type or a bad value. For a name without declared arguments nothing is
    checked (nor imported) and ``args`` comes back as it is: its builder's signature is checked when it is built."""
    section = "model" if kind == "model" else "data"
    if kind == "model" and isinstance(args, dict) and canonical_name("model", name) in known_names("model"):
        moved = moved_args(canonical_name("model", name))  # an older config's key: say where it lives now
        for key in args:
            if key in moved:
                raise ConfigError(f"model.args.{key}: {moved[key][1]}")
    args_cls = args_type(kind, name)
    if args_cls is None:
        return args
    if isinstance(args, args_cls):
        return args
    try:
        return from_dict(args_cls, args, f"{section}.args")
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:  # a value the dataclass refuses names its field first
        raise ConfigError(f"{section}.args.{err}") from None


def model_spec(name: str) -> ModelSpec:
    """The :class:`~drivetrain.detector.spec.ModelSpec` of model ``name``; ConfigError naming ``model.name`` and the
    known names otherwise. Nothing is imported unless ``name`` is in the registry."""
    if not isinstance(name, str):
        raise ConfigError(f"model.name: expected a registered name, got {type(name).__name__}")
    short = canonical_name("model", name)
    if short in _BUILTIN["model"]:
        module, attr = MODELS[short]
        return getattr(importlib.import_module(module), attr)
    if short not in _REGISTERED["model"] and short in _entry_points("model"):
        found = _load_entry_point("model", short, name)
        ep = _entry_points("model")[short]
        origin = _entry_point_origin(ep)
        spec = found if isinstance(found, ModelSpec) else _plain_spec(short, found, "")
        _REGISTERED["model"][short] = _Registered(spec.build, origin, spec.summary, spec.args, spec)
    if short in _REGISTERED["model"]:
        spec = _REGISTERED["model"][short].spec
        assert spec is not None  # every registered model has one (register_model makes it)
        return spec
    raise _unknown("model", name)


def weight_formats() -> tuple[WeightFormat, ...]:
    """Every weights format ``model.init_from`` can read, by the specs of our models and the registered ones (our
    model modules are imported: this runs only when a run asks for ``init_from``). A format shared by several
    models (one original's weights read by two of our detectors) is listed once."""
    found: dict[str, WeightFormat] = {}
    specs = [model_spec(name) for name in _BUILTIN["model"]]
    specs += [r.spec for r in _REGISTERED["model"].values() if r.spec is not None]
    for spec in specs:
        for fmt in spec.weight_formats:
            if found.setdefault(fmt.name, fmt) is not fmt:
                raise ValueError(f"weight format {fmt.name!r} is declared twice, by different models' specs")
    return tuple(found.values())


def lookup(kind: str, name: str) -> Callable[..., Any]:
    """The builder registered as ``name`` (a model's: its spec's ``build``); ConfigError naming the field and the
    known names otherwise.

    Nothing is imported unless ``name`` is in the registry: our own module for a built-in name, the installed
    package for an entry-point name.
    """
    if kind == "model":
        return model_spec(name).build
    if not isinstance(name, str):
        raise ConfigError(f"data.name: expected a registered name, got {type(name).__name__}")
    short = canonical_name(kind, name)
    if short in DATASETS:
        module, attr, _ = DATASETS[short]
        return getattr(importlib.import_module(module), attr)
    if short in _REGISTERED[kind]:
        return _REGISTERED[kind][short].builder
    if short in _entry_points(kind):
        return _load_entry_point(kind, short, name)
    raise _unknown(kind, name)


def _load_entry_point(kind: str, short: str, name: str) -> Any:
    ep = _entry_points(kind)[short]
    try:
        return ep.load()
    except Exception as err:  # an installed package that fails to import: say which
        section = "model" if kind == "model" else "data"
        raise ConfigError(
            f"{section}.name: {name!r} is the entry point {ep.value!r} of an installed package, "
            f"which failed to load ({type(err).__name__}: {err})"
        ) from None


def _unknown(kind: str, name: str) -> ConfigError:
    section = "model" if kind == "model" else "data"
    what = "models" if kind == "model" else "datasets"
    hint = "; names are looked up in the registry, never imported from a config" if ":" in name or "." in name else ""
    return ConfigError(
        f"{section}.name: unknown {'model' if kind == 'model' else 'dataset'} {name!r}; known {what}: "
        f"{', '.join(known_names(kind))} (others come from installed packages' '{GROUPS[kind]}' entry points "
        f"or --plugin MODULE on the command line{hint})"
    )


def _plain_spec(name: str, builder: Callable[..., Any], summary: str) -> ModelSpec:
    """The spec of a model registered by its builder alone: no typed arguments (its signature is checked when it
    is built), no weight formats but our own; camera, lidar or tensors — the engine does not ask."""
    if not callable(builder):
        raise TypeError(f"register: the builder of {name!r} must be a class or function, got {builder!r}")
    return ModelSpec(name, build=builder, args=None, modalities=MODALITIES, summary=summary)


def _register(kind: str, name: str, builder: Callable[..., Any] | None, summary: str, args: type | None = None) -> Any:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"register: {name!r} is not a short name (lower-case letters, digits, '_' or '-')")
    if name in _BUILTIN[kind]:
        raise ValueError(f"register: {name!r} is one of drivetrain's own {kind} names; choose another")

    def add(fn: Callable[..., Any], spec: ModelSpec | None = None) -> Callable[..., Any]:
        if not callable(fn):
            raise TypeError(f"register: the builder of {name!r} must be a class or function, got {fn!r}")
        origin = f"plugin {_LOADING_PLUGIN[-1]}" if _LOADING_PLUGIN else f"module {getattr(fn, '__module__', '?')}"
        previous = _REGISTERED[kind].get(name)
        if previous is not None and previous.builder is not fn:
            raise ValueError(f"register: {kind} {name!r} is already registered by {previous.origin}")
        purpose = summary or ((fn.__doc__ or "").strip().splitlines() or [""])[0]
        if kind == "model" and spec is None:
            spec = _plain_spec(name, fn, purpose)
        _REGISTERED[kind][name] = _Registered(fn, origin, purpose, args, spec)
        return fn

    if isinstance(builder, ModelSpec):
        return add(builder.build, builder)
    return add if builder is None else add(builder)


def register_model(
    name: str | ModelSpec, builder: Callable[..., Any] | None = None, *, summary: str = ""
) -> Callable[..., Any] | ModelSpec:
    """Register a model as ``model.name``: its :class:`~drivetrain.detector.spec.ModelSpec` (typed ``model.args``,
    modalities, weight formats), or a bare builder (an ``nn.Module`` class or a function returning one).

    Use as ``register_model(SPEC)``, ``register_model("mydet", MyDetector)`` or as a decorator
    ``@register_model("mydet")``; call it from a module passed with ``--plugin`` (or from your own script before
    building a Trainer). Built-in names cannot be replaced. Returns what it was given.
    """
    if isinstance(name, ModelSpec):
        spec = name
        _register("model", spec.name, spec, summary or spec.summary, spec.args)
        return spec
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
            hint = _not_on_path(module, err)
            raise ConfigError(
                f"--plugin {module}: cannot import it ({type(err).__name__}: {err})" + (f"; {hint}" if hint else "")
            ) from None
        finally:
            _LOADING_PLUGIN.pop()


def _not_on_path(module: str, err: Exception) -> str | None:
    """How to put ``module`` on the import path, when ``err`` says that it (or a package above it) is not there; None
    for any other failure (e.g. a module the plugin itself imports is missing).

    The ``drivetrain`` console script leaves the current folder off the path on purpose (docs/safety.md), so a
    plugin beside the user is not found until its folder is named: the line says how, with the folder when the
    plugin is in the current one."""
    import os
    import sys
    from pathlib import Path

    parts = module.split(".")
    missing = getattr(err, "name", None)
    packages = {".".join(parts[:n]) for n in range(1, len(parts) + 1)}  # myproj, myproj.bevgrid
    if not isinstance(err, ModuleNotFoundError) or missing not in packages:
        return None
    top = parts[0]
    if missing != top:  # the package was found; the module named in it is not there
        parent, _, name = missing.rpartition(".")
        where = getattr(sys.modules.get(parent), "__path__", None)
        return f"the package {parent} ({', '.join(where) if where else 'found'}) holds no module {name}"
    here = Path.cwd()
    if (here / f"{top}.py").is_file() or (here / top).is_dir():
        folder = str(here)
        where = f"{top} is in the current folder, which drivetrain leaves off the import path (docs/safety.md)"
    else:
        folder = "FOLDER"
        where = f"no folder on the import path holds {top}"
    command = " ".join(["drivetrain", *sys.argv[1:]]) if sys.argv[1:] else "drivetrain ..."
    shown = os.environ.get("PYTHONPATH")
    path = f"{folder}{os.pathsep}{shown}" if shown else folder
    return (
        f"{where}: put the folder that holds it on the path, PYTHONPATH={path} {command}, or install its package "
        "(pip install -e . in its project)"
    )
