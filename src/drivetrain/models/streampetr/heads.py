"""StreamPETR's prediction heads: the 3D class and box branches shared by all decoder layers, and the 2D focal
head on the image features.

3D branches (``StreamPETRHead._init_layers`` of StreamPETR, ``projects/mmdet3d_plugin/models/dense_heads/
streampetr_head.py``): class ``[Linear(E, E), LayerNorm, ReLU] × 2 → Linear(E, C)`` with the bias at
``−log(99)`` (prior 0.01, ``init_weights``); box ``[Linear(E, E), ReLU] × 2 → Linear(E, 10)``. The original
puts the *same* module object in its list once per layer, so the weights are shared; here one module each.
:func:`box_codes` turns a layer's box output into the code the loss takes: ``σ(reg_xyz + logit(reference))``
scaled to ``pc_range`` in metres (the same initial reference in every layer: no iterative refinement), the
other eight entries as they are: ``(x, y, z, ln dx, ln dy, ln dz, sin, cos, vx, vy)``.

2D focal head (``FocalHead`` of ``projects/mmdet3d_plugin/models/dense_heads/focal_head.py``): a class tower
``Conv3×3 → GroupNorm(32) → ReLU`` feeding the class logits and the centerness (both biases at prior 0.01) and a
box tower of the same shape feeding ``ltrb`` (sigmoid distances from the token's location) and the projected
centre as an offset in logit space; the locations are the token centres normalised by the (padded) image size;
boxes are clamped to the image and returned as ``cxcywh`` (``apply_ltrb``, ``apply_center_offset`` of
``projects/mmdet3d_plugin/models/utils/misc.py``). Deviation: the original also returns the tokens ranked by
``σ(max class)·σ(centerness)`` (``topk_indexes``); with the published ``train_ratio = infer_ratio = 1`` that
keeps every token and only reorders them, and attention does not depend on the order of its keys, so the
detector uses the tokens in image order.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from drivetrain.models.streampetr.position import inverse_sigmoid
from drivetrain.models.streampetr.recipe import CLASSES, STRIDE

__all__ = ["FocalHead", "apply_ltrb", "box_codes", "class_branch", "regression_branch", "token_locations"]

PRIOR_BIAS = -math.log(99.0)  # bias_init_with_prob(0.01)


def class_branch(embed_dims: int, num_classes: int, num_fcs: int = 2) -> nn.Sequential:
    """``[Linear, LayerNorm, ReLU] × num_fcs → Linear(E, C)``, the last bias at prior 0.01."""
    layers: list[nn.Module] = []
    for _ in range(num_fcs):
        layers += [nn.Linear(embed_dims, embed_dims), nn.LayerNorm(embed_dims), nn.ReLU(inplace=True)]
    last = nn.Linear(embed_dims, num_classes)
    nn.init.constant_(last.bias, PRIOR_BIAS)
    return nn.Sequential(*layers, last)


def regression_branch(embed_dims: int, code_size: int = 10, num_fcs: int = 2) -> nn.Sequential:
    """``[Linear, ReLU] × num_fcs → Linear(E, code_size)``."""
    layers: list[nn.Module] = []
    for _ in range(num_fcs):
        layers += [nn.Linear(embed_dims, embed_dims), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(embed_dims, code_size))


def box_codes(regression: torch.Tensor, reference: torch.Tensor, pc_min: torch.Tensor, pc_size: torch.Tensor):
    """Box codes in metres from the box branch's output and the queries' normalised reference points.

    Args:
        regression: ``(L, B, Q, 10)`` raw box-branch outputs of every layer.
        reference: ``(B, Q, 3)`` reference points in ``[0, 1]`` (normalised by ``pc_range``).
        pc_min: ``(3,)`` ``pc_range`` minimum, metres.
        pc_size: ``(3,)`` ``pc_range`` extent, metres.

    Returns:
        ``(L, B, Q, 10)``: ``(x, y, z, ln dx, ln dy, ln dz, sin, cos, vx, vy)``, centre in metres.
    """
    centre = (regression[..., :3] + inverse_sigmoid(reference)).sigmoid()  # (L, B, Q, 3) in [0, 1]
    return torch.cat([centre * pc_size + pc_min, regression[..., 3:]], dim=-1)  # (L, B, Q, 10)


def token_locations(height: int, width: int, stride: int, image_size: tuple[int, int], device=None) -> torch.Tensor:
    """Token centres ``((j + ½)·stride / W, (i + ½)·stride / H)`` of an ``height × width`` feature map.

    Args:
        height: feature rows.
        width: feature columns.
        stride: pixels per feature cell.
        image_size: ``(W, H)`` of the (padded) image the features come from.
        device: where to build the result.

    Returns:
        ``(height·width, 2)`` normalised ``(x, y)``, row-major.
    """
    ys = (torch.arange(height, device=device, dtype=torch.float32) + 0.5) * stride / image_size[1]  # (h,)
    xs = (torch.arange(width, device=device, dtype=torch.float32) + 0.5) * stride / image_size[0]  # (w,)
    grid = torch.stack(torch.broadcast_tensors(xs.view(1, width), ys.view(height, 1)), dim=-1)  # (h, w, 2)
    return grid.reshape(height * width, 2)  # (h·w, 2)


def apply_ltrb(locations: torch.Tensor, ltrb: torch.Tensor) -> torch.Tensor:
    """``cxcywh`` boxes from distances to the edges: ``(x − l, y − t, x + r, y + b)`` clamped to ``[0, 1]``.

    Args:
        locations: ``(..., 2)`` normalised token centres.
        ltrb: ``(..., 4)`` distances in image fractions.

    Returns:
        ``(..., 4)`` normalised ``cxcywh``.
    """
    low = (locations - ltrb[..., :2]).clamp(0, 1)  # (..., 2)
    high = (locations + ltrb[..., 2:]).clamp(0, 1)  # (..., 2)
    return torch.cat([(low + high) / 2, high - low], dim=-1)  # (..., 4)


def _tower(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.GroupNorm(32, channels), nn.ReLU())


class FocalHead(nn.Module):
    """StreamPETR's 2D auxiliary head on the image features (see the module docstring).

    Args:
        in_channels: feature channels (a multiple of 32, for GroupNorm(32)).
        num_classes: ``C``.
        stride: feature stride in pixels (:data:`~.recipe.STRIDE`).
    """

    def __init__(self, in_channels: int = 256, num_classes: int = len(CLASSES), stride: int = STRIDE) -> None:
        super().__init__()
        if in_channels % 32:
            raise ValueError(f"in_channels: GroupNorm(32) needs a multiple of 32, got {in_channels}")
        self.stride = stride
        self.shared_cls, self.shared_reg = _tower(in_channels), _tower(in_channels)
        self.cls = nn.Conv2d(in_channels, num_classes, 1)
        self.centerness = nn.Conv2d(in_channels, 1, 1)
        self.ltrb = nn.Conv2d(in_channels, 4, 1)
        self.center2d = nn.Conv2d(in_channels, 2, 1)
        nn.init.constant_(self.cls.bias, PRIOR_BIAS)
        nn.init.constant_(self.centerness.bias, PRIOR_BIAS)

    def forward(self, feats: torch.Tensor, image_size: tuple[int, int], batch_size: int) -> dict[str, torch.Tensor]:
        """The focal-head outputs of every image.

        Args:
            feats: ``(B·N, E, h, w)`` image features.
            image_size: ``(W, H)`` of the (padded) images, pixels.
            batch_size: ``B``.

        Returns:
            The :class:`~drivetrain.losses.focal_head.FocalHeadLoss` outputs: ``cls_logits`` ``(B, N, T, C)``, ``boxes``
            ``(B, N, T, 4)`` normalised cxcywh, ``centres`` ``(B, N, T, 2)`` normalised, ``centerness``
            ``(B, N, h, w)`` logits; ``T = h·w`` tokens, row-major.
        """
        bn, _, h, w = feats.shape
        n = bn // batch_size
        cls_feat, reg_feat = self.shared_cls(feats), self.shared_reg(feats)  # (B·N, E, h, w) each

        def tokens(x: torch.Tensor) -> torch.Tensor:
            return x.flatten(2).transpose(1, 2).reshape(batch_size, n, h * w, -1)  # (B, N, T, ·)

        locations = token_locations(h, w, self.stride, image_size, feats.device).to(feats.dtype)  # (T, 2)
        ltrb = tokens(self.ltrb(reg_feat)).sigmoid()  # (B, N, T, 4)
        centres = (inverse_sigmoid(locations) + tokens(self.center2d(reg_feat))).sigmoid()  # (B, N, T, 2)
        return {
            "cls_logits": tokens(self.cls(cls_feat)),  # (B, N, T, C)
            "boxes": apply_ltrb(locations, ltrb),  # (B, N, T, 4)
            "centres": centres,
            "centerness": self.centerness(cls_feat).view(batch_size, n, h, w),  # (B, N, h, w)
        }
