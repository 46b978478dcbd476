"""Reading a config file: YAML data, its ``base:`` chain, and the per-key merge of the chain.

A config may start from another one and say only what differs::

    # my_run.yaml, in my project folder
    base: ../drivetrain/configs/lidar_model_tiny.yaml   # relative to this file's folder
    unset: [model.args.anchor_ranges]            # take a key the base chain sets away (the builder's default)
    run: {out_dir: runs/my-run}
    optim: {lr: 2.0e-3}                          # merged per key: the rest of optim stays the base's

Rules (a config is data from someone else, docs/safety.md):

- ``base`` is one path, **relative to the folder of the file that names it**, to a ``.yaml``/``.yml`` file; any
  file the user can read is allowed (a project's config extending a shipped one is the point), an absolute path
  or ``~`` is refused (a config and its bases travel together: an absolute path works only on one machine), and
  so is any other suffix (a base is never a Python file or a private key that happens to parse as YAML).
- Bases chain (a base may have a base) up to :data:`MAX_BASE_DEPTH` deep; a file met twice is a loop, refused
  with the chain named.
- Merging: a mapping merges with the base's mapping per key, recursively (this file's value wins); lists and
  scalars replace the base's value whole. ``null`` is a value as everywhere else (``bev: null`` turns that step
  off; ``clip_norm: null`` means no clipping), never "inherit". ``unset: [dotted.key, ...]`` removes keys the base
  chain set before this file's values merge: the field then takes its default (for ``model.args``/``data.args``,
  the builder's own default); unsetting a mapping and then setting it replaces it whole. Unsetting a key the
  chain does not set is an error (a typo would otherwise do nothing).
- ``base`` and ``unset`` are read here and are not part of the resolved config; unknown keys and wrong types in
  any file of the chain are still errors, named by the file that set the key (:meth:`ConfigSource.explain`).

Bounds (a small file must not stand for a huge one, docs/safety.md): every file of the chain must be a regular
file (a FIFO would block the read forever) of at most :data:`MAX_CONFIG_BYTES`, and every YAML document drivetrain
reads — config files, a run's ``config.yaml``, ``KEY=VALUE`` values — is parsed by :class:`BoundedSafeLoader`:
``yaml.SafeLoader`` (no tags that build Python objects) that counts each node *as the copies aliases make of it*.
A document that would expand to more than :data:`MAX_YAML_NODES` nodes or nest deeper than :data:`MAX_YAML_DEPTH`
is refused while it is parsed, in one line naming the file, line and column: an alias "bomb" (nine aliases of
nine aliases …, a few hundred bytes that the merge would copy into billions of nodes) never reaches the merge.
A YAML error says what is wrong and where, without quoting the file's text (a ``base:`` may be a link to a file
that is not a config at all; its contents are not ours to print).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from drivetrain.engine.typed import ConfigError
from drivetrain.safeio.reads import read_text
from drivetrain.safeio.yaml_files import (
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    BoundedSafeLoader,
    YAMLBoundError,
    load_yaml,
    yaml_problem,
)

__all__ = [
    "BASE_SUFFIXES",
    "MAX_BASE_DEPTH",
    "MAX_CONFIG_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "BoundedSafeLoader",
    "ConfigSource",
    "YAMLBoundError",
    "load_yaml",
    "merge_config",
    "read_config_file",
    "read_yaml_file",
    "yaml_problem",
]

MAX_BASE_DEPTH = 16  # bases below one config file; deeper is refused (a loop is caught before that)
# The largest shipped config (configs/ssn_lyft.yaml) is 4.5 KB and ~300 nodes, nested 5 deep, and a run's
# config.yaml (every field written out) ~400 nodes; the bounds leave 200× and more room above that while keeping
# what one file can make the merge copy to ~100k small objects (tens of MB at most).
MAX_CONFIG_BYTES = 1 << 20  # bytes of one config file
BASE_SUFFIXES = (".yaml", ".yml")
_OVERRIDE = "override"  # the origin of a key set on the command line


@dataclass(frozen=True)
class ConfigSource:
    """A config file with its base chain merged: what :func:`~drivetrain.engine.config.load_config` validates."""

    path: Path  # the file as named (``--config``)
    data: dict[str, Any]  # the merged chain, without ``base``/``unset``
    chain: tuple[Path, ...]  # ``path``, its base, that base's base, ... (as written relative to the first)
    origins: dict[str, Path] = field(default_factory=dict)  # dotted key → the file of the chain that set it last

    def explain(self, err: ConfigError, overrides: list[str] | tuple[str, ...] = ()) -> ConfigError:
        """``err`` (whose message starts with a dotted key) prefixed with where that key was set.

        Args:
            err: an error of validating :attr:`data` (with ``overrides`` applied), ``"optim.lrr: unknown key"``.
            overrides: the ``KEY=VALUE`` overrides applied after the chain; a key one of them set is named by it,
                as typed (it is on the command line, not in a file).

        Returns:
            ``"<file>: <message>"``, ``"<base> (a base of <path>): <message>"`` when a base set the key, or
            ``"override <KEY=VALUE>: <message>"`` when an override did.
        """
        key = re.sub(r"\[[^\]]*\]", "", str(err).split(": ", 1)[0])  # optim.groups[0].lr_mult → optim.groups.lr_mult
        origins: dict[str, Path | str] = dict(self.origins)
        for item in overrides:
            origins[item.partition("=")[0]] = item
        parts = key.split(".")
        for end in range(len(parts), 0, -1):
            origin = origins.get(".".join(parts[:end]))
            if origin is not None:
                break
        if origin is None:  # a section only an override names (nosuch.key=1 → "nosuch: unknown key")
            origin = next((item for item in overrides if item.partition("=")[0].startswith(f"{key}.")), None)
        if isinstance(origin, str):  # as typed; quoted when it holds a line break or another control character
            return ConfigError(f"{_OVERRIDE} {origin if origin.isprintable() else repr(origin)}: {err}")
        if origin is None or origin == self.path:
            return ConfigError(f"{self.path}: {err}")
        hint = ""
        if re.search(r": unknown (key|argument)", str(err)):  # a base's key that does not apply to this config
            section = ".".join(parts[:-1]) or key  # model.args.backbone → model.args (e.g. another model's args)
            hint = f"; {self.path} drops what its bases set there with `unset: [{section}]` (docs/engine.md)"
        return ConfigError(f"{origin} (a base of {self.path}): {err}{hint}")


def read_config_file(path: str | Path) -> ConfigSource:
    """Read the YAML config at ``path`` and its ``base:`` chain, merged (module docstring: the rules).

    Args:
        path: the config file (any suffix but ``.py``; its bases must be ``.yaml``/``.yml``).

    Returns:
        The merged data (not yet validated), the chain of files and which file set each key.

    Raises:
        ConfigError: a missing, unreadable, empty or non-mapping file, bad YAML, a bad ``base``/``unset`` value,
            a loop or a chain deeper than :data:`MAX_BASE_DEPTH`, each naming the file (and the chain).
    """
    path = Path(path)
    chain: list[Path] = [path]
    documents = [_read_document(path, None)]
    seen = [_identity(path)]
    while "base" in documents[-1]:
        including = chain[-1]
        base = _base_path(documents[-1]["base"], including)
        if len(chain) > MAX_BASE_DEPTH:
            raise ConfigError(f"{path}: base: the chain is deeper than {MAX_BASE_DEPTH} files ({_arrows(chain)} → ...)")
        identity = _identity(base)
        if identity in seen:
            raise ConfigError(f"{path}: base: the chain loops: {_arrows([*chain, base])}")
        chain.append(base)
        seen.append(identity)
        documents.append(_read_document(base, including))
    data: dict[str, Any] = {}
    origins: dict[str, Path] = {}
    for file, document in zip(reversed(chain), reversed(documents), strict=True):
        if "unset" in document:
            if file == chain[-1]:
                raise ConfigError(f"{file}: unset: needs a base (it removes keys the base chain sets)")
            for key in _unset_keys(document["unset"], file):
                _unset(data, origins, key, file)
        body = {k: v for k, v in document.items() if k not in ("base", "unset")}
        _record(origins, body, file, "")
        data = merge_config(data, body)
    return ConfigSource(path, data, tuple(chain), origins)


def merge_config(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` merged onto ``base``: mappings per key, recursively (the child's value wins); lists, scalars and
    ``null`` replace. Neither argument is changed.

    Example:
        >>> merge_config({"optim": {"lr": 1e-3, "betas": [0.9, 0.99]}}, {"optim": {"betas": [0.8, 0.9]}})
        {'optim': {'lr': 0.001, 'betas': [0.8, 0.9]}}
    """
    out = _copy(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = _copy(value)
    return out


def read_yaml_file(path: str | Path, where: str | None = None) -> Any:
    """The YAML document in the file ``path``: a regular file of at most :data:`MAX_CONFIG_BYTES`, UTF-8, parsed by
    :class:`BoundedSafeLoader` (a run's ``config.yaml``, one file of a config chain).

    Args:
        path: the file.
        where: how messages name it (default: the path).

    Raises:
        ConfigError: one line naming the file: missing, not a regular file, too large, not UTF-8, not valid YAML
            (the problem and its line, never the file's text), a Python tag, or past the YAML bounds.
    """
    where = where or str(path)
    try:
        text = read_text(path, limit=MAX_CONFIG_BYTES, what="a config may hold")
    except FileNotFoundError:
        raise ConfigError(f"{where}: config file not found") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a text file (a YAML config is UTF-8 text)") from None
    except OSError as err:
        raise ConfigError(f"{where}: cannot read the config ({err.strerror or type(err).__name__})") from None
    try:
        return load_yaml(text)
    except yaml.YAMLError as err:
        if isinstance(err, YAMLBoundError):
            raise ConfigError(f"{where}: refused: the YAML {yaml_problem(err)}; a config never needs that") from None
        link = f"; it is a link to {os.readlink(path)}, which is no YAML config" if Path(path).is_symlink() else ""
        raise ConfigError(f"{where}: not valid YAML: {yaml_problem(err)}{link}") from None


# ---------------------------------------------------------------------- one file
def _read_document(path: Path, including: Path | None) -> dict[str, Any]:
    """The top-level mapping of one file of the chain (``including``: the file that names it as its base)."""
    where = f"{path} (the base of {including})" if including is not None else str(path)
    if not (path.exists() or path.is_symlink()):
        raise ConfigError(f"{where}: config file not found")
    if path.suffix == ".py":
        raise ConfigError(
            f"{path}: a Python config (mmdetection3d / mmengine style) is not read — drivetrain configs are YAML "
            "data and never run code; start from the YAML equivalent in configs/ (`drivetrain configs` lists "
            "them)"
        )
    data = read_yaml_file(path, where)
    if data is None or data == {}:
        raise ConfigError(f"{where}: the config is empty; start from one in configs/ (e.g. configs/smoke.yaml)")
    if not isinstance(data, dict):
        link = f" ({path} is a link to {os.readlink(path)})" if path.is_symlink() else ""
        raise ConfigError(f"{where}: expected a mapping at the top level, got {type(data).__name__}{link}")
    return data


def _base_path(value: Any, including: Path) -> Path:
    """The file ``base: value`` of ``including`` names, checked against the rules (module docstring)."""
    if not isinstance(value, str) or not value.strip():
        shown = f"{type(value).__name__} {value!r}"
        raise ConfigError(f"{including}: base: expected the relative path of one YAML file, got {shown}")
    if "\0" in value:
        raise ConfigError(f"{including}: base: {value!r}: a path cannot hold a NUL character")
    if Path(value).is_absolute() or value.startswith("~"):
        raise ConfigError(
            f"{including}: base: {value}: an absolute path is refused; write it relative to this file's folder "
            f"({including.parent}), so the config and its base can be moved together"
        )
    if Path(value).suffix not in BASE_SUFFIXES:
        raise ConfigError(f"{including}: base: {value}: a base must be a .yaml or .yml file")
    return Path(os.path.normpath(including.parent / value))


def _identity(path: Path) -> Path:
    """The file itself (links and ``..`` resolved), to recognise a loop through another spelling."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: the lexical path is all there is
        return Path(os.path.abspath(path))


def _arrows(chain: list[Path]) -> str:
    return " → ".join(str(p) for p in chain)


# ---------------------------------------------------------------------- unset and origins
def _unset_keys(value: Any, file: Path) -> list[str]:
    keys = [value] if isinstance(value, str) else value
    if not isinstance(keys, list) or not all(isinstance(k, str) and k and "" not in k.split(".") for k in keys):
        raise ConfigError(
            f"{file}: unset: expected a list of dotted keys (e.g. [model.args.anchor_ranges]), got {value!r}"
        )
    return keys


def _unset(data: dict[str, Any], origins: dict[str, Path], key: str, file: Path) -> None:
    """Remove ``key`` (dotted) from the merged ``data`` of the bases; an error naming ``file`` if they lack it."""
    *parents, leaf = key.split(".")
    node: Any = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or leaf not in node:
        raise ConfigError(f"{file}: unset: {key}: the base chain does not set it")
    del node[leaf]
    for name in [k for k in origins if k == key or k.startswith(key + ".")]:
        del origins[name]


def _record(origins: dict[str, Path], data: dict[str, Any], file: Path, prefix: str) -> None:
    """Note ``file`` as the origin of every key of ``data`` (a value that is no mapping replaces a subtree)."""
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if not isinstance(value, dict):
            for below in [k for k in origins if k.startswith(key + ".")]:
                del origins[below]
        origins[key] = file
        if isinstance(value, dict):
            _record(origins, value, file, key)


def _copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data
