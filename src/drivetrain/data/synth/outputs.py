"""What the synthetic generator made in a folder, and removing exactly that (``data synth --overwrite``, and
:func:`~drivetrain.data.synth.generate` before it writes a new set over one of ours).

A folder holds a synthetic dataset of ours when it has the generator's manifest ``drivetrain_synth.json``
(:mod:`drivetrain.data.synth.manifest`: written first, marked complete last, so a generation that was killed is
recognised as ours too). What was made there:

- the tables in the table folder the manifest names (``v1.0-mini``, or ``v1.01-train`` for ``--format lyft``);
- the data files and the map: those the tables list (``sample_data`` and ``map`` ``filename``), and every file the
  generator writes for the recorded settings (:class:`~drivetrain.data.synth.names.GeneratedNames`: a killed
  generation wrote images and lidar files before any table), inside the folders the generator writes
  (``samples``, ``sweeps``, ``maps``; Lyft: ``images``, ``lidar``, ``maps``);
- the manifest, and what drivetrain adds beside it: the frame index ``drivetrain_index.npz``, its temporary file
  and the generation lock.

:func:`remove_generated` deletes those and the folders they leave empty; any other file put beside or between
them stays. It never follows a link: a link where one of those files or folders should be is unlinked (a linked
``samples/`` loses its link, the files of its target stay). Everything is read and checked before the first
deletion, so a refusal leaves the folder as it was; the manifest is marked unfinished before the first deletion
and removed last, so a removal that is interrupted leaves a folder still recognised as ours, and running it again
(or generating again) finishes it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from drivetrain.data.errors import DataError
from drivetrain.data.formats.registry import FORMATS
from drivetrain.data.formats.schema import TABLES
from drivetrain.data.synth.manifest import LOCK_FILE, MANIFEST, Manifest, read_manifest, write_manifest
from drivetrain.data.synth.names import GeneratedNames
from drivetrain.data.table_paths import PATH_FIELDS, check_table_paths

__all__ = ["SETTINGS_FILE", "listed_files", "remove_generated"]

SETTINGS_FILE = MANIFEST
# The top folders the generator writes data files in, for any format (samples, sweeps, maps; images, lidar).
DATA_FOLDERS = frozenset(f.split("/", 1)[0] for fmt in FORMATS.values() for f in fmt.synth.folders())
BESIDE = ("drivetrain_index.npz", ".drivetrain_index.npz.tmp.npz")


def listed_files(root: Path, manifest: Manifest) -> set[str]:
    """The data files (names relative to ``root``) the tables of the synthetic dataset at ``root`` list.

    The tables of a finished dataset must be readable; those of an unfinished one may be missing or cut short
    (the generator writes them last), and such tables list nothing. Tables that are read are checked either way.

    Raises:
        DataError: naming the table: unreadable tables of a finished dataset, or file names outside the root.
    """
    files: set[str] = set()
    for table, field in PATH_FIELDS.items():
        path = root / manifest.version / f"{table}.json"
        try:
            rows = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as err:
            if not manifest.complete:
                continue
            raise DataError(
                f"cannot list the files of the synthetic dataset ({type(err).__name__}: {err}); nothing was deleted "
                "— delete it yourself",
                path,
            ) from None
        if not isinstance(rows, list):
            if not manifest.complete:
                continue
            raise DataError(
                "cannot list the files of the synthetic dataset (not a JSON list); nothing was deleted", path
            )
        check_table_paths(rows, field, path)
        files.update(row[field] for row in rows if isinstance(row, dict) and isinstance(row.get(field), str))
    return {f for f in files if f.split("/", 1)[0] in DATA_FOLDERS}


def remove_generated(root: str | Path, *, replacing: bool = False) -> None:
    """Delete the synthetic dataset at ``root``: what the module lists and nothing else.

    Args:
        root: the dataset folder.
        replacing: a new set is written next (by the generator, which holds the generation lock): the lock and the
            manifest (marked unfinished) stay.

    Raises:
        DataError: ``root`` holds no synthetic dataset of ours, or its file list cannot be read; nothing is deleted.
        OSError: a file could not be deleted.
    """
    root = Path(root)
    manifest = read_manifest(root)
    if manifest is None:
        raise DataError(f"holds no synthetic dataset (no {MANIFEST}); not touching it", root)
    listed = listed_files(root, manifest)
    if manifest.complete:  # from here on the folder is an unfinished set of ours until the new one is written
        write_manifest(root, manifest.config, manifest.synth.name, complete=False)
    names = GeneratedNames(manifest.config, manifest.synth)
    folders = manifest.synth.folders()
    folders |= {parent.as_posix() for f in listed for parent in Path(f).parents if parent != Path(".")}
    tops = {f.split("/", 1)[0] for f in (*listed, *folders)}
    for top in sorted(tops):
        _remove_listed(root, root / top, lambda rel: rel in listed or rel in names, folders)
    tables = root / manifest.version
    if tables.is_symlink():
        tables.unlink()
    elif tables.is_dir():
        for name in TABLES:
            _unlink(tables / f"{name}.json")
        _rmdir_if_empty(tables)
    for name in BESIDE:
        _unlink(root / name)
    if not replacing:
        _unlink(root / LOCK_FILE)
        _unlink(root / MANIFEST)  # last: an interrupted removal can be run again


def _remove_listed(root: Path, top: Path, made: Callable[[str], bool], folders: set[str]) -> None:
    """Bottom-up through the real folders under ``top``: unlink the files we ``made`` (and links standing for our
    folders), then remove our folders left empty. Links are never descended into."""
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
            if (made(rel) and (link or not path.is_dir())) or (rel in folders and link):
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
