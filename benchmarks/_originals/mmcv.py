"""Ports of mmcv 1.6.0's ops the originals call on a GPU: one custom operator per C++ kernel.

- ``mmcv/ops/focal_loss.py`` (``SigmoidFocalLossFunction``) with the kernels ``sigmoid_focal_loss_forward``/
  ``_backward``;
- ``mmcv/ops/nms.py`` (``nms_rotated``) with ``mmcv/ops/csrc/pytorch/cuda/nms_rotated_cuda.cu``.

Each C++ kernel is one custom operator in :data:`LIBRARY` (why: ``benchmarks/originals.py``, "What runs as on
a GPU").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from drivetrain.geometry.rotated_iou import rotated_bev_iou_pairwise

LIBRARY = "drivetrain_originals"  # the torch.library namespace of the ports' custom operators (mmcv's C++ kernels)
FLT_MIN = float(torch.finfo(torch.float32).tiny)


# ============================================================================ mmcv's C++ kernels: one op each
def _custom_op(name: str, mutates_args: tuple[str, ...]) -> Callable[[Callable], Any]:
    """``torch.library.custom_op`` in :data:`LIBRARY`, or the operator an earlier load of this script defined."""

    def define(fn: Callable) -> Any:
        existing = getattr(getattr(torch.ops, LIBRARY), name, None)
        if existing is not None:
            return existing
        return torch.library.custom_op(f"{LIBRARY}::{name}", mutates_args=mutates_args)(fn)

    return define


@_custom_op("sigmoid_focal_loss_forward", mutates_args=("output",))
def _sigmoid_focal_loss_forward(
    input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, output: torch.Tensor, gamma: float, alpha: float
) -> None:
    """mmcv ``sigmoid_focal_loss_forward_cuda_kernel``: the per-element focal loss of class ``c`` against label
    ``target`` (``c == target``: positive), written into ``output`` (``weight`` empty: no class weights)."""
    p = input.sigmoid()  # (N, C)
    positive = target.unsqueeze(1) == torch.arange(input.shape[1], device=input.device)  # (N, C)
    pos = -alpha * (1 - p).pow(gamma) * p.clamp(min=FLT_MIN).log()  # (N, C)
    neg = -(1 - alpha) * p.pow(gamma) * (1 - p).clamp(min=FLT_MIN).log()  # (N, C)
    output.copy_(torch.where(positive, pos, neg))


@_custom_op("sigmoid_focal_loss_backward", mutates_args=("grad_input",))
def _sigmoid_focal_loss_backward(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor,
    grad_input: torch.Tensor,
    gamma: float,
    alpha: float,
) -> None:
    """mmcv ``sigmoid_focal_loss_backward_cuda_kernel``: d(loss)/d(input) per element, into ``grad_input``."""
    p = input.sigmoid()  # (N, C)
    positive = target.unsqueeze(1) == torch.arange(input.shape[1], device=input.device)  # (N, C)
    pos = -alpha * (1 - p).pow(gamma) * (1 - p - gamma * p * p.clamp(min=FLT_MIN).log())  # (N, C)
    neg = -(1 - alpha) * p.pow(gamma) * (gamma * (1 - p) * (1 - p).clamp(min=FLT_MIN).log() - p)  # (N, C)
    grad_input.copy_(torch.where(positive, pos, neg))


@_custom_op("nms_rotated_kernel", mutates_args=())
def _nms_rotated_kernel(dets_sorted: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """mmcv ``nms_rotated_cuda_kernel``: bit mask of which score-sorted box suppresses which (IoU > threshold),
    here as a bool ``(N, N)`` matrix."""
    return rotated_bev_iou_pairwise(dets_sorted, dets_sorted) > iou_threshold  # (N, N)


class SigmoidFocalLossFunction(torch.autograd.Function):
    """mmcv 1.6.0 ``mmcv/ops/focal_loss.py``: ``SigmoidFocalLossFunction`` (forward and backward, as on CUDA)."""

    @staticmethod
    def forward(ctx, input, target, gamma=2.0, alpha=0.25, weight=None, reduction="mean"):  # type: ignore[no-untyped-def, override]
        weight = input.new_empty(0) if weight is None else weight
        ctx.reduction_dict = {"none": 0, "mean": 1, "sum": 2}
        ctx.gamma, ctx.alpha, ctx.reduction = float(gamma), float(alpha), ctx.reduction_dict[reduction]
        output = input.new_zeros(input.size())
        _sigmoid_focal_loss_forward(input, target, weight, output, ctx.gamma, ctx.alpha)
        if ctx.reduction == ctx.reduction_dict["mean"]:
            output = output.sum() / input.size(0)
        elif ctx.reduction == ctx.reduction_dict["sum"]:
            output = output.sum()
        ctx.save_for_backward(input, target, weight)
        return output

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[no-untyped-def, override]
        input, target, weight = ctx.saved_tensors
        grad_input = input.new_zeros(input.size())
        _sigmoid_focal_loss_backward(input, target, weight, grad_input, ctx.gamma, ctx.alpha)
        grad_input *= grad_output
        if ctx.reduction == ctx.reduction_dict["mean"]:
            grad_input /= input.size(0)
        return grad_input, None, None, None, None, None


def nms_rotated(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> tuple[torch.Tensor, Any]:
    """mmcv 1.6.0 ``mmcv/ops/nms.py``: ``nms_rotated`` (``clockwise=True``, no labels), with the C++ wrapper
    ``nms_rotated_cuda`` (``nms_rotated_cuda.cu``): the kernel, its mask to the host, the greedy pass there, the
    kept indices back to the device, ``order_t.index(keep)``."""
    if dets.shape[0] == 0:
        return dets, None
    _, order = scores.sort(0, descending=True)
    dets_sorted = dets.index_select(0, order)
    mask = _nms_rotated_kernel(dets_sorted, iou_threshold)  # the kernel
    mask_host = mask.cpu()  # Tensor mask_cpu = mask.to(at::kCPU)
    removed = np.zeros(dets.shape[0], dtype=bool)
    keep = []
    for i in range(dets.shape[0]):  # the host loop over the mask
        if not removed[i]:
            keep.append(i)
            removed |= mask_host[i].numpy()
    keep_inds = order[torch.tensor(keep, dtype=torch.long).to(order.device)]  # order_t.index({keep.to(device)})
    dets = torch.cat((dets[keep_inds], scores[keep_inds].reshape(-1, 1)), dim=1)
    return dets, keep_inds
