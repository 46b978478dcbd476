"""BEV backbone and neck of PointPillars/SSN: mmdetection3d's ``SECOND`` and ``SECONDFPN``.

After ``mmdet3d/models/backbones/second.py`` and ``mmdet3d/models/necks/second_fpn.py``:

- ``SECOND``: one block per stage, ``Conv3×3(stride s, no bias) → BN(eps 1e-3, momentum 0.01) → ReLU`` then
  ``layer_num × [Conv3×3 → BN → ReLU]``; it returns every stage's output. Convolutions start from Kaiming
  normal (fan_out, ReLU), the backbone's ``init_cfg``.
- ``SECONDFPN``: per stage ``ConvTranspose2d(kernel = stride = upsample stride, no bias) → BN → ReLU`` (a
  stride below 1 becomes a strided convolution), outputs concatenated along channels. Transposed
  convolutions start from Kaiming normal, BN weights from 1 (the neck's ``init_cfg``).

nuScenes PointPillars: SECOND(64 → [64, 128, 256], layer_nums [3, 5, 5], strides [2, 2, 2]) on the 400×400
canvas, SECONDFPN([64, 128, 256] → 3 × 128, upsample [1, 2, 4]) → (B, 384, 200, 200).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SECOND", "SECONDFPN"]


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=1e-3, momentum=0.01)


class SECOND(nn.Module):
    """Strided conv stages; ``forward`` returns each stage's output ``(B, out_channels[i], H/Πs, W/Πs)``.

    Args:
        in_channels: channels of the BEV canvas.
        out_channels: channels per stage.
        layer_nums: extra 3×3 conv layers per stage.
        layer_strides: stride of each stage's first conv.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: tuple[int, ...] = (64, 128, 256),
        layer_nums: tuple[int, ...] = (3, 5, 5),
        layer_strides: tuple[int, ...] = (2, 2, 2),
    ) -> None:
        super().__init__()
        if not len(out_channels) == len(layer_nums) == len(layer_strides):
            raise ValueError(
                f"out_channels, layer_nums, layer_strides: need one entry per stage, got "
                f"{out_channels}, {layer_nums}, {layer_strides}"
            )
        blocks = []
        for cin, cout, num, stride in zip(
            (in_channels, *out_channels[:-1]), out_channels, layer_nums, layer_strides, strict=True
        ):
            layers: list[nn.Module] = [
                nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                _bn(cout),
                nn.ReLU(),
            ]
            for _ in range(num):
                layers += [nn.Conv2d(cout, cout, 3, padding=1, bias=False), _bn(cout), nn.ReLU()]
            blocks.append(nn.Sequential(*layers))
        self.blocks = nn.ModuleList(blocks)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(B, C, H, W)`` → one feature map per stage."""
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        return tuple(outs)


class SECONDFPN(nn.Module):
    """Upsample every stage to the first stage's resolution and concatenate: ``(B, Σ out_channels, H', W')``.

    Args:
        in_channels: channels of each input stage.
        out_channels: channels after each stage's upsampling.
        upsample_strides: per stage; ≥ 1 a transposed conv (kernel = stride), < 1 a conv of stride 1/s.
    """

    def __init__(
        self,
        in_channels: tuple[int, ...] = (64, 128, 256),
        out_channels: tuple[int, ...] = (128, 128, 128),
        upsample_strides: tuple[float, ...] = (1, 2, 4),
    ) -> None:
        super().__init__()
        if not len(in_channels) == len(out_channels) == len(upsample_strides):
            raise ValueError("in_channels, out_channels, upsample_strides: need one entry per stage")
        blocks = []
        for cin, cout, stride in zip(in_channels, out_channels, upsample_strides, strict=True):
            if stride >= 1:
                up: nn.Module = nn.ConvTranspose2d(cin, cout, int(stride), stride=int(stride), bias=False)
            else:
                k = round(1 / stride)
                up = nn.Conv2d(cin, cout, k, stride=k, bias=False)
            blocks.append(nn.Sequential(up, _bn(cout), nn.ReLU()))
        self.blocks = nn.ModuleList(blocks)
        self.out_channels = sum(out_channels)
        for m in self.modules():
            if isinstance(m, nn.ConvTranspose2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, feats: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Stage outputs → ``(B, Σ out_channels, H', W')``."""
        if len(feats) != len(self.blocks):
            raise ValueError(f"feats: expected {len(self.blocks)} stages, got {len(feats)}")
        ups = [block(f) for block, f in zip(self.blocks, feats, strict=True)]
        return torch.cat(ups, dim=1) if len(ups) > 1 else ups[0]  # (B, ΣC, H', W')
