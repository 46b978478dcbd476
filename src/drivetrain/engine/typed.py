"""Plain data (parsed YAML) → typed dataclasses, checking keys and types: every error a one-line
:class:`~drivetrain.engine.errors.ConfigError` naming the dotted key. A leaf of the engine, so that the config
sections (:mod:`drivetrain.engine.config`) and the registry's argument checks (:mod:`drivetrain.engine.registry`)
share it without importing each other.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from drivetrain.engine.errors import ConfigError

__all__ = ["from_dict"]


def from_dict(cls: type, data: Any, key: str = "") -> Any:
    """Build dataclass ``cls`` from plain data, checking keys and types; errors name the dotted key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{key or '<root>'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for name in data:
        if name not in names:
            moved = getattr(cls, "moved", None)  # a section that says where a key of its old spelling lives now
            reason = moved(str(name)) if moved is not None else f"unknown key; known keys: {', '.join(sorted(names))}"
            raise ConfigError(f"{_join(key, str(name))}: {reason}")
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
        try:
            return _coerce(inner[0], value, key)
        except ConfigError as first:
            for member in inner[1:]:  # e.g. bool | dict: a later member takes what the first refuses
                try:
                    return _coerce(member, value, key)
                except ConfigError:
                    pass
            raise first
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
        return from_dict(tp, value, key)
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
