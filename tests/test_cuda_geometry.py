"""Geometry, assignment and heatmaps on CUDA against the CPU references on the same inputs: rotated BEV IoU (dense
and sparse), rotated NMS (batched, per group, multi-class with its shortened pass), Gaussian heatmaps, the max-IoU
assigner and its anchor windows. Every result that is a decision (kept boxes, assignments) must be equal; IoUs and
heatmap values within the float rounding of the two devices' kernels."""

from __future__ import annotations

import pytest
import torch

from drivetrain.geometry.heatmap import draw_gaussians
from drivetrain.geometry.rotated_iou import rotated_bev_iou_pairwise
from drivetrain.geometry.rotated_nms import (
    BEV_COLUMNS,
    batched_rotated_nms,
    multiclass_rotated_nms,
    reference_multiclass_rotated_nms,
)
from drivetrain.match.anchor_window import windowed_max_iou_assign_with_pairs
from drivetrain.match.max_iou import (
    anchor_thresholds,
    batched_max_iou_assign,
    reference_max_iou_assign,
    reference_max_iou_assign_per_class,
)
from drivetrain.models.pointpillars.anchors import grid_anchors, grid_layout, per_class_anchors, per_class_layout
from drivetrain.models.pointpillars.recipe import NUS_PP_ASSIGNER
from test_geometry_heatmap import MAX_R, initial_heatmap, random_targets
from test_geometry_heatmap import reference as reference_heatmap
from test_geometry_rotated_iou import _random_boxes
from test_geometry_rotated_nms import _lidar_scene, _reference_mask, _scene, _tie_free_scores
from test_match_anchor_window import CONFIGS, ROTATED, _awkward
from test_match_max_iou import PER_CLASS_SIZES, SSN_CFGS, TINY, batch_of, scene

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICE = "cuda"
# float64 IoU: about a hundred operations on coordinates below 10 on each device (sin/cos, clipping, shoelace), each
# within 2^-53 relative: ~1e-14; 1e-12 as the CPU tests allow against an independent polygon reference.
# float32 IoU: each device rounds the vertices by ~1e-7 relative (its own sin/cos, maybe fused multiply-adds), an
# area moves by perimeter (≤ 13) × 1e-6 and the IoU by that over the union (≥ 0.04): 3e-4, as float32 against
# float64 on one device (tests/test_geometry_rotated_iou.py).
IOU_ATOL = {torch.float64: 1e-12, torch.float32: 3e-4}
# A decision that compares an IoU with a threshold is the same on both devices when no IoU lies within the two
# devices' float64 difference (IOU_ATOL) of it: the tests check that precondition with 1e-9.
DECISION_MARGIN = 1e-9


def _assert_clear_of(iou: torch.Tensor, threshold: float) -> None:
    """Precondition: no IoU within DECISION_MARGIN of ``threshold`` (else the devices may decide either way)."""
    assert ((iou - threshold).abs() > DECISION_MARGIN).all(), "an IoU lies at the threshold: pick other inputs"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_rotated_iou_on_cuda_equals_the_cpu_one_dense_and_sparse(dtype, gen):
    boxes = _random_boxes(gen, 300, dtype=dtype)  # (300, 5)
    batched = _random_boxes(gen, 2 * 3 * 40, dtype=dtype).view(2, 3, 40, 5)  # leading dims broadcast
    cpu = rotated_bev_iou_pairwise(boxes, boxes)
    gpu = rotated_bev_iou_pairwise(boxes.to(DEVICE), boxes.to(DEVICE))
    assert gpu.dtype == dtype and gpu.device.type == DEVICE
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=IOU_ATOL[dtype])
    if dtype == torch.float64:  # disjoint pairs are exactly 0 on both (float32 may round a touching pair either way)
        assert torch.equal(gpu.cpu() == 0, cpu == 0)
    assert (cpu > 0).float().mean() < 0.5 and (cpu.diagonal() > 0.99).all()  # a mix of disjoint and overlapping
    # the sparse path (meeting pairs by index on the device) gives the dense CPU matrix, with leading dims
    sparse = rotated_bev_iou_pairwise(batched.to(DEVICE), batched[:1].to(DEVICE), sparse=True).cpu()
    torch.testing.assert_close(sparse, rotated_bev_iou_pairwise(batched, batched[:1]), rtol=0, atol=IOU_ATOL[dtype])


def test_sparse_rotated_iou_on_cuda_under_tf32_is_the_dense_matrix(gen):
    """With ``allow_tf32`` (``speed.tf32: true``; the run's evaluation inherits it) a float32 matmul on CUDA rounds
    its inputs to 10 mantissa bits: cdist's matmul form ``|a|² + |b|² − 2a·b`` (its default beyond 25 rows) is then
    off by about ``5000 × 2⁻¹¹ ≈ 2.4`` square metres at lidar range, which dropped overlapping pairs (IoU up to 1)
    from the sparse path's meeting pairs (PointPillars' compact decoding). The gaps are each pair's difference,
    untouched by the flag. Same device, same per-pair ops: the float32 tolerance of the two devices (IOU_ATOL)
    bounds the difference, and a dropped pair breaks it."""
    torch.backends.cuda.matmul.allow_tf32 = True  # restored by conftest
    n = 300
    centre = torch.rand(n, 2, generator=gen) * 20 + 30  # (n, 2) a crowd near the corner of a nuScenes range
    size = torch.rand(n, 2, generator=gen) * 0.8 + 0.3  # (n, 2) pedestrian- to cone-sized: small radii
    boxes = torch.cat([centre, size, torch.rand(n, 1, generator=gen) * 6], dim=-1).to(DEVICE)  # (n, 5) float32
    dense = rotated_bev_iou_pairwise(boxes, boxes)  # elementwise clipping: no matmul
    assert (dense > 0.1).sum() > n + 100  # overlapping pairs beside the diagonal
    sparse = rotated_bev_iou_pairwise(boxes, boxes, sparse=True)
    torch.testing.assert_close(sparse, dense, rtol=0, atol=IOU_ATOL[torch.float32])


@pytest.mark.parametrize("threshold", [0.1, 0.5])
def test_batched_rotated_nms_on_cuda_equals_the_per_sample_reference(threshold, gen):
    boxes = _scene(gen, 4, 60)  # (4, 60, 5) float64, crowded
    scores = _tie_free_scores(gen, 4, 60)  # (4, 60)
    valid = torch.rand(4, 60, generator=gen) < 0.85
    valid[2] = False  # an empty sample
    groups = torch.randint(0, 3, (4, 60), generator=gen)
    _assert_clear_of(rotated_bev_iou_pairwise(boxes, boxes), threshold)
    moved = [t.to(DEVICE) for t in (boxes, scores, valid)]
    for group in (None, groups):
        keep = batched_rotated_nms(*moved, threshold, None if group is None else group.to(DEVICE))
        assert keep.device.type == DEVICE
        expected = _reference_mask(boxes, scores, valid, threshold, group)
        assert torch.equal(keep.cpu(), expected)
        assert expected.sum() < valid.sum()  # something was suppressed


@pytest.mark.parametrize(
    ("score_threshold", "iou_threshold", "max_num", "sparse"),
    [(0.05, 0.2, 500, False), (0.3, 0.5, 9, True)],
    ids=["published", "sparse_truncated"],
)
def test_multiclass_nms_on_cuda_equals_the_reference(score_threshold, iou_threshold, max_num, sparse, gen):
    """mmdet3d's multi-class NMS on CUDA (also the sparse IoU and the pass shortened to the largest class's
    candidate count, as compact decoding runs it) against the per-sample, per-class original on the CPU."""
    boxes, scores = _lidar_scene(gen, 4, 50, 5)  # (4, 50, 9), (4, 50, 5)
    valid = torch.rand(4, 50, generator=gen) < 0.9
    valid[1] = False
    scores[3, :, 2] = 0.01  # a class with no candidate in one sample
    bev = boxes[..., list(BEV_COLUMNS)]
    _assert_clear_of(rotated_bev_iou_pairwise(bev, bev), iou_threshold)
    candidates = (scores > score_threshold) & valid.unsqueeze(-1)  # (B, N, C)
    steps = int(candidates.sum(dim=1).max()) if sparse else None
    out = multiclass_rotated_nms(
        boxes.to(DEVICE), scores.to(DEVICE), valid.to(DEVICE), score_threshold, iou_threshold, max_num,
        sparse=sparse, max_candidates=steps,
    )  # fmt: skip
    out_boxes, out_scores, out_labels, out_indices = (rb.to("cpu") for rb in out)
    expected = reference_multiclass_rotated_nms(boxes, scores, valid, score_threshold, iou_threshold, max_num)
    for b, ref in enumerate(expected):
        n = int(out_boxes.sizes[b])
        assert n == ref["boxes"].shape[0]
        assert torch.equal(out_indices.tensor[b, :n], ref["indices"])
        assert torch.equal(out_labels.tensor[b, :n], ref["labels"])
        assert torch.equal(out_scores.tensor[b, :n], ref["scores"])
        assert torch.equal(out_boxes.tensor[b, :n], ref["boxes"])
    assert int(out_boxes.sizes[1]) == 0 and int(out_boxes.sizes.sum()) > 0
    if sparse:
        assert (out_boxes.sizes == max_num).any()  # the truncation to max_num by score ran


@pytest.mark.parametrize(
    ("num_classes", "max_radius"),
    [(0, None), (3, MAX_R), (3, None)],
    ids=["dense_no_labels", "window_labels", "dense_labels"],
)
def test_heatmap_drawing_on_cuda_equals_the_per_box_reference(num_classes, max_radius):
    """The batched Gaussians on CUDA (each path: the dense maximum, the windowed and the dense scatter) against the
    original's per-box loop on the CPU: values ≤ 1, exp and products on two devices a few float32 ulps apart
    (1e-6, as the CPU test's bound for exp's ulps)."""
    gen = torch.Generator().manual_seed(23)
    centres, radii, labels = random_targets((2, 3), 9, gen, num_classes=num_classes)
    heatmap = initial_heatmap((2, 3), num_classes, gen, zero=False)
    expected = reference_heatmap(heatmap, centres, radii, labels)
    out = draw_gaussians(
        heatmap.to(DEVICE), centres.to(DEVICE), radii.to(DEVICE), labels.to(DEVICE) if labels is not None else None,
        max_radius=max_radius,
    )  # fmt: skip
    assert out.device.type == DEVICE and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=1e-6)
    assert (expected > heatmap).sum() > 20  # something was drawn


@pytest.mark.parametrize("per_class", [False, True], ids=["class_agnostic", "per_class"])
def test_max_iou_assignment_on_cuda_equals_the_per_sample_reference(per_class, gen):
    """The dense batched assigner on CUDA, whole and in anchor slices, against the original's per-sample (per-class)
    loop on the CPU. The nearest-BEV IoUs are the same float32 element-wise operations on both devices, so the
    assignments (ties included: exact anchor copies, a duplicate GT) are equal."""
    if per_class:
        anchors, classes = per_class_anchors(TINY, PER_CLASS_SIZES)
        samples = [scene(anchors, n, 3, gen) for n in (9, 0, 4)]
        expected = torch.stack(
            [reference_max_iou_assign_per_class(anchors, classes, b, lab, SSN_CFGS) for b, lab in samples]
        )
        th = anchor_thresholds(SSN_CFGS, anchor_classes=classes.to(DEVICE))
        kwargs = {"anchor_classes": classes.to(DEVICE)}
    else:
        anchors = grid_anchors(TINY, (8, 8))  # (384, 9)
        samples = [scene(anchors, n, 3, gen) for n in (7, 0, 12)]
        expected = torch.stack([reference_max_iou_assign(anchors, b, lab, NUS_PP_ASSIGNER) for b, lab in samples])
        th = anchor_thresholds(NUS_PP_ASSIGNER, num_anchors=anchors.shape[0], device=DEVICE)
        kwargs = {}
    gt_boxes, gt_labels = (rb.to(DEVICE) for rb in batch_of(samples))
    for chunk in (None, 37):
        got = batched_max_iou_assign(anchors.to(DEVICE), gt_boxes, gt_labels, th, chunk=chunk, **kwargs)
        assert got.device.type == DEVICE and torch.equal(got.cpu(), expected)
    assert (expected > 0).any() and (expected == 0).any()


@pytest.mark.parametrize("layout", ["tiny", "rotated", "per_class"])
def test_windowed_assignment_on_cuda_equals_the_dense_one_on_the_cpu(layout, gen):
    """The anchor windows on CUDA (their bounds in float64 on the device, the pair list sized by one host read)
    give the dense CPU assignment for every assigner config (thresholds at 0, no low-quality matches, ...) and the
    same window pairs; the GTs include a huge one, one outside the grid, a tiny one, one across the axes and an
    exact anchor copy."""
    if layout == "per_class":
        anchors, classes = per_class_anchors(TINY, PER_CLASS_SIZES)
        grid = per_class_layout(TINY, PER_CLASS_SIZES)
        configs = [SSN_CFGS]
    else:
        anchor_cfg = TINY if layout == "tiny" else ROTATED
        anchors, classes = grid_anchors(anchor_cfg, (8, 8)), None
        grid = grid_layout(anchor_cfg, (8, 8))
        configs = CONFIGS
    samples = [scene(anchors, n, 3, gen) for n in (7, 0, 12)] + [_awkward(anchors, gen)]
    gt_boxes, gt_labels = batch_of(samples)
    moved_boxes, moved_labels = gt_boxes.to(DEVICE), gt_labels.to(DEVICE)
    for cfg in configs:
        kwargs = {"anchor_classes": classes} if classes is not None else {}
        th = anchor_thresholds(cfg, num_anchors=None if classes is not None else anchors.shape[0], **kwargs)
        expected = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, **kwargs)
        _, cpu_pairs = windowed_max_iou_assign_with_pairs(anchors, grid, gt_boxes, gt_labels, th, **kwargs)
        moved = {k: v.to(DEVICE) for k, v in kwargs.items()}
        th_gpu = anchor_thresholds(cfg, num_anchors=None if classes is not None else anchors.shape[0],
                                   device=DEVICE, **moved)  # fmt: skip
        got, pairs = windowed_max_iou_assign_with_pairs(
            anchors.to(DEVICE), grid, moved_boxes, moved_labels, th_gpu, **moved
        )
        assert got.device.type == DEVICE and torch.equal(got.cpu(), expected), cfg
        assert (pairs is None) == (cpu_pairs is None)
        if pairs is not None:  # the same pairs, in the same order
            assert torch.equal(pairs.flat.cpu(), cpu_pairs.flat) and torch.equal(pairs.gt.cpu(), cpu_pairs.gt)
        assert (expected > 0).any()
