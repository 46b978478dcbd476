"""Reductions over the ragged dim that ignore padding: ``sum``, ``mean``, ``fill_padding``.

Padding is replaced (``masked_fill``), never multiplied by zero, so NaN or inf in the padding cannot
leak into values or gradients. An empty sample sums to 0 and averages to 0, with zero gradient.
"""

from __future__ import annotations

import torch

from drivetrain.ragged.padded import RaggedBatch

__all__ = ["fill_padding", "mean", "sum"]


def _check(rb: RaggedBatch) -> None:
    if not isinstance(rb, RaggedBatch):
        raise TypeError(f"rb: expected a RaggedBatch, got {type(rb).__name__}")


def sum(rb: RaggedBatch) -> torch.Tensor:  # the ragged counterpart of torch.sum
    """Per-sample sum over the ragged dim.

    Args:
        rb: RaggedBatch ``(*batch, ..., S, ...)``.

    Returns:
        ``rb.tensor`` shape without the ragged dim, e.g. ``(L, B, D)`` for ``(L, B, G, D)``; integer
        and bool data sum to int64 as in ``torch.sum``.
    """
    _check(rb)
    return rb.tensor.masked_fill(~rb.broadcast_mask(), 0).sum(rb.ragged_dim)  # (*batch, ...)


def mean(rb: RaggedBatch) -> torch.Tensor:
    """Per-sample mean over the ragged dim; an empty sample gives 0 (never NaN, not in the gradient).

    Integer and bool data give ``torch.get_default_dtype()`` means.

    Example:
        >>> mean(RaggedBatch.from_list([torch.tensor([1.0, 3.0]), torch.zeros(0)]))
        tensor([2., 0.])
    """
    _check(rb)
    total = sum(rb)  # (*batch, ...)
    if not (total.is_floating_point() or total.is_complex()):
        total = total.to(torch.get_default_dtype())
    count = rb.sizes.clamp(min=1).to(total.dtype)  # (*batch,)
    return total / count.view(*count.shape, *([1] * (total.dim() - count.dim())))  # (*batch, ...)


def fill_padding(rb: RaggedBatch, value: float) -> RaggedBatch:
    """Copy of ``rb`` with every padding position set to ``value`` (zero gradient there)."""
    _check(rb)
    return rb.with_padding(value)
