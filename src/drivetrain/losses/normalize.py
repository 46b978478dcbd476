"""Average factors: how many positives a loss sum is divided by, clamped ≥ 1 and agreed across ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["average_factor"]


def average_factor(
    count: torch.Tensor | float, *, across_ranks: bool = True, device: torch.device | None = None
) -> torch.Tensor:
    """Mean of ``count`` over the ranks of the default process group (if any), clamped to ≥ 1.

    Stays on the device (an all-reduce, no host sync); with no initialised process group, or
    ``across_ranks=False``, it is just ``max(count, 1)``. Averaging over ranks is what the published
    heads do with their positive counts, so each rank divides by the same number.

    Args:
        count: 0-dim tensor (or number) of positives on this rank.
        across_ranks: average over the ranks of the default process group (False: this rank's count).
        device: where a number is all-reduced (default the CPU): the predictions' device, as the originals'
            ``cls_scores.new_tensor`` before ``reduce_mean``; under NCCL this rank's GPU, since NCCL all-reduces no
            CPU tensor ("No backend type associated with device type cpu"). With nothing to average over, a number
            stays a host scalar (no copy to the device, which a GPU would wait for).

    Returns:
        0-dim fp32 tensor.
    """
    value = torch.as_tensor(count, dtype=torch.float32).clone()
    if across_ranks and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        if device is not None and not isinstance(count, torch.Tensor):
            value = value.to(device)
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value = value / dist.get_world_size()
    return value.clamp(min=1.0)
