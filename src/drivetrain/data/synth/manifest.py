"""The generator's manifest ``drivetrain_synth.json``: which folders hold a synthetic dataset of ours, finished or not.

The generator writes the manifest FIRST — its settings with ``"complete": false`` — before any table, image or
lidar file, and rewrites it with ``"complete": true`` once the last file is written. So a folder is in one of
these states (:func:`folder_state`):

- ``missing`` or ``empty`` (nothing in it but the generation lock, or the temporary file of a manifest whose first
  write was cut short): generating may begin;
- ``unfinished``: our manifest says ``"complete": false`` — a generation that was killed (or runs now); generating
  again recovers it (the files it had written are found from its settings and replaced);
- ``complete``: a finished dataset of ours (a manifest without ``complete`` is one too: drivetrain before this
  wrote it last);
- ``foreign``: not empty and without a manifest — a folder drivetrain did not make (a real nuScenes root, someone's
  files): nothing is ever generated into it or deleted from it.

A manifest that is not the generator's (not JSON, not an object, missing or mistyped settings) is a
:class:`~drivetrain.data.errors.DataError` naming it: such a folder is never written to either. The manifest is
read as data (a regular file of at most :data:`MAX_MANIFEST_BYTES`, JSON), never followed as an instruction: its
settings only ever name our own files to find (:class:`~drivetrain.data.synth.names.GeneratedNames`).

:func:`generation_lock` is the lock (``.generate.lock`` in the folder) every writer of a synthetic dataset holds
while it writes: the ranks of one node wait on it in turn, ``data synth`` refuses a folder another process is
generating into.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from drivetrain.data.errors import DataError
from drivetrain.data.formats.registry import DEFAULT, FORMATS, index_meta
from drivetrain.data.formats.synth_format import SynthFormat
from drivetrain.data.synth.config import SynthConfig
from drivetrain.safeio.files import replace_text

__all__ = [
    "LOCK_FILE",
    "MANIFEST",
    "Manifest",
    "folder_state",
    "generation_lock",
    "read_manifest",
    "write_manifest",
]

MANIFEST = "drivetrain_synth.json"
LOCK_FILE = ".generate.lock"
MAX_MANIFEST_BYTES = 1 << 20  # the full preset's manifest is 0.5 kB; a megabyte holds 50 000 scene names


@dataclass(frozen=True)
class Manifest:
    """What a manifest of ours records."""

    settings: dict[str, Any]  # as recorded (the generator's settings, version, dataset, complete)
    config: SynthConfig  # the settings as the generator's configuration
    version: str  # the table folder: v1.0-mini, or v1.01-train for the Lyft flavour
    synth: SynthFormat  # the format written (its record's synth)
    complete: bool  # every file was written


def write_manifest(root: Path, config: SynthConfig, dataset: str, *, complete: bool) -> None:
    """Record ``config`` as the generator's settings for format ``dataset`` (a name in
    :data:`~drivetrain.data.formats.registry.FORMATS`) in ``root`` (replaced whole: a link there is replaced)."""
    fmt = FORMATS[dataset]
    settings = {"version": fmt.synth.version, **index_meta(fmt), **asdict(config)}
    replace_text(root / MANIFEST, json.dumps({**settings, "complete": complete}, indent=2))


def read_manifest(root: Path) -> Manifest | None:
    """The manifest of ``root``; None when there is none.

    Raises:
        DataError: naming the manifest: not a regular file, too large, not JSON, or not the generator's settings.
    """
    path = root / MANIFEST
    text = _read_small(path)
    if text is None:
        return None
    try:
        settings = json.loads(text)
    except (ValueError, RecursionError) as err:
        why = f"not JSON: {err}" if isinstance(err, ValueError) else "nested too deeply"
        raise _not_ours(path, why) from None
    versions = [fmt.synth.version for fmt in FORMATS.values()]
    if not isinstance(settings, dict) or settings.get("version") not in versions:
        raise _not_ours(path, f"needs version {' or '.join(map(repr, versions))}, seed and scenes")
    fmt = FORMATS.get(settings.get("dataset", DEFAULT.name))
    if fmt is None or settings["version"] != fmt.synth.version:
        raise _not_ours(path, "its dataset and version do not go together")
    complete = settings.get("complete", True)
    if not isinstance(complete, bool):
        raise _not_ours(path, f"complete: expected true or false, got {complete!r}")
    values: dict[str, Any] = {}
    for field in fields(SynthConfig):
        value = settings.get(field.name)
        if field.name == "scenes":
            ok = isinstance(value, list) and all(isinstance(s, str) for s in value)
            value = tuple(value) if ok else value
        elif isinstance(field.default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok:
            raise _not_ours(path, f"{field.name}: missing or of the wrong type")
        values[field.name] = value
    try:
        config = SynthConfig(**values)
    except ValueError as err:
        raise _not_ours(path, str(err)) from None
    return Manifest(settings, config, settings["version"], fmt.synth, complete)


def _not_ours(path: Path, why: str) -> DataError:
    return DataError(f"is not a drivetrain synthetic dataset's settings ({why}); not touching {path.parent}", path)


def _read_small(path: Path) -> str | None:
    """The text of the regular file ``path`` (links followed), None when nothing is there; never blocks on a FIFO
    and never reads more than :data:`MAX_MANIFEST_BYTES`."""
    try:
        info = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise _not_ours(path, "a link to nothing") from None
        return None
    except OSError as err:
        raise DataError(f"cannot be read ({err.strerror})", path) from None
    if not stat.S_ISREG(info.st_mode):
        raise _not_ours(path, "not a regular file")
    if info.st_size > MAX_MANIFEST_BYTES:
        raise _not_ours(path, f"{info.st_size} bytes, more than {MAX_MANIFEST_BYTES}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO swapped in since: no wait
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise _not_ours(path, "not a regular file")
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as err:
        raise DataError(f"cannot be read ({err.strerror})", path) from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise _not_ours(path, f"more than {MAX_MANIFEST_BYTES} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise _not_ours(path, "not UTF-8 text") from None


def folder_state(root: Path) -> tuple[str, Manifest | None]:
    """``(state, manifest)`` of ``root``: ``missing``, ``empty``, ``unfinished``, ``complete`` or ``foreign``
    (see the module), with its manifest for the two states of ours.

    Raises:
        DataError: ``root`` is not a folder, or its manifest is not the generator's.
    """
    if not (root.exists() or root.is_symlink()):
        return "missing", None
    if not root.is_dir():
        raise DataError("is not a folder", root)
    manifest = read_manifest(root)
    if manifest is not None:
        return ("complete" if manifest.complete else "unfinished"), manifest
    try:
        with os.scandir(root) as entries:
            names = {entry.name for entry in entries}
    except OSError as err:
        raise DataError(f"cannot be listed ({err.strerror})", root) from None
    ours = {name for name in names if name == LOCK_FILE or name.startswith(f".{MANIFEST}.tmp-")}  # a first write cut
    return ("empty" if names <= ours else "foreign"), None


@contextlib.contextmanager
def generation_lock(root: Path, *, wait: bool = True) -> Iterator[None]:
    """Hold ``root``'s generation lock (an advisory ``flock`` on ``.generate.lock``, created in ``root``) for the
    ``with`` block; ranks of one node take turns. With ``wait=False``, a lock another process holds is a DataError
    instead of a wait. A link at the lock's name is replaced by the file (its target is not opened), and a
    filesystem without ``flock`` runs unlocked, as before there was a lock."""
    path = root / LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        path.unlink()  # a link planted at the name: opening it for writing would create or truncate its target
        fd = os.open(path, flags, 0o666)
    with os.fdopen(fd, "r+b") as lock:
        if not stat.S_ISREG(os.fstat(lock.fileno()).st_mode):
            raise DataError("is not a regular file (the generation lock)", path)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise DataError("another process is generating the synthetic dataset here now", root) from None
        except OSError:
            pass  # no flock on this filesystem
        yield
