"""The 2D focal detector: a small camera detector made of StreamPETR's 2D focal head, the data → model → batched
loss → trainer loop; its arguments, each declared once, in :class:`Focal2DArgs`.

Each camera image goes through a few stride-2 conv stages to stride 16; per feature cell the head predicts
class logits, a box as distances (left, top, right, bottom) from the cell centre, the projected 3D centre
as an offset from the cell centre, and a centerness logit — the outputs
:class:`~drivetrain.losses.focal_head.FocalHeadLoss` takes. It is the smallest model that learns from the synthetic
nuScenes-format data, so ``drivetrain train`` runs the whole loop on it in minutes on a CPU; the 3D heads come with
the StreamPETR model.

Its recipe is the published focal head's (:mod:`drivetrain.losses.focal_head`: the stride, the loss weights and 2D
matching costs, through :func:`~drivetrain.losses.focal_head.focal_head_loss`) with ImageNet image normalisation
(:data:`~drivetrain.pipeline.augment.photometric.IMAGENET_MEAN`, ``IMAGENET_STD``); the small backbone has no
published counterpart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from drivetrain.batch import Batch
from drivetrain.data.formats.nuscenes.tables import CLASSES
from drivetrain.losses.focal_head import STRIDE, FocalHeadLoss, focal_head_loss
from drivetrain.losses.inputs import Targets
from drivetrain.pipeline.augment.photometric import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["Focal2DArgs", "FocalDetector2D"]

PATHS: dict[str, Callable[[FocalHeadLoss, Mapping[str, Any], Targets], dict[str, torch.Tensor]]] = {
    "batched": FocalHeadLoss.__call__,
    "reference": FocalHeadLoss.reference,
}
"""The loss's two paths by the name ``model.args.impl`` gives: the criterion's entry point, unbound."""


@dataclass(frozen=True)
class Focal2DArgs:
    """``model.args`` of ``model.name: focal2d``: the arguments of :class:`FocalDetector2D`."""

    num_classes: int = len(CLASSES)  # C: class channels, the dataset's classes (nuScenes' ten)
    width: int = 32  # channels of the first stage (later stages double it once)
    stride: int = STRIDE  # feature stride, a power of two ≥ 2 (16, as the published focal head)
    impl: Literal["batched", "reference"] = "batched"  # path of the loss: every image at once or per image
    sync_cls_avg_factor: bool = False  # average the classification count over ranks (False, as published)


def _stage(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.GroupNorm(8, c_out), nn.ReLU(inplace=True)
    )


class FocalDetector2D(nn.Module):
    """Per-camera 2D detector trained with the focal-head loss (``input_modalities``: camera).

    Args:
        args: the arguments (:class:`Focal2DArgs`: each one's type, default and meaning).
        **changes: fields of ``args`` to replace, by name (``FocalDetector2D(width=8)``); an unknown name is a
            ``TypeError`` naming it.
    """

    input_modalities: tuple[str, ...] = ("camera",)

    def __init__(self, args: Focal2DArgs = Focal2DArgs(), **changes: Any) -> None:
        super().__init__()
        args = dataclasses.replace(args, **changes)
        self.args = args
        if args.impl not in PATHS:
            raise ValueError(f"impl: expected 'batched' or 'reference', got {args.impl!r}")
        self._loss_path = PATHS[args.impl]  # chosen once
        num_classes, width, stride = args.num_classes, args.width, args.stride
        if stride < 2 or stride & (stride - 1):
            raise ValueError(f"stride: must be a power of two ≥ 2, got {stride}")
        stages, channels = [], 3
        for i in range(int(math.log2(stride))):
            out = width if i < 2 else 2 * width
            stages.append(_stage(channels, out, 2))
            channels = out
        self.backbone = nn.Sequential(*stages)
        self.neck = _stage(channels, channels, 1)
        self.cls = nn.Conv2d(channels, num_classes, 1)
        self.box = nn.Conv2d(channels, 4, 1)
        self.centre = nn.Conv2d(channels, 2, 1)
        self.centerness = nn.Conv2d(channels, 1, 1)
        nn.init.constant_(self.cls.bias, -math.log(99.0))  # prior 0.01, as the published heads
        self.stride = stride
        self.criterion = focal_head_loss(num_classes, stride=stride, sync_cls_avg_factor=args.sync_cls_avg_factor)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """``batch.images`` uint8 ``(B, N, 3, H, W)`` → the focal-head outputs (see FocalHeadLoss)."""
        images = batch.images
        b, n, _, h, w = images.shape
        x = (images.reshape(b * n, 3, h, w).float() - self.mean) / self.std  # (B*N, 3, H, W)
        feats = self.neck(self.backbone(x))  # (B*N, F, Hf, Wf)
        hf, wf = feats.shape[-2:]
        ys = (torch.arange(hf, device=x.device) * self.stride + self.stride / 2) / h  # (Hf,)
        xs = (torch.arange(wf, device=x.device) * self.stride + self.stride / 2) / w  # (Wf,)
        cell = torch.stack(torch.broadcast_tensors(xs.view(1, wf), ys.view(hf, 1)), dim=-1)  # (Hf, Wf, 2)
        cell = cell.reshape(1, hf * wf, 2)  # (1, Q, 2) normalised (x, y)

        def tokens(t: torch.Tensor) -> torch.Tensor:
            return t.flatten(2).transpose(1, 2)  # (B*N, Q, ·)

        ltrb = tokens(self.box(feats)).sigmoid()  # (B*N, Q, 4) distances in image fractions
        low = (cell - ltrb[..., :2]).clamp(0, 1)  # (B*N, Q, 2)
        high = (cell + ltrb[..., 2:]).clamp(0, 1)  # (B*N, Q, 2)
        boxes = torch.cat([(low + high) / 2, high - low], dim=-1)  # (B*N, Q, 4) cxcywh
        centres = (torch.logit(cell, eps=1e-4) + tokens(self.centre(feats))).sigmoid()  # (B*N, Q, 2)
        q = hf * wf
        return {
            "cls_logits": tokens(self.cls(feats)).reshape(b, n, q, -1),  # (B, N, Q, C)
            "boxes": boxes.reshape(b, n, q, 4),
            "centres": centres.reshape(b, n, q, 2),
            "centerness": self.centerness(feats).reshape(b, n, hf, wf),
        }

    @property
    def loss_weights(self) -> dict[str, float]:
        """The focal head's published weights (a run config's ``model.loss_weights`` overrides them by name)."""
        return dict(self.criterion.weights)

    def loss(self, outputs: dict[str, torch.Tensor], batch: Batch) -> dict[str, torch.Tensor]:
        """Unweighted focal-head terms, weighted by the engine with :attr:`loss_weights`."""
        return self._loss_path(self.criterion, outputs, batch)
