"""Host↔device transfer of a batch: every tensor of a nested structure moved, each once, without a blocking copy.

:func:`to_device` moves tensor by tensor, in the model's memory format. Every copy toward a device is issued
``non_blocking``: from pinned memory (a loader with ``pin_memory``) it runs asynchronously; from pageable memory
CUDA first stages the source on the host and returns without waiting for the device's queued work. Copies to the
CPU block (the host is about to read them). Objects that know how to move themselves
(:class:`drivetrain.data.Batch`, :class:`drivetrain.ragged.RaggedBatch`) are asked to, and copy each of their
tensors once (a ragged batch: its data, sizes and cached mask). On a CPU target nothing is copied.

:class:`PackedCopier` moves a whole structure in few copies (the ACCV-Lab batching helpers' packed copy:
published ×8.1 over blocking per-tensor ``.to()`` from pageable memory for 528 tensors of ~150 KB in all): the
small tensors are concatenated by dtype into one pinned staging buffer (one region per dtype, in decreasing
element size so each region starts at a multiple of its element size), and that buffer goes over in one
non-blocking copy; the outputs are typed views into the one device buffer. The host work is one pass over the
leaves in Python and, per dtype, one concatenation and one split into views in C++ (``flatten_dense_tensors`` /
``unflatten_dense_tensors``, as DDP's buckets use) — no Python step per tensor. Large tensors (``PACK_BELOW``
bytes and more) are pinned and copied one by one; a structure with fewer than ``PACK_MIN_LEAVES`` small tensors
has each copied on its own, non-blocking, as it is. Non-tensor leaves pass through. The copy is issued on the
caller's stream (or a given one); :class:`Transfer` is the handle: ``ready()`` asks the copy's event, ``get()``
makes the current stream wait for it and records the buffers on that stream (``record_stream``), so the caching
allocator does not hand them out while the consumer still reads them. Staging buffers come from PyTorch's caching
pinned allocator, which reuses them across batches once their copies have completed. Device→host (``to_host``) is
the same in reverse, into one pinned host buffer. On a given stream other than the caller's, a structure holding
device tensors (the sources of ``to_host``; for ``to_device``, tensors already on the device, e.g. a DALI batch's
images, which pass through to work the caller queues on that stream, as the prefetcher's transform) makes that
stream first wait for the caller's (which wrote them) and records them on it, so that stream reads them once
written and their blocks are not handed out before it has.

**The two thresholds, measured** (CPU, 2 cores, AMD EPYC, torch 2.13, one thread; the H200 run of ``bench copy``:
``benchmarks/results/copy-cuda.md``; the fits below: docs/benchmarks.md, ``copy``). Per-tensor
``.to(non_blocking=True)`` from pinned memory cost 6.85 µs of host time a tensor on the H200's host (3.615 ms for
528). The packed path's host work is the same code on any device: fitted over
4–528 tensors it costs 22.3 µs + 1.68 µs a tensor on this CPU; the previous packed path (reshape/split/view per
tensor in Python) cost 43 µs + 4.0 µs a tensor here and 4.305 ms for 528 on the H200, so that host runs this
code 2.0× slower. Packing wins where 2.0 × (22.3 + 1.68 n) < 6.85 n, from n ≈ 13 tensors, and for a host up to
2.2× slower from n ≈ 15.6: ``PACK_MIN_LEAVES`` = 16. A packed tensor costs two host copies of its bytes (its
group's concatenation, then the staging write): 0.6 µs more at 16 KB and 4.8 µs at 64 KB on this CPU, against
the 1.7 µs (6.85 / 2.0 − 1.68) that packing saves a tensor: they meet near 29 KB, ``PACK_BELOW`` = 32 KB. A
layout cache (per structure: groups, offsets) was measured and left out: the one Python pass that finds the
layout costs 0.19 µs a tensor, a cache key of dtypes and shapes 0.12 µs, and the views (0.93 µs a tensor in C++)
are new for every buffer. Grouping equal shapes (one view and ``unbind`` per shape) was 27 % faster at 528
tensors of 11 shapes and 32 % slower at 24 tensors, a collated batch's count: left out too.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from drivetrain.batch import ModelBatch
from drivetrain.ragged import RaggedBatch

__all__ = ["PACK_BELOW", "PACK_MIN_LEAVES", "PackedCopier", "Transfer", "flatten", "to_device"]

PACK_BELOW = 1 << 15  # bytes: smaller tensors are packed, larger ones copied on their own (module docstring)
PACK_MIN_LEAVES = 16  # fewer tensors to pack than this: each copied on its own (module docstring)


def to_device(batch: ModelBatch, device: torch.device | str, channels_last: str = "none") -> ModelBatch:
    """Move every tensor of a (nested) batch to ``device``, each once; 4-D/5-D float tensors get the memory format.

    Copies toward a device are non-blocking (asynchronous from pinned memory; see the module docstring), copies
    to the CPU block.

    Args:
        batch: a tensor, dict, list or tuple of them (nested), a :class:`~drivetrain.ragged.RaggedBatch`, an
            object with ``to(device)`` (``drivetrain.batch.Batch``), or any other value (returned as is).
        device: the target device.
        channels_last: ``"2d"`` puts 4-D float tensors in ``channels_last``, ``"3d"`` 5-D ones in
            ``channels_last_3d``; ``"none"`` keeps the layout. Tensors inside objects that move themselves keep
            theirs.

    Returns:
        The same structure with every tensor on ``device``.
    """
    device = torch.device(device)
    return _to_device(batch, device, device.type != "cpu", channels_last)


def _to_device(batch: ModelBatch, device: torch.device, non_blocking: bool, channels_last: str) -> ModelBatch:
    if isinstance(batch, torch.Tensor):
        out = batch.to(device, non_blocking=non_blocking)
        if out.is_floating_point() and channels_last == "2d" and out.dim() == 4:
            out = out.contiguous(memory_format=torch.channels_last)
        elif out.is_floating_point() and channels_last == "3d" and out.dim() == 5:
            out = out.contiguous(memory_format=torch.channels_last_3d)
        return out
    if isinstance(batch, dict):
        return {k: _to_device(v, device, non_blocking, channels_last) for k, v in batch.items()}
    if isinstance(batch, RaggedBatch):  # data, sizes and cached mask: one copy each
        return batch.to(device, non_blocking=non_blocking)
    if callable(getattr(batch, "to", None)):  # batch objects that move themselves (drivetrain.batch.Batch)
        return batch.to(device)
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(v, device, non_blocking, channels_last) for v in batch)
    return batch


# ------------------------------------------------------------------------------------------ structure
def flatten(structure: Any) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], Any]]:
    """The tensor leaves of a nested structure and a function that rebuilds it from new leaves.

    Walks tensors, dicts, lists, tuples (also named), dataclass instances (``Batch``; frozen ones too) and
    :class:`~drivetrain.ragged.RaggedBatch` (its data, sizes and cached mask); anything else is a leaf value
    passed through unchanged.

    Example:
        >>> leaves, rebuild = flatten({"a": torch.ones(2), "b": [torch.zeros(1), "text"]})
        >>> rebuild([t * 2 for t in leaves])["a"]
        tensor([2., 2.])
    """
    leaves: list[torch.Tensor] = []
    spec = _flatten(structure, leaves)
    return leaves, lambda new: _unflatten(spec, iter(new))


def _flatten(node: Any, leaves: list[torch.Tensor]) -> tuple:
    if isinstance(node, torch.Tensor):
        leaves.append(node)
        return ("tensor",)
    if isinstance(node, RaggedBatch):
        mask = node.cached_mask  # the cached mask travels too (else it is recomputed on the device)
        parts = (node.tensor, node.sizes) if mask is None else (node.tensor, node.sizes, mask)
        return ("ragged", node.ragged_dim, [_flatten(t, leaves) for t in parts])
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        names = [f.name for f in dataclasses.fields(node)]
        return ("dataclass", node, names, [_flatten(getattr(node, n), leaves) for n in names])
    if isinstance(node, dict):
        return ("dict", type(node), list(node), [_flatten(v, leaves) for v in node.values()])
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return ("namedtuple", type(node), [_flatten(v, leaves) for v in node])
    if isinstance(node, (list, tuple)):
        return ("sequence", type(node), [_flatten(v, leaves) for v in node])
    return ("value", node)


def _unflatten(spec: tuple, leaves: Iterator[torch.Tensor]) -> Any:
    kind = spec[0]
    if kind == "tensor":
        return next(leaves)
    if kind == "ragged":
        parts = [_unflatten(s, leaves) for s in spec[2]]
        return RaggedBatch.unchecked(parts[0], parts[1], spec[1], parts[2] if len(parts) == 3 else None)
    if kind == "dataclass":
        out = copy.copy(spec[1])
        for name, child in zip(spec[2], spec[3], strict=True):
            object.__setattr__(out, name, _unflatten(child, leaves))  # frozen dataclasses too
        return out
    if kind == "dict":
        return spec[1](zip(spec[2], (_unflatten(s, leaves) for s in spec[3]), strict=True))
    if kind == "namedtuple":
        return spec[1](*(_unflatten(s, leaves) for s in spec[2]))
    if kind == "sequence":
        return spec[1](_unflatten(s, leaves) for s in spec[2])
    return spec[1]


# ------------------------------------------------------------------------------------------ packed copy
class Transfer:
    """The handle of a :class:`PackedCopier` copy: the moved structure once the copy is done.

    Attributes:
        nbytes_packed: bytes that went in the one packed copy.
        num_packed: tensors in it.
        num_single: tensors copied on their own (large, below the copier's leaf count, or already on another
            device).
    """

    def __init__(
        self,
        structure: Any,
        event: torch.cuda.Event | None,
        buffers: list[torch.Tensor],
        stream: Any,
        *,
        host: bool = False,
        nbytes_packed: int = 0,
        num_packed: int = 0,
        num_single: int = 0,
    ) -> None:
        self._structure, self._event, self._buffers, self._stream, self._host = structure, event, buffers, stream, host
        self.nbytes_packed, self.num_packed, self.num_single = nbytes_packed, num_packed, num_single

    def ready(self) -> bool:
        """Whether the copy has finished (never blocks)."""
        return self._event is None or self._event.query()

    def get(self) -> Any:
        """The moved structure. Device targets: the current stream waits for the copy (no host sync) and the
        buffers are recorded on it. Host targets (``to_host``): waits on the host for the copy to land."""
        if self._event is not None:
            if self._host:
                self._event.synchronize()  # sync: host reads the copied values; the caller asked for them
            else:
                current = torch.cuda.current_stream(self._buffers[0].device) if self._buffers else None
                if current is not None and current != self._stream:
                    current.wait_event(self._event)
                    for buffer in self._buffers:
                        buffer.record_stream(current)
            self._event = None
        return self._structure


class PackedCopier:
    """Copy nested structures of tensors between host and ``device`` in one packed transfer (module docstring).

    Args:
        device: the device side of the copies.
        pack_below: tensors with fewer bytes than this are packed; larger ones are copied on their own.
        min_leaves: with fewer tensors to pack than this, every tensor is copied on its own (one non-blocking
            copy each), which costs less host time than packing so few.
        always: pack and copy even when ``device`` is the CPU (a copy of the structure; tests and the packing
            overhead benchmark). Without it a CPU target returns the input as it is.

    Example:
        >>> copier = PackedCopier(torch.device("cuda"))
        >>> handle = copier.to_device(batch)   # one pinned staging write per dtype, one non-blocking copy
        >>> batch = handle.get()               # the current stream waits for the copy
    """

    def __init__(
        self,
        device: torch.device | str,
        *,
        pack_below: int = PACK_BELOW,
        min_leaves: int = PACK_MIN_LEAVES,
        always: bool = False,
    ) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if pack_below < 0:
            raise ValueError(f"pack_below: must be ≥ 0 bytes, got {pack_below}")
        if min_leaves < 0:
            raise ValueError(f"min_leaves: must be ≥ 0 tensors, got {min_leaves}")
        self.pack_below, self.min_leaves, self.always = int(pack_below), int(min_leaves), bool(always)

    def to_device(self, structure: Any, stream: Any = None) -> Transfer:
        """Start copying every host tensor of ``structure`` to the device (on ``stream``, default: the current one);
        tensors already on the device pass through, and ``stream`` waits for the caller's stream that wrote them."""
        if self.device.type == "cpu" and not self.always:
            return Transfer(structure, None, [], None)
        return self._copy(structure, self.device, stream)

    def to_host(self, structure: Any, stream: Any = None) -> Transfer:
        """Start copying every device tensor of ``structure`` to pinned host memory; ``get()`` waits for it."""
        if self.device.type == "cpu" and not self.always:
            return Transfer(structure, None, [], None)
        return self._copy(structure, torch.device("cpu"), stream)

    def _copy(self, structure: Any, target: torch.device, stream: Any) -> Transfer:
        leaves, rebuild = flatten(structure)
        cuda = self.device.type == "cuda"
        source = torch.device("cpu") if target.type != "cpu" else self.device
        plan = _Plan(leaves, source, target, self.pack_below)
        alone: list[int] = []  # too few to pay for packing: the small ones each on their own, as they are
        if plan.num_packed < self.min_leaves:
            alone = [i for indices, _ in plan.groups.values() for i in indices] + plan.empty
            plan.groups, plan.order, plan.region_bytes, plan.empty, plan.num_packed, plan.nbytes = {}, [], [], [], 0, 0
        if cuda:
            current = torch.cuda.current_stream(self.device)
            stream = stream if stream is not None else current
            if stream != current:  # device tensors the caller's stream writes (a copy's sources to the host; tensors
                on_device = [leaf for leaf in leaves if leaf.is_cuda]  # already on the device, handed on as they are
                if on_device:  # to work queued on ``stream``): ``stream`` reads them after (no host sync), and their
                    stream.wait_stream(current)  # blocks stay theirs until it has, should the caller free them
                    for leaf in on_device:
                        leaf.record_stream(stream)
        out = list(leaves)
        buffers: list[torch.Tensor] = []
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
            if plan.nbytes:
                buffers.append(_pack(plan, source, target, out, cuda))
            for i in plan.empty:  # nothing to copy: a new empty tensor of the shape on the target
                out[i] = torch.empty(leaves[i].shape, dtype=leaves[i].dtype, device=target)
            for i in plan.single:  # large: pinned first (unless it is), so that its copy runs asynchronously
                tensor = leaves[i]
                if cuda and target.type != "cpu" and tensor.is_cpu and not tensor.is_pinned():
                    tensor = tensor.pin_memory()
                out[i] = tensor.to(target, non_blocking=cuda, copy=True)  # to the host: pinned (torch's _to_copy)
                buffers.append(out[i])
            for i in alone:  # small: a pageable one is staged by CUDA, cheaper than pinning it first
                out[i] = leaves[i].to(target, non_blocking=cuda, copy=True)
                buffers.append(out[i])
            event = None
            if cuda:
                event = torch.cuda.Event()
                event.record(stream)
        return Transfer(
            rebuild(out), event, [b for b in buffers if b.device.type == "cuda"], stream, host=target.type == "cpu",
            nbytes_packed=plan.nbytes, num_packed=plan.num_packed, num_single=len(plan.single) + len(alone),
        )  # fmt: skip


class _Plan:
    """Where each leaf of one copy goes, found in one pass over the leaves: packed (grouped by dtype, each group a
    region of the staging buffer), empty (nothing to copy), or on its own (large, or on a third device); leaves
    already on the target are in none of them and pass through.

    Attributes:
        groups: dtype → (the packed leaves' indices, the leaves), in order.
        order: the packed dtypes in the order of their regions in the staging buffer (decreasing element size).
        region_bytes: each region's bytes, in that order.
        empty: indices of the empty source tensors.
        single: indices of the tensors copied on their own.
        num_packed: packed and empty leaves (the leaves the packed transfer carries).
        nbytes: bytes of the staging buffer (the regions, back to back).
    """

    def __init__(self, leaves: list[torch.Tensor], source: torch.device, target: torch.device, pack_below: int):
        self.groups: dict[torch.dtype, tuple[list[int], list[torch.Tensor]]] = {}
        nbytes_of: dict[torch.dtype, int] = {}
        self.empty: list[int] = []
        self.single: list[int] = []
        from_host = source.type == "cpu"
        for i, t in enumerate(leaves):  # per leaf: attribute reads only (``t.device.type`` would cost 5× more)
            if t.is_cpu != from_host:
                if t.device != target:
                    self.single.append(i)  # on another device: copied as it is
                continue
            nbytes = t.nbytes
            if nbytes >= pack_below:
                if t.device != target:
                    self.single.append(i)
            elif nbytes == 0:
                self.empty.append(i)
            elif (dtype := t.dtype) in nbytes_of:
                nbytes_of[dtype] += nbytes
                indices, group = self.groups[dtype]
                indices.append(i)
                group.append(t)
            else:
                nbytes_of[dtype], self.groups[dtype] = nbytes, ([i], [t])
        # regions in decreasing element size: each starts at a multiple of its element size, with no padding
        self.order = sorted(nbytes_of, key=lambda dtype: -dtype.itemsize)
        self.region_bytes = [nbytes_of[dtype] for dtype in self.order]
        self.nbytes = sum(self.region_bytes)
        self.num_packed = sum(len(indices) for indices, _ in self.groups.values()) + len(self.empty)


def _pack(plan: _Plan, source: torch.device, target: torch.device, out: list[Any], cuda: bool) -> torch.Tensor:
    """Copy ``plan``'s groups over in one transfer; their outputs (typed views of the landed buffer) go into
    ``out``; returns the landed buffer. Host work per dtype, none per tensor in Python: one concatenation of the
    group (C++) and one split of its landed region into views (C++); one concatenation of the groups' bytes into
    the staging buffer."""
    flat = [_flatten_dense_tensors(plan.groups[dtype][1]).view(torch.uint8) for dtype in plan.order]  # (bytes,)
    staging = torch.empty(plan.nbytes, dtype=torch.uint8, device=source, pin_memory=cuda and source.type == "cpu")
    torch.cat(flat, out=staging)  # (nbytes,)
    landed = torch.empty(plan.nbytes, dtype=torch.uint8, device=target, pin_memory=cuda and target.type == "cpu")
    landed.copy_(staging, non_blocking=cuda)
    for dtype, region in zip(plan.order, landed.split(plan.region_bytes), strict=True):
        indices, group = plan.groups[dtype]
        for i, view in zip(indices, _unflatten_dense_tensors(region.view(dtype), group), strict=True):
            out[i] = view
    return landed
