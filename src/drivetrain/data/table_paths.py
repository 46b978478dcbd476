"""File names from dataset tables and frame indexes: relative to the dataset root, and inside it.

A nuScenes-format table names every data file relative to the root (``sample_data.filename`` =
``samples/CAM_FRONT/x.jpg``, ``map.filename`` = ``maps/x.png``), and the frame index keeps those names. Tables
and indexes may come from someone else, so a name that is absolute or has a ``..`` part is refused before any
file is opened or even looked for: joined to the root it would reach outside the dataset.

The test is lexical, on the name alone (the parts of its ``PurePosixPath``), so that symbolic links *inside*
the root keep working: users link ``samples/`` to a larger disk, and such a link is followed as usual. That is
also why a ``..`` part is refused wherever it stands, not only where it would climb above the root: after a
linked folder the system resolves ``..`` into the link target's parent, which is no part of the dataset
(``samples/../x`` names ``x`` beside the target, not ``x`` in the root).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from drivetrain.data.errors import DataError

__all__ = ["check_table_paths", "path_problem"]

# Tables whose rows name files under the root, and the field that names them.
PATH_FIELDS = {"sample_data": "filename", "map": "filename"}


def path_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a file name inside a dataset root, or None when it can.

    Example: ``path_problem("../x.jpg")`` → ``"has a '..' part"``; ``path_problem("samples/x.jpg")`` → None.
    """
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a file name"
    if not name:
        return "is empty"
    if "\x00" in name:
        return "holds a NUL character"
    if name.startswith("/"):
        return "is an absolute path"
    # The parts of PurePosixPath(name) without building one (millions of rows): '' and '.' parts collapse
    # there and cannot climb, so a '..' component is what remains to look for.
    if ".." in name and ".." in name.split("/"):
        return "has a '..' part"
    return None


def check_table_paths(rows: Iterable[Any], field: str, table: str | Path) -> None:
    """DataError naming the table file, the row (number and token) and the value of the first bad ``field``.

    Rows without the field (or that are not objects) are left to the table checks that need them.
    """
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or field not in row:
            continue
        problem = path_problem(row[field])
        if problem is not None:
            raise DataError(
                f"row {i} (token {row.get('token')!r}): {field} {row[field]!r} {problem}; file names in a table "
                "must be relative to the dataset root and stay inside it",
                table,
            )
