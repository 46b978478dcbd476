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
"""

from __future__ import annotations

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

    def decorate(self, voxels: torch.Tensor, num_points: torch.Tensor, coors: torch.Tensor) -> torch.Tensor:
        """The decorated, padding-zeroed slot features ``(V, T, in_channels)``.

        Args:
            voxels: ``(V, T, C)`` points per voxel, zero padded.
            num_points: ``(V,)`` points stored per voxel (≥ 1).
            coors: ``(V, 4)`` int ``(b, z, y, x)``.
        """
        parts = [voxels]
        xyz = voxels[..., :3]  # (V, T, 3)
        if self.with_cluster_center:
            mean = xyz.sum(dim=1, keepdim=True) / num_points.to(voxels.dtype).view(-1, 1, 1)  # (V, 1, 3)
            parts.append(xyz - mean)  # (V, T, 3)
        if self.with_voxel_center:
            cell = coors[:, [3, 2, 1]].to(voxels.dtype)  # (V, 3) (x, y, z)
            centre = cell * self.voxel_size.to(voxels.dtype) + self.centre_offset.to(voxels.dtype)  # (V, 3)
            parts.append(xyz - centre.unsqueeze(1))  # (V, T, 3)
        if self.with_distance:
            parts.append(xyz.norm(dim=2, keepdim=True))  # (V, T, 1)
        feats = torch.cat(parts, dim=2)  # (V, T, in_channels)
        slots = torch.arange(voxels.shape[1], device=voxels.device)  # (T,)
        mask = slots.unsqueeze(0) < num_points.unsqueeze(1)  # (V, T)
        return feats * mask.unsqueeze(2).to(feats.dtype)  # (V, T, in_channels)

    def forward(self, voxels: torch.Tensor, num_points: torch.Tensor, coors: torch.Tensor) -> torch.Tensor:
        """Voxel features ``(V, feat_channels[-1])``; arguments as :meth:`decorate`."""
        x = self.decorate(voxels, num_points, coors)
        for layer in self.layers:
            x = layer(x)
        return x  # (V, out)
