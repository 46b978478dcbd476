"""The error every part of ``drivetrain.data`` raises for bad input: it names the file or field."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DataError"]


class DataError(ValueError):
    """Bad or missing input data; ``path`` is the file (or table) at fault when there is one."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        super().__init__(f"{self.path}: {message}" if self.path else message)
