"""Anchor-head decoding: the batched path equals the per-sample original (top-k, decode, multi-class rotated
NMS, direction correction), with and without candidate compaction; hand-checked cases for each step."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.geometry.delta_coder import encode_delta_xyzwlhr
from drivetrain.models.pointpillars.postprocess import DecodeConfig, decode, reference_decode


def _anchors(num: int, generator: torch.Generator) -> torch.Tensor:
    """Anchors on a 20 m square, sizes of cars and pedestrians, yaws 0 or 1.57 (as the grids)."""
    xy = torch.rand(num, 2, generator=generator) * 20 - 10
    size = torch.where(torch.rand(num, 1, generator=generator) < 0.5, torch.tensor([4.6, 1.95, 1.7]), 0.7)
    yaw = (torch.rand(num, 1, generator=generator) < 0.5).float() * 1.57
    return torch.cat([xy, torch.full((num, 1), -1.0), size, yaw, torch.zeros(num, 2)], dim=1)  # (A, 9)


def _outputs(batch: int, num: int, classes: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    anchors = _anchors(num, g)
    cls_logits = torch.randn(batch, num, classes, generator=g) * 2 - 3  # continuous: no score ties
    cls_logits[-1] = -10.0  # the last sample: no class candidate anywhere
    box_preds = torch.randn(batch, num, 9, generator=g) * 0.3
    dir_logits = torch.randn(batch, num, 2, generator=g)
    return cls_logits, box_preds, dir_logits, anchors


@pytest.mark.parametrize("nms_pre", [64, 1000])  # below and above the anchor count (the original's two branches)
@pytest.mark.parametrize("compact", [False, True])
def test_batched_decode_equals_the_per_sample_original(nms_pre, compact):
    cls_logits, box_preds, dir_logits, anchors = _outputs(3, 200, 4, seed=nms_pre)
    cfg = DecodeConfig(nms_pre=nms_pre, max_num=40)
    boxes, scores, labels = decode(cls_logits, box_preds, dir_logits, anchors, cfg, compact=compact)
    reference = reference_decode(cls_logits, box_preds, dir_logits, anchors, cfg)
    assert boxes.sizes.tolist() == [r["boxes"].shape[0] for r in reference]
    assert boxes.sizes[0] > 5 and boxes.sizes[-1] == 0  # both some detections and an empty sample
    for b, ref in enumerate(reference):
        n = ref["boxes"].shape[0]
        # The same float ops on the same values: bit-equal.
        torch.testing.assert_close(boxes.tensor[b, :n], ref["boxes"], rtol=0, atol=0)
        assert torch.equal(scores.tensor[b, :n], ref["scores"]) and torch.equal(labels.tensor[b, :n], ref["labels"])


def test_max_num_cuts_by_score():
    cls_logits, box_preds, dir_logits, anchors = _outputs(2, 300, 3, seed=5)
    cfg = DecodeConfig(nms_pre=300, max_num=10)
    boxes, scores, _ = decode(cls_logits, box_preds, dir_logits, anchors, cfg)
    reference = reference_decode(cls_logits, box_preds, dir_logits, anchors, cfg)
    assert boxes.sizes.tolist() == [10, 0] and reference[0]["scores"].shape == (10,)
    assert torch.equal(scores.tensor[0], reference[0]["scores"])
    assert torch.all(scores.tensor[0, :-1] >= scores.tensor[0, 1:])  # sorted when more than max_num were kept


def _single(boxes: torch.Tensor, logits: torch.Tensor, dir_logits: torch.Tensor, anchors: torch.Tensor, **cfg):
    """Decode exact target boxes: the deltas are their encodings against ``anchors``."""
    deltas = encode_delta_xyzwlhr(anchors, boxes)[None]  # (1, N, 9)
    out = decode(logits[None], deltas, dir_logits[None], anchors, DecodeConfig(**cfg))
    return [t.to_list()[0] for t in out]


def test_overlapping_boxes_of_one_class_suppress_and_of_two_classes_do_not():
    anchors = torch.tensor([[0.0, 0, -1, 4, 2, 1.5, 0, 0, 0]] * 2)
    boxes = torch.tensor([[0.0, 0, -1, 4, 2, 1.5, 0.3, 0, 0], [0.2, 0, -1, 4, 2, 1.5, 0.3, 0, 0]])  # IoU ≈ 0.9
    dirs = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    same = torch.tensor([[2.0, -9.0], [1.0, -9.0]])  # both class 0
    kept, scores, labels = _single(boxes, same, dirs, anchors)
    assert labels.tolist() == [0] and torch.allclose(kept[0, :2], boxes[0, :2], atol=1e-5)
    assert scores.tolist() == pytest.approx([torch.sigmoid(torch.tensor(2.0)).item()])
    apart = torch.tensor([[2.0, -9.0], [-9.0, 1.0]])  # class 0 and class 1
    _, _, labels = _single(boxes, apart, dirs, anchors)
    assert labels.tolist() == [0, 1]


def test_score_threshold_is_strict_and_nms_threshold_suppresses_above_it():
    anchors = torch.tensor([[0.0, 0, -1, 2, 2, 1.5, 0, 0, 0], [1.0, 0, -1, 2, 2, 1.5, 0, 0, 0]])
    dirs = torch.zeros(2, 2)
    # Two 2×2 squares one metre apart: IoU = 2 / 6 = 1/3.
    logits = torch.tensor([[3.0], [2.0]])
    assert len(_single(anchors, logits, dirs, anchors, nms_threshold=0.3)[0]) == 1
    assert len(_single(anchors, logits, dirs, anchors, nms_threshold=0.34)[0]) == 2
    at_threshold = torch.logit(torch.tensor([[0.5], [0.9]]))  # sigmoid 0.5 is not > 0.5
    _, scores, _ = _single(anchors, at_threshold, dirs, anchors, score_threshold=0.5, nms_threshold=1.0)
    assert scores.tolist() == pytest.approx([0.9])


@pytest.mark.parametrize(
    ("yaw", "bin_", "expected"),
    [
        (0.3, 0, 0.3),  # in (−π/4, 3π/4): bin 0 keeps it
        (0.3, 1, 0.3 + math.pi),  # bin 1 turns it around
        (3.0, 0, 3.0 - math.pi),  # folded into the half turn above −0.7854 first
        (-1.0, 1, -1.0 + 2 * math.pi),  # −1.0 folds to −1 + π, then bin 1 adds π
    ],
)
def test_direction_bin_correction(yaw, bin_, expected):
    anchors = torch.tensor([[0.0, 0, -1, 4, 2, 1.5, 0, 0, 0]])
    box = anchors.clone()
    box[0, 6] = yaw
    dirs = torch.tensor([[1.0, 0.0]]) if bin_ == 0 else torch.tensor([[0.0, 1.0]])
    kept, _, _ = _single(box, torch.tensor([[2.0]]), dirs, anchors)
    assert kept[0, 6].item() == pytest.approx(expected, abs=1e-5)


def test_bad_inputs_are_named():
    cls_logits, box_preds, dir_logits, anchors = _outputs(2, 50, 3, seed=0)
    with pytest.raises(ValueError, match="dir_logits"):
        decode(cls_logits, box_preds, dir_logits[..., :1], anchors)
    with pytest.raises(ValueError, match="anchors"):
        reference_decode(cls_logits, box_preds, dir_logits, anchors[:10])
    with pytest.raises(ValueError, match="nms_pre"):
        DecodeConfig(nms_pre=0)
    with pytest.raises(ValueError, match="nms_threshold"):
        DecodeConfig(nms_threshold=1.5)
