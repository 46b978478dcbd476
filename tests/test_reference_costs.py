"""The reference paths cost what the originals cost (issue 29 item 3): per path, our reference's ATen kernels against
those of a port of the original's operations (``benchmarks/originals.py``), counted by the same counter on the same
inputs, stand in an exact relation; and each port computes what our reference computes, so the two take the same
data-dependent turns (matches, positives, kept boxes).

Counts depend on shapes and loop counts only, so each relation is exact: the reference's kernels are the original's
plus a fixed number per loop, each number explained below (and in docs/benchmarks.md, "Do the reference paths cost
what the originals cost?"). Values are compared with the tolerance of the two formulas: the ports compute in float32
the same terms in other orders (mmdet's weighted sums over every row, mmcv's focal loss formula), so terms agree to
≤ 1e-5 relative, as the batched path's equality tests allow for a change of summation order.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drivetrain.cli.bench import available, load
from drivetrain.losses.focal_head import focal_head_loss
from drivetrain.models.pointpillars.loss import reference_anchor_head_loss
from drivetrain.models.pointpillars.recipe import NUS_CODE_WEIGHTS, NUS_DIR_OFFSET
from drivetrain.models.streampetr.loss import streampetr_loss

RTOL = 1e-5
FOCAL_HEAD_TERMS = {  # our term names → the original's loss modules
    "enc_loss_cls": "cls",
    "enc_loss_bbox": "bbox",
    "enc_loss_iou": "iou",
    "centers2d_loss": "centers2d",
    "centerness_loss": "centerness",
}


@pytest.fixture(scope="module")
def originals():
    return load(available()["originals"])


def _delta(row) -> int:
    return int(row.reference.kernels - row.original.kernels)


# ---------------------------------------------------------------------- StreamPETR
# StreamPETR's 3D loss, with at least one ground truth in the batch:
#   +1 once: the unassigned-GT counter;
#   +10 per decoder layer: our focal loss is 17 ATen ops (one-hot 3, elementwise 14) where mmcv's CUDA op is 2
#       (new_zeros and its kernel): +15; its targets encoded with one log for the three sizes (normalize_bbox: three):
#       −2; the original's clamp of the positive count before .item() and its two loss-weight products: −3;
#   −6 per sample: the original lifts each sample's boxes to their gravity centres in its loss (6 ops; ours come so);
#   −5 per layer and sample with ground truth: our cost matrix is the original's in 5 fewer ops (one gather of
#       pos − neg for two column indexings, one log for three, the weights folded into mul_/add_);
#   +1 per layer and sample without: our assigner's empty (0, 2) pairs tensor;
#   denoising: +10 once (its targets from our (B, P) layout: labels and boxes repeated per group, the noised labels
#       gathered and written, one-hot once); +5 per layer (the focal loss +12 as above without the one-hot, its
#       targets encoded −2, the original's loss-weight and dn_weight products −4 and count clamp −1); and −1 per layer
#       when there are several: the original's known-query logits are a strided slice of the layers, which mmdet's
#       focal-loss wrapper copies (pred.contiguous()) before mmcv's kernel.
def _streampetr_delta(loops: dict[str, int]) -> int:
    layers, samples = loops["layers"], loops["samples"]
    delta = 1 + 10 * layers - 6 * samples - 5 * layers * loops["samples_with_gt"] + layers * loops["samples_without_gt"]
    return delta + (10 + 5 * layers - (layers if layers > 1 else 0)) * loops["denoising"]


@pytest.mark.parametrize(
    ("batch", "layers", "min_gt", "max_gt", "groups", "seed"),
    [(1, 1, 2, 5, 1, 0), (2, 2, 0, 6, 2, 1), (3, 2, 1, 9, 3, 2), (2, 3, 5, 12, 1, 3)],
)
def test_streampetr_reference_costs_the_original_plus_fixed_differences(
    originals, batch, layers, min_gt, max_gt, groups, seed
):
    streampetr, _ = originals.camera_cases(batch, layers, 30, min_gt, max_gt, groups, seed)
    row = originals.count_streampetr(streampetr)
    assert row.loops["samples_with_gt"] > 0
    assert _delta(row) == _streampetr_delta(row.loops), row
    assert abs(row.ratio - 1) < 0.25  # the fixed differences are small beside the per-sample work


def test_streampetr_port_computes_our_reference_terms(originals):

    data, _ = originals.camera_cases(2, 2, 30, 0, 7, 2, seed=4)
    loss = streampetr_loss(backend="scipy")
    ours = loss.reference(data["outputs"], data["targets"])
    theirs = originals.original_streampetr_loss(
        originals.streampetr_inputs(data["outputs"], data["targets"], loss.code_weights, loss.dn_split)
    )
    assert set(ours) == set(theirs)
    for name, value in ours.items():  # the original returns its terms weighted
        weight = loss.weights[name.split(".")[-1]]
        torch.testing.assert_close(theirs[name] / weight, value, rtol=RTOL, atol=1e-7, msg=name)


# ---------------------------------------------------------------------- focal head and heatmap
# The focal head, with at least one positive in the batch:
#   +16 once: our five terms (QFL, GIoU, L1 ×2, Gaussian focal with mmdet's formulas in fewer ops but each term's
#       nan_to_num, the unassigned-GT counter) against the original's (GIoULoss' any(weight > 0) read, mmdet's QFL
#       with nonzero and index_put, weight_reduce_loss and the loss weights);
#   −2 per image: our xyxy → cxcywh is 4 ops where mmdet's is 7 (−3), and one more op per image in either branch:
#       with ground truth our radius is cast to int64 for the drawing, without it our assigner makes an empty pairs
#       tensor (+1);
#   0 per ground truth: both draw each box with 3 ops (its cell, the peak scaling, the max-merge).
def test_focal_head_reference_costs_the_original_plus_fixed_differences(originals):
    for batch, seed in ((1, 0), (2, 1), (3, 2)):
        _, focal_head = originals.camera_cases(batch=batch, seed=seed)
        row = originals.count_focal_head(focal_head)
        assert row.loops["positives"] > 0
        assert _delta(row) == 16 - 2 * row.loops["images"], row
        assert abs(row.ratio - 1) < 0.05


def test_focal_head_port_computes_our_reference_terms(originals):

    _, data = originals.camera_cases(batch=1, seed=5)
    loss = focal_head_loss(backend="scipy")
    ours = loss.reference(data["outputs"], data["targets"])
    theirs = originals.original_focal_head_loss(originals.focal_head_inputs(data["outputs"], data["targets"]))
    for name, value in ours.items():
        weight = originals.FOCAL_HEAD_WEIGHTS[FOCAL_HEAD_TERMS[name]]
        torch.testing.assert_close(theirs[name] / weight, value, rtol=RTOL, atol=1e-7, msg=name)


def test_heatmap_reference_draws_as_the_original_one_zero_map_fewer_per_image(originals):
    # The original makes a zero map per image and stacks them (images + 1 ops); ours copies the batch's map once.
    from drivetrain.geometry.heatmap import focal_head_radius, reference_draw_gaussians

    _, data = originals.camera_cases(batch=2, seed=6)
    row = originals.count_heatmap(data)
    assert _delta(row) == -row.loops["images"]
    assert row.reference.syncs == row.original.syncs  # per image its radii, per box two centre reads and one copy
    targets = data["targets"]
    cells = [c for r in targets["centers_2d"].apply(lambda t: (t / 16).long()).to_list() for c in r]
    radii = focal_head_radius(targets["centers_2d"].tensor, targets["gt_boxes_2d"].tensor, 16)
    radius_list = [r for row_ in targets["centers_2d"].with_tensor(radii).to_list() for r in row_]
    ours = reference_draw_gaussians(torch.zeros(len(cells), 16, 44), cells, radius_list)
    # the same float64 Gaussian, cast once: equal bit for bit
    assert torch.equal(ours, originals._original_heatmaps(cells, radius_list, (16, 44)))


# ---------------------------------------------------------------------- PointPillars and SSN
@pytest.fixture(scope="module")
def pointpillars_rows(originals):
    cases = [originals.lidar_case("pointpillars", batch=b, min_gt=lo, max_gt=hi, seed=s) for b, lo, hi, s in
             ((1, 1, 4, 0), (2, 0, 6, 1), (3, 2, 9, 2))]  # fmt: skip
    return [originals.count_anchor_head(case) for case in cases]


def test_pointpillars_assignment_costs_the_original_plus_fixed_differences(pointpillars_rows):
    # +1 once: the per-sample assignments stacked into (B, A); +2 per sample with ground truth: our nearest-BEV IoU
    # works per axis (bit-equal, 4 more ops) and skips the two clones mmdet3d's box objects make (−2); +1 per sample
    # without: its all-negative assignment (the original skips its assigner).
    for assignment, _ in pointpillars_rows:
        loops = assignment.loops
        with_gt = loops["samples_with_gt"]
        assert _delta(assignment) == 1 + 2 * with_gt + (loops["samples"] - with_gt), assignment


def test_pointpillars_targets_and_loss_cost_the_original_plus_fixed_differences(pointpillars_rows):
    # +17 once (the loss, less 2 when the box and direction terms run: the original's loss weights on them);
    # −1 per sample with ground truth (our assignment carries no labels, so the sampler gathers none);
    # −11 per sample with positives (our box encoding is 13 ops where mmdet3d's coder is 24).
    for _, targets in pointpillars_rows:
        loops = targets.loops
        expected = 17 - 2 * loops["any_positive"] - loops["samples_with_gt"] - 11 * loops["samples_with_positives"]
        assert _delta(targets) == expected, targets


@pytest.fixture(scope="module")
def ssn_rows(originals):
    cases = [originals.lidar_case("ssn", batch=b, min_gt=lo, max_gt=hi, seed=s) for b, lo, hi, s in
             ((1, 2, 5, 0), (2, 0, 7, 1))]  # fmt: skip
    return [originals.count_anchor_head(case) for case in cases]


def test_ssn_assignment_targets_and_loss_cost_the_original_plus_fixed_differences(ssn_rows):
    # SSN assigns and builds targets per class. The original splits a sample's ground truth by class in its targets
    # (4 ops per class: a mask, two boolean indexings, a box clone) and assigns each class on its own anchors; ours
    # splits in the assignment (6 ops per class: both masks, nonzero, the class's anchors, its all-negative result or
    # its scatter back, and +9 per class with ground truth: its boxes and labels gathered, the IoU as above +2, the
    # class-local indices mapped to the sample's) and builds targets on the class blocks, as views.
    for assignment, targets in ssn_rows:
        loops = assignment.loops
        samples, present = loops["samples"], loops["class_samples_with_gt"]
        assert _delta(assignment) == 1 + 61 * samples + 9 * present, assignment
        # targets: −40 per sample for the original's class split, −2 for its two more concatenations per sample;
        # −1 per class with ground truth (no labels to gather), −11 per class with positives (the box encoding)
        expected = 16 - 42 * samples - present - 11 * loops["class_samples_with_positives"]
        assert _delta(targets) == expected, targets


def test_anchor_head_ports_compute_our_reference_terms(originals, pointpillars_rows):
    for name in ("pointpillars", "ssn"):
        case = originals.lidar_case(name, batch=2, min_gt=2, max_gt=6, seed=7)
        model, outputs, gt_boxes, gt_labels = case["model"], case["outputs"], case["gt_boxes"], case["gt_labels"]
        assigned = model.assign(outputs["feature_size"], gt_boxes, gt_labels)
        head = (outputs["cls_logits"], outputs["box_preds"], outputs["dir_logits"], outputs["anchors"])
        ours = model.criterion.reference(*head, assigned, gt_boxes, gt_labels, anchor_classes=case["classes"])
        theirs = originals.original_anchor_head_loss(originals.anchor_head_inputs(model, outputs, gt_boxes, gt_labels))
        for term, value in ours.items():
            torch.testing.assert_close(theirs[term] / model.criterion.weights[term], value, rtol=RTOL, atol=0.0)


def test_reference_anchor_head_loss_names_a_label_beyond_the_classes():
    anchors = torch.tensor([[0.0, 0, 0, 4, 2, 1.5, 0, 0, 0]])
    box = anchors.clone()
    with pytest.raises(ValueError, match="gt_labels"):
        reference_anchor_head_loss(
            [torch.zeros(1, 3)], [torch.zeros(1, 9)], [torch.zeros(1, 2)], anchors, [torch.ones(1, dtype=torch.long)],
            [box], [torch.tensor([7])], code_weights=NUS_CODE_WEIGHTS, dir_offset=NUS_DIR_OFFSET,
        )  # fmt: skip


# ---------------------------------------------------------------------- decoding
@pytest.fixture(scope="module")
def decode_rows(originals):
    case = originals.lidar_case("pointpillars", batch=3, min_gt=2, max_gt=4, seed=8)
    rows = []
    for nms_pre, live_classes in ((60, [10, 4]), (100, [3, 0, 7]), (40, [1])):
        data = originals.decode_case(case)
        logits = data["cls_logits"][: len(live_classes)].clone()
        for b, k in enumerate(live_classes):
            logits[b, :, k:] = -30.0  # classes without a candidate: no NMS call
        data |= {"cls_logits": logits, "box_preds": data["box_preds"][: len(live_classes)],
                 "dir_logits": data["dir_logits"][: len(live_classes)],
                 "cfg": dataclasses.replace(data["cfg"], nms_pre=nms_pre)}  # fmt: skip
        rows.append(originals.count_decode(data))
    return rows


def test_rotated_nms_reference_costs_the_original_plus_its_iou_per_call(decode_rows):
    # +200 per NMS call: mmcv's CUDA kernel makes the suppression mask in one launch; ours is our rotated-IoU primitive
    # (207 ATen ops for up to 512 boxes: one chunk) and its threshold (+1): +207; without mmdet3d's xyxyr → xywhr
    # round trip (−7). +6 per sample: its valid boxes selected (nonzero and three gathers), their positions.
    for nms, _ in decode_rows:
        assert nms.loops["most_candidates"] <= 512
        assert _delta(nms) == 6 * nms.loops["samples"] + 200 * nms.loops["nms_calls"], nms


def test_decoding_reference_costs_the_original_plus_its_iou_per_call(decode_rows):
    # −26 per sample: our box decoding is 11 ops fewer than mmdet3d's coder, no xywhr2xyxyr (12) and box-object
    # clones (2) and no background score column (2), one positions tensor (+1); +1 per sample with a call (its kept
    # boxes' direction bins gathered once); +200 per NMS call as above.
    for _, decoding in decode_rows:
        loops = decoding.loops
        expected = -26 * loops["samples"] + loops["samples_with_calls"] + 200 * loops["nms_calls"]
        assert _delta(decoding) == expected, decoding


def test_decoding_port_keeps_what_our_reference_keeps(originals):
    from drivetrain.models.pointpillars.postprocess import reference_decode

    data = originals.decode_case(originals.lidar_case("pointpillars", batch=2, min_gt=2, max_gt=4, seed=9))
    cfg = dataclasses.replace(data["cfg"], nms_pre=80)
    head = (data["cls_logits"], data["box_preds"], data["dir_logits"], data["anchors"])
    ours = reference_decode(*head, cfg)
    theirs = originals.original_decode(originals.decode_inputs(*head, cfg))
    for mine, (boxes, scores, labels) in zip(ours, theirs, strict=True):
        assert torch.equal(mine["labels"], labels) and torch.equal(mine["scores"], scores)
        # the original hands bottom-centre boxes back; its yaw is ours
        torch.testing.assert_close(mine["boxes"][:, 6], boxes[:, 6], rtol=0, atol=1e-6)
