"""Tests for drivetrain.models.pointpillars.anchors: the aligned range anchors of PointPillars and SSN."""

from __future__ import annotations

import pytest
import torch

from drivetrain.models.pointpillars.anchors import (
    AnchorConfig,
    grid_anchors,
    num_grid_anchors,
    num_per_class_anchors,
    per_class_anchors,
)
from drivetrain.models.pointpillars.head import flatten_anchor_map
from drivetrain.models.pointpillars.recipe import NUS_PP_ANCHORS, NUS_SSN_ANCHORS, NUS_SSN_FEATURE_SIZES

TINY = AnchorConfig(
    ranges=((-16, -16, -1.8, 16, 16, -1.8), (-16, -16, -1.6, 16, 16, -1.6), (-16, -16, -1.7, 16, 16, -1.7)),
    sizes=((3.9, 1.6, 1.56), (0.8, 0.6, 1.73), (1.76, 0.6, 1.73)),
)
TINY_GRID = (32, 32)


def original_single_range(feature_size, anchor_range, sizes, rotations):
    """The original's steps (AlignedAnchor3DRangeGenerator.anchors_single_range, D = 1, two custom zeros),
    returning ``(1, H, W, S, R, 9)`` with the **bottom** z, as the original does."""
    d, h, w = 1, *feature_size
    rng = torch.tensor(anchor_range)
    zc = torch.linspace(rng[2], rng[5], d + 1)
    yc = torch.linspace(rng[1], rng[4], h + 1)
    xc = torch.linspace(rng[0], rng[3], w + 1)
    sizes = torch.tensor(sizes).reshape(-1, 3) * 1
    rots = torch.tensor(rotations)
    zc, yc, xc = zc + (zc[1] - zc[0]) / 2, yc + (yc[1] - yc[0]) / 2, xc + (xc[1] - xc[0]) / 2
    rets = list(torch.meshgrid(xc[:w], yc[:h], zc[:d], rots, indexing="ij"))
    tile = [1, 1, 1, int(sizes.shape[0]), 1]
    rets = [r.unsqueeze(-2).repeat(tile).unsqueeze(-1) for r in rets]
    size_shape = list(rets[0].shape)
    size_shape[3] = 1
    rets.insert(3, sizes.reshape(1, 1, 1, -1, 1, 3).repeat(size_shape))
    ret = torch.cat(rets, dim=-1).permute(2, 1, 0, 3, 4, 5)
    return torch.cat([ret, ret.new_zeros([*ret.shape[:-1], 2])], dim=-1)


def to_centre_z(anchors: torch.Tensor) -> torch.Tensor:
    out = anchors.clone()
    out[..., 2] = anchors[..., 2] + anchors[..., 5] / 2
    return out


def test_tiny_count_and_shape():
    anchors = grid_anchors(TINY, TINY_GRID)
    assert num_grid_anchors(TINY, TINY_GRID) == 32 * 32 * 3 * 2 == 6144
    assert anchors.shape == (6144, 9) and anchors.dtype == torch.float32
    assert (anchors[:, 7:] == 0).all()


def test_equals_original_generator_bit_for_bit():
    pairs = zip(TINY.ranges, TINY.sizes, strict=True)
    per_range = [original_single_range(TINY_GRID, r, [s], TINY.rotations) for r, s in pairs]
    original = torch.cat(per_range, dim=-3).reshape(-1, 9)  # the original's size_per_range concat, reshape_out
    assert torch.equal(grid_anchors(TINY, TINY_GRID), to_centre_z(original))


def test_index_layout_location_size_rotation():
    anchors = grid_anchors(TINY, TINY_GRID)
    w = TINY_GRID[1]
    s_num, r_num = TINY.num_sizes, TINY.num_rotations
    step = 32 / 32
    for y, x, s, r in [(0, 0, 0, 0), (0, 1, 2, 1), (5, 17, 1, 0), (31, 31, 2, 1), (12, 3, 0, 1)]:
        a = anchors[((y * w + x) * s_num + s) * r_num + r]
        assert a[0].item() == pytest.approx(-16 + (x + 0.5) * step, abs=1e-5)
        assert a[1].item() == pytest.approx(-16 + (y + 0.5) * step, abs=1e-5)
        assert a[3:6].tolist() == pytest.approx(list(TINY.sizes[s]))
        assert a[2].item() == pytest.approx(TINY.ranges[s][2] + TINY.sizes[s][2] / 2)  # gravity centre
        assert a[6].item() == pytest.approx(TINY.rotations[r])


def test_layout_matches_head_flattening():
    """Channel ``s·R + r`` at cell (y, x) of a head map lands at the anchor index of (y, x, s, r)."""
    h, w, k = 4, 5, TINY.num_sizes * TINY.num_rotations
    code = torch.arange(h * w * k).reshape(h, w, k).permute(2, 0, 1)[None].float()  # (1, K, H, W): value = index
    flat = flatten_anchor_map(code, 1)[0, :, 0]
    assert torch.equal(flat, torch.arange(h * w * k).float())
    anchors = grid_anchors(TINY, (h, w))
    assert anchors.shape[0] == flat.shape[0]


def test_nuscenes_pointpillars_numbers():
    assert num_grid_anchors(NUS_PP_ANCHORS, (200, 200)) == 560_000
    small = grid_anchors(NUS_PP_ANCHORS, (2, 2))  # the per-cell pattern without building 560k anchors
    assert small.shape == (2 * 2 * 14, 9)
    # centres of a 200-cell map over ±49.6: first cell at −49.6 + 0.248
    row = grid_anchors(NUS_PP_ANCHORS, (1, 200))
    assert row[0, 0].item() == pytest.approx(-49.352, abs=1e-4)
    assert row[-1, 0].item() == pytest.approx(49.352, abs=1e-4)
    car = row[0]
    assert car[2].item() == pytest.approx(-1.80032795 + 1.72270761 / 2)


@pytest.mark.slow
def test_nuscenes_pointpillars_full_grid():
    anchors = grid_anchors(NUS_PP_ANCHORS, (200, 200))
    assert anchors.shape == (560_000, 9)
    per_range = [
        original_single_range((200, 200), r, [s], NUS_PP_ANCHORS.rotations)
        for r, s in zip(NUS_PP_ANCHORS.ranges, NUS_PP_ANCHORS.sizes, strict=True)
    ]
    assert torch.equal(anchors, to_centre_z(torch.cat(per_range, dim=-3).reshape(-1, 9)))


def test_ssn_counts():
    counts = num_per_class_anchors(NUS_SSN_ANCHORS, NUS_SSN_FEATURE_SIZES)
    assert counts == [80_000] * 5 + [20_000] * 5
    assert sum(counts) == 500_000


def test_per_class_equals_original_and_layout():
    cfg = AnchorConfig(ranges=TINY.ranges, sizes=TINY.sizes)
    sizes = ((8, 8), (8, 6), (4, 4))
    anchors, classes = per_class_anchors(cfg, sizes)
    counts = num_per_class_anchors(cfg, sizes)
    assert anchors.shape == (sum(counts), 9) and classes.shape == (sum(counts),)
    blocks = []
    for c, fs in enumerate(sizes):  # the original's multi_cls_grid_anchors: view, rotation-major permute
        a = original_single_range(fs, cfg.ranges[c], [cfg.sizes[c]], cfg.rotations)
        a = a.view(*fs, -1, 9).permute(2, 0, 1, 3).reshape(-1, 9)
        blocks.append(a)
    assert torch.equal(anchors, to_centre_z(torch.cat(blocks)))
    assert torch.equal(classes, torch.repeat_interleave(torch.arange(3), torch.tensor(counts)))
    # block 1 (8×6 map): anchor (r·H + y)·W + x
    h, w = sizes[1]
    r, y, x = 1, 5, 2
    a = anchors[counts[0] + (r * h + y) * w + x]
    assert a[6].item() == pytest.approx(cfg.rotations[r])
    assert a[0].item() == pytest.approx(-16 + (x + 0.5) * 32 / w, abs=1e-5)
    assert a[1].item() == pytest.approx(-16 + (y + 0.5) * 32 / h, abs=1e-5)


def test_single_range_shared_by_all_sizes():
    shared = AnchorConfig(ranges=(TINY.ranges[0],), sizes=TINY.sizes)
    anchors = grid_anchors(shared, (3, 3)).reshape(3, 3, 3, 2, 9)
    assert torch.equal(anchors[..., 0, :, :2], anchors[..., 2, :, :2])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(ranges=((0,) * 6,), sizes=()),
        dict(ranges=((0,) * 6,) * 2, sizes=((1, 1, 1),) * 3),
        dict(ranges=((0,) * 5,), sizes=((1, 1, 1),)),
        dict(ranges=((0,) * 6,), sizes=((1, 1, 1),), rotations=()),
        dict(ranges=((0,) * 6,), sizes=((1, 1, 1),), custom_values=(1.0, 0.0)),
    ],
)
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        AnchorConfig(**kwargs)


def test_per_class_needs_one_feature_size_per_class():
    with pytest.raises(ValueError, match="feature_sizes"):
        per_class_anchors(TINY, ((4, 4),))
