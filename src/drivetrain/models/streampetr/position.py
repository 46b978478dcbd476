"""PETR's 3D position embedding: each image token's camera ray, sampled at depth bins, as its position.

For a token at pixel ``(u, v)`` and a depth bin ``d`` the 3D point is ``lidar2img⁻¹ · (u·d, v·d, d, 1)``: the
point at depth ``d`` on the ray through that pixel, in the lidar frame. The ``D`` points of a token are
normalised by ``position_range`` to ``[0, 1]``, passed through ``inverse_sigmoid`` and an MLP
(``3D → 4E → E``) to give the token's position embedding. Depth bins are linear-increasing (LID):
``d_i = start + (stop − start) / (D (D + 1)) · i (i + 1)``, ``i = 0 … D−1``.

Mirrors ``StreamPETRHead.__init__`` (``coords_d``) and ``StreamPETRHead.position_embeding`` of
StreamPETR (``projects/mmdet3d_plugin/models/dense_heads/streampetr_head.py``), including the "cone" it
returns for the spatial alignment: ``|f_x|/1000, |f_y|/1000`` and the normalised points of the last depth
bin and of bin ``D − 30`` (bin 34 of 64; the original slices ``[-90:-87]`` of the flattened ``3D``
coordinates). Deviation: token centres are given in pixels rather than normalised by the padded image
size and multiplied back (the same numbers; our batches carry no padding yet).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PositionEmbedding3D", "inverse_sigmoid", "lid_depths", "token_points"]


def lid_depths(num: int, start: float, stop: float) -> torch.Tensor:
    """Linear-increasing depth bins: ``start + (stop − start) / (num (num + 1)) · i (i + 1)``.

    Args:
        num: number of bins, ``D`` (64).
        start: the first depth in metres (1).
        stop: the depth the bins are scaled to (the x maximum of ``position_range``, 61.2); the last bin
            lies below it (≈ 59.3 m for 64 bins).

    Returns:
        float32 ``(D,)`` metres.
    """
    index = torch.arange(num, dtype=torch.float32)  # (D,)
    bin_size = (stop - start) / (num * (1 + num))
    return start + bin_size * index * (index + 1)  # (D,)


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``log(x / (1 − x))`` with both sides clamped to ≥ ``eps`` (mmdet's ``inverse_sigmoid``), elementwise."""
    x = x.clamp(min=0, max=1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def token_points(centres: torch.Tensor, lidar2img: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """The 3D points of every token's ray at every depth bin, in the lidar frame.

    Args:
        centres: ``(B, N, T, 2)`` token centres in pixels ``(u, v)`` of each camera.
        lidar2img: ``(B, N, 4, 4)`` lidar → image of each camera.
        depths: ``(D,)`` depth bins in metres.

    Returns:
        ``(B, N, T, D, 3)`` metres, in the dtype of ``centres``.
    """
    eps = 1e-5
    d = depths.view(1, 1, 1, -1, 1).to(centres)  # (1, 1, 1, D, 1)
    uv = centres.unsqueeze(-2) * torch.clamp(d, min=eps)  # (B, N, T, D, 2): u·d, v·d as the original
    coords = torch.cat([uv, d.expand_as(uv[..., :1]), torch.ones_like(uv[..., :1])], dim=-1)  # (B, N, T, D, 4)
    # inv_ex: linalg.inv's arithmetic without its singularity check, which reads the device's info flags on the
    # host (a sync on CUDA every forward); a projection matrix of the data is invertible by construction.
    img2lidar = torch.linalg.inv_ex(lidar2img.to(centres.dtype)).inverse  # (B, N, 4, 4)
    points = (img2lidar[:, :, None, None] @ coords.unsqueeze(-1)).squeeze(-1)  # (B, N, T, D, 4)
    return points[..., :3]  # (B, N, T, D, 3)


class PositionEmbedding3D(nn.Module):
    """Token position embeddings from camera rays (see the module docstring).

    Args:
        embed_dims: ``E`` (256).
        depth_num: depth bins ``D`` (64).
        depth_start: first depth in metres (1).
        position_range: ``(x_min, y_min, z_min, x_max, y_max, z_max)`` metres that map to ``[0, 1]``
            (−61.2, −61.2, −10, 61.2, 61.2, 10).
    """

    def __init__(
        self,
        embed_dims: int = 256,
        depth_num: int = 64,
        depth_start: float = 1.0,
        position_range: tuple[float, ...] = (-61.2, -61.2, -10.0, 61.2, 61.2, 10.0),
    ) -> None:
        super().__init__()
        if depth_num < 30:
            raise ValueError(f"depth_num: the cone reads bin depth_num − 30, so it must be ≥ 30, got {depth_num}")
        self.depth_num = depth_num
        self.register_buffer("depths", lid_depths(depth_num, depth_start, position_range[3]), persistent=False)
        self.register_buffer("range_min", torch.tensor(position_range[:3], dtype=torch.float32), persistent=False)
        self.register_buffer("range_size", torch.tensor(position_range[3:], dtype=torch.float32) - self.range_min,
                             persistent=False)  # fmt: skip
        self.encoder = nn.Sequential(
            nn.Linear(3 * depth_num, 4 * embed_dims), nn.ReLU(), nn.Linear(4 * embed_dims, embed_dims)
        )

    def forward(
        self, centres: torch.Tensor, lidar2img: torch.Tensor, intrinsics: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Position embeddings and cones of every token of every camera.

        Args:
            centres: ``(B, N, T, 2)`` token centres in pixels.
            lidar2img: ``(B, N, 4, 4)``.
            intrinsics: ``(B, N, 3, 3)`` (or ``4 × 4``) camera matrices.

        Returns:
            ``pos_embed`` ``(B, N·T, E)`` and ``cone`` ``(B, N·T, 8)``.
        """
        b, n, t, _ = centres.shape
        points = token_points(centres, lidar2img, self.depths)  # (B, N, T, D, 3)
        normalised = (points - self.range_min) / self.range_size  # (B, N, T, D, 3)
        flat = normalised.reshape(b, n * t, self.depth_num * 3)  # (B, N·T, 3D)
        pos_embed = self.encoder(inverse_sigmoid(flat))  # (B, N·T, E)
        focal = torch.stack([intrinsics[..., 0, 0], intrinsics[..., 1, 1]], dim=-1).abs() / 1e3  # (B, N, 2)
        focal = focal.unsqueeze(2).expand(b, n, t, 2).reshape(b, n * t, 2)  # (B, N·T, 2)
        cone = torch.cat([focal, flat[..., -3:], flat[..., -90:-87]], dim=-1)  # (B, N·T, 8)
        return pos_embed, cone
