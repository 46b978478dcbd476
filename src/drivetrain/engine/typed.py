"""Plain data (parsed YAML) → typed dataclasses, checking keys and types: every error a one-line
:class:`~drivetrain.engine.typed.ConfigError` naming the dotted key. A leaf of the engine, so that the config
sections (:mod:`drivetrain.engine.config`) and the registry's argument checks (:mod:`drivetrain.engine.registry`)
share it without importing each other.

A dataclass with a ``from_dict(value)`` class method reads its own YAML value (the augmentation recipe, whose camera
``bev`` overrides the recipe's step field by field; ``model.init_from``, a bare path or a mapping): its ValueError
or TypeError becomes the ConfigError, prefixed with the key unless the message names it already.

:class:`ConfigError`, the engine's configuration error, lives here too: the registry raises it and the config module
(which looks names up in the registry) re-exports it, without the two importing each other.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar, Literal, Protocol

__all__ = ["ConfigError", "DataclassInstance", "from_dict"]


class DataclassInstance(Protocol):
    """Any dataclass instance (a builder's typed arguments: ``model.args``, ``data.args``), for annotations."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


def from_dict(cls: type, data: Any, key: str = "") -> Any:
    """Build dataclass ``cls`` from plain data, checking keys and types; errors name the dotted key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{key or '<root>'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for name in data:
        if name not in names:
            raise ConfigError(f"{_join(key, str(name))}: unknown key; known keys: {', '.join(sorted(names))}")
    kwargs = {name: _coerce(hints[name], value, _join(key, name)) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise ConfigError(f"{key or '<root>'}: {err}") from None


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for member in inner:  # the first member the value fits; none: the first member's error
            try:
                return _coerce(member, value, key)
            except ConfigError as err:
                errors.append(err)
        raise errors[0]
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: expected one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:  # tuple[int, ...] (any length) or tuple[int, int] (that length); YAML writes a list
        variadic = len(args) == 2 and args[1] is Ellipsis
        if not isinstance(value, list | tuple) or not (variadic or len(value) == len(args)):
            size = "" if variadic else f" of {len(args)}"
            raise ConfigError(f"{key}: expected a list{size}, got {type(value).__name__} {value!r}")
        return tuple(_coerce(args[0 if variadic else i], v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        read = getattr(tp, "from_dict", None)  # a section that reads its own YAML value
        if read is None:
            return from_dict(tp, value, key)
        try:
            return read(value)
        except ConfigError:
            raise
        except (ValueError, TypeError) as err:
            message = str(err)
            raise ConfigError(message if message.startswith(key) else f"{key}: {message}") from None
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {type(value).__name__} {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {type(value).__name__} {value!r}")
        try:
            return float(value)
        except OverflowError:  # an int past the float range (not shown: repr refuses past 4,300 digits)
            past = f"an integer of {value.bit_length()} bits, past the float range"
            raise ConfigError(f"{key}: must be a finite number, got {past}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {tp}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class ConfigError(ValueError):
    """A configuration file, key, value or override is wrong; the message names it."""
