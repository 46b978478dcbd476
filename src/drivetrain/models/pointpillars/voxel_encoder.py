"""Voxel feature encoder of the nuScenes PointPillars/SSN configs: mmdetection3d's ``HardVFE``.

After ``mmdet3d/models/voxel_encoders/voxel_encoder.py`` (``HardVFE``) and ``utils.py`` (``VFELayer``,
``get_paddings_indicator``):

1. *Decoration* of every point slot of a voxel ``(V, T, C)``: the point itself, its offset from the mean
   of the voxel's points (``with_cluster_center``; the sum over all T slots — padding is zero — divided by
   ``num_points``) and from the voxel's centre (``with_voxel_center``: ``x − (i_x·v_x + v_x/2 + x_min)``,
   likewise y and z), optionally its distance to the origin. C = 4 gives 10 features.
2. Padded slots (``t ≥ num_points``) are set to zero.
3. ``VFELayer`` × len(feat_channels): ``Linear`` (no bias) → ``BatchNorm1d`` (eps 1e-3, momentum 0.01) over
   every slot, padding included → ReLU → max over the T slots; every layer but the last concatenates the
   max to each slot's features (2 × channels). The last returns ``(V, channels)``.

As in the original, padded slots take part in the BatchNorm statistics and in the max after step 2 (their
features are the BN of zero, through the ReLU): kept, since the published weights were trained so.

Speed (named deviation, backward only): the original normalises the transposed ``(V, C, T)`` copy and transposes
back, so autograd hands BatchNorm's backward a *transposed* gradient and ATen takes its slow generic path (on
the CPU ~3× the time of a contiguous one; it was ~59 % of PointPillars' whole backward). :class:`_ContiguousGrad`
makes that gradient contiguous. The forward is bit-identical to the original; the input gradient differs only
in the order of BatchNorm's two per-channel sums (Σg and Σg·x̂ over the V·T slots), bounded by recursive
summation's γ_N = N·ε/(1 − N·ε) times the sums of magnitudes (tests/test_models_pointpillars_modules.py derives
the bound per channel). A ``(V·T, C)`` layout would be faster still, but ATen's CPU statistics on that layout
lose ~200× the accuracy (max error 1e-4 against 5e-7 at 160k slots, measured against float64), so it is not used.

Compact path (``num_stored`` given: the batched path; named deviation, summation order only). At the published
nuScenes config (T = 64 slots, ~9 points a voxel) ~85 % of the ``V·T`` slots are padding, and every padded slot
of a voxel holds the same value through every layer: zero features, so ``Linear`` gives 0 and BatchNorm one
per-channel value, and after the first layer ``[that value ‖ the voxel's max]``. So the layers run on the real
slots (``R = Σ num_points`` rows, voxel by voxel in slot order) plus one row per voxel standing for its
``k = T − n`` padded slots:

- BatchNorm's batch statistics are *weighted* sums over these rows (weight 1, or ``k``) divided by ``N = V·T``
  (float32, ATen's cascade sums, as accurate as its statistics of the original layout); the running statistics
  move as ``BatchNorm1d``'s (momentum, unbiased variance with ``N``); normalisation is ATen's
  ``x·(γ·σ⁻¹) + (β − μ·γ·σ⁻¹)``; the backward is in closed form (:class:`_WeightedBatchNorm`).
- The max over a voxel's slots takes the first row reaching it (real slots in order, then the padded stand-in),
  as ``torch.max`` takes the first slot; a stand-in of a full voxel (``k = 0``) has weight 0 and is left out.
- Backward is the original's summed over each stand-in's ``k`` copies: the copies share one value, so the
  stand-in's gradient is their sum, which is what the weighted statistics and the single use in the max give.

Forward and gradients equal the original's layout up to the order (and precision) of BatchNorm's sums:
tests/test_models_pointpillars_modules.py checks the two paths in float64 (equal to ~1e-12) and bounds the float32
difference by the original layout's own error against float64. Cost ∝ ``R + V`` instead of ``V·T``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from drivetrain.pipeline.voxelize import VoxelGrid

__all__ = ["HardVFE", "VFELayer"]


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous (see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class VFELayer(nn.Module):
    """Linear → BN1d → ReLU per point slot, max over the slots; optionally the max concatenated back.

    Args:
        in_channels: features per slot.
        out_channels: channels of the linear layer.
        cat_max: return ``(V, T, 2·out)`` (slot features ‖ voxel max) instead of ``(V, out)``.
    """

    def __init__(self, in_channels: int, out_channels: int, cat_max: bool) -> None:
        super().__init__()
        self.cat_max = cat_max
        self.linear = nn.Linear(in_channels, out_channels, bias=False)
        self.norm = nn.BatchNorm1d(out_channels, eps=1e-3, momentum=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(V, T, in)`` → ``(V, T, 2·out)`` with ``cat_max``, else ``(V, out)``."""
        y = self.linear(x)  # (V, T, out)
        # contiguous as the original: BatchNorm's statistics then sum in the original's order (bit-equal); the
        # gradient reaching BatchNorm is made contiguous (its fast backward path)
        normed = _ContiguousGrad.apply(self.norm(y.transpose(1, 2).contiguous()))  # (V, out, T)
        y = torch.relu(normed.transpose(1, 2).contiguous())  # (V, T, out)
        pooled = y.max(dim=1, keepdim=True).values  # (V, 1, out)
        if not self.cat_max:
            return pooled.squeeze(1)  # (V, out)
        return torch.cat([y, pooled.expand_as(y)], dim=2)  # (V, T, 2·out)

    def forward_rows(self, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
        """The compact path (module docstring): ``(R + V, in)`` rows → ``(R + V, 2·out)`` with ``cat_max``, else
        ``(V, out)``."""
        y = _weighted_batch_norm(self.linear(x), rows, self.norm)  # (R + V, out)
        y = torch.relu(y)  # (R + V, out)
        pooled = _first_max(y, rows)  # (V, out)
        if not self.cat_max:
            return pooled
        return torch.cat([y, pooled.index_select(0, rows.voxel)], dim=1)  # (R + V, 2·out)


class _Rows(NamedTuple):
    """The compact layout: ``R`` real slots voxel by voxel, then one padded stand-in per voxel."""

    voxel: torch.Tensor  # int64 (R + V,) each row's voxel
    weight: torch.Tensor  # float32 (R + V,) 1 for a real slot, k = T − n for a stand-in (0: a full voxel)
    used: torch.Tensor  # bool (R + V,) weight > 0
    total: int  # N = V·T, the slots the statistics average over
    num_voxels: int  # V


def _weighted_batch_norm(y: torch.Tensor, rows: _Rows, norm: nn.BatchNorm1d) -> torch.Tensor:
    """``norm`` applied to the ``V·T`` slots that ``y``'s rows stand for (see the module docstring)."""
    if norm.training or norm.running_mean is None:
        out, mean, var = _WeightedBatchNorm.apply(y, rows.weight, rows.total, norm.weight, norm.bias, norm.eps)
        if norm.training and norm.running_mean is not None:  # as BatchNorm1d: momentum, unbiased variance
            with torch.no_grad():
                norm.num_batches_tracked.add_(1)
                momentum = norm.momentum
                if momentum is None:  # a cumulative average
                    momentum = 1.0 / float(norm.num_batches_tracked)  # a CPU buffer unless on a device
                total = rows.total  # an int, or a device tensor (the static step's real V·T: no host read)
                below = (total - 1).clamp(min=1) if isinstance(total, torch.Tensor) else max(total - 1, 1)
                unbiased = var * (total / below)  # (C,)
                norm.running_mean.mul_(1 - momentum).add_(mean.to(norm.running_mean.dtype), alpha=momentum)
                norm.running_var.mul_(1 - momentum).add_(unbiased.to(norm.running_var.dtype), alpha=momentum)
        return out
    scale = (norm.running_var.to(y.dtype) + norm.eps).rsqrt()  # (C,)
    scale = scale if norm.weight is None else scale * norm.weight  # (C,)
    shift = -norm.running_mean.to(y.dtype) * scale  # (C,)
    shift = shift if norm.bias is None else shift + norm.bias  # (C,)
    return torch.addcmul(shift, y, scale)  # (R + V, C)


class _WeightedBatchNorm(torch.autograd.Function):
    """Training-mode BatchNorm over rows with weights (a row stands for ``weight`` identical slots, ``total``
    slots in all), with the gradient in closed form.

    Forward: ``μ = Σ w y / N``, ``σ² = Σ w (y − μ)² / N`` (float32, ATen's cascade sums: ~2e-7 relative at a
    million rows), ``out = y·(γ/σ) + (β − μ γ/σ)``. Backward, with ``g`` a row's gradient (for a stand-in the sum
    over its copies) and ``x̂ = (y − μ)/σ``: ``∂y = (γ/σ)·(g − w·(Σg + x̂·Σg·x̂)/N)``, ``∂γ = Σ g·x̂``, ``∂β = Σ g``
    (the sums unweighted: a stand-in's ``g`` already sums its copies).
    """

    @staticmethod
    def forward(ctx, y, weight, total, gamma, beta, eps):  # type: ignore[no-untyped-def, override]
        w = weight.to(y.dtype).unsqueeze(1)  # (R, 1)
        mean = (y * w).sum(0) / total  # (C,)
        centred = y - mean  # (R, C)
        var = (centred * centred).mul_(w).sum(0) / total  # (C,) biased
        invstd = (var + eps).rsqrt()  # (C,)
        scale = invstd if gamma is None else invstd * gamma  # (C,)
        shift = -mean * scale if beta is None else beta - mean * scale  # (C,)
        ctx.save_for_backward(centred, w, invstd, scale)
        ctx.total, ctx.affine = total, (gamma is not None, beta is not None)
        ctx.mark_non_differentiable(mean, var)
        return torch.addcmul(shift, y, scale), mean, var

    @staticmethod
    def backward(ctx, grad, _grad_mean, _grad_var):  # type: ignore[no-untyped-def, override]
        centred, w, invstd, scale = ctx.saved_tensors
        total = ctx.total
        sum_g = grad.sum(0)  # (C,) Σg
        sum_gx = (grad * centred).sum(0) * invstd  # (C,) Σg·x̂
        inner = torch.addcmul(scale * sum_g / total, centred, scale * invstd * sum_gx / total)  # (R, C)
        grad_y = torch.addcmul(inner.mul_(w).neg_(), grad, scale)  # (R, C)
        has_gamma, has_beta = ctx.affine
        return grad_y, None, None, sum_gx if has_gamma else None, sum_g if has_beta else None, None


def _first_max(y: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """``(V, C)``: per voxel and channel the value of its first used row reaching the maximum (``torch.max``'s
    choice over the slots), gathered so that the gradient reaches that one row."""
    num_rows, channels = y.shape
    with torch.no_grad():
        index = rows.voxel.unsqueeze(1).expand(-1, channels)  # (R + V, C)
        value = torch.where(rows.used.unsqueeze(1), y, float("-inf"))  # (R + V, C)
        top = y.new_full((rows.num_voxels, channels), float("-inf")).scatter_reduce_(0, index, value, "amax")
        order = torch.arange(num_rows, device=y.device).unsqueeze(1)  # (R + V, 1)
        hit = torch.where(value == top.index_select(0, rows.voxel), order, num_rows)  # (R + V, C)
        first = torch.full_like(top, num_rows, dtype=torch.long).scatter_reduce_(0, index, hit, "amin")  # (V, C)
    return y.gather(0, first)  # (V, C)


class HardVFE(nn.Module):
    """Point decoration + VFE layers: voxels ``(V, T, C)`` → voxel features ``(V, feat_channels[-1])``.

    Args:
        in_channels: point features C (x, y, z first).
        feat_channels: output channels of each VFE layer (nuScenes PointPillars: (64, 64); SSN Lyft: (32, 64)).
        grid: the voxel grid (its range and voxel size give the voxel centres).
        with_cluster_center: add the offset from the voxel's point mean (3 features).
        with_voxel_center: add the offset from the voxel's centre (3 features).
        with_distance: add the distance to the origin (1 feature).
    """

    def __init__(
        self,
        in_channels: int,
        feat_channels: tuple[int, ...],
        grid: VoxelGrid,
        with_cluster_center: bool = True,
        with_voxel_center: bool = True,
        with_distance: bool = False,
    ) -> None:
        super().__init__()
        if not feat_channels:
            raise ValueError("feat_channels: needs at least one layer")
        self.with_cluster_center, self.with_voxel_center, self.with_distance = (
            with_cluster_center,
            with_voxel_center,
            with_distance,
        )
        lo = grid.point_cloud_range[:3]
        size = grid.voxel_size
        # voxel centre of cell (x, y, z) = cell · size + (size / 2 + min), in (x, y, z) order
        self.register_buffer("voxel_size", torch.tensor(size), persistent=False)
        self.register_buffer(
            "centre_offset", torch.tensor([s / 2 + m for s, m in zip(size, lo, strict=True)]), persistent=False
        )
        channels = in_channels + 3 * with_cluster_center + 3 * with_voxel_center + int(with_distance)
        self.in_channels = channels
        layers = []
        for i, out in enumerate(feat_channels):
            last = i == len(feat_channels) - 1
            layers.append(VFELayer(channels if i == 0 else 2 * feat_channels[i - 1], out, cat_max=not last))
        self.layers = nn.ModuleList(layers)

    def _voxel_terms(
        self, voxels: torch.Tensor, num_points: torch.Tensor, coors: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Per voxel: the mean of its points ``(V, 1, 3)`` and its centre ``(V, 3)`` (None where not used)."""
        mean = centre = None
        if self.with_cluster_center:
            mean = voxels[..., :3].sum(dim=1, keepdim=True) / num_points.to(voxels.dtype).view(-1, 1, 1)  # (V, 1, 3)
        if self.with_voxel_center:
            cell = coors[:, [3, 2, 1]].to(voxels.dtype)  # (V, 3) (x, y, z)
            centre = cell * self.voxel_size.to(voxels.dtype) + self.centre_offset.to(voxels.dtype)  # (V, 3)
        return mean, centre

    def _decorate(self, points: torch.Tensor, mean: torch.Tensor | None, centre: torch.Tensor | None) -> torch.Tensor:
        """``(..., C)`` points with their voxel's ``mean``/``centre`` broadcast to them → ``(..., in_channels)``."""
        parts = [points]
        xyz = points[..., :3]  # (..., 3)
        if mean is not None:
            parts.append(xyz - mean)  # (..., 3)
        if centre is not None:
            parts.append(xyz - centre)  # (..., 3)
        if self.with_distance:
            parts.append(xyz.norm(dim=-1, keepdim=True))  # (..., 1)
        return torch.cat(parts, dim=-1)  # (..., in_channels)

    def decorate(self, voxels: torch.Tensor, num_points: torch.Tensor, coors: torch.Tensor) -> torch.Tensor:
        """The decorated, padding-zeroed slot features ``(V, T, in_channels)``.

        Args:
            voxels: ``(V, T, C)`` points per voxel, zero padded.
            num_points: ``(V,)`` points stored per voxel (≥ 1).
            coors: ``(V, 4)`` int ``(b, z, y, x)``.
        """
        mean, centre = self._voxel_terms(voxels, num_points, coors)
        feats = self._decorate(voxels, mean, None if centre is None else centre.unsqueeze(1))  # (V, T, in_channels)
        slots = torch.arange(voxels.shape[1], device=voxels.device)  # (T,)
        mask = slots.unsqueeze(0) < num_points.unsqueeze(1)  # (V, T)
        return feats * mask.unsqueeze(2).to(feats.dtype)  # (V, T, in_channels)

    def forward(
        self, voxels: torch.Tensor, num_points: torch.Tensor, coors: torch.Tensor, num_stored: int | None = None
    ) -> torch.Tensor:
        """Voxel features ``(V, feat_channels[-1])``; arguments as :meth:`decorate`.

        ``num_stored`` (``Σ num_points``, known on the host from the voxelization) runs the compact path over the
        real slots (module docstring); None runs the original's ``(V, T)`` layout.
        """
        if num_stored is not None:
            return self._forward_rows(voxels, num_points, coors, num_stored)
        x = self.decorate(voxels, num_points, coors)
        for layer in self.layers:
            x = layer(x)
        return x  # (V, out)

    def _forward_rows(
        self, voxels: torch.Tensor, num_points: torch.Tensor, coors: torch.Tensor, num_stored: int
    ) -> torch.Tensor:
        num_voxels, depth, channels = voxels.shape
        device = voxels.device
        counts = num_points.long()  # (V,)
        voxel_ids = torch.arange(num_voxels, device=device)  # (V,)
        voxel = torch.repeat_interleave(voxel_ids, counts, output_size=num_stored)  # (R,)
        first = counts.cumsum(0) - counts  # (V,) each voxel's first row
        slot = torch.arange(num_stored, device=device) - first.index_select(0, voxel)  # (R,)
        points = voxels.reshape(-1, channels).index_select(0, voxel * depth + slot)  # (R, C)
        mean, centre = self._voxel_terms(voxels, num_points, coors)
        feats = self._decorate(
            points,
            None if mean is None else mean.squeeze(1).index_select(0, voxel),
            None if centre is None else centre.index_select(0, voxel),
        )  # (R, in_channels): the real slots' features, by the same operations as the (V, T) layout
        x = torch.cat([feats, feats.new_zeros(num_voxels, feats.shape[1])])  # (R + V, in): stand-ins are zero
        weight = torch.cat([torch.ones(num_stored, device=device), (depth - counts).to(torch.float32)])  # (R + V,)
        rows = _Rows(torch.cat([voxel, voxel_ids]), weight, weight > 0, num_voxels * depth, num_voxels)
        for layer in self.layers:
            x = layer.forward_rows(x, rows)
        return x  # (V, out)
