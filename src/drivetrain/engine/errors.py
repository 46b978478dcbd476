"""The engine's configuration error, in a module of its own: the registry raises it and the config module (which
looks names up in the registry) re-exports it, without the two importing each other."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration file, key, value or override is wrong; the message names it."""
