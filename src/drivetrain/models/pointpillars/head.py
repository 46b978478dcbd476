"""The anchor head of PointPillars: mmdetection3d's ``Anchor3DHead`` convolutions and output layout.

After ``mmdet3d/models/dense_heads/anchor3d_head.py`` (``_init_layers``, ``forward_single``, the default
``init_cfg``): three 1×1 convolutions on the neck's map — classification ``A·C`` channels, box regression
``A·D`` and direction ``A·2`` — with ``A`` anchors per location (sizes × rotations), ``C`` classes, ``D`` the
box code size (9 with velocity, 7 without). Weights start from N(0, 0.01²), biases from 0, except the
classification bias ``−log((1 − 0.01) / 0.01) = −4.595`` (prior probability 0.01).

The loss and the decoder read the outputs as mmdetection3d does: ``permute(0, 2, 3, 1).reshape(B, −1, K)``,
so anchor ``((y·W + x)·A + a)`` is location (y, x), anchor a, and its class-c logit is channel ``a·C + c``
— the order :mod:`drivetrain.models.pointpillars.anchors` generates anchors in.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["Anchor3DHead", "BaseShapeHead", "ShapeAwareHead", "flatten_anchor_map"]

PRIOR_PROB = 0.01


def flatten_anchor_map(x: torch.Tensor, per_anchor: int) -> torch.Tensor:
    """``(B, A·K, H, W)`` → ``(B, H·W·A, K)``: mmdetection3d's ``permute(0, 2, 3, 1).reshape(B, -1, K)``."""
    return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1, per_anchor)  # (B, H·W·A, K)


class Anchor3DHead(nn.Module):
    """1×1 conv heads for classification, box deltas and direction bins.

    Args:
        in_channels: channels of the neck's output (nuScenes PointPillars: 384).
        num_anchors: anchors per location, A (sizes × rotations).
        num_classes: C.
        code_size: D (9: x, y, z, dx, dy, dz, yaw, vx, vy; 7 without velocity).
        use_direction_classifier: add the direction conv (2 bins per anchor).
    """

    def __init__(
        self,
        in_channels: int,
        num_anchors: int,
        num_classes: int,
        code_size: int = 9,
        use_direction_classifier: bool = True,
    ) -> None:
        super().__init__()
        self.num_anchors, self.num_classes, self.code_size = num_anchors, num_classes, code_size
        self.conv_cls = nn.Conv2d(in_channels, num_anchors * num_classes, 1)
        self.conv_reg = nn.Conv2d(in_channels, num_anchors * code_size, 1)
        self.conv_dir_cls = nn.Conv2d(in_channels, num_anchors * 2, 1) if use_direction_classifier else None
        for conv in (self.conv_cls, self.conv_reg, self.conv_dir_cls):
            if conv is not None:
                nn.init.normal_(conv.weight, std=0.01)
                nn.init.zeros_(conv.bias)
        nn.init.constant_(self.conv_cls.bias, -math.log((1 - PRIOR_PROB) / PRIOR_PROB))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(B, in_channels, H, W)`` → per anchor ``cls_logits (B, H·W·A, C)``, ``box_preds (B, H·W·A, D)``,
        ``dir_logits (B, H·W·A, 2)`` (absent without the direction classifier)."""
        out = {
            "cls_logits": flatten_anchor_map(self.conv_cls(x), self.num_classes),  # (B, H·W·A, C)
            "box_preds": flatten_anchor_map(self.conv_reg(x), self.code_size),  # (B, H·W·A, D)
        }
        if self.conv_dir_cls is not None:
            out["dir_logits"] = flatten_anchor_map(self.conv_dir_cls(x), 2)  # (B, H·W·A, 2)
        return out


class BaseShapeHead(nn.Module):
    """One SSN task branch: shared ``[Conv3×3 (no bias) → BN2d → ReLU]`` layers, then the three 1×1 convs.

    After ``BaseShapeHead`` in ``mmdet3d/models/dense_heads/shape_aware_head.py``. Its outputs are laid out
    anchor-major — ``view(B, A, K, H, W).permute(0, 1, 3, 4, 2)`` — so anchor ``(a·H + y)·W + x``; this is
    *not* :class:`Anchor3DHead`'s location-major order. The BatchNorm is ``BN2d`` with PyTorch's defaults
    (eps 1e-5, momentum 0.1): ``ShapeAwareHead._init_layers`` does not pass the task's ``norm_cfg`` on.
    Initialisation: Kaiming normal (fan_out, ReLU) for the shared convs, N(0, 0.01²) for the 1×1 convs with
    the classification and direction biases at ``−4.595`` (``bias_prob=0.01`` on both in the original).

    Args:
        in_channels: channels of the neck's output.
        num_anchors: anchors per location of this task, A (its sizes × rotations).
        num_classes: C (all classes: every branch scores every class).
        code_size: D.
        shared_channels: channels of the shared conv layers.
        shared_strides: their strides (a stride 2 halves the map: large objects).
    """

    def __init__(
        self,
        in_channels: int,
        num_anchors: int,
        num_classes: int,
        code_size: int,
        shared_channels: tuple[int, ...] = (64, 64),
        shared_strides: tuple[int, ...] = (1, 1),
    ) -> None:
        super().__init__()
        if len(shared_channels) != len(shared_strides):
            raise ValueError(f"shared_channels, shared_strides: lengths differ ({shared_channels}, {shared_strides})")
        self.num_anchors, self.num_classes, self.code_size = num_anchors, num_classes, code_size
        layers: list[nn.Module] = []
        for cin, cout, stride in zip(
            (in_channels, *shared_channels[:-1]), shared_channels, shared_strides, strict=True
        ):
            conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            layers += [conv, nn.BatchNorm2d(cout), nn.ReLU()]
        self.shared_conv = nn.Sequential(*layers)
        width = shared_channels[-1] if shared_channels else in_channels
        self.conv_cls = nn.Conv2d(width, num_anchors * num_classes, 1)
        self.conv_reg = nn.Conv2d(width, num_anchors * code_size, 1)
        self.conv_dir_cls = nn.Conv2d(width, num_anchors * 2, 1)
        prior_bias = -math.log((1 - PRIOR_PROB) / PRIOR_PROB)
        for conv, bias in ((self.conv_cls, prior_bias), (self.conv_reg, 0.0), (self.conv_dir_cls, prior_bias)):
            nn.init.normal_(conv.weight, std=0.01)
            nn.init.constant_(conv.bias, bias)

    def _flatten(self, x: torch.Tensor, per_anchor: int) -> torch.Tensor:
        b, _, h, w = x.shape
        return x.view(b, self.num_anchors, per_anchor, h, w).permute(0, 1, 3, 4, 2).reshape(b, -1, per_anchor)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(B, in, H, W)`` → ``cls_logits (B, A·H'·W', C)``, ``box_preds``, ``dir_logits``, anchor-major."""
        x = self.shared_conv(x)  # (B, width, H', W')
        return {
            "cls_logits": self._flatten(self.conv_cls(x), self.num_classes),  # (B, A·H'·W', C)
            "box_preds": self._flatten(self.conv_reg(x), self.code_size),  # (B, A·H'·W', D)
            "dir_logits": self._flatten(self.conv_dir_cls(x), 2),  # (B, A·H'·W', 2)
        }


class ShapeAwareHead(nn.Module):
    """SSN's head: one :class:`BaseShapeHead` per task (group of similar shapes), outputs concatenated.

    After ``ShapeAwareHead._init_layers`` / ``forward_single``: branch ``t`` has ``num_rotations ×
    len(task classes)`` anchors per location on its own map; the anchors of all branches are concatenated in
    task order (the order of the per-class anchor generator's ranges).

    Args:
        in_channels: channels of the neck's output (nuScenes SSN: 384).
        tasks: per task ``(num_task_classes, shared_channels, shared_strides)``; nuScenes SSN:
            (2, (64, 64), (1, 1)) bicycle+motorcycle, (1, …) pedestrian, (2, …) cone+barrier,
            (1, (64, 64, 64), (2, 1, 1)) car, (4, (64, 64, 64), (2, 1, 1)) truck/trailer/bus/CV.
        num_classes: C.
        code_size: D.
        num_rotations: anchor rotations per class (2).
    """

    def __init__(
        self,
        in_channels: int,
        tasks: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...],
        num_classes: int,
        code_size: int = 9,
        num_rotations: int = 2,
    ) -> None:
        super().__init__()
        if sum(t[0] for t in tasks) != num_classes:
            raise ValueError(
                f"tasks: their classes add up to {sum(t[0] for t in tasks)}, not num_classes={num_classes}"
            )
        self.heads = nn.ModuleList(
            BaseShapeHead(in_channels, n * num_rotations, num_classes, code_size, tuple(ch), tuple(st))
            for n, ch, st in tasks
        )

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(B, in, H, W)`` → every task's anchors concatenated: ``cls_logits (B, ΣA_t·H_t·W_t, C)``, ..."""
        outs = [head(x) for head in self.heads]
        return {key: torch.cat([o[key] for o in outs], dim=1) for key in outs[0]}  # (B, Σ anchors, ·)
