"""Average factors: how many positives a loss sum is divided by, clamped ≥ 1 and agreed across ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["average_factor"]


def average_factor(count: torch.Tensor | float, *, across_ranks: bool = True) -> torch.Tensor:
    """Mean of ``count`` over the ranks of the default process group (if any), clamped to ≥ 1.

    Stays on the device (an all-reduce, no host sync); with no initialised process group, or
    ``across_ranks=False``, it is just ``max(count, 1)``. Averaging over ranks is what the published
    heads do with their positive counts, so each rank divides by the same number.

    Args:
        count: 0-dim tensor (or number) of positives on this rank; under a process group a tensor on this rank's
            device (a number becomes a CPU tensor, which NCCL cannot all-reduce).
        across_ranks: average over the ranks of the default process group (False: this rank's count).

    Returns:
        0-dim fp32 tensor.
    """
    value = torch.as_tensor(count, dtype=torch.float32).clone()
    if across_ranks and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value = value / dist.get_world_size()
    return value.clamp(min=1.0)
