"""A third detector as a plugin, in one file: its spec, model and criterion (docs/design.md, "A new detector").

``SlotDetector`` reads lidar points, pools one feature per frame and predicts a fixed set of box slots (class
logits and a box each); its criterion matches slots to ground truth one-to-one with drivetrain's batched
Hungarian solver (:func:`drivetrain.match.solve`) and sums a focal classification term over every slot and an L1
box term over the matched ones. It is deliberately small: what it proves is the wiring, not accuracy — that a
detector defined here, registered with ``drivetrain ... --plugin slot_detector``, trains, checkpoints, resumes
exactly and is scored by ``drivetrain eval`` with no file of drivetrain changed (tests/test_plugin_detector.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from drivetrain.batch import Batch
from drivetrain.engine.registry import register_model
from drivetrain.losses.functional import sigmoid_focal_loss
from drivetrain.match import solve
from drivetrain.model_spec import ModelSpec
from drivetrain.ragged import RaggedBatch

BOX = 9  # (x, y, z_centre, dx, dy, dz, yaw, vx, vy), the dataset's box code


@dataclass(frozen=True)
class SlotArgs:
    """``model.args`` of ``slots``."""

    num_classes: int = 10  # the dataset's classes (nuScenes: 10)
    num_slots: int = 16  # boxes predicted per frame
    width: int = 32  # feature channels
    extent: float = 32.0  # metres: centres are predicted in ±extent


class SlotDetector(nn.Module):
    """Points → per-point MLP → masked max-pool → ``num_slots`` boxes and class logits."""

    input_modalities: ClassVar[tuple[str, ...]] = ("lidar",)
    loss_weights: ClassVar[dict[str, float]] = {"loss_cls": 1.0, "loss_box": 0.25}

    def __init__(self, num_classes: int = 10, num_slots: int = 16, width: int = 32, extent: float = 32.0) -> None:
        super().__init__()
        self.num_classes, self.num_slots, self.extent = num_classes, num_slots, extent
        self.points = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, num_slots * (num_classes + BOX))
        nn.init.constant_(self.head.bias[: num_slots * num_classes], -4.6)  # prior 0.01, as focal-loss heads start

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        points = batch.points  # (B, P, 5) ragged
        xyz = points.tensor[..., :4] / self.extent  # (B, P, 4): x, y, z, intensity (scaled)
        features = self.points(xyz)  # (B, P, W)
        features = features.masked_fill(~points.mask.unsqueeze(-1), float("-inf")).amax(1)  # (B, W)
        features = torch.nan_to_num(features, neginf=0.0)  # a frame without points pools to zero
        out = self.head(features).view(-1, self.num_slots, self.num_classes + BOX)  # (B, S, C + 9)
        logits, raw = out.split([self.num_classes, BOX], dim=-1)
        centre = torch.tanh(raw[..., :3]) * self.extent  # (B, S, 3)
        size = raw[..., 3:6].clamp(-5.0, 5.0).exp()  # (B, S, 3)
        boxes = torch.cat([centre, size, raw[..., 6:]], dim=-1)  # (B, S, 9)
        return {"logits": logits, "boxes": boxes}

    def loss(self, outputs: dict[str, torch.Tensor], batch: Batch) -> dict[str, torch.Tensor]:
        return slot_loss(outputs["logits"].float(), outputs["boxes"].float(), batch.gt_boxes, batch.gt_labels)

    @torch.no_grad()
    def detect(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outputs = self.forward(batch)
        scores, labels = outputs["logits"].sigmoid().max(-1)  # (B, S)
        return outputs["boxes"], scores, labels


def slot_loss(
    logits: torch.Tensor, boxes: torch.Tensor, gt_boxes: RaggedBatch, gt_labels: RaggedBatch
) -> dict[str, torch.Tensor]:
    """The criterion: one-to-one matching on centre distance, focal classification over all slots, L1 on matches.

    Args:
        logits: ``(B, S, C)``; boxes: ``(B, S, 9)``; gt_boxes: ragged ``(B, G, 9)``; gt_labels: ragged ``(B, G)``.

    Returns:
        ``loss_cls`` and ``loss_box``, each divided by the number of ground truths (at least 1).
    """
    num_classes = logits.shape[-1]
    with torch.no_grad():
        cost = torch.cdist(boxes[..., :3], gt_boxes.tensor[..., :3])  # (B, S, G)
        pairs = solve(RaggedBatch(cost, gt_boxes.sizes, ragged_dim=2))  # (B, G, 2) (slot, gt), ragged G
    matched = pairs.mask  # (B, G)
    slot, gt = pairs.tensor[..., 0].clamp(min=0), pairs.tensor[..., 1].clamp(min=0)  # (B, G)
    labels = gt_labels.tensor.gather(1, gt)  # (B, G)
    target = torch.zeros_like(logits)  # (B, S, C)
    one_hot = nn.functional.one_hot(labels.clamp(min=0), num_classes).to(logits.dtype)  # (B, G, C)
    target.scatter_add_(1, slot.unsqueeze(-1).expand(-1, -1, num_classes), one_hot * matched.unsqueeze(-1))
    count = gt_boxes.sizes.sum().clamp(min=1).to(logits.dtype)
    loss_cls = sigmoid_focal_loss(logits, target).sum() / count
    pred = boxes.gather(1, slot.unsqueeze(-1).expand(-1, -1, BOX))  # (B, G, 9)
    truth = gt_boxes.tensor.gather(1, gt.unsqueeze(-1).expand(-1, -1, BOX))  # (B, G, 9)
    loss_box = ((pred - truth).abs().nan_to_num(0.0) * matched.unsqueeze(-1)).sum() / count
    return {"loss_cls": loss_cls, "loss_box": loss_box}


SPEC = register_model(
    ModelSpec(
        "slots",
        build=SlotDetector,
        args=SlotArgs,
        modalities=frozenset({"lidar"}),
        summary="a lidar slot detector defined in one plugin file",
    )
)
