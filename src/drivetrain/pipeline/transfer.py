"""Host→device transfer of a batch: every tensor of a nested structure moved, in the model's memory format.

Tensors copied from pinned memory go asynchronously (``non_blocking``); objects that know how to move
themselves (:class:`drivetrain.data.Batch`, :class:`drivetrain.ragged.RaggedBatch`) are asked to. On a CPU
target nothing is copied: ``Tensor.to`` returns the tensor itself.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["to_device"]


def to_device(batch: Any, device: torch.device, channels_last: str = "none") -> Any:
    """Move every tensor of a (nested) batch to ``device``; 4-D/5-D float tensors get the memory format.

    Args:
        batch: a tensor, dict, list or tuple of them (nested), an object with ``to(device)``, or any other
            value (returned as is).
        device: the target device.
        channels_last: ``"2d"`` puts 4-D float tensors in ``channels_last``, ``"3d"`` 5-D ones in
            ``channels_last_3d``; ``"none"`` keeps the layout.

    Returns:
        The same structure with every tensor on ``device``.
    """
    if isinstance(batch, torch.Tensor):
        out = batch.to(device, non_blocking=batch.is_pinned())
        if out.is_floating_point() and channels_last == "2d" and out.dim() == 4:
            out = out.contiguous(memory_format=torch.channels_last)
        elif out.is_floating_point() and channels_last == "3d" and out.dim() == 5:
            out = out.contiguous(memory_format=torch.channels_last_3d)
        return out
    if isinstance(batch, dict):
        return {k: to_device(v, device, channels_last) for k, v in batch.items()}
    if callable(getattr(batch, "to", None)):  # batch objects that move themselves (data.Batch, RaggedBatch)
        return batch.to(device)
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device, channels_last) for v in batch)
    return batch
