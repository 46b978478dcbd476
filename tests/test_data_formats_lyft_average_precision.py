"""The Lyft metric on hand-worked examples of lyft_dataset_sdk's definition (3D IoU, strict threshold, VOC-style
greedy matching by score, all-point AP), and its polygon clipping against shapely.

Cross-checked against the SDK itself (PyPI 0.0.8 and GitHub master) by scripts/lyft_sdk_crosscheck.py, which
needs the SDK in a separate environment; these tests do not."""

import numpy as np
import pytest

from drivetrain.data.formats.lyft.average_precision import (
    IOU_THRESHOLDS,
    LyftBoxes,
    average_precision,
    bev_intersection,
    class_average_precisions,
    footprint_corners,
    iou_3d,
    lyft_average_precisions,
)


def boxes(*rows, sample=None, score=None):
    """Boxes from rows (x, y, z, width, length, height, yaw[, pitch]); yaw/pitch as a z-then-y quaternion."""
    rows = np.array([list(r) + [0.0] * (8 - len(r)) for r in rows], dtype=np.float64).reshape(-1, 8)
    yaw, pitch = rows[:, 6], rows[:, 7]
    cy, sy, cp, sp = np.cos(yaw / 2), np.sin(yaw / 2), np.cos(pitch / 2), np.sin(pitch / 2)
    rotation = np.stack([cy * cp, -sy * sp, cy * sp, sy * cp], 1)
    k = len(rows)
    sample = np.zeros(k, np.int64) if sample is None else np.asarray(sample, np.int64)
    score = np.ones(k) if score is None else np.asarray(score, np.float64)
    return LyftBoxes(sample, rows[:, :3], rows[:, 3:6], rotation, score)


UNIT = (0, 0, 0, 1, 1, 1, 0)


def aps(gt, pred):
    return class_average_precisions(gt, pred, IOU_THRESHOLDS)


def test_bev_intersection_equals_shapely_on_random_rectangles():
    polygon = pytest.importorskip("shapely.geometry").Polygon
    rng = np.random.default_rng(0)
    k = 500
    a = boxes(*np.concatenate([rng.uniform(-3, 3, (k, 3)) + 1500, rng.uniform(0.3, 6, (k, 3)),
                               rng.uniform(-4, 4, (k, 1))], 1))  # fmt: skip
    b = boxes(*np.concatenate([rng.uniform(-3, 3, (k, 3)) + 1500, rng.uniform(0.3, 6, (k, 3)),
                               rng.uniform(-4, 4, (k, 1))], 1))  # fmt: skip
    ca, cb = footprint_corners(a), footprint_corners(b)
    cb[:50] = ca[:50]  # identical footprints: every edge collinear with one of the other
    cb[50:100] = ca[50:100] + np.array([0.5, 0.0])
    reference = [polygon(ca[i]).intersection(polygon(cb[i])).area for i in range(k)]
    np.testing.assert_allclose(bev_intersection(ca, cb), reference, rtol=1e-9, atol=1e-9)


def test_unit_cubes_offset_by_a_quarter_have_iou_0_6_and_match_only_below_it():
    gt, pred = boxes(UNIT), boxes((0.25, 0, 0, 1, 1, 1, 0))
    assert iou_3d(pred, gt)[0] == 0.6  # 0.75 / (1 + 1 - 0.75)
    np.testing.assert_array_equal(aps(gt, pred), [1, 1, 0, 0, 0, 0, 0, 0, 0, 0])  # 0.6 > 0.6 is no match


def test_an_iou_equal_to_the_threshold_is_not_a_match():
    gt, pred = boxes((0, 0, 0, 1, 3, 1, 0)), boxes((1, 0, 0, 1, 3, 1, 0))
    assert iou_3d(pred, gt)[0] == 0.5  # 2 / (3 + 3 - 2)
    assert aps(gt, pred)[0] == 0.0


def test_iou_is_footprint_overlap_times_height_overlap():
    assert iou_3d(boxes((0, 0, 0.5, 1, 1, 1, 0)), boxes(UNIT))[0] == pytest.approx(1 / 3)
    assert iou_3d(boxes((0, 0, 0, 1, 2, 1, np.pi / 2)), boxes((0, 0, 0, 1, 2, 1, 0)))[0] == pytest.approx(1 / 3)
    assert iou_3d(boxes((3, 0, 0, 1, 1, 1, 0)), boxes(UNIT))[0] == 0.0


def test_a_pitched_rotation_shrinks_the_footprint_as_in_the_sdk():
    # The SDK takes cos and sin of the footprint from R[0, 0] and R[1, 0]: a pitch of 60° halves both sides.
    pred = boxes((0, 0, 0, 1, 1, 1, 0, np.pi / 3))
    assert iou_3d(pred, boxes(UNIT))[0] == pytest.approx(0.25 / 1.75)


def test_a_false_positive_ranked_above_the_true_positive_halves_the_ap():
    gt = boxes(UNIT)
    far, hit = (5, 5, 0, 1, 1, 1, 0), UNIT
    assert (aps(gt, boxes(far, hit, score=[0.9, 0.8])) == 0.5).all()  # precision 1/2 at recall 1
    assert (aps(gt, boxes(far, hit, score=[0.8, 0.9])) == 1.0).all()


def test_score_ties_keep_submission_order():
    gt = boxes(UNIT)
    assert (aps(gt, boxes((5, 5, 0, 1, 1, 1, 0), UNIT, score=[0.5, 0.5])) == 0.5).all()
    assert (aps(gt, boxes(UNIT, (5, 5, 0, 1, 1, 1, 0), score=[0.5, 0.5])) == 1.0).all()


def test_a_second_detection_of_the_same_object_is_a_false_positive():
    gt = boxes(UNIT, (10, 0, 0, 1, 1, 1, 0))
    pred = boxes(UNIT, UNIT, score=[0.9, 0.8])
    # TP, FP: recall 1/2 at precision 1, then 1/2 at 1/2 → AP 0.5
    assert (aps(gt, pred) == 0.5).all()


def test_a_prediction_whose_best_ground_truth_is_taken_is_false_even_if_another_overlaps():
    gt = boxes(UNIT, (0.3, 0, 0, 1, 1, 1, 0))
    pred = boxes(UNIT, (0.1, 0, 0, 1, 1, 1, 0), score=[0.9, 0.8])
    # the second prediction overlaps GT 0 (IoU 0.82) most and GT 1 (IoU 0.67) enough, but GT 0 is taken
    assert (aps(gt, pred) == 0.5).all()


def test_matches_stay_within_a_sample():
    gt = boxes(UNIT, sample=[0])
    assert (aps(gt, boxes(UNIT, sample=[1])) == 0.0).all()


def test_average_precision_is_the_area_under_the_precision_envelope():
    # recall 1/2, 1/2, 1 at precision 1, 1/2, 2/3: envelope 1 up to recall 1/2, then 2/3 → 1/2 + 1/2 · 2/3
    assert average_precision(np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.5, 2 / 3])) == pytest.approx(5 / 6)
    assert average_precision(np.array([0.5]), np.array([1.0])) == 0.5


def test_classes_without_ground_truth_are_left_out_and_empty_predictions_score_zero():
    other = (5, 5, 0, 1, 1, 1, 0)
    gt, pred = boxes(UNIT, other), boxes(UNIT, other)
    table = lyft_average_precisions(gt, np.array([0, 1]), pred, np.array([0, 2]), 3)
    assert (table[0] == 1.0).all()
    assert (table[1] == 0.0).all()  # the class-2 box on the class-1 object does not count for class 1
    assert np.isnan(table[2]).all()  # no GT: left out of the mAP, even with predictions
    assert np.nanmean(table) == 0.5
    empty = lyft_average_precisions(gt, np.array([0, 1]), pred.take(np.zeros(2, bool)), np.zeros(0, np.int64), 3)
    assert (empty[:2] == 0.0).all() and np.nanmean(empty) == 0.0


def test_pypi_footprint_turns_by_minus_the_heading():
    gt = boxes((0, 0, 0, 1, 4, 1, 0.3))
    pred = boxes((0.5, 1.0, 0, 1, 4, 1, 1.0))
    mirrored_gt, mirrored_pred = boxes((0, 0, 0, 1, 4, 1, -0.3)), boxes((0.5, 1.0, 0, 1, 4, 1, -1.0))
    pypi = iou_3d(pred, gt, footprint="pypi-0.0.8")[0]
    assert pypi == pytest.approx(iou_3d(mirrored_pred, mirrored_gt)[0], abs=1e-12)
    assert pypi != pytest.approx(iou_3d(pred, gt)[0], abs=1e-3)  # the two definitions differ in general ...
    concentric = boxes((0, 0, 0, 1, 4, 1, 1.0))  # ... but not for boxes with one centre (GT as predictions)
    assert iou_3d(concentric, gt, footprint="pypi-0.0.8")[0] == pytest.approx(iou_3d(concentric, gt)[0])
    with pytest.raises(ValueError, match="footprint"):
        footprint_corners(gt, "shapely")
