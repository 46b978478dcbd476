"""StreamPETR's image backbone and neck: one feature level at stride 16 with ``embed_dims`` channels per image.

``resnet50`` mirrors the published R50 config (``projects/configs/StreamPETR/
stream_petr_r50_flash_704_bs2_seq_24e.py``, ``img_backbone``/``img_neck``): mmdet's ``ResNet`` (depth 50,
``style='pytorch'``: the stride sits on the 3×3 conv of a bottleneck; ``out_indices=(2, 3)``: C4 at stride 16
and C5 at stride 32) and StreamPETR's ``CPFPN`` (``projects/mmdet3d_plugin/models/necks/cp_fpn.py``; in
``[1024, 2048]``, out 256, ``num_outs=2``). ``Petr3D.extract_img_feat`` (``projects/mmdet3d_plugin/models/
detectors/petr3d.py``) keeps only ``img_feats[self.position_level]`` with ``position_level=0`` (the config
does not set it), and the heads receive that one level as ``data['img_feats']``; so the backbone returns level
0, stride 16: the 3×3 conv of C4's lateral plus the nearest-upsampled lateral of C5. CPFPN builds that 3×3 conv
for level 0 only (level 1 is C5's bare lateral, unused downstream), which is what makes it safe with
activation checkpointing under DDP (no unused parameters).

Parameter names follow torchvision's ``resnet50`` (``conv1``, ``bn1``, ``layer3.5.bn3``,
``layer4.0.downsample.0`` …), which mmdet's ResNet shares, so a ``torchvision://resnet50`` state dict loads
into :attr:`ResNetBackbone.trunk` with ``strict=False`` (only ``fc.*`` left over).

Deviations, each for a reason (the published values are the first in each pair):

* random init instead of ``pretrained='torchvision://resnet50'``: nothing is downloaded here;
* ``norm_eval`` True → False and BN ``requires_grad`` False → True by default: with pretrained weights the
  ImageNet statistics and affine parameters are kept frozen; from random init frozen BN would keep its initial
  statistics (mean 0, variance 1) and affine (1, 0) forever, so here they train unless asked otherwise;
* ``with_cp`` True → False by default (the engine's ``speed.activation_checkpointing`` is the switch of
  choice); when on, a block's recomputation in backward restores the BN running statistics it touched, so they
  advance once per forward as without checkpointing (mmdet's checkpointed blocks update them twice when BN
  trains; the published run never noticed because ``norm_eval`` kept BN in eval mode);
* CPFPN without extra levels, ``start_level``/``end_level`` or norms: the published config uses none of them;
* ``tiny``: a four-stage conv net to stride 16 for CPU runs, no counterpart in the original.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["CPFPN", "Bottleneck", "ResNet50", "ResNetBackbone", "TinyBackbone", "build_backbone"]

RESNET50_BLOCKS = (3, 4, 6, 3)  # bottlenecks per stage
RESNET50_WIDTHS = (64, 128, 256, 512)  # 3×3 conv channels per stage; outputs are ×4
EXPANSION = 4


@contextlib.contextmanager
def _kept_bn_statistics(module: nn.Module) -> Iterator[None]:
    """Restore the running statistics (and batch counts) of ``module``'s batch norms on exit."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [[b.clone() for b in m.buffers()] for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, buffers in zip(norms, saved, strict=True):
                for b, s in zip(m.buffers(), buffers, strict=True):
                    b.copy_(s)


class Bottleneck(nn.Module):
    """ResNet bottleneck, ``style='pytorch'``: 1×1 → 3×3 (stride) → 1×1 (×4), each with BN; identity or 1×1 + BN.

    Args:
        in_channels: input channels.
        width: channels of the 1×1 and 3×3 convs; the output has ``4 · width``.
        stride: stride of the 3×3 conv (and of the downsample).
        with_cp: recompute the block in backward instead of keeping its activations.
    """

    def __init__(self, in_channels: int, width: int, stride: int = 1, with_cp: bool = False) -> None:
        super().__init__()
        out_channels = width * EXPANSION
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )
        self.with_cp = with_cp

    def _residual(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)  # (B, 4·width, H/s, W/s)
        out = self.relu(self.bn1(self.conv1(x)))  # (B, width, H, W)
        out = self.relu(self.bn2(self.conv2(out)))  # (B, width, H/s, W/s)
        return self.bn3(self.conv3(out)) + identity  # (B, 4·width, H/s, W/s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H, W)`` → ``(B, 4·width, H/stride, W/stride)``."""
        if not (self.with_cp and torch.is_grad_enabled()):
            return self.relu(self._residual(x))
        if torch.compiler.is_compiling():  # traced once (dynamo refuses the closure's side effect below); the
            # backward recomputes the traced ops, the BN statistics' update is applied once, by the forward
            return self.relu(checkpoint(self._residual, x, use_reentrant=False))
        calls = []

        def run(x: torch.Tensor) -> torch.Tensor:
            if calls:  # the recomputation in backward: the forward already advanced the BN statistics
                with _kept_bn_statistics(self):
                    return self._residual(x)
            calls.append(True)
            return self._residual(x)

        # The final ReLU stays outside, as mmdet's Bottleneck: it is in place on the checkpoint's output.
        return self.relu(checkpoint(run, x, use_reentrant=False))


class ResNet50(nn.Module):
    """ResNet-50 trunk (torchvision/mmdet layout, no pooling or fc), random init; returns the chosen stages.

    Args:
        out_indices: stages to return, 0-based: 0 → C2 (256 ch, stride 4) … 3 → C5 (2048 ch, stride 32).
            StreamPETR: ``(2, 3)``.
        frozen_stages: ``-1`` freezes nothing (published); ``k ≥ 0`` freezes the stem and stages ``1 … k``
            (mmdet numbering: stage 1 is ``layer1``): no gradients, and their BN stays in eval mode.
        norm_eval: keep every BN in eval mode in training (published True, with pretrained weights; default
            False: from random init frozen statistics would never adapt).
        with_cp: checkpoint each bottleneck (published True; see the module docstring).
        norm_requires_grad: train the BN affine parameters (published False with pretrained weights; default
            True for the same reason as ``norm_eval``).
        zero_init_residual: start each bottleneck's last BN weight at zero, so every block starts as the
            identity (mmdet's default for random init; needs ``norm_requires_grad``).
    """

    def __init__(
        self,
        out_indices: Sequence[int] = (2, 3),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        norm_requires_grad: bool = True,
        zero_init_residual: bool = True,
    ) -> None:
        super().__init__()
        if not out_indices or any(i not in range(4) for i in out_indices):
            raise ValueError(f"out_indices: expected stages among 0…3, got {tuple(out_indices)}")
        if frozen_stages not in range(-1, 5):
            raise ValueError(f"frozen_stages: expected −1…4, got {frozen_stages}")
        if zero_init_residual and not norm_requires_grad:
            raise ValueError("zero_init_residual with norm_requires_grad=False would keep every residual branch at 0")
        self.out_indices = tuple(out_indices)
        self.frozen_stages, self.norm_eval = frozen_stages, norm_eval
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = 64
        for i, (blocks, width) in enumerate(zip(RESNET50_BLOCKS, RESNET50_WIDTHS, strict=True)):
            stride = 1 if i == 0 else 2
            layer = [Bottleneck(channels, width, stride, with_cp)]
            channels = width * EXPANSION
            layer += [Bottleneck(channels, width, 1, with_cp) for _ in range(blocks - 1)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*layer))
        self.out_channels = tuple(RESNET50_WIDTHS[i] * EXPANSION for i in self.out_indices)
        self._init_weights(zero_init_residual)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.requires_grad_(norm_requires_grad)
        for m in self._frozen():
            m.requires_grad_(False)
        self.train()

    def _init_weights(self, zero_init_residual: bool) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)

    def _frozen(self) -> list[nn.Module]:
        if self.frozen_stages < 0:
            return []
        return [self.conv1, self.bn1] + [getattr(self, f"layer{i}") for i in range(1, self.frozen_stages + 1)]

    def train(self, mode: bool = True) -> ResNet50:
        """Set training mode, keeping the frozen stages (and every BN with ``norm_eval``) in eval mode."""
        super().train(mode)
        if mode:
            for m in self._frozen():
                m.eval()
            if self.norm_eval:
                for m in self.modules():
                    if isinstance(m, nn.modules.batchnorm._BatchNorm):
                        m.eval()
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Features of the stages in ``out_indices``.

        Args:
            x: ``(B, 3, H, W)`` float images.

        Returns:
            one ``(B, C_i, H/s_i, W/s_i)`` tensor per entry of ``out_indices``, ``s_i = 4 · 2^i`` (rounded up).
        """
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (B, 64, H/4, W/4)
        outs = []
        for i in range(4):
            x = getattr(self, f"layer{i + 1}")(x)  # (B, 256·2^i, H/(4·2^i), W/(4·2^i))
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)


class CPFPN(nn.Module):
    """StreamPETR's CPFPN: lateral 1×1 convs, top-down nearest upsample + add, a 3×3 conv on level 0 only.

    Args:
        in_channels: channels of each input level, finest first (``[1024, 2048]``).
        out_channels: channels of every output level (256, ``E``).
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int) -> None:
        super().__init__()
        if len(in_channels) < 1:
            raise ValueError("in_channels: expected at least one level")
        self.lateral_convs = nn.ModuleList(nn.Conv2d(c, out_channels, 1) for c in in_channels)
        self.fpn_conv = nn.Conv2d(out_channels, out_channels, 3, padding=1)  # level 0 only, as the original
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # the original's init_cfg: Xavier uniform on every Conv2d, bias 0
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Top-down pyramid of ``inputs``.

        Args:
            inputs: one ``(B, C_i, H_i, W_i)`` tensor per level, finest first.

        Returns:
            one ``(B, E, H_i, W_i)`` tensor per level: level 0 through the 3×3 conv, the others the bare
            top-down sums (the original's outputs; StreamPETR reads level 0).
        """
        if len(inputs) != len(self.lateral_convs):
            raise ValueError(f"inputs: expected {len(self.lateral_convs)} levels, got {len(inputs)}")
        laterals = [conv(x) for conv, x in zip(self.lateral_convs, inputs, strict=True)]  # [(B, E, H_i, W_i)]
        for i in range(len(laterals) - 1, 0, -1):
            up = F.interpolate(laterals[i], size=laterals[i - 1].shape[-2:], mode="nearest")  # (B, E, H_i-1, W_i-1)
            laterals[i - 1] = laterals[i - 1] + up  # (B, E, H_i-1, W_i-1)
        return (self.fpn_conv(laterals[0]), *laterals[1:])


def _check_size(images: torch.Tensor, divisor: int, kind: str) -> None:
    h, w = images.shape[-2:]
    if h % divisor or w % divisor:
        raise ValueError(f"{kind} backbone: image size {h}×{w} (H×W) is not divisible by {divisor}; pad the images")


class ResNetBackbone(nn.Module):
    """ResNet-50 trunk + CPFPN neck, level 0: ``(B·N, 3, H, W)`` → ``(B·N, E, H/16, W/16)``.

    Args:
        embed_dims: ``E``, the neck's output channels (256).
        **trunk_args: keyword arguments of :class:`ResNet50` (``frozen_stages``, ``norm_eval``, ``with_cp``,
            ``norm_requires_grad``, ``zero_init_residual``); ``out_indices`` is fixed to ``(2, 3)``.
    """

    stride = 16
    size_divisor = 32  # C5 is at stride 32

    def __init__(self, embed_dims: int = 256, **trunk_args: Any) -> None:
        super().__init__()
        self.trunk = ResNet50(out_indices=(2, 3), **trunk_args)
        self.neck = CPFPN(self.trunk.out_channels, embed_dims)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` float ``(B·N, 3, H, W)``, H and W multiples of 32 → ``(B·N, E, H/16, W/16)``."""
        _check_size(images, self.size_divisor, "resnet50")
        return self.neck(self.trunk(images))[0]  # (B·N, E, H/16, W/16)


def _conv_gn_relu(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.GroupNorm(8, c_out), nn.ReLU(inplace=True)
    )


class TinyBackbone(nn.Module):
    """Four stride-2 conv3×3-GroupNorm(8)-ReLU stages (``w, w, 2w, 2w``) and a 1×1 conv to ``E``, for CPU runs.

    Args:
        embed_dims: ``E``.
        width: ``w``, channels of the first two stages; a multiple of 8 (the GroupNorm groups).
    """

    stride = 16
    size_divisor = 16

    def __init__(self, embed_dims: int, width: int = 32) -> None:
        super().__init__()
        if width < 8 or width % 8:
            raise ValueError(f"width: expected a positive multiple of 8 (GroupNorm(8)), got {width}")
        widths = (width, width, 2 * width, 2 * width)
        self.trunk = nn.Sequential(
            *(_conv_gn_relu(c_in, c_out, 2) for c_in, c_out in zip((3, *widths[:-1]), widths, strict=True))
        )
        self.neck = nn.Conv2d(widths[-1], embed_dims, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` float ``(B·N, 3, H, W)``, H and W multiples of 16 → ``(B·N, E, H/16, W/16)``."""
        _check_size(images, self.size_divisor, "tiny")
        return self.neck(self.trunk(images))  # (B·N, E, H/16, W/16)


BACKBONES = {"tiny": TinyBackbone, "resnet50": ResNetBackbone}


def build_backbone(kind: str, embed_dims: int, **kwargs: Any) -> nn.Module:
    """The image backbone + neck named ``kind``, with ``stride = 16`` and ``embed_dims`` output channels.

    Args:
        kind: ``tiny`` (:class:`TinyBackbone`) or ``resnet50`` (:class:`ResNetBackbone`).
        embed_dims: ``E``.
        **kwargs: keyword arguments of that class (``width`` of ``tiny``; ``frozen_stages``, ``norm_eval``,
            ``with_cp`` … of ``resnet50``).

    Returns:
        a module mapping float ``(B·N, 3, H, W)`` to ``(B·N, E, H/16, W/16)``.

    Example:
        >>> build_backbone("tiny", 64, width=16)(torch.zeros(6, 3, 192, 320)).shape
        torch.Size([6, 64, 12, 20])
    """
    if kind not in BACKBONES:
        raise ValueError(f"backbone: unknown kind {kind!r}; expected one of {sorted(BACKBONES)}")
    return BACKBONES[kind](embed_dims, **kwargs)
