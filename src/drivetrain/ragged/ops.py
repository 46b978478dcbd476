"""Batched, sync-free index ops on ragged batches: gather, scatter, write, map_pairs, mask_from_indices.

Every op here handles all samples of all batch dims in a fixed number of kernel launches, reads no
tensor values on the host, and is differentiable for floating data. Shapes use one glossary: ``*batch``
the batch dims (e.g. ``L, B``), ``N`` the indexed length, ``J`` the padded number of indices, ``*rest``
trailing data dims. Internally each op flattens to ``M = prod(batch)`` rows of ``R = prod(rest)``
elements and uses one ``index_select`` / ``index_copy_`` over the flat row space.

Valid indices lie in ``[-size, size)`` of their sample (its size for ragged data, ``N`` for a plain
tensor); negative indices count from the end of the sample, as in Python (``-1`` is the last valid entry).
Index padding is never read, whatever it holds.
Out-of-range indices raise ``IndexError`` naming the argument on the CPU (checked with no host sync). On a
GPU the check is a device-side assert enabled by :func:`drivetrain.ragged.set_device_checks` (off by
default, since it costs a few launches per op); without it an out-of-range index is undefined behaviour
(it may read a neighbouring sample's row), as in the per-sample CUDA kernels of other libraries.
"""

from __future__ import annotations

import math
from builtins import sum as builtins_sum

import torch

from drivetrain.ragged._checks import (
    assert_values,
    check_batch_shape,
    check_int_dtype,
    check_same_device,
    values_checked,
)
from drivetrain.ragged.padded import RaggedBatch, _normalize_ragged_dim, movedim

__all__ = ["as_index", "combine", "gather", "map_pairs", "mask_from_indices", "scatter", "write"]


def as_index(index: RaggedBatch | torch.Tensor, name: str = "index") -> RaggedBatch:
    """Validate an index argument; a plain ``(*batch, J)`` tensor counts as all-valid."""
    if isinstance(index, torch.Tensor):
        if index.dim() < 2:
            raise ValueError(f"{name}: a plain index tensor needs shape (*batch, J), got {tuple(index.shape)}")
        index = RaggedBatch.from_dense(index, num_batch_dims=index.dim() - 1)
    if not isinstance(index, RaggedBatch):
        raise TypeError(f"{name}: expected a RaggedBatch or tensor of indices, got {type(index).__name__}")
    check_int_dtype(index.tensor, name)
    if index.tensor.dim() != index.num_batch_dims + 1:
        raise ValueError(
            f"{name}: must have shape (*batch, J) with the ragged dim last, got {tuple(index.shape)} "
            f"with {index.num_batch_dims} batch dim(s)"
        )
    return index


def _source(
    data: RaggedBatch | torch.Tensor, num_batch_dims: int, dim: int | None, name: str
) -> tuple[torch.Tensor, int, torch.Tensor | int]:
    """Return (tensor, indexed dim, per-sample length limit) for a data argument."""
    if isinstance(data, RaggedBatch):
        if data.num_batch_dims != num_batch_dims:
            raise ValueError(f"{name}: has {data.num_batch_dims} batch dim(s), the index has {num_batch_dims}")
        if dim is not None and _normalize_ragged_dim(dim, num_batch_dims, data.tensor.dim(), "dim") != data.ragged_dim:
            raise ValueError(f"dim: {dim} differs from the ragged dim {data.ragged_dim} of {name}")
        return data.tensor, data.ragged_dim, data.sizes
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"{name}: expected a RaggedBatch or tensor, got {type(data).__name__}")
    if data.dim() <= num_batch_dims:
        raise ValueError(f"{name}: shape {tuple(data.shape)} has no dim to index after {num_batch_dims} batch dim(s)")
    dim = _normalize_ragged_dim(dim, num_batch_dims, data.dim(), "dim")
    return data, dim, data.shape[dim]


def _resolve(index: RaggedBatch, limit: torch.Tensor | int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the index range without a sync; return int64 indices with padding set to 0, and the padding.

    Returns:
        ``idx`` int64 ``(*batch, J)`` and ``invalid`` bool ``(*batch, J)`` (True at index padding).
    """
    valid = index.mask  # (*batch, J)
    invalid = ~valid  # (*batch, J)
    idx = index.tensor.long() * valid  # (*batch, J): padding -> 0 (a multiply is cheaper than masked_fill)
    bound = limit.unsqueeze(-1) if isinstance(limit, torch.Tensor) else limit  # (*batch, 1) or int
    idx = torch.where(idx < 0, idx + bound, idx)  # (*batch, J): negative indices count from the sample's end
    if values_checked(idx.device) and idx.numel() > 0:
        message = f"{name}: an index lies outside [-size, size) of its sample"
        if isinstance(limit, torch.Tensor):
            ok = ((idx >= 0) & (idx < bound) | invalid).all()
        elif limit == 0:
            ok = invalid.all()
        else:
            low, high = idx.aminmax()
            ok = (low >= 0) & (high < limit)
        assert_values(ok, IndexError, message)
    return idx, invalid


def _row_base(batch_shape: torch.Size, length: int, device: torch.device) -> torch.Tensor:
    """Offset of each sample's first row in the flat ``(M * length, R)`` view: ``(*batch, 1)``."""
    num_rows = math.prod(batch_shape)
    if length == 0:  # the arange below would be empty; every sample starts at row 0
        return torch.zeros(*batch_shape, 1, dtype=torch.int64, device=device)  # (*batch, 1)
    return torch.arange(0, num_rows * length, max(length, 1), device=device).view(*batch_shape, 1)  # (*batch, 1)


def _dump_rows(index: RaggedBatch, limit: torch.Tensor | int, length: int, name: str) -> tuple[torch.Tensor, int]:
    """Flat target rows ``(M*J,)`` of the indices in a ``(M * length + 1, R)`` buffer; padding → last row."""
    idx, invalid = _resolve(index, limit, name)  # (*batch, J)
    dump = math.prod(index.batch_shape) * length
    rows = (idx + _row_base(index.batch_shape, length, idx.device)).masked_fill_(invalid, dump)  # (*batch, J)
    return rows.view(-1), dump


def full_rows(like: torch.Tensor, num_rows: int, width: int, fill: float) -> torch.Tensor:
    """``(num_rows, width)`` of ``fill`` in ``like``'s dtype and device; zeros take the memset path (22 µs
    instead of 34 µs for 1.7 MB on the benchmark's CPU)."""
    if fill == 0:
        return like.new_zeros((num_rows, width))  # (T, R)
    return like.new_full((num_rows, width), fill)  # (T, R)


def empty_source_result(src: torch.Tensor, shape: tuple[int, ...], fill: float) -> torch.Tensor:
    """Output of an op whose source has no elements: all ``fill``, still linked to ``src`` in the graph
    (an all-zero gradient) so that a loss built only from it can call ``backward()``."""
    out = src.new_full(shape, fill)
    return out + src.sum().to(out.dtype) * 0 if src.requires_grad else out


def take_rows(flat: torch.Tensor, rows: torch.Tensor, invalid: torch.Tensor, fill: float | None) -> torch.Tensor:
    """``flat[rows]`` with ``fill`` where ``invalid`` (rows there must be in range; their value is unused).

    Args:
        flat: ``(T, R)`` source rows.
        rows: int64 ``(K,)`` row numbers.
        invalid: bool ``(K,)``.
        fill: value of invalid output rows; None leaves them as whatever row they point at.

    Returns:
        ``(K, R)``; differentiable w.r.t. ``flat``.
    """
    if fill is None:
        return flat.index_select(0, rows)  # (K, R)
    if not torch.compiler.is_compiling() and flat.shape[0] <= 8 * rows.shape[0]:
        # Filling the output costs ~10x a copy per element (eager CPU): cheaper to read padding from an extra
        # fill row. Not under torch.compile: the choice would be a guard on the (dynamic) lengths, and the
        # fill below fuses into the gather there. Both give the same values and gradients.
        extended = torch.cat([flat, flat.new_full((1, flat.shape[1]), fill)])  # (T+1, R)
        return extended.index_select(0, rows.masked_fill(invalid, flat.shape[0]))  # (K, R)
    return flat.index_select(0, rows).masked_fill_(invalid.unsqueeze(1), fill)  # (K, R)


def gather(
    data: RaggedBatch | torch.Tensor,
    index: RaggedBatch | torch.Tensor,
    fill: float | None = 0,
    *,
    dim: int | None = None,
) -> RaggedBatch:
    """Batched gather: ``out[b, j] = data[b, index[b, j]]`` for ``j < index.sizes[b]``, ``fill`` elsewhere.

    Args:
        data: ``(*batch, N, *rest)`` tensor (``N`` at ``dim``, default the first dim after the batch
            dims), or a RaggedBatch (indexed along its ragged dim; indices must be below its sizes).
        index: RaggedBatch of integers ``(*batch, J)``; a plain tensor counts as all-valid.
        fill: value at padding positions of the output; None leaves them unspecified (copies of the
            sample's first entry), which saves a pass over the output in hot code.
        dim: for a plain-tensor ``data``, the dim to index.

    Returns:
        RaggedBatch ``(*batch, J, *rest)`` (``J`` at ``dim``) sharing ``index``'s sizes. Gradients flow
        to ``data`` (accumulated over repeated indices).

    Example:
        >>> matched_pred = gather(pred_boxes, pred_index)  # (L, B, Q, D) at (L, B, G) -> (L, B, G, D)
    """
    return _gather(data, index, fill, dim, "data", "index")


def _gather(
    data: RaggedBatch | torch.Tensor,
    index: RaggedBatch | torch.Tensor,
    fill: float | None,
    dim: int | None,
    data_name: str,
    index_name: str,
) -> RaggedBatch:
    """:func:`gather`, with the argument names that its error messages use (``map_pairs`` passes its own)."""
    index = as_index(index, index_name)
    nb = index.num_batch_dims
    tensor, dim, limit = _source(data, nb, dim, data_name)
    check_batch_shape(tensor.shape[:nb], index.batch_shape, data_name, index_name)
    check_same_device(tensor, index.tensor, data_name, index_name)
    src = movedim(tensor, dim, nb)  # (*batch, N, *rest)
    rest = src.shape[nb + 1 :]
    num_rows, n, r = math.prod(index.batch_shape), src.shape[nb], math.prod(rest)
    idx, invalid = _resolve(index, limit, index_name)  # (*batch, J)
    out_shape = (*index.batch_shape, index.max_size, *rest)
    if n == 0 or num_rows == 0:
        out = empty_source_result(src, out_shape, 0 if fill is None else fill)  # (*batch, J, *rest)
    else:
        rows = (idx + _row_base(index.batch_shape, n, idx.device)).view(-1)  # (M*J,)
        out = take_rows(src.reshape(num_rows * n, r), rows, invalid.view(-1), fill).view(out_shape)
    return RaggedBatch.unchecked(movedim(out, nb, dim), index.sizes, dim, index.cached_mask)


def scatter(
    values: RaggedBatch | torch.Tensor,
    index: RaggedBatch | torch.Tensor,
    size: int,
    fill: float = 0,
    *,
    dim: int | None = None,
) -> torch.Tensor:
    """Inverse of :func:`gather` into a new tensor: ``out[b, index[b, j]] = values[b, j]`` for valid ``j``.

    Args:
        values: ``(*batch, J, *rest)`` tensor or RaggedBatch (``J`` at ``dim``; only the first
            ``index.sizes[b]`` entries of sample ``b`` are used).
        index: RaggedBatch of integers ``(*batch, J)`` in ``[-size, size)``. Within a sample, indices
            must be distinct; with duplicates one of the values lands (which one is unspecified).
        size: length ``N`` of the output's indexed dim.
        fill: value at positions no index points to.
        dim: for a plain-tensor ``values``, the dim holding ``J``.

    Returns:
        Tensor ``(*batch, N, *rest)`` (``N`` at ``dim``). Gradients flow to ``values``.
    """
    index = as_index(index)
    nb = index.num_batch_dims
    tensor, dim, _ = _source(values, nb, dim, "values")
    check_batch_shape(tensor.shape[:nb], index.batch_shape, "values", "index")
    check_same_device(tensor, index.tensor, "values", "index")
    if size < 0:
        raise ValueError(f"size: must be ≥ 0, got {size}")
    src = movedim(tensor, dim, nb)  # (*batch, J, *rest)
    if src.shape[nb] != index.max_size:
        raise ValueError(
            f"values: has length {src.shape[nb]} at dim {dim}, the index has padded length {index.max_size}"
        )
    rest = src.shape[nb + 1 :]
    num_rows, r = math.prod(index.batch_shape), math.prod(rest)
    rows, dump = _dump_rows(index, size, size, "index")  # (M*J,)
    out = full_rows(src, dump + 1, r, fill)  # (M*N + 1, R): last row takes the padding
    out.index_copy_(0, rows, src.reshape(num_rows * index.max_size, r))
    out = out[:dump].view(*index.batch_shape, size, *rest)  # (*batch, N, *rest)
    return movedim(out, nb, dim)


def write(
    into: RaggedBatch | torch.Tensor,
    index: RaggedBatch | torch.Tensor,
    values: RaggedBatch | torch.Tensor,
    *,
    dim: int | None = None,
) -> RaggedBatch | torch.Tensor:
    """Copy of ``into`` with ``into[b, index[b, j]] = values[b, j]`` for valid ``j``.

    Args:
        into: ``(*batch, N, *rest)`` tensor (``N`` at ``dim``) or RaggedBatch (written along its
            ragged dim; indices must be below its sizes).
        index: RaggedBatch of integers ``(*batch, J)``, distinct within a sample.
        values: ``(*batch, J, *rest)`` tensor or RaggedBatch of ``into``'s dtype, ``J`` at the same dim.
        dim: for a plain-tensor ``into``, the dim to write along.

    Returns:
        Same type and shape as ``into`` (a RaggedBatch keeps its sizes). Gradients flow to ``values``
        and to ``into`` (zero at the overwritten positions).
    """
    return _write(into, index, values, dim, "into", "index", "values")


def _write(
    into: RaggedBatch | torch.Tensor,
    index: RaggedBatch | torch.Tensor,
    values: RaggedBatch | torch.Tensor,
    dim: int | None,
    into_name: str,
    index_name: str,
    values_name: str,
) -> RaggedBatch | torch.Tensor:
    """:func:`write`, with the argument names that its error messages use (``map_pairs`` passes its own)."""
    index = as_index(index, index_name)
    nb = index.num_batch_dims
    target, dim, limit = _source(into, nb, dim, into_name)
    vals = values.tensor if isinstance(values, RaggedBatch) else values
    if not isinstance(vals, torch.Tensor):
        raise TypeError(f"{values_name}: expected a RaggedBatch or tensor, got {type(values).__name__}")
    check_batch_shape(target.shape[:nb], index.batch_shape, into_name, index_name)
    check_same_device(target, index.tensor, into_name, index_name)
    check_same_device(vals, target, values_name, into_name)
    if vals.dtype != target.dtype:
        raise ValueError(f"{values_name}: dtype {vals.dtype} differs from the dtype {target.dtype} of {into_name}")
    dst = movedim(target, dim, nb)  # (*batch, N, *rest)
    if vals.dim() != target.dim():
        raise ValueError(f"{values_name}: has {vals.dim()} dims, {into_name} has {target.dim()}")
    values_dim = values.ragged_dim if isinstance(values, RaggedBatch) else dim
    src = movedim(vals, values_dim, nb)  # (*batch, J, *rest)
    expected = (*index.batch_shape, index.max_size, *dst.shape[nb + 1 :])
    if tuple(src.shape) != expected:
        raise ValueError(
            f"{values_name}: shape {tuple(vals.shape)} (ragged dim moved to {nb}: {tuple(src.shape)}) does not "
            f"match {expected} = (batch, {index_name} padded length, data dims of {into_name})"
        )
    rest = dst.shape[nb + 1 :]
    num_rows, n, r = math.prod(index.batch_shape), dst.shape[nb], math.prod(rest)
    rows, dump = _dump_rows(index, limit, n, index_name)  # (M*J,)
    out = torch.cat([dst.reshape(dump, r), dst.new_zeros(1, r)])  # (M*N + 1, R)
    out.index_copy_(0, rows, src.reshape(num_rows * index.max_size, r))
    out = movedim(out[:dump].view(dst.shape), nb, dim)  # (*batch, N, *rest) with N at dim
    if isinstance(into, RaggedBatch):
        return into.with_tensor(out)
    return out


def map_pairs(
    src: RaggedBatch | torch.Tensor,
    src_index: RaggedBatch | torch.Tensor,
    dst_index: RaggedBatch | torch.Tensor,
    dst: RaggedBatch | torch.Tensor,
) -> RaggedBatch | torch.Tensor:
    """Copy of ``dst`` with ``dst[b, dst_index[b, j]] = src[b, src_index[b, j]]`` for valid pairs ``j``.

    Typical use: move matched ground truth into prediction slots (``src`` = GT ``(*batch, G, D)``,
    ``dst`` = targets ``(*batch, Q, D)``). Source indices may repeat; destination indices must be
    distinct within a sample. Both indices must have equal sizes (checked without a sync, see module).

    Returns:
        Same type as ``dst``; gradients flow to ``src`` and to ``dst`` (zero where overwritten).
    """
    src_index, dst_index = as_index(src_index, "src_index"), as_index(dst_index, "dst_index")
    check_batch_shape(src_index.batch_shape, dst_index.batch_shape, "src_index", "dst_index")
    if src_index.max_size != dst_index.max_size:
        raise ValueError(
            f"src_index: padded length {src_index.max_size} differs from {dst_index.max_size} of dst_index"
        )
    if src_index.sizes is not dst_index.sizes and values_checked(src_index.device):
        same = (src_index.sizes == dst_index.sizes).all()
        assert_values(same, ValueError, "src_index: sizes differ from the sizes of dst_index")
    gathered = _gather(src, src_index, None, None, "src", "src_index")  # (*batch, J, *rest); padding unwritten
    values = movedim(gathered.tensor, gathered.ragged_dim, _target_dim(dst, src_index))  # (*batch, J, *rest)
    return _write(dst, dst_index, values, None, "dst", "dst_index", "src")


def _target_dim(dst: RaggedBatch | torch.Tensor, index: RaggedBatch) -> int:
    if isinstance(dst, RaggedBatch):
        return dst.ragged_dim
    return index.num_batch_dims


def mask_from_indices(index: RaggedBatch | torch.Tensor, size: int) -> torch.Tensor:
    """Bool ``(*batch, size)``: True at ``index[b, j]`` for every valid ``j``.

    Example:
        >>> is_matched = mask_from_indices(pred_index, num_queries)  # (L, B, Q)
    """
    index = as_index(index)
    if size < 0:
        raise ValueError(f"size: must be ≥ 0, got {size}")
    rows, dump = _dump_rows(index, size, size, "index")  # (M*J,)
    out = torch.zeros(dump + 1, dtype=torch.bool, device=rows.device)  # (M*N + 1,)
    out.index_fill_(0, rows, True)
    return out[:dump].view(*index.batch_shape, size)  # (*batch, N)


def combine(parts: list[RaggedBatch], fill: float = 0) -> RaggedBatch:
    """Concatenate ragged batches sample by sample: sample ``b`` = valid entries of ``parts[0][b]``,
    then of ``parts[1][b]``, ... (e.g. matches of the denoising queries after the regular ones).

    Sync-free: the output's padded length is the sum of the inputs' padded lengths (known from shapes).

    Args:
        parts: RaggedBatches with one batch shape, ragged dim, dtype, device and data dims.
        fill: value at the output's padding positions.

    Returns:
        RaggedBatch ``(*batch, sum S_k, *rest)`` with sizes ``sum_k parts[k].sizes``.
    """
    if not parts:
        raise ValueError("parts: needs at least one RaggedBatch")
    first = parts[0]
    for k, part in enumerate(parts):
        if not isinstance(part, RaggedBatch):
            raise TypeError(f"parts[{k}]: expected a RaggedBatch, got {type(part).__name__}")
        check_batch_shape(part.batch_shape, first.batch_shape, f"parts[{k}]", "parts[0]")
        check_same_device(part.tensor, first.tensor, f"parts[{k}]", "parts[0]")
        same_layout = part.ragged_dim == first.ragged_dim and part.dtype == first.dtype
        data_dims = [s for d, s in enumerate(part.shape) if d != part.ragged_dim]
        if not same_layout or data_dims != [s for d, s in enumerate(first.shape) if d != first.ragged_dim]:
            raise ValueError(
                f"parts[{k}]: shape {tuple(part.shape)}, ragged dim {part.ragged_dim}, dtype {part.dtype} "
                f"do not line up with parts[0] ({tuple(first.shape)}, {first.ragged_dim}, {first.dtype})"
            )
    dim = first.ragged_dim
    total_len = builtins_sum(part.max_size for part in parts)
    shape = list(first.shape)
    shape[dim] = total_len
    out: torch.Tensor = first.tensor.new_full(shape, fill)  # (*batch, sum S_k, *rest)
    offset = torch.zeros_like(first.sizes)  # (*batch,)
    for part in parts:
        positions = torch.arange(part.max_size, device=offset.device)  # (S_k,)
        index = RaggedBatch.unchecked(
            offset.unsqueeze(-1) + positions, part.sizes, part.num_batch_dims, part.cached_mask
        )
        out = write(out, index, part.tensor, dim=dim)  # (*batch, sum S_k, *rest)
        offset = offset + part.sizes  # (*batch,)
    return RaggedBatch.unchecked(out, offset, dim)
