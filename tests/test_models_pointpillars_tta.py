"""Test-time augmentation: views map back exactly, the batched merge equals the original's per-label loop, an
identity view reproduces plain detection, and ``drivetrain eval --tta`` refuses models without it."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from drivetrain.models.pointpillars.recipe import LIDAR_AUG
from drivetrain.models.pointpillars.tta import TTAConfig, map_boxes_back, merge, reference_merge, views
from drivetrain.pipeline.augment.bev import apply_bev_aug
from drivetrain.ragged import RaggedBatch

NO_FILTERS = dataclasses.replace(LIDAR_AUG, point_range=None, object_range=None, shuffle=False)


def _boxes(n: int, g: torch.Generator) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=g) * 40 - 20
    rest = torch.cat([torch.rand(n, 1, generator=g) - 1, torch.rand(n, 3, generator=g) * 3 + 0.5], dim=1)
    yaw = torch.rand(n, 1, generator=g) * 2 * math.pi - math.pi
    return torch.cat([xy, rest, yaw, torch.randn(n, 2, generator=g)], dim=1).double()  # (n, 9)


def test_every_view_maps_back_to_the_original_boxes():
    g = torch.Generator().manual_seed(0)
    boxes = _boxes(12, g)
    cfg = TTAConfig(scales=(0.9, 1.1), rotations=(0.0, 0.4))
    params_list = views(cfg, 1, 5, torch.device("cpu"))
    assert len(params_list) == 2 * 2 * 4
    points = RaggedBatch.from_list([torch.zeros(5, 4)])
    for params in params_list:
        _, moved, _ = apply_bev_aug(
            points, RaggedBatch.from_list([boxes]), RaggedBatch.from_list([torch.zeros(12, dtype=torch.int64)]), params,
            NO_FILTERS,
        )  # fmt: skip
        back = map_boxes_back(moved.tensor, params)[0]
        # float32 matrices (the augmentation's own precision) on float64 boxes: ~1e-7 relative of 20 m.
        torch.testing.assert_close(back[:, :6], boxes[:, :6], rtol=0, atol=2e-5)
        torch.testing.assert_close(back[:, 7:], boxes[:, 7:], rtol=0, atol=2e-5)
        turn = torch.remainder(back[:, 6] - boxes[:, 6] + math.pi, 2 * math.pi) - math.pi
        torch.testing.assert_close(turn, torch.zeros_like(turn), rtol=0, atol=2e-6)


def _per_view(g: torch.Generator, num_views: int, batch: int, classes: int):
    out = []
    for _ in range(num_views):
        sizes = torch.randint(0, 30, (batch,), generator=g)
        boxes = [_boxes(int(n), g).float() for n in sizes]
        for b in boxes:
            b[:, :2] = b[:, :2] * 0.3  # crowd them: views overlap and NMS has work
        scores = [torch.rand(int(n), generator=g) * 0.9 + 0.05 for n in sizes]
        labels = [torch.randint(0, classes, (int(n),), generator=g) for n in sizes]
        out.append(tuple(RaggedBatch.from_list(x) for x in (boxes, scores, labels)))
    return out


@pytest.mark.parametrize("max_num", [8, 500])
def test_batched_merge_equals_the_per_sample_original(max_num):
    g = torch.Generator().manual_seed(max_num)
    per_view = _per_view(g, num_views=4, batch=3, classes=4)
    boxes, scores, labels = merge(per_view, 4, 0.2, max_num)
    reference = reference_merge(per_view, 4, 0.2, max_num)
    total = sum(int(v[0].sizes.sum()) for v in per_view)
    assert int(boxes.sizes.sum()) < total  # something was suppressed
    for b, ref in enumerate(reference):
        n = ref["boxes"].shape[0]
        assert int(boxes.sizes[b]) == n
        assert torch.equal(boxes.tensor[b, :n], ref["boxes"]) and torch.equal(scores.tensor[b, :n], ref["scores"])
        assert torch.equal(labels.tensor[b, :n], ref["labels"])
        assert torch.all(ref["scores"][:-1] >= ref["scores"][1:])


@pytest.fixture(scope="module")
def model_and_batch(synth_index, synth_root):
    from drivetrain.data import DatasetConfig, FrameDataset, collate
    from drivetrain.models.pointpillars.model import PointPillars
    from test_models_pointpillars_detector import TINY

    config = DatasetConfig(load_images=False, load_points=True, num_sweeps=1, use_dim=(0, 1, 2, 4))
    dataset = FrameDataset(synth_index, config, synth_root)
    batch = collate([dataset[i] for i in (1, 4)])
    torch.manual_seed(0)
    model = PointPillars(**{**TINY, "decode": {"nms_pre": 60}}).eval()  # few boxes: the reference NMS loops in Python
    with torch.no_grad():
        model.head.conv_cls.bias.add_(4.0)  # many scoring anchors: the merge has work
    return model, batch


def test_one_identity_view_is_plain_detection_sorted_by_score(model_and_batch):
    model, batch = model_and_batch
    plain = model.detect(batch, tta=False)
    model.tta_config = TTAConfig(flips=((False, False),))
    try:
        merged = model.detect(batch)
    finally:
        model.tta_config = None
    for b in range(2):
        n = int(plain[0].sizes[b])
        order = plain[1].tensor[b, :n].argsort(descending=True, stable=True)
        assert int(merged[0].sizes[b]) == n > 10
        assert torch.equal(merged[0].tensor[b, :n], plain[0].tensor[b, :n][order])
        assert torch.equal(merged[2].tensor[b, :n], plain[2].tensor[b, :n][order])


@pytest.mark.slow  # the reference decodes and merges in Python loops: ~15 s on 2 cores
def test_flip_views_batched_and_reference_agree(model_and_batch):
    model, batch = model_and_batch
    model.tta_config = TTAConfig()
    try:
        fast = model.detect(batch)
        model.set_path(impl="reference")
        ref = model.detect(batch)
    finally:
        model.tta_config = None
        model.set_path(impl="batched")
    assert torch.equal(fast[0].sizes, ref[0].sizes)
    for b in range(2):
        n = int(fast[0].sizes[b])
        torch.testing.assert_close(fast[0].tensor[b, :n], ref[0].tensor[b, :n], rtol=0, atol=0)
        assert torch.equal(fast[2].tensor[b, :n], ref[2].tensor[b, :n])


def test_bad_tta_config_is_named():
    with pytest.raises(ValueError, match="scales"):
        TTAConfig(scales=(0.0,))
    with pytest.raises(ValueError, match="flips"):
        TTAConfig(flips=((True,),))
