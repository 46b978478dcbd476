"""Small constant tensors (code weights, image sizes, ranges) on a device, copied there once per process.

``torch.tensor(values, device="cuda")`` copies from pageable host memory, which waits for the stream: a host
sync in every call of a hot path (CUDA's sync debug mode reports it). :func:`constant` makes the copy once per
``(values, dtype, device)`` and hands back the cached tensor afterwards, so from the second step on a loss or
decoder that needs a handful of numbers on the device costs no sync at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

__all__ = ["constant"]


def constant(values: float | Sequence[float], *, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """The tensor of ``values`` on ``device``, shared between callers: never write to it.

    Args:
        values: a number or a flat sequence of numbers.
        dtype: dtype of the result.
        device: where the result lives; the first call per device copies (a sync on CUDA), later ones don't.

    Returns:
        ``()`` or ``(len(values),)`` tensor without autograd history, read-only by contract: every caller
        of the same values shares it.
    """
    key = tuple(float(v) for v in values) if isinstance(values, Sequence) else float(values)
    if torch.compiler.is_compiling():  # a compiled graph holds its constants itself
        return torch.tensor(key, dtype=dtype, device=device)
    return _cached(key, dtype, torch.device(device))


@lru_cache(maxsize=256)
def _cached(values: float | tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)
