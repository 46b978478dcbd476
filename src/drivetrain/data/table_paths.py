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
from drivetrain.data.formats.schema import TABLES
from drivetrain.safeio.json_files import JSONLimitError, load

__all__ = ["ANNOTATION_TABLES", "check_root", "check_table_paths", "path_problem"]

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


ANNOTATION_TABLES = ("sample_annotation", "instance")
"""The tables a root without annotations (e.g. a test split) may lack: indexing reads them as empty."""


def check_root(root: str | Path, version: str, *, annotations: bool = True) -> Path:
    """Raise :class:`DataError` unless ``root/version`` holds every nuScenes table as valid JSON (nesting and
    integers bounded: :mod:`drivetrain.safeio.json_files`), whose file names (``sample_data`` and ``map``) stay inside
    ``root`` (see :mod:`drivetrain.data.table_paths`).

    ``annotations=False`` lets the ``ANNOTATION_TABLES`` be absent (indexing a root without annotations; a metric
    needs them)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError("dataset root does not exist or is not a folder", root)
    tables = root / version
    if not tables.is_dir():
        found = sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "sample.json").exists())
        raise DataError(
            f"not a nuScenes-format root: no table folder {version!r}"
            + (f" (table folders found: {found}; pass --version)" if found else " (no nuScenes tables found at all)"),
            root,
        )
    for name in TABLES:
        path = tables / f"{name}.json"
        if not path.exists() and not annotations and name in ANNOTATION_TABLES:
            continue  # a root without annotations
        if not path.exists():
            raise DataError(f"missing nuScenes table {name!r}", path)
        try:
            rows = load(path)  # a regular file only (a FIFO would block): OSError otherwise
        except OSError as err:
            raise DataError(f"cannot read nuScenes table {name!r} ({err.strerror or err})", path) from None
        except JSONLimitError as err:  # nested too deep, an integer outside 64 bits: the place is named
            raise DataError(str(err), path) from None
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
            raise DataError(f"table is not valid JSON ({err})", path) from None
        if not isinstance(rows, list):
            raise DataError(f"a table must be a JSON list of records, got a {type(rows).__name__}", path)
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or not isinstance(row.get("token"), str):
                raise DataError(f"record {i} is not an object with a string 'token'", path)
        if name in PATH_FIELDS:  # before the devkit looks for a map file or we open a data file
            check_table_paths(rows, PATH_FIELDS[name], path)
    return root
