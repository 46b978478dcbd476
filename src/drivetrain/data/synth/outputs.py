"""What the synthetic generator made in a folder, and removing exactly that (``data synth --overwrite``).

A folder holds a synthetic dataset of ours when it has ``drivetrain_synth.json``, the generator's settings
(written last, so an unfinished generation has none and is never taken for one). What was made there:

- the tables in the table folder the settings name (``v1.0-mini``, or ``v1.01-train`` for ``--format lyft``);
- the data files and the map those tables list (``sample_data`` and ``map`` ``filename``), inside the folders
  the generator writes (``samples``, ``sweeps``, ``maps``; Lyft: ``images``, ``lidar``, ``maps``);
- the settings file, and what drivetrain adds beside them: the frame index ``drivetrain_index.npz``, its
  temporary file and the generation lock of the ``synthetic`` data builder.

:func:`remove_generated` deletes those and the folders they leave empty; any other file put beside or between
them stays. It never follows a link: a link where one of those files or folders should be is unlinked (a linked
``samples/`` loses its link, the files of its target stay). Everything is read and checked before the first
deletion, so a refusal leaves the folder as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from drivetrain.data.errors import DataError
from drivetrain.data.lyft_format import LYFT_VERSION
from drivetrain.data.nuscenes_format import TABLES
from drivetrain.data.synth.generate import VERSION
from drivetrain.data.table_paths import PATH_FIELDS, check_table_paths

__all__ = ["SETTINGS_FILE", "generated_files", "remove_generated"]

SETTINGS_FILE = "drivetrain_synth.json"
DATA_FOLDERS = ("samples", "sweeps", "maps", "images", "lidar")
BESIDE = ("drivetrain_index.npz", ".drivetrain_index.npz.tmp.npz", ".generate.lock")


def generated_files(root: Path) -> tuple[str, set[str]]:
    """The table folder and the data files (names relative to ``root``) of the synthetic dataset at ``root``.

    Raises:
        DataError: naming the file: no settings file, one that is not the generator's, or tables that cannot
            be read or name files outside the root.
    """
    settings_path = root / SETTINGS_FILE
    if not (settings_path.exists() or settings_path.is_symlink()):
        raise DataError(f"holds no synthetic dataset (no {SETTINGS_FILE}); not touching it", root)
    try:
        settings: Any = json.loads(settings_path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(
            f"is not a drivetrain synthetic dataset's settings ({err}); not touching {root}", settings_path
        ) from None
    if (
        not isinstance(settings, dict)
        or not {"seed", "scenes"} <= settings.keys()
        or settings.get("version") not in (VERSION, LYFT_VERSION)
    ):
        raise DataError(
            f"is not a drivetrain synthetic dataset's settings (needs version {VERSION!r} or {LYFT_VERSION!r}, seed "
            f"and scenes); not touching {root}",
            settings_path,
        )
    version = settings["version"]
    files: set[str] = set()
    for table, field in PATH_FIELDS.items():
        path = root / version / f"{table}.json"
        try:
            rows = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise DataError(
                f"cannot list the files of the synthetic dataset ({err}); nothing was deleted — delete it yourself",
                path,
            ) from None
        if not isinstance(rows, list):
            raise DataError(
                "cannot list the files of the synthetic dataset (not a JSON list); nothing was deleted", path
            )
        check_table_paths(rows, field, path)
        files.update(row[field] for row in rows if isinstance(row, dict) and isinstance(row.get(field), str))
    return version, {f for f in files if f.split("/", 1)[0] in DATA_FOLDERS}


def remove_generated(root: str | Path) -> None:
    """Delete the synthetic dataset at ``root``: what :func:`generated_files` lists and nothing else (see the module).

    Raises:
        DataError: ``root`` holds no synthetic dataset of ours, or its file list cannot be read; nothing is deleted.
        OSError: a file could not be deleted.
    """
    root = Path(root)
    version, files = generated_files(root)
    folders = {parent.as_posix() for f in files for parent in Path(f).parents if parent != Path(".")}
    for top in sorted({f.split("/", 1)[0] for f in files}):
        _remove_listed(root, root / top, files, folders)
    tables = root / version
    if tables.is_symlink():
        tables.unlink()
    elif tables.is_dir():
        for name in TABLES:
            _unlink(tables / f"{name}.json")
        _rmdir_if_empty(tables)
    for name in (*BESIDE, SETTINGS_FILE):  # the settings last: an interrupted removal can be run again
        _unlink(root / name)


def _remove_listed(root: Path, top: Path, files: set[str], folders: set[str]) -> None:
    """Bottom-up through the real folders under ``top``: unlink the listed files (and links standing for listed
    folders), then remove the listed folders left empty. Links are never descended into."""
    if top.is_symlink():
        top.unlink()
        return
    if not top.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(top, topdown=False):
        here = Path(dirpath)
        for name in (*filenames, *dirnames):
            path = here / name
            rel, link = path.relative_to(root).as_posix(), path.is_symlink()
            if (rel in files and (link or not path.is_dir())) or (rel in folders and link):
                path.unlink()
        if here.relative_to(root).as_posix() in folders:
            _rmdir_if_empty(here)


def _unlink(path: Path) -> None:
    """Unlink a file or a link (never a folder)."""
    if path.is_symlink() or path.is_file():
        path.unlink()


def _rmdir_if_empty(path: Path) -> None:
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        path.rmdir()
