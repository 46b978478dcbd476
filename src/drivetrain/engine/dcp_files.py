"""Model and optimizer state as ``torch.distributed.checkpoint`` (DCP) shards, read as data, never as code.

A sharded checkpoint keeps its tensors in ``step-N/weights/`` — each rank writes the shards it holds
(``__<rank>_<n>.distcp``, what DCP's ``FileSystemWriter`` writes: one ``torch.save`` of each tensor, back to back),
and the coordinator (rank 0) writes the index ``.metadata.json``. DCP reshards on load: a checkpoint written by
2 FSDP ranks loads into 1 process, or into DDP, each rank reading only the slices its own tensors need.

What DCP does that this module does not:

- DCP's ``.metadata`` is a pickle, and so are its non-tensor ("bytes") items; unpickling a file someone handed you
  runs their code. :func:`json_writer` writes the index as JSON instead and :func:`json_reader` parses it as JSON
  (:func:`metadata_from_json`: every field's type checked, file names plain ``__R_N.distcp`` names of the folder,
  tensor entries only), so nothing read from a checkpoint reaches ``pickle``: the tensors themselves are read by
  DCP with ``torch.load(weights_only=True)``.
- Only tensors go to DCP: :func:`split_tensors` takes the tensors out of a nested state dict (keys
  ``<component>/<path>/<to>/<tensor>``) and leaves a skeleton — the dict with ``{"__dcp_tensor__": key}`` where
  each tensor was — that the checkpoint's small ``state.pt`` holds (plain data, ``weights_only``-safe);
  :func:`join_tensors` puts them back.

:func:`stage` copies tensors off the live ones (for an asynchronous save, which writes while training goes on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from drivetrain.safeio import json_files
from drivetrain.safeio.reads import read_text

__all__ = [
    "INDEX",
    "SHARDS",
    "TENSOR_REF",
    "ShardError",
    "Shards",
    "allocate",
    "index_of",
    "join_tensors",
    "json_reader",
    "json_writer",
    "metadata_from_json",
    "metadata_to_json",
    "read_full",
    "read_into",
    "shard_keys",
    "split_tensors",
    "stage",
    "write_shards",
]

SHARDS = "weights"  # a checkpoint's folder of DCP shards
INDEX = ".metadata.json"  # the shards' index (DCP's metadata, as JSON)
TENSOR_REF = "__dcp_tensor__"  # a skeleton's placeholder key: {TENSOR_REF: key}
INDEX_FORMAT = "drivetrain-dcp-json-1"
MAX_INDEX_BYTES = 256 << 20  # an index is ~200 bytes per tensor chunk
_SHARD_NAME = re.compile(r"^__\d+_\d+\.distcp$")


@dataclasses.dataclass
class Shards:
    """A component's state that stays in a checkpoint's shards until it is loaded into live tensors (the model or
    the optimizer of a resumed run: each rank reads what its own tensors hold; :func:`read_into`).

    Args:
        folder: the checkpoint's shard folder (its files verified against the ``COMMITTED`` marker).
        skeleton: the component's state with ``{TENSOR_REF: key}`` for each tensor (:func:`split_tensors`).
    """

    folder: Path
    skeleton: Any

    def __contains__(self, key: object) -> bool:
        return isinstance(self.skeleton, Mapping) and key in self.skeleton


class ShardError(ValueError):
    """A sharded checkpoint's index or shards are not what this module writes (one line, naming the file)."""


# ---------------------------------------------------------------------------------------------- tensors out and in
def split_tensors(obj: Any, prefix: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """Take the tensors out of nested dicts/lists/tuples ``obj``.

    Args:
        obj: a state dict (model or optimizer; DTensors count as tensors).
        prefix: the first part of every key (the component's name).

    Returns:
        ``(skeleton, tensors)``: ``obj`` with each tensor replaced by ``{TENSOR_REF: key}``, and the tensors by key.
    """
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, key: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[key] = node
            return {TENSOR_REF: key}
        if isinstance(node, Mapping):
            return {k: walk(v, f"{key}/{k}") for k, v in node.items()}
        if isinstance(node, list | tuple):
            return type(node)(walk(v, f"{key}/{i}") for i, v in enumerate(node))
        return node

    return walk(obj, prefix), tensors


def shard_keys(skeleton: Any) -> list[str]:
    """The tensor keys a skeleton of :func:`split_tensors` refers to, in order."""
    keys: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if set(node) == {TENSOR_REF}:
                keys.append(node[TENSOR_REF])
                return
            for v in node.values():
                walk(v)
        elif isinstance(node, list | tuple):
            for v in node:
                walk(v)

    walk(skeleton)
    return keys


def join_tensors(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The state dict a skeleton of :func:`split_tensors` was made from, its tensors from ``tensors``."""

    def walk(node: Any) -> Any:
        if isinstance(node, Mapping):
            if set(node) == {TENSOR_REF}:
                return tensors[node[TENSOR_REF]]
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return type(node)(walk(v) for v in node)
        return node

    return walk(skeleton)


def stage(tensors: Mapping[str, torch.Tensor], into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Copies of ``tensors`` on the CPU that training no longer touches (a DTensor stays a DTensor of its copied
    local shard): what an asynchronous save writes while the optimizer updates the originals in place.

    Args:
        tensors: the live tensors, by key.
        into: earlier copies, by key, reused where shape and dtype match (a fresh allocation of hundreds of MB costs
            more than the copy: page faults); updated with the copies made.

    Returns:
        The copies, by key.
    """
    from torch.distributed.tensor import DTensor

    into = {} if into is None else into
    staged: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        local = t.to_local() if isinstance(t, DTensor) else t
        old = into.get(key)
        old_local = old.to_local() if isinstance(old, DTensor) else old
        if (
            old_local is not None
            and isinstance(old, DTensor) == isinstance(t, DTensor)
            and old.shape == t.shape
            and old_local.shape == local.shape
            and old_local.dtype == local.dtype
        ):
            old_local.copy_(local.detach())
            staged[key] = old
        else:
            # A DTensor's .to() copies its local shard and keeps its spec; DTensor.from_local would move a CPU copy to
            # the mesh's device type (under FSDP on CUDA, back onto a GPU: the current one, cuda:0 in the background
            # thread of every rank).
            staged[key] = t.detach().to("cpu", copy=True)
        into[key] = staged[key]
    return staged


# ---------------------------------------------------------------------------------------------- the JSON index
def metadata_to_json(metadata: Any) -> dict[str, Any]:
    """DCP's ``Metadata`` of tensors as plain JSON data (its ``planner_data`` is None: the state dict is flat)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    tensors = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            raise ShardError(f"{fqn}: not a tensor; only tensors are written as shards")
        tensors[fqn] = {
            "dtype": str(md.properties.dtype).removeprefix("torch."),
            "size": list(md.size),
            "chunks": [[list(c.offsets), list(c.sizes)] for c in md.chunks],
        }
    storage = []
    for index, info in (metadata.storage_data or {}).items():
        if info.transform_descriptors:
            raise ShardError(f"{index.fqn}: stream transforms are not written")
        offset = None if index.offset is None else list(index.offset)
        storage.append([index.fqn, offset, index.index, info.relative_path, info.offset, info.length])
    return {"format": INDEX_FORMAT, "version": metadata.version, "tensors": tensors, "storage": storage}


def _ints(value: Any, what: str, where: object) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ShardError(f"{where}: {what} is not a list of non-negative integers")
    return value


def metadata_from_json(data: Any, where: object) -> Any:
    """DCP's ``Metadata`` from :func:`metadata_to_json`'s data, every field checked.

    Raises:
        ShardError: anything else (another format, a non-tensor entry, an unknown dtype, a file that is not a
            plain shard name of the folder, a negative or non-integer offset); one line naming ``where``.
    """
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
        raise ShardError(f"{where}: not a drivetrain shard index (format {INDEX_FORMAT!r} expected)")
    tensors, storage, version = data.get("tensors"), data.get("storage"), data.get("version")
    if not isinstance(tensors, dict) or not isinstance(storage, list) or not isinstance(version, str | None):
        raise ShardError(f"{where}: malformed shard index (needs tensors, storage and version)")
    state_md = {}
    for fqn, md in tensors.items():
        if not isinstance(md, dict) or not isinstance(md.get("dtype"), str) or not isinstance(md.get("chunks"), list):
            raise ShardError(f"{where}: entry {fqn!r} is not a tensor entry (dtype, size, chunks)")
        dtype = getattr(torch, md["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ShardError(f"{where}: entry {fqn!r} has no dtype of torch ({md['dtype']!r})")
        chunks = []
        for chunk in md["chunks"]:
            if not isinstance(chunk, list) or len(chunk) != 2:
                raise ShardError(f"{where}: entry {fqn!r} has a malformed chunk")
            offsets, sizes = _ints(chunk[0], f"{fqn!r} chunk offsets", where), _ints(chunk[1], "chunk sizes", where)
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)))
        size = torch.Size(_ints(md.get("size"), f"{fqn!r} size", where))
        state_md[fqn] = TensorStorageMetadata(properties=TensorProperties(dtype=dtype), size=size, chunks=chunks)
    storage_md = {}
    for row in storage:
        if not isinstance(row, list) or len(row) != 6 or not isinstance(row[0], str) or not isinstance(row[3], str):
            raise ShardError(f"{where}: malformed storage entry")
        fqn, offset, index, file, at, length = row
        if fqn not in state_md:
            raise ShardError(f"{where}: storage entry for {fqn!r}, which the index does not list")
        if _SHARD_NAME.match(file) is None:
            raise ShardError(f"{where}: storage entry names {file!r}, not a shard file of the folder")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
            raise ShardError(f"{where}: storage entry index of {fqn!r} is not an integer")
        at, length = _ints([at, length], f"{fqn!r} storage offset and length", where)
        key = MetadataIndex(fqn, None if offset is None else torch.Size(_ints(offset, "offset", where)), index)
        storage_md[key] = _StorageInfo(relative_path=file, offset=at, length=length)
    return Metadata(state_dict_metadata=state_md, storage_data=storage_md, storage_meta=StorageMeta(), version=version)


@functools.cache
def _json_writer_class() -> type:
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

    class JsonWriter(FileSystemWriter):
        """DCP's ``FileSystemWriter`` (one file per rank, fsynced) whose index is ``.metadata.json``, not a pickle;
        ``files``: the shard files this rank wrote."""

        def __init__(self, path: Path) -> None:
            super().__init__(path, single_file_per_rank=True, sync_files=True, overwrite=False)
            self.files: list[str] = []

        def write_data(self, plan: Any, planner: Any) -> Any:
            future = super().write_data(plan, planner)
            self.files = sorted({result.storage_data.relative_path for result in future.value()})
            return future

        def finish(self, metadata: Any, results: Any) -> None:
            storage = {}
            for rank_results in results:
                storage.update({r.index: r.storage_data for r in rank_results})
            metadata = dataclasses.replace(metadata, storage_data=storage, version=CURRENT_DCP_VERSION)
            text = json.dumps(metadata_to_json(metadata))
            tmp = Path(self.path) / f"{INDEX}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, Path(self.path) / INDEX)

    return JsonWriter


@functools.cache
def _json_reader_class() -> type:
    from torch.distributed.checkpoint import FileSystemReader

    class JsonReader(FileSystemReader):
        """DCP's ``FileSystemReader`` that reads ``.metadata.json`` (:func:`metadata_from_json`); never a pickle."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = Path(self.path) / INDEX
            try:
                data = json_files.loads(read_text(path, limit=MAX_INDEX_BYTES, what="a shard index may hold"))
            except (OSError, ValueError) as err:
                reason = err.strerror if isinstance(err, OSError) and err.strerror else err
                raise ShardError(f"{path}: unreadable shard index ({reason})") from None
            metadata = metadata_from_json(data, path)
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return JsonReader


def json_writer(folder: Path) -> Any:
    """A DCP storage writer into ``folder`` that writes the index as JSON (``.files``: this rank's shard files)."""
    return _json_writer_class()(folder)


def json_reader(folder: Path) -> Any:
    """A DCP storage reader of ``folder`` that parses the index as JSON and unpickles nothing."""
    return _json_reader_class()(folder)


# ---------------------------------------------------------------------------------------------- save and load
def _planners() -> tuple[Any, Any]:
    from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner

    # A tensor every rank holds (DDP's parameters and buffers, FSDP's buffers) is written by rank 0: the copy DDP
    # broadcasts at the next forward, where the ranks' buffers differ after the last one (BatchNorm statistics).
    save = DefaultSavePlanner(flatten_state_dict=False, dedup_save_to_lowest_rank=True)
    return save, DefaultLoadPlanner(flatten_state_dict=False)


@contextlib.contextmanager
def _one_process(no_dist: bool) -> Iterator[None]:
    """DCP warns that it "assumes the intent" of a single process when there is no process group: it is ours."""
    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def write_shards(folder: Path, tensors: Mapping[str, torch.Tensor], group: Any = None) -> list[str]:
    """Write ``tensors`` (flat, by key) into ``folder`` with DCP: collective over ``group`` (every rank its shards,
    rank 0 the index); without a process group, one process writes all. Returns the files this rank wrote."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    writer = json_writer(folder)
    no_dist = not (dist.is_available() and dist.is_initialized())
    with _one_process(no_dist):
        dcp.save(dict(tensors), storage_writer=writer, planner=_planners()[0], process_group=group, no_dist=no_dist)
    return list(writer.files)


def index_of(folder: Path) -> Any:
    """The checked DCP ``Metadata`` of the shards in ``folder`` (raises ShardError)."""
    return json_reader(folder).read_metadata()


def read_into(folder: Path, templates: Mapping[str, torch.Tensor], group: Any = None) -> None:
    """Load the shards of ``folder`` into ``templates`` in place (collective over ``group``; DCP reshards: each rank
    reads the slices its tensors, or DTensor shards, cover). Raises ShardError for a key or shape the index lacks
    or holds otherwise (one line)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    index = index_of(folder)
    saved = index.state_dict_metadata
    for key, t in templates.items():
        if key not in saved:
            raise ShardError(f"{folder}: no tensor {key!r}, which this run loads")
        if tuple(saved[key].size) != tuple(t.shape):
            raise ShardError(f"{folder}: {key!r} has shape {tuple(saved[key].size)}, this run's {tuple(t.shape)}")
    extra = [key for key in saved if key not in templates]
    if extra:
        raise ShardError(f"{folder}: holds {extra[0]!r}, which this run has no tensor for")
    no_dist = not (dist.is_available() and dist.is_initialized())
    with _one_process(no_dist):
        dcp.load(dict(templates), storage_reader=json_reader(folder), planner=_planners()[1], process_group=group,
                 no_dist=no_dist)  # fmt: skip


def allocate(folder: Path, keys: list[str]) -> dict[str, torch.Tensor]:
    """New whole tensors of the saved shape and dtype for ``keys`` of the shards in ``folder``: templates for what
    the checkpoint's state holds and this run's live state lacks (a module's extra state whose tensors exist only
    once it ran, such as a memory that is empty before the first step). A key the index lacks is left out
    (:func:`read_into` names it); declared sizes beyond the shard files' bytes are one ShardError line."""
    metadata = index_of(folder).state_dict_metadata
    found = [key for key in keys if key in metadata]
    declared = sum(math.prod(metadata[k].size) * metadata[k].properties.dtype.itemsize for k in found)
    held = sum(path.stat().st_size for path in folder.glob("*.distcp"))
    if declared > held:
        raise ShardError(
            f"{folder}: its index declares {declared} bytes of tensors beyond this run's, the shards hold {held}"
        )
    return {key: torch.empty(tuple(metadata[key].size), dtype=metadata[key].properties.dtype) for key in found}


def read_full(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the shards of ``folder``, whole, in this process (no process group involved)."""
    import torch.distributed.checkpoint as dcp

    index = index_of(folder)
    tensors = {key: torch.empty(tuple(md.size), dtype=md.properties.dtype) for key, md in
               index.state_dict_metadata.items()}  # fmt: skip
    with _one_process(True):
        dcp.load(tensors, storage_reader=json_reader(folder), planner=_planners()[1], no_dist=True)
    return tensors
