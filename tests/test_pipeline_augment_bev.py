"""Tests for drivetrain.pipeline.augment.bev: the batched BEV augmentation against the per-sample mmdet3d-style
reference, hand-worked conventions, replay, identity, draws, config validation and the absence of host syncs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from drivetrain.models.pointpillars.recipe import LIDAR_AUG
from drivetrain.pipeline.augment.bev import (
    BevAugParams,
    apply_bev_aug,
    bev_config_from_dict,
    draw_bev_params,
    make_bev_params,
    reference_bev_aug,
    sample_bev_params,
)
from drivetrain.ragged import RaggedBatch
from helpers.boxes import random_boxes3d
from helpers.nosync import no_host_sync

EPS32 = torch.finfo(torch.float32).eps
BIG = 10**9
CHANNELS = 4  # x, y, z, Δt as in the nuScenes PointPillars pipeline
# Every random step on (SSN-like flips, a translation), so the comparison exercises all of them.
FULL_CONFIG = dataclasses.replace(LIDAR_AUG, translation_std=(0.5, 0.5, 0.2), flip_horizontal=0.5, flip_vertical=0.5)
NO_FILTERS = dict(point_range=None, object_range=None, shuffle=False)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(7)


# ----------------------------------------------------------------------------------------------- helpers
def _params(num: int, length: int, **values) -> BevAugParams:
    """Given parameters: identity unless overridden (lists of per-sample values)."""
    bools = {"flip_h", "flip_v"}
    defaults = {"angle": [0.0] * num, "scale": [1.0] * num, "translation": [[0.0] * 3] * num}
    defaults |= {"flip_h": [False] * num, "flip_v": [False] * num, "shuffle_keys": [[0.0] * length] * num}
    defaults |= values
    tensors = {k: torch.tensor(v, dtype=torch.bool if k in bools else torch.float32) for k, v in defaults.items()}
    return make_bev_params(**tensors)


def _one(points: list[list[float]], boxes: list[list[float]], labels: list[int] | None = None):
    """A batch of one sample from Python lists (boxes may be empty)."""
    pts = torch.tensor(points, dtype=torch.float32).reshape(-1, CHANNELS)
    bxs = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 9)
    lbs = torch.tensor(labels if labels is not None else list(range(len(boxes))), dtype=torch.int64)
    return RaggedBatch.from_list([pts]), RaggedBatch.from_list([bxs]), RaggedBatch.from_list([lbs])


def random_scene(kind: str, gen: torch.Generator) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
    """Points ``(B, P, 4)``, boxes ``(B, G, 9)`` and labels ``(B, G)`` with poisoned padding (NaN, −BIG).

    ``single``: one ordinary sample. ``single_empty``: one sample with no points and no boxes (P = G = 0).
    ``four``: sample 0 empty, sample 1 entirely outside every range (80–90 m away, so even a 0.39 rad turn
    and a 0.95 scale keep it past 50 m), samples 2 and 3 ordinary (sample 3 full length). ``four_ordinary``:
    four ordinary samples of different sizes. Ordinary points lie in ±62 m (z in [−6, 4]), ordinary box
    centres in ±62.5 m: many land outside the ranges.
    """
    max_points, max_boxes = 40, 7
    if kind == "single_empty":
        point_sizes, box_sizes = [0], [0]
        max_points = max_boxes = 0
    elif kind == "single":
        point_sizes, box_sizes = [max_points], [max_boxes]
    elif kind == "four_ordinary":
        point_sizes, box_sizes = [max_points, 17, 33, 29], [6, max_boxes, 5, 3]
    else:
        point_sizes, box_sizes = [0, 25, 31, max_points], [0, 5, 4, max_boxes]
    num = len(point_sizes)
    u = torch.rand(num, max_points, CHANNELS, generator=gen)
    xyz = torch.stack([u[..., 0] * 124 - 62, u[..., 1] * 124 - 62, u[..., 2] * 10 - 6], dim=-1)
    points = torch.cat([xyz, u[..., 3:]], dim=-1)
    boxes = random_boxes3d((num, max_boxes), gen)
    boxes[..., :2] *= 1.25
    labels = torch.randint(0, 10, (num, max_boxes), generator=gen)
    if kind == "four":
        far = 80 + 10 * torch.rand(max_points, 2, generator=gen)
        points[1, :, :2] = far * torch.tensor([1.0, -1.0])
        boxes[1, :, :2] = 80 + 10 * torch.rand(max_boxes, 2, generator=gen)
    point_pad = torch.arange(max_points) >= torch.tensor(point_sizes)[:, None]
    box_pad = torch.arange(max_boxes) >= torch.tensor(box_sizes)[:, None]
    points = points.masked_fill(point_pad[..., None], math.nan)
    boxes = boxes.masked_fill(box_pad[..., None], math.nan)
    labels = labels.masked_fill(box_pad, -BIG)
    return (
        RaggedBatch(points, torch.tensor(point_sizes)),
        RaggedBatch(boxes, torch.tensor(box_sizes)),
        RaggedBatch(labels, torch.tensor(box_sizes)),
    )


def rotation_atol(xyz: torch.Tensor, translation: torch.Tensor, scale_max: float = 1.05) -> float:
    """Bound on |batched − reference| for a coordinate after rotate → scale → translate, in float32.

    The reference rounds a 3-term dot product with ``rot_mat_T`` (≤ 3u·Σ|x_j| by the usual γ₃ bound, u = eps/2),
    then the scale product and the translation sum (1u each); the batched path rounds the matrix entries
    ``sign·s·cos`` (2u) and a 3-term dot product plus the translation (≤ 4u). ``sin``/``cos`` of the same
    float32 angle may differ by 1 ulp between the vectorised (batched) and scalar (reference) kernels (1u).
    Both paths err against the exact value, so their difference is ≤ 12u·(s·Σ|x_j| + Σ|t|) = 6·eps·(…);
    8·eps leaves a margin. Flips are exact.
    """
    if xyz.numel() == 0:
        return 0.0
    magnitude = scale_max * float(xyz.abs().sum(-1).max()) + float(translation.abs().sum())
    return 8 * EPS32 * magnitude


def transformed_coordinates(points, boxes, labels, params, b):
    """The reference's coordinates before any filter (tie-free checks look at them)."""
    config = dataclasses.replace(LIDAR_AUG, **NO_FILTERS)
    n, m = int(points.sizes[b]), int(boxes.sizes[b])
    pts, bxs, _ = reference_bev_aug(
        points.tensor[b, :n], boxes.tensor[b, :m], labels.tensor[b, :m], params.sample(b), config
    )
    return pts, bxs


def assert_clear_of_boundaries(points, boxes, labels, params, config, margin=1e-3):
    """Precondition of the random comparison: no coordinate within ``margin`` of a range bound (where the two
    paths' float32 rounding could legitimately disagree on keep/drop)."""
    for b in range(points.batch_shape[0]):
        pts, bxs = transformed_coordinates(points, boxes, labels, params, b)
        pr, orr = config.point_range, config.object_range
        for axis in range(3):
            for bound in (pr[axis], pr[axis + 3]):
                assert ((pts[:, axis] - bound).abs() > margin).all()
        for axis in range(2):
            for bound in (orr[axis], orr[axis + 2]):
                assert ((bxs[:, axis] - bound).abs() > margin).all()


def assert_matches_reference(points, boxes, labels, params, config, out):
    """Batched output == per-sample reference: kept sets, order, labels, yaw, sizes exactly; xyz and velocity
    to the float32 rotation bound of :func:`rotation_atol`."""
    out_points, out_boxes, out_labels = out
    got_points, got_boxes, got_labels = out_points.to_list(), out_boxes.to_list(), out_labels.to_list()
    for b in range(points.batch_shape[0]):
        n, m = int(points.sizes[b]), int(boxes.sizes[b])
        sample = params.sample(b)
        ref_points, ref_boxes, ref_labels = reference_bev_aug(
            points.tensor[b, :n], boxes.tensor[b, :m], labels.tensor[b, :m], sample, config
        )
        assert got_points[b].shape == ref_points.shape
        assert got_boxes[b].shape == ref_boxes.shape
        atol_xyz = rotation_atol(points.tensor[b, :n, :3], sample.translation)
        torch.testing.assert_close(got_points[b][:, :3], ref_points[:, :3], atol=atol_xyz, rtol=0)
        assert torch.equal(got_points[b][:, 3:], ref_points[:, 3:])  # carried channels: exact
        atol_centre = rotation_atol(boxes.tensor[b, :m, :3], sample.translation)
        torch.testing.assert_close(got_boxes[b][:, :3], ref_boxes[:, :3], atol=atol_centre, rtol=0)
        assert torch.equal(got_boxes[b][:, 3:7], ref_boxes[:, 3:7])  # sizes and yaw: the same ops, bit-exact
        atol_velocity = rotation_atol(boxes.tensor[b, :m, 7:9], torch.zeros(3))
        torch.testing.assert_close(got_boxes[b][:, 7:9], ref_boxes[:, 7:9], atol=atol_velocity, rtol=0)
        assert torch.equal(got_labels[b], ref_labels)
    assert torch.equal(out_boxes.sizes, out_labels.sizes)


# ----------------------------------------------------------------------------------------------- batched == reference
@pytest.mark.parametrize("kind", ["single", "single_empty", "four"])
def test_batched_matches_per_sample_reference_with_sampled_params(kind, gen):
    points, boxes, labels = random_scene(kind, gen)
    params = sample_bev_params(points, FULL_CONFIG, gen)
    assert_clear_of_boundaries(points, boxes, labels, params, FULL_CONFIG)
    out = apply_bev_aug(points, boxes, labels, params, FULL_CONFIG)
    assert_matches_reference(points, boxes, labels, params, FULL_CONFIG, out)
    if kind == "four":
        assert out[0].sizes[:2].tolist() == [0, 0]  # the empty and the far sample keep nothing
        assert out[1].sizes[:2].tolist() == [0, 0]
        assert (out[0].sizes[2:] > 0).all() and (out[0].sizes[2:] < points.sizes[2:]).all()


@pytest.mark.parametrize(
    "config",
    [
        FULL_CONFIG,
        dataclasses.replace(LIDAR_AUG, shuffle=False),
        dataclasses.replace(LIDAR_AUG, point_range=None),
        dataclasses.replace(LIDAR_AUG, object_range=None),
    ],
    ids=["full", "no_shuffle", "no_point_filter", "no_object_filter"],
)
def test_batched_matches_reference_for_every_flip_combination(config, gen):
    points, boxes, labels = random_scene("four_ordinary", gen)
    length = points.max_size
    params = _params(
        4,
        length,
        angle=[0.3, -0.39, 0.05, -0.2],
        scale=[1.04, 0.96, 1.0, 0.951],
        translation=[[0.3, -0.2, 0.1], [0.0, 0.0, 0.0], [-0.4, 0.25, -0.1], [0.1, 0.1, 0.0]],
        flip_h=[True, False, True, False],
        flip_v=[True, True, False, False],
        shuffle_keys=torch.rand(4, length, generator=gen).tolist(),
    )
    if config.point_range is not None and config.object_range is not None:
        assert_clear_of_boundaries(points, boxes, labels, params, config)
    out = apply_bev_aug(points, boxes, labels, params, config)
    assert_matches_reference(points, boxes, labels, params, config, out)
    assert (out[1].sizes > 0).all()  # every flip combination has boxes to check


def test_boxes_and_points_exactly_on_range_boundaries_are_dropped():
    # Ranges are strict (mmdet3d's in_range_3d / in_range_bev use > and <): a coordinate equal to a bound is out.
    points = [
        [50.0, 0.0, 0.0, 0.0],  # x on x_max: out
        [-50.0, 0.0, 0.0, 1.0],  # x on x_min: out
        [49.999, -49.999, 0.0, 2.0],  # just inside: in
        [0.0, 0.0, -5.0, 3.0],  # z on z_min: out
        [0.0, 0.0, 3.0, 4.0],  # z on z_max: out
        [0.0, 0.0, 2.999, 5.0],  # in
        [0.0, -50.0, 0.0, 6.0],  # y on y_min: out (and after the horizontal flip, on y_max: still out)
    ]
    boxes = [
        [50.0, 0.0, 0.0, 1, 1, 1, 0.0, 0, 0],  # out
        [0.0, -50.0, 0.0, 1, 1, 1, 0.0, 0, 0],  # out
        [49.99, -49.99, 10.0, 1, 1, 1, 0.0, 0, 0],  # in: the object filter is BEV only, z is not looked at
        [-50.0, 50.0, 0.0, 1, 1, 1, 0.0, 0, 0],  # out
    ]
    pts, bxs, lbs = _one(points, boxes)
    config = dataclasses.replace(LIDAR_AUG, shuffle=False)
    for flip_h in (False, True):
        params = _params(1, len(points), flip_h=[flip_h])
        out = apply_bev_aug(pts, bxs, lbs, params, config)
        assert_matches_reference(pts, bxs, lbs, params, config, out)
        assert out[0].to_list()[0][:, 3].tolist() == [2.0, 5.0]
        assert out[2].to_list()[0].tolist() == [2]


# ----------------------------------------------------------------------------------------------- replay, identity
def test_replayed_params_give_identical_output(gen):
    points, boxes, labels = random_scene("four", gen)
    params = sample_bev_params(points, FULL_CONFIG, gen)
    first = apply_bev_aug(points, boxes, labels, params, FULL_CONFIG)
    again = apply_bev_aug(points, boxes, labels, params, FULL_CONFIG)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a.tensor, b.tensor) and torch.equal(a.sizes, b.sizes)


@pytest.mark.parametrize("ranges", ["huge", "none"])
def test_identity_params_return_the_input(ranges, gen):
    points, boxes, labels = random_scene("four", gen)
    points = RaggedBatch(points.tensor.clone(), points.sizes)
    points.tensor[1, :, :2] = 0  # bring the far sample in, so every sample keeps something
    big = 1e6
    if ranges == "huge":
        config = dataclasses.replace(
            LIDAR_AUG,
            rot_range=(0, 0),
            scale_range=(1, 1),
            flip_horizontal=0,
            shuffle=False,
            point_range=(-big, -big, -big, big, big, big),
            object_range=(-big, -big, big, big),
        )
    else:
        config = dataclasses.replace(LIDAR_AUG, rot_range=(0, 0), scale_range=(1, 1), flip_horizontal=0, **NO_FILTERS)
    params = sample_bev_params(points, config, gen)
    out = apply_bev_aug(points, boxes, labels, params, config)
    for got, given in zip(out, (points, boxes, labels), strict=True):
        assert torch.equal(got.sizes, given.sizes)
        for a, b in zip(got.to_list(), given.to_list(), strict=True):
            assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------------- conventions by hand
def test_rotation_by_plus_half_pi_turns_counter_clockwise():
    # rotation_3d_in_axis(axis=2) stacks rot_mat_T = [[c, s, 0], [-s, c, 0], [0, 0, 1]] and computes p @ rot_mat_T:
    # x' = c·x − s·y, y' = s·x + c·y. With θ = π/2 (c = 0, s = 1): (10, 0) → (0, 10); velocity (1, 0) → (0, 1);
    # the yaw grows by θ: 0.1 → 0.1 + π/2 = 1.6707963.
    pts, bxs, lbs = _one([[10.0, 0.0, -1.0, 0.5]], [[10.0, 0.0, -1.0, 4.0, 2.0, 1.5, 0.1, 1.0, 0.0]])
    params = _params(1, 1, angle=[math.pi / 2])
    out_pts, out_bxs, _ = apply_bev_aug(pts, bxs, lbs, params, dataclasses.replace(LIDAR_AUG, **NO_FILTERS))
    torch.testing.assert_close(out_pts.tensor[0], torch.tensor([[0.0, 10.0, -1.0, 0.5]]), atol=1e-5, rtol=0)
    expected = torch.tensor([[0.0, 10.0, -1.0, 4.0, 2.0, 1.5, 1.6707963, 0.0, 1.0]])
    torch.testing.assert_close(out_bxs.tensor[0], expected, atol=1e-5, rtol=0)


def test_rotation_by_0_3_matches_hand_computed_numbers():
    # cos 0.3 = 0.9553365, sin 0.3 = 0.2955202: (3, 4) → (3c − 4s, 3s + 4c) = (1.6839286, 4.7079066);
    # velocity (0, 2) → (−2s, 2c) = (−0.5910404, 1.9106730); yaw 0.3 → 0.6.
    pts, bxs, lbs = _one([[3.0, 4.0, 0.0, 0.0]], [[3.0, 4.0, 0.0, 1.0, 1.0, 1.0, 0.3, 0.0, 2.0]])
    params = _params(1, 1, angle=[0.3])
    out_pts, out_bxs, _ = apply_bev_aug(pts, bxs, lbs, params, dataclasses.replace(LIDAR_AUG, **NO_FILTERS))
    torch.testing.assert_close(out_pts.tensor[0, 0, :2], torch.tensor([1.6839286, 4.7079066]), atol=1e-6, rtol=0)
    expected = torch.tensor([1.6839286, 4.7079066, 0.0, 1.0, 1.0, 1.0, 0.6, -0.5910404, 1.9106730])
    torch.testing.assert_close(out_bxs.tensor[0, 0], expected, atol=1e-6, rtol=0)


BOX = [1.0, 2.0, 0.5, 4.0, 2.0, 1.5, 0.3, 1.5, -0.5]
POINT = [1.0, 2.0, 0.5, 7.0]


@pytest.mark.parametrize(
    ("flip_h", "flip_v", "object_range", "point", "box"),
    [
        # horizontal: y → −y, yaw → −yaw, vy → −vy
        (True, False, None, [1.0, -2.0, 0.5, 7.0], [1.0, -2.0, 0.5, 4.0, 2.0, 1.5, -0.3, 1.5, 0.5]),
        # vertical: x → −x, yaw → π − yaw = 2.8415927, vx → −vx
        (False, True, None, [-1.0, 2.0, 0.5, 7.0], [-1.0, 2.0, 0.5, 4.0, 2.0, 1.5, 2.8415927, -1.5, -0.5]),
        # both, horizontal first: yaw → −(−0.3) + π = 3.4415927, unwrapped without the object filter ...
        (True, True, None, [-1.0, -2.0, 0.5, 7.0], [-1.0, -2.0, 0.5, 4.0, 2.0, 1.5, 3.4415927, -1.5, 0.5]),
        # ... and wrapped into [−π, π) by ObjectRangeFilter's limit_yaw: 3.4415927 − 2π = −2.8415927
        (True, True, (-50, -50, 50, 50), [-1.0, -2.0, 0.5, 7.0], [-1, -2, 0.5, 4, 2, 1.5, -2.8415927, -1.5, 0.5]),
    ],
    ids=["horizontal", "vertical", "both", "both_wrapped"],
)
def test_flips_follow_mmdet3d(flip_h, flip_v, object_range, point, box):
    pts, bxs, lbs = _one([POINT], [BOX])
    config = dataclasses.replace(LIDAR_AUG, point_range=None, object_range=object_range, shuffle=False)
    params = _params(1, 1, flip_h=[flip_h], flip_v=[flip_v])
    out_pts, out_bxs, _ = apply_bev_aug(pts, bxs, lbs, params, config)
    torch.testing.assert_close(out_pts.tensor[0, 0], torch.tensor(point), atol=1e-6, rtol=0)
    torch.testing.assert_close(out_bxs.tensor[0, 0], torch.tensor(box, dtype=torch.float32), atol=1e-6, rtol=0)


def test_scale_multiplies_xyz_sizes_and_velocity():
    pts, bxs, lbs = _one([POINT], [BOX])
    params = _params(1, 1, scale=[1.05])
    out_pts, out_bxs, _ = apply_bev_aug(pts, bxs, lbs, params, dataclasses.replace(LIDAR_AUG, **NO_FILTERS))
    torch.testing.assert_close(out_pts.tensor[0, 0], torch.tensor([1.05, 2.1, 0.525, 7.0]))
    expected = torch.tensor([1.05, 2.1, 0.525, 4.2, 2.1, 1.575, 0.3, 1.575, -0.525])
    torch.testing.assert_close(out_bxs.tensor[0, 0], expected)


def test_translation_moves_points_and_centres_but_not_velocity():
    pts, bxs, lbs = _one([POINT], [BOX])
    params = _params(1, 1, translation=[[1.0, -2.0, 0.25]])
    out_pts, out_bxs, _ = apply_bev_aug(pts, bxs, lbs, params, dataclasses.replace(LIDAR_AUG, **NO_FILTERS))
    torch.testing.assert_close(out_pts.tensor[0, 0], torch.tensor([2.0, 0.0, 0.75, 7.0]))
    torch.testing.assert_close(out_bxs.tensor[0, 0], torch.tensor([2.0, 0.0, 0.75, 4.0, 2.0, 1.5, 0.3, 1.5, -0.5]))


def test_centre_z_scales_like_mmdet3d_bottom_centre():
    # mmdet3d scales the bottom centre z_b = z − dz/2 and dz; converting back gives our scaled centre z.
    pts, bxs, lbs = _one([POINT], [BOX])
    scale = 0.96
    out_bxs = apply_bev_aug(pts, bxs, lbs, _params(1, 1, scale=[scale]), dataclasses.replace(LIDAR_AUG, **NO_FILTERS))[
        1
    ]
    z, dz = BOX[2], BOX[5]
    bottom_scaled, dz_scaled = (z - dz / 2) * scale, dz * scale
    assert out_bxs.tensor[0, 0, 2].item() == pytest.approx(bottom_scaled + dz_scaled / 2, abs=1e-6)


def test_matrix_maps_points_like_the_sequential_steps(gen):
    points, boxes, labels = random_scene("four", gen)
    params = sample_bev_params(points, FULL_CONFIG, gen)
    for b in (2, 3):
        n = int(points.sizes[b])
        xyz = points.tensor[b, :n, :3]
        homogeneous = torch.cat([xyz, torch.ones(n, 1)], dim=-1)
        via_matrix = (homogeneous @ params.matrix[b].T)[:, :3]
        sequential, _ = transformed_coordinates(points, boxes, labels, params, b)
        atol = rotation_atol(xyz, params.translation[b])
        torch.testing.assert_close(via_matrix, sequential[:, :3], atol=atol, rtol=0)
    flip = _params(1, 1, flip_h=[True], flip_v=[True]).matrix[0]
    assert torch.equal(flip, torch.diag(torch.tensor([-1.0, -1.0, 1.0, 1.0])))


def test_shuffle_orders_kept_points_by_their_keys():
    # Point 1 leaves the range; the kept points [p0, p2, p3, p4] take keys[:4] = [0.5, 0.1, 0.9, 0.3], whose
    # argsort [1, 3, 0, 2] gives [p2, p4, p0, p3]; padding (the dropped slot) stays at the end, zeroed.
    points = [[float(i), 0.0, 0.0, float(i)] for i in range(5)]
    points[1][0] = 99.0
    pts, bxs, lbs = _one(points, [])
    params = _params(1, 5, shuffle_keys=[[0.5, 0.1, 0.9, 0.3, 0.7]])
    out_pts = apply_bev_aug(pts, bxs, lbs, params, LIDAR_AUG)[0]
    assert out_pts.sizes.tolist() == [4]
    assert out_pts.tensor[0, :, 3].tolist() == [2.0, 4.0, 0.0, 3.0, 0.0]
    ref_pts = reference_bev_aug(pts.tensor[0], bxs.tensor[0], lbs.tensor[0], params.sample(0), LIDAR_AUG)[0]
    assert torch.equal(out_pts.to_list()[0], ref_pts)


# ----------------------------------------------------------------------------------------------- no sync, draws
@pytest.mark.parametrize(
    "config",
    [FULL_CONFIG, dataclasses.replace(LIDAR_AUG, shuffle=False), dataclasses.replace(LIDAR_AUG, **NO_FILTERS)],
    ids=["full", "filter_only", "transform_only"],
)
def test_sample_and_apply_never_sync(config, gen):
    points, boxes, labels = random_scene("four", gen)
    with no_host_sync():
        params = sample_bev_params(points, config, gen)
        out = apply_bev_aug(points, boxes, labels, params, config)
    assert [o.batch_shape[0] for o in out] == [4, 4, 4]


def test_draws_depend_only_on_the_generator():
    points, _, _ = random_scene("four", torch.Generator().manual_seed(0))
    first = sample_bev_params(points, FULL_CONFIG, torch.Generator().manual_seed(5))
    torch.rand(10)  # the global RNG is not used
    again = sample_bev_params(points, FULL_CONFIG, torch.Generator().manual_seed(5))
    other = sample_bev_params(points, FULL_CONFIG, torch.Generator().manual_seed(6))
    for name in BevAugParams.__dataclass_fields__:
        assert torch.equal(getattr(first, name), getattr(again, name)), name
    assert not torch.equal(first.angle, other.angle)


def test_size_only_draws_are_the_sampled_ones():
    """``draw_bev_params`` (what the trainer's stage and the workers call with the batch's sizes) draws exactly
    what ``sample_bev_params`` draws from the points, in the same order."""
    points, _, _ = random_scene("four", torch.Generator().manual_seed(0))
    for config in (FULL_CONFIG, dataclasses.replace(LIDAR_AUG, shuffle=False)):
        sampled = sample_bev_params(points, config, torch.Generator().manual_seed(5))
        drawn = draw_bev_params(points.batch_shape[0], points.max_size, config, torch.Generator().manual_seed(5))
        for name in BevAugParams.__dataclass_fields__:
            assert torch.equal(getattr(sampled, name), getattr(drawn, name)), name
    with pytest.raises(ValueError, match="generator"):
        draw_bev_params(2, 3, FULL_CONFIG, torch.Generator(), device="meta")


def test_draws_respect_ranges_and_probabilities():
    points = RaggedBatch(torch.zeros(64, 3, CHANNELS), torch.full((64,), 3))
    gen = torch.Generator().manual_seed(3)
    params = sample_bev_params(points, dataclasses.replace(LIDAR_AUG, flip_horizontal=1.0, flip_vertical=0.0), gen)
    assert params.angle.abs().max() <= 0.3925 and params.angle.std() > 0.1
    assert ((params.scale >= 0.95) & (params.scale <= 1.05)).all()
    assert torch.equal(params.translation.abs(), torch.zeros(64, 3))
    assert params.flip_h.all() and not params.flip_v.any()
    assert ((params.shuffle_keys >= 0) & (params.shuffle_keys < 1)).all()
    ssn = sample_bev_params(points, dataclasses.replace(LIDAR_AUG, flip_vertical=0.5, shuffle=False), gen)
    assert 0 < ssn.flip_v.sum() < 64 and 0 < ssn.flip_h.sum() < 64
    assert torch.equal(ssn.shuffle_keys, torch.zeros(64, 3))


# ----------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rot_range", (0.5, -0.5)),
        ("rot_range", (0.0,)),
        ("rot_range", (math.nan, 0.0)),
        ("scale_range", (0.0, 1.0)),
        ("scale_range", (1.1, 1.0)),
        ("translation_std", (-1.0, 0.0, 0.0)),
        ("flip_horizontal", 1.5),
        ("flip_vertical", -0.1),
        ("point_range", (-50, -50, 5, 50, 50, 3)),
        ("point_range", (-50, -50, 50, 50)),
        ("object_range", (-50, 50, 50, 50)),
        ("shuffle", "yes"),
    ],
)
def test_bad_config_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(LIDAR_AUG, **{field: value})


def test_config_from_a_yaml_mapping_names_the_key_and_field():
    config = bev_config_from_dict(
        {"rot_range": [-0.1, 0.1], "object_range": None}, "data.augment.lidar", base=LIDAR_AUG
    )
    assert config.rot_range == (-0.1, 0.1) and config.object_range is None and config.flip_horizontal == 0.5
    base = dataclasses.replace(LIDAR_AUG, flip_horizontal=0.0)
    assert bev_config_from_dict({}, "k", base=base) == base  # fields not given keep the base's
    with pytest.raises(ValueError, match=r"^data\.augment\.lidar\.rot_range: lower bound"):
        bev_config_from_dict({"rot_range": [1, 0]}, "data.augment.lidar")
    with pytest.raises(ValueError, match=r"^data\.augment\.lidar: unknown field\(s\) \['rot'\]"):
        bev_config_from_dict({"rot": [1, 0]}, "data.augment.lidar")
    with pytest.raises(ValueError, match=r"^data\.augment\.lidar: expected a mapping"):
        bev_config_from_dict([1, 0], "data.augment.lidar")


def test_config_accepts_lists_from_yaml():
    config = dataclasses.replace(LIDAR_AUG, rot_range=[-0.1, 0.1], point_range=[-1, -1, -1, 1, 1, 1])
    assert config.rot_range == (-0.1, 0.1) and config.point_range == (-1.0, -1.0, -1.0, 1.0, 1.0, 1.0)


def test_mismatched_params_or_boxes_raise_value_error(gen):
    points, boxes, labels = random_scene("four", gen)
    params = sample_bev_params(points, FULL_CONFIG, gen)
    with pytest.raises(ValueError, match=r"params\.angle"):
        apply_bev_aug(points, boxes, labels, params.sample(0), FULL_CONFIG)
    short = make_bev_params(
        params.angle, params.scale, params.translation, params.flip_h, params.flip_v, params.shuffle_keys[:, :3]
    )
    with pytest.raises(ValueError, match=r"params\.shuffle_keys"):
        apply_bev_aug(points, boxes, labels, short, FULL_CONFIG)
    with pytest.raises(ValueError, match="boxes"):
        apply_bev_aug(points, boxes.apply(lambda t: t[..., :8]), labels, params, FULL_CONFIG)


# ----------------------------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_the_cpu_reference_without_sync():
    """The parameters are drawn on the host (as the loader draws them) and moved: the same draws as on a CPU, whose
    clearance from the filters' boundaries is checked here without a GPU (a CUDA generator's draws differ)."""
    points, boxes, labels = random_scene("four", torch.Generator().manual_seed(11))
    device_inputs = [x.to("cuda") for x in (points, boxes, labels)]
    drawn = sample_bev_params(points, FULL_CONFIG, torch.Generator().manual_seed(11))
    params = BevAugParams(*(getattr(drawn, name).to("cuda") for name in BevAugParams.__dataclass_fields__))
    apply_bev_aug(*device_inputs, params, FULL_CONFIG)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = apply_bev_aug(*device_inputs, params, FULL_CONFIG)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu_params = BevAugParams(*(getattr(params, name).cpu() for name in BevAugParams.__dataclass_fields__))
    assert_clear_of_boundaries(points, boxes, labels, cpu_params, FULL_CONFIG)
    assert_matches_reference(points, boxes, labels, cpu_params, FULL_CONFIG, tuple(o.to("cpu") for o in out))


def test_on_the_cpu_the_augmentations_parameters_are_not_copied():
    """``stage._to`` moves the parameters as the loader's batches are moved (the packed copier): on the CPU it hands
    back the very tensors (the CUDA case, pinned and not waiting for the stream, is in tests/test_cuda_lidar.py)."""
    from drivetrain.pipeline.augment.stage import _to

    gen = torch.Generator().manual_seed(0)
    points, _, _ = random_scene("four_ordinary", gen)
    params = sample_bev_params(points, FULL_CONFIG, gen)
    moved = _to(params, torch.device("cpu"))
    assert all(getattr(moved, f.name) is getattr(params, f.name) for f in dataclasses.fields(params))
