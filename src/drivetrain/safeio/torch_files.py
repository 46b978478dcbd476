"""Loading a torch file someone else may have made: tensors only, bounded, in one line when refused.

:func:`load_torch_file` is the one door through which checkpoints (:class:`~.checkpoint.Checkpointer`), weights
sources (``model.init_from``) and a run's recorded versions (``drivetrain report``) reach ``torch.load``:

- the path must be a regular file (:mod:`drivetrain.safeio.reads`: a FIFO would block ``torch.load`` forever);
  the file is opened once, and every check and the load read that one open file, so the bytes checked are the
  bytes loaded;
- **the members of a zip archive may not declare more bytes than the file holds.** ``torch.save`` (the zip
  format, PyTorch ≥ 1.6) stores every member uncompressed, each member's bytes once, after a local header, so
  the uncompressed sizes of an archive it wrote sum to less than the file's size. torch's reader allocates each
  member's declared size and inflates a deflated member into it: a 3 MB archive of deflated zeros declares
  gigabytes. The bound — declared total ≤ file size — holds for every file ``torch.save`` writes and refuses
  any expansion before a byte is inflated; a checkpoint someone re-compressed is refused too (load it where you
  trust it and ``torch.save`` it again). Legacy (pre-zip) files, which only ``model.init_from`` accepts, read
  each tensor's bytes from the file itself, so they cannot expand;
- ``torch.load(weights_only=True)``: a file holding pickled Python objects is refused in our words — the object
  it needs, and that it is never loaded. torch's own message (which advises ``weights_only=False``, i.e. running
  the file's code) is never shown. Which failure it was is told by the exception's type
  (``pickle.UnpicklingError``) and the file's format, not by torch's wording, which changes between releases;
- what was loaded may hold at most :data:`MAX_OBJECTS` containers and items nested :data:`MAX_NESTING` deep,
  counting every shared reference as a copy: a pickle's memo can make a 100 KB file hold nine references to a
  list of nine references to … — the YAML alias bomb in pickle form, which the config comparison of a resume or
  the model rebuild of ``eval`` would expand. It is walked once, iteratively, before anything uses it.

Example:
    >>> state = load_torch_file(run / "checkpoints/step-00000040/state.pt")  # doctest: +SKIP
"""

from __future__ import annotations

import _compat_pickle
import hashlib
import io
import os
import pickle
import pickletools
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch

from drivetrain.safeio.reads import human_bytes, open_regular

__all__ = ["MAX_NESTING", "MAX_OBJECTS", "TorchFileError", "check_archives", "check_file", "load_torch_file"]

# Besides torch's own, the globals a file of tensors names (torch's weights-only unpickler allows them).
_TENSOR_GLOBALS = (
    "collections.OrderedDict",
    "collections.Counter",
    "builtins.set",
    "builtins.bytearray",
    "builtins.complex",
    "_codecs.encode",
)
# What a loaded file may hold as Python containers, every shared reference counted as a copy: the smoke run's
# checkpoint holds 522 objects nested 7 deep, a full StreamPETR's ~15k (2 per model tensor, ~9 per optimizer
# entry); a pickle's memo lets a 100 KB file hold a list of nine references to a list of nine ... that the config
# comparison then copies into billions (measured: 24 s and a MemoryError at 3 GiB). 2**20 is ~70× the largest.
MAX_OBJECTS = 1 << 20
MAX_NESTING = 100
_PICKLE_PROTO = 0x80  # a pickle of protocol ≥ 2 starts with the PROTO opcode: torch's legacy format does


class TorchFileError(ValueError):
    """A torch file that is not loaded; the message is the reason (without the path: the caller names it)."""


def load_torch_file(
    path: str | Path, *, legacy: bool = False, mmap: bool = False, sha256: str | None = None, size: int | None = None
) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, after the checks of the module docstring.

    Args:
        path: the file.
        legacy: accept torch's pre-zip format (weights from before PyTorch 1.6); else only a zip archive.
        mmap: memory-map the tensors instead of reading them (``torch.load(mmap=True)``; zip archives only).
        sha256: refuse unless the file's SHA-256 is this (a checkpoint's ``COMMITTED`` marker).
        size: refuse unless the file holds this many bytes (the marker's size).

    Returns:
        What the file holds (dicts, lists, tensors, numbers, strings).

    Raises:
        TorchFileError: one line: the reason (a special file, a size or checksum that differs, members that
            declare more than the file, pickled objects, not a torch file, a damaged archive).
        OSError: the file is missing or cannot be read (``strerror`` says why; a FIFO or a device is a
            :class:`~drivetrain.safeio.reads.NotRegularFileError`).
    """
    with open_regular(path) as f:
        on_disk = os.fstat(f.fileno()).st_size
        if (size is not None and on_disk != size) or (sha256 is not None and _sha256(f) != sha256):
            raise TorchFileError("size or SHA-256 differs from the COMMITTED marker (corrupt)")
        is_zip = _check_archive(f, on_disk)
        if not is_zip and not legacy:
            raise TorchFileError("not a torch.save archive (a zip file)")
        f.seek(0)
        try:
            if mmap:  # torch maps a file by name: this open file's name, so the checked file is the one mapped
                name = f"/proc/self/fd/{f.fileno()}" if os.path.exists("/proc/self/fd") else str(path)
                loaded = torch.load(name, map_location="cpu", weights_only=True, mmap=True)
            else:
                loaded = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            raise TorchFileError(_unpickling_reason(f, is_zip, err)) from None
        except OSError as err:
            raise TorchFileError(f"cannot be read ({err.strerror or type(err).__name__})") from None
        except Exception as err:  # torch raises several types for a file that is not its format
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise TorchFileError(f"not a loadable torch file ({type(err).__name__}: {first[:200]})") from None
    _check_structure(loaded)
    return loaded


def check_file(path: str | Path, *, size: int, sha256: str) -> None:
    """Refuse ``path`` unless it is a regular file of ``size`` bytes and SHA-256 ``sha256`` (a sharded
    checkpoint's files, against its ``COMMITTED`` marker).

    Raises:
        TorchFileError: the size or checksum differs.
        OSError: the file is missing, unreadable, or no regular file (a FIFO would block).
    """
    with open_regular(path) as f:
        if os.fstat(f.fileno()).st_size != size or _sha256(f) != sha256:
            raise TorchFileError("size or SHA-256 differs from the COMMITTED marker (corrupt)")


class _Slice(io.RawIOBase):
    """The bytes ``[offset, offset + length)`` of an open file as a seekable file of their own."""

    def __init__(self, f: IO[bytes], offset: int, length: int) -> None:
        self._f, self._offset, self._length, self._pos = f, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = min(max(base + pos, 0), self._length)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._length - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._offset + self._pos)
        data = self._f.read(n)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def check_archives(path: str | Path, slices: list[tuple[int, int]]) -> None:
    """Refuse ``path`` unless each ``(offset, length)`` slice lies in the file and is a ``torch.save`` zip archive
    whose members declare no more bytes than the slice holds (a sharded checkpoint's tensors: DCP loads each slice
    with ``torch.load(weights_only=True)``; a deflated member that would inflate to gigabytes is refused first).

    Raises:
        TorchFileError: a slice outside the file, not a zip archive, damaged, or expanding (naming its offset).
        OSError: the file is missing, unreadable, or no regular file.
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        for offset, length in slices:
            if offset + length > size:
                raise TorchFileError(f"a tensor at byte {offset} (+{length}) lies past the file's end ({size})")
            try:
                if not _check_archive(_Slice(f, offset, length), length):
                    raise TorchFileError(f"the tensor at byte {offset} is not a torch.save archive (a zip file)")
            except TorchFileError as err:
                raise TorchFileError(f"the tensor at byte {offset}: {err}") from None


def _check_structure(obj: Any) -> None:
    """TorchFileError when the loaded containers expand past :data:`MAX_OBJECTS` or :data:`MAX_NESTING` once every
    shared reference is counted as the copy that walking or copying it makes (module docstring). Iterative, so
    neither a deep nor a self-containing structure recurses; a tensor counts as one object."""
    seen, stack = 0, [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        seen += 1
        if depth > MAX_NESTING:
            raise TorchFileError(f"its containers nest deeper than {MAX_NESTING} levels; refused")
        if isinstance(item, Mapping):
            stack.extend((part, depth + 1) for pair in item.items() for part in pair)
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend((part, depth + 1) for part in item)
        if seen + len(stack) > MAX_OBJECTS:  # counted before they are walked: the stack stays bounded too
            raise TorchFileError(
                f"its containers expand to more than {MAX_OBJECTS} objects through shared references; refused"
            )


def _sha256(f: IO[bytes]) -> str:
    digest = hashlib.sha256()
    f.seek(0)
    for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _check_archive(f: IO[bytes], on_disk: int) -> bool:
    """Whether ``f`` is a zip archive; TorchFileError if its members declare more bytes than the file holds."""
    f.seek(0)
    if not zipfile.is_zipfile(f):
        return False
    f.seek(0)
    try:
        with zipfile.ZipFile(f) as archive:
            declared = sum(m.file_size for m in archive.infolist())
    except (zipfile.BadZipFile, ValueError, EOFError) as err:
        raise TorchFileError(f"a damaged zip archive ({err})") from None
    if declared > on_disk:
        raise TorchFileError(
            f"its members declare {human_bytes(declared)} uncompressed, more than the file's {human_bytes(on_disk)} "
            "(torch.save stores members uncompressed); refused before loading"
        )
    return True


def _unpickling_reason(f: IO[bytes], is_zip: bool, err: pickle.UnpicklingError) -> str:
    """Why the weights-only unpickler refused ``f``: pickled Python objects (named where we can), or no pickle."""
    f.seek(0)
    if not is_zip and f.read(1) != bytes([_PICKLE_PROTO]):
        return "not a PyTorch weights file (neither a zip archive nor a pickle)"
    needed = _needed_global(f, is_zip, str(err))
    what = f" (it needs {needed})" if needed else ""
    return (
        f"holds pickled Python objects{what}, which are never loaded (torch.load weights_only=True); save its "
        "tensors alone (a state dict) where you trust the file"
    )


def _needed_global(f: IO[bytes], is_zip: bool, message: str) -> str | None:
    """The Python object a refused pickle names: the first global of the archive's ``data.pkl`` that torch's
    weights-only unpickler does not allow (read with :mod:`pickletools`, which parses opcodes and runs nothing);
    failing that (a legacy file), the one torch's message names (``GLOBAL posix.system`` so far)."""
    if is_zip:
        try:
            f.seek(0)
            with zipfile.ZipFile(f) as archive:
                name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                data = archive.read(name) if name else b""
            allowed = _allowed_globals()
            strings: list[str] = []
            for opcode, arg, _ in pickletools.genops(data):
                if opcode.name == "GLOBAL":
                    module, _, attr = str(arg).partition(" ")
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    module, attr = strings[-2], strings[-1]
                else:
                    if isinstance(arg, str):
                        strings.append(arg)
                    continue
                if (module, attr) in _compat_pickle.NAME_MAPPING:  # protocol 2 writes Python 2 names, as
                    module, attr = _compat_pickle.NAME_MAPPING[(module, attr)]  # pickle's fix_imports reads them
                module = _compat_pickle.IMPORT_MAPPING.get(module, module)  # __builtin__ → builtins
                if f"{module}.{attr}" not in allowed and module.split(".")[0] != "torch":
                    return f"{module}.{attr}"
        except Exception:  # a damaged pickle: fall back on torch's words
            pass
    found = re.search(r"GLOBAL ([\w.]+)", message)
    return found[1] if found else None


def _allowed_globals() -> set[str]:
    """``module.name`` of the globals torch's weights-only unpickler allows (its own table where this torch has
    it, else those a file of tensors names besides torch's own)."""
    try:
        from torch import _weights_only_unpickler

        return set(_weights_only_unpickler._get_allowed_globals())
    except (ImportError, AttributeError, TypeError):
        return set(_TENSOR_GLOBALS)
