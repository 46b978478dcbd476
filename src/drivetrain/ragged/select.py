"""Compacting selection: keep the masked entries of each sample, packed to the front.

The output's padded length is the longest selection, a value only the device knows. With ``trim=True``
these ops therefore read it back (**one host sync**); with ``trim=False`` they keep the input's padded
length and never sync, which is what hot code should use.
"""

from __future__ import annotations

import math

import torch

from drivetrain.ragged._checks import check_batch_shape, check_same_device
from drivetrain.ragged.ops import empty_source_result, full_rows
from drivetrain.ragged.padded import RaggedBatch, _normalize_ragged_dim, movedim

__all__ = ["indices_from_mask", "select"]


def _mask_tensor(mask: RaggedBatch | torch.Tensor) -> torch.Tensor:
    if isinstance(mask, RaggedBatch):
        if mask.tensor.dim() != mask.num_batch_dims + 1:
            raise ValueError(f"mask: must have shape (*batch, N), got {tuple(mask.shape)}")
        if mask.dtype != torch.bool:
            raise ValueError(f"mask: must be bool, got {mask.dtype}")
        return mask.tensor & mask.mask  # (*batch, N): padding counts as not selected
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask: must be a bool tensor of shape (*batch, N), got {got}")
    if mask.dim() < 2:
        raise ValueError(f"mask: needs shape (*batch, N) with at least one batch dim, got {tuple(mask.shape)}")
    return mask


def select(
    data: RaggedBatch | torch.Tensor,
    mask: RaggedBatch | torch.Tensor,
    *,
    ragged_dim: int | None = None,
    trim: bool = True,
    fill: float = 0,
) -> RaggedBatch:
    """Per-sample boolean selection, compacted: sample ``b`` keeps ``data[b][mask[b]]`` in order.

    Args:
        data: ``(*batch, N, *rest)`` tensor (``N`` at ``ragged_dim``, default the first dim after the
            batch dims) or RaggedBatch (its padding is never selected).
        mask: bool ``(*batch, N)`` (or a RaggedBatch of bools; its padding counts as False).
        ragged_dim: the dim of ``data`` that ``mask`` selects along, for a plain tensor ``data``.
        trim: cut the padded length to the longest selection. **Synchronises with the device once**
            (the length is data-dependent). ``trim=False`` keeps length ``N`` and never syncs.
        fill: value at the output's padding positions.

    Returns:
        RaggedBatch ``(*batch, K, *rest)`` with sizes ``mask.sum(-1)``; gradients flow to ``data``.

    Example:
        >>> positives = select(pred_logits, is_matched, trim=False)  # no sync
    """
    m = _mask_tensor(mask)  # (*batch, N)
    nb = m.dim() - 1
    if isinstance(data, RaggedBatch):
        if data.num_batch_dims != nb:
            raise ValueError(f"data: has {data.num_batch_dims} batch dim(s), mask has {nb}")
        tensor, dim = data.tensor, data.ragged_dim
        m = m & data.mask  # (*batch, N)
    elif isinstance(data, torch.Tensor):
        tensor = data
        if tensor.dim() <= nb:
            raise ValueError(f"data: shape {tuple(tensor.shape)} has no dim after {nb} batch dim(s)")
        dim = _normalize_ragged_dim(ragged_dim, nb, tensor.dim())
    else:
        raise TypeError(f"data: expected a RaggedBatch or tensor, got {type(data).__name__}")
    check_batch_shape(tensor.shape[:nb], m.shape[:nb], "data", "mask")
    check_same_device(tensor, m, "data", "mask")
    n = tensor.shape[dim]
    if m.shape[-1] != n:
        raise ValueError(f"mask: length {m.shape[-1]} differs from length {n} of data dim {dim}")
    src = movedim(tensor, dim, nb)  # (*batch, N, *rest)
    rest = src.shape[nb + 1 :]
    dest, counts, k = _destinations(m, trim)  # (M*N,), (*batch,)
    num_rows, r = math.prod(m.shape[:-1]), math.prod(rest)
    out_shape = (*m.shape[:-1], k, *rest)
    if n == 0 or num_rows == 0:
        out = empty_source_result(src, out_shape, fill)  # (*batch, K, *rest)
    else:
        # One pass that writes each selected row to its slot; the others land on a dump row. Reading the slots'
        # sources instead (a gather) needs the order of the selection as another (*batch, N) buffer and a
        # separate pass for the fill: more large temporaries, whose first touch costs page faults on the CPU.
        out = full_rows(src, num_rows * k + 1, r, fill)  # (M*K + 1, R): the last row takes the unselected
        out.index_copy_(0, dest, src.reshape(num_rows * n, r))
        out = out[: num_rows * k].view(out_shape)  # (*batch, K, *rest)
    return RaggedBatch.unchecked(movedim(out, nb, dim), counts, dim)


def _destinations(m: torch.Tensor, trim: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Output row of every entry in the flat ``(M*K + 1, ·)`` layout: selected entries go to the front of
    their sample's ``K`` slots, in order; the others to the dump row ``M*K``.

    Args:
        m: bool ``(*batch, N)``.
        trim: cut ``K`` to the largest count instead of ``N``.

    Returns:
        ``dest`` int64 ``(M*N,)``, ``counts`` int64 ``(*batch,)``, and ``K``: ``N``, or the largest count
        when ``trim`` (one sync).
    """
    n, num_rows = m.shape[-1], math.prod(m.shape[:-1])
    taken = m.cumsum(-1)  # (*batch, N): selected entries up to and including each position
    counts = taken[..., -1].clone() if n > 0 else taken.new_zeros(m.shape[:-1])  # (*batch,)
    k = n
    if trim:
        k = int(counts.max().item()) if counts.numel() > 0 else 0  # sync: trimmed length is data-dependent
    if k == 0 or num_rows == 0:
        return taken.new_full((num_rows * n,), num_rows * k), counts, k  # (M*N,): nothing is selected
    start = torch.arange(-1, num_rows * k - 1, k, device=m.device).view(*m.shape[:-1], 1)  # (*batch, 1)
    dest = torch.where(m, taken.add_(start), num_rows * k)  # (*batch, N)
    return dest.view(-1), counts, k  # (M*N,)


def indices_from_mask(mask: RaggedBatch | torch.Tensor, *, trim: bool = True) -> RaggedBatch:
    """Positions of the True entries of each sample, as int64 RaggedBatch ``(*batch, K)``.

    With ``trim=True`` this **synchronises with the device once** (see :func:`select`).

    Example:
        >>> indices_from_mask(torch.tensor([[True, False, True], [False, False, False]])).to_list()
        [tensor([0, 2]), tensor([], dtype=torch.int64)]
    """
    m = _mask_tensor(mask)  # (*batch, N)
    dest, counts, k = _destinations(m, trim)  # (M*N,), (*batch,)
    num_rows, n = math.prod(m.shape[:-1]), m.shape[-1]
    positions = torch.arange(n, device=m.device).expand(m.shape).reshape(-1)  # (M*N,)
    out = positions.new_zeros(num_rows * k + 1)  # (M*K + 1,): padding 0, the last entry takes the unselected
    out.index_copy_(0, dest, positions)
    return RaggedBatch.unchecked(out[: num_rows * k].view(*m.shape[:-1], k), counts, m.dim() - 1)
