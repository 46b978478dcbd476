"""A dense 3D convolutional middle encoder between the voxel encoder and the BEV backbone (VoxelNet's
"convolutional middle layers"): voxel features scattered into a ``(B, C, nz, ny, nx)`` volume, ``blocks``
Conv3d-GroupNorm-ReLU blocks that halve the height (stride ``(2, 1, 1)``) while the channels grow from
``base_channels`` (×2 per block), and the remaining height folded into the channels of the BEV map.

It is the workload on which ``speed.channels_last=3d`` and the ``base_channels`` × activation-checkpointing table
of the performance guide are measured (issue 17); PointPillars' pillars (``nz == 1``) do not need it. Enable it
with ``model.args.middle: {base_channels: 16, blocks: 2}`` and a voxel size that cuts z into several cells.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["DenseMiddleEncoder", "scatter_to_volume"]


def scatter_to_volume(
    feats: torch.Tensor, coors: torch.Tensor, batch_size: int, grid_size: tuple[int, int, int]
) -> torch.Tensor:
    """Write every voxel's ``(C,)`` features into its cell of a zero ``(B, C, nz, ny, nx)`` volume (one indexed
    write; ``coors`` rows ``(b, z, y, x)``, unique per voxel)."""
    nx, ny, nz = grid_size
    channels = feats.shape[1]
    volume = feats.new_zeros(batch_size, channels, nz * ny * nx)  # (B, C, nz·ny·nx)
    cell = (coors[:, 1].long() * ny + coors[:, 2].long()) * nx + coors[:, 3].long()  # (V,)
    volume[coors[:, 0].long(), :, cell] = feats
    return volume.view(batch_size, channels, nz, ny, nx)


class DenseMiddleEncoder(nn.Module):
    """Conv3d blocks over the voxel volume, then the height folded into channels (see the module docstring).

    Args:
        in_channels: voxel feature channels.
        depth: ``nz``, the grid's cells along z.
        base_channels: channels of the first block (the guide's 16 / 32 / 64).
        blocks: Conv3d-GroupNorm-ReLU blocks, each halving the height (stride 2 along z) and doubling channels.
    """

    def __init__(self, in_channels: int, depth: int, base_channels: int = 16, blocks: int = 2) -> None:
        super().__init__()
        if depth < 2:
            raise ValueError(
                f"middle: the voxel grid has {depth} cell along z; a 3D encoder needs voxel_size z < the range"
            )
        if base_channels < 1 or blocks < 1:
            raise ValueError(f"middle: base_channels and blocks must be ≥ 1, got {base_channels}, {blocks}")
        layers: list[nn.Module] = []
        channels, height = in_channels, depth
        for i in range(blocks):
            out = base_channels * 2**i
            layers += [
                nn.Conv3d(channels, out, 3, stride=(2, 1, 1), padding=1, bias=False),
                nn.GroupNorm(math.gcd(8, out), out),
                nn.ReLU(inplace=True),
            ]
            channels, height = out, (height + 1) // 2
        self.blocks = nn.Sequential(*layers)
        self.out_channels = channels * height

    def forward(self, volume: torch.Tensor) -> torch.Tensor:
        """``(B, C, nz, ny, nx)`` → BEV ``(B, C'·nz', ny, nx)``."""
        x = self.blocks(volume)  # (B, C', nz', ny, nx)
        b, c, d, h, w = x.shape
        return x.reshape(b, c * d, h, w)
