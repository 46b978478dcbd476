"""Rotated BEV IoU: hand-worked values, invariances, dtypes, and an independent polygon reference."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.geometry.rotated_iou import rotated_bev_iou_aligned, rotated_bev_iou_pairwise
from helpers.nosync import no_host_sync

try:
    from shapely.geometry import Polygon
except ImportError:  # pragma: no cover - the venv has shapely; fall back to plain clipping
    Polygon = None


def _corners(box: list[float]) -> list[tuple[float, float]]:
    x, y, dx, dy, yaw = box
    c, s = math.cos(yaw), math.sin(yaw)
    local = [(dx / 2, dy / 2), (-dx / 2, dy / 2), (-dx / 2, -dy / 2), (dx / 2, -dy / 2)]
    return [(x + c * u - s * v, y + s * u + c * v) for u, v in local]


def _clip_python(subject: list[tuple[float, float]], clip: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Plain Sutherland–Hodgman of a polygon by a counter-clockwise convex polygon (world frame)."""
    out = subject
    for i in range(len(clip)):
        (ax, ay), (bx, by) = clip[i], clip[(i + 1) % len(clip)]

        def side(p, ax=ax, ay=ay, bx=bx, by=by):
            return (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax)

        points, out = out, []
        for j in range(len(points)):
            p, q = points[j], points[(j + 1) % len(points)]
            sp, sq = side(p), side(q)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
            if sq >= 0:
                out.append(q)
        if not out:
            return []
    return out


def _area(poly: list[tuple[float, float]]) -> float:
    return 0.5 * sum(p[0] * q[1] - p[1] * q[0] for p, q in zip(poly, poly[1:] + poly[:1], strict=True))


def _slow_iou(a: list[float], b: list[float]) -> float:
    """Independent per-pair IoU: shapely if importable, else plain Python clipping in the world frame."""
    if a[2] * a[3] < 1e-14 or b[2] * b[3] < 1e-14:
        return 0.0
    if Polygon is not None:
        pa, pb = Polygon(_corners(a)), Polygon(_corners(b))
        inter = pa.intersection(pb).area
    else:
        inter = max(_area(_clip_python(_corners(a), _corners(b))), 0.0)
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def _random_boxes(gen: torch.Generator, n: int, dtype=torch.float64, spread: float = 6.0) -> torch.Tensor:
    centre = torch.rand(n, 2, generator=gen, dtype=dtype) * spread  # (n, 2)
    size = torch.rand(n, 2, generator=gen, dtype=dtype) * 3 + 0.2  # (n, 2)
    yaw = (torch.rand(n, 1, generator=gen, dtype=dtype) - 0.5) * 4 * math.pi  # (n, 1)
    return torch.cat([centre, size, yaw], dim=-1)  # (n, 5)


def _iou(a, b) -> float:
    return rotated_bev_iou_aligned(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)).item()


def test_identical_boxes_have_iou_one():
    assert _iou([1.0, 2.0, 4.0, 1.5, 0.7], [1.0, 2.0, 4.0, 1.5, 0.7]) == pytest.approx(1.0, abs=1e-12)


def test_disjoint_and_touching_boxes_have_iou_zero():
    assert _iou([0.0, 0.0, 1.0, 1.0, 0.3], [5.0, 5.0, 1.0, 1.0, 1.0]) == 0.0
    assert _iou([0.0, 0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0, 0.0]) == 0.0  # shared edge only


def test_unit_square_against_itself_rotated_45_degrees():
    # The rotated square is |x| + |y| <= √2/2; it cuts each corner of the unit square off along
    # x + y = √2/2, a right isosceles triangle with legs h = 1 - √2/2. Overlap = 1 - 4·h²/2 = 2(√2 - 1),
    # a regular octagon; IoU = 2(√2 - 1) / (2 - 2(√2 - 1)) = 1/√2.
    h = 1 - math.sqrt(2) / 2
    inter = 1 - 2 * h * h
    assert inter == pytest.approx(2 * (math.sqrt(2) - 1))
    expected = inter / (2 - inter)  # = 1/√2
    assert _iou([0.0, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0, math.pi / 4]) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(1 / math.sqrt(2))


def test_axis_aligned_offsets():
    # 2×1 boxes shifted by 0.5 in x: intersection 1.5·1, union 2 + 2 - 1.5.
    assert _iou([0.0, 0.0, 2.0, 1.0, 0.0], [0.5, 0.0, 2.0, 1.0, 0.0]) == pytest.approx(1.5 / 2.5, abs=1e-12)
    # Shift in x and y: 1.5 × 0.75 overlap.
    assert _iou([0.0, 0.0, 2.0, 1.0, 0.0], [0.5, 0.25, 2.0, 1.0, 0.0]) == pytest.approx(1.125 / 2.875, abs=1e-12)
    # A 2×1 box rotated by 90° is a 1×2 box: the cross overlap is 1×1.
    assert _iou([0.0, 0.0, 2.0, 1.0, 0.0], [0.0, 0.0, 2.0, 1.0, math.pi / 2]) == pytest.approx(1 / 3, abs=1e-12)


def test_contained_box_gives_area_ratio():
    assert _iou([0.0, 0.0, 4.0, 4.0, 0.3], [0.2, -0.1, 1.0, 2.0, 1.1]) == pytest.approx(2 / 16, abs=1e-12)


def test_yaw_is_counter_clockwise():
    # A 4×0.5 bar at yaw +30° passes through 1.5·(cos 30°, sin 30°) (upper right, counter-clockwise from +x);
    # the bar at yaw -30° passes below it.
    bar = [0.0, 0.0, 4.0, 0.5, math.pi / 6]
    probe = [1.5 * math.cos(math.pi / 6), 1.5 * math.sin(math.pi / 6), 0.2, 0.2, 0.0]
    assert _iou(bar, probe) > 0.0
    assert _iou([0.0, 0.0, 4.0, 0.5, -math.pi / 6], probe) == 0.0


def test_degenerate_boxes_have_iou_zero():
    assert _iou([0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0, 0.0]) == 0.0
    assert _iou([0.0, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1e-8, 1e-8, 0.0]) == 0.0


def test_pairwise_matches_independent_polygon_reference(gen):
    boxes = _random_boxes(gen, 40)  # (40, 5)
    iou = rotated_bev_iou_pairwise(boxes, boxes)  # (40, 40)
    rows = boxes.tolist()
    expected = torch.tensor([[_slow_iou(a, b) for b in rows] for a in rows], dtype=torch.float64)
    assert (iou > 0).sum() > 80  # the scene has plenty of overlaps
    torch.testing.assert_close(iou, expected, rtol=0, atol=1e-12)


def test_near_degenerate_pairs_match_reference(gen):
    # Shared edges and vertices lying on the other box's edges: nearly equal boxes, quarter turns of the
    # same box, and yaws on multiples of 45°.
    a = _random_boxes(gen, 90, spread=1.0)  # (90, 5)
    b = a.clone()
    b[:30] += 1e-9 * torch.randn(30, 5, generator=gen, dtype=torch.float64)
    b[30:60, 4] += math.pi / 2 * torch.randint(0, 4, (30,), generator=gen)
    b[60:, :2] += 0.3 * torch.randn(30, 2, generator=gen, dtype=torch.float64)
    b[60:, 4] = torch.round(a[60:, 4] / (math.pi / 4)) * (math.pi / 4)
    expected = torch.tensor([_slow_iou(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)], dtype=torch.float64)
    torch.testing.assert_close(rotated_bev_iou_aligned(a, b), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(rotated_bev_iou_aligned(a.float(), b.float()).double(), expected, rtol=0, atol=1e-5)


def test_plain_python_clipping_agrees_with_shapely(gen):
    # Keeps the fallback reference honest where shapely is present.
    if Polygon is None:
        pytest.skip("shapely not importable")
    for a, b in zip(_random_boxes(gen, 30).tolist(), _random_boxes(gen, 30).tolist(), strict=True):
        inter = max(_area(_clip_python(_corners(a), _corners(b))), 0.0)
        assert inter == pytest.approx(Polygon(_corners(a)).intersection(Polygon(_corners(b))).area, abs=1e-12)


def test_symmetric_and_aligned_equals_pairwise_diagonal(gen):
    a, b = _random_boxes(gen, 25), _random_boxes(gen, 25)
    pairwise = rotated_bev_iou_pairwise(a, b)  # (25, 25)
    torch.testing.assert_close(pairwise, rotated_bev_iou_pairwise(b, a).T, rtol=0, atol=1e-13)
    torch.testing.assert_close(pairwise.diagonal(), rotated_bev_iou_aligned(a, b), rtol=0, atol=0)


def test_invariant_to_moving_both_boxes_together(gen):
    a, b = _random_boxes(gen, 30), _random_boxes(gen, 30)
    iou = rotated_bev_iou_aligned(a, b)  # (30,)
    angle, shift = 0.83, torch.tensor([12.5, -7.25], dtype=torch.float64)
    rot = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=torch.float64)

    def move(boxes):
        return torch.cat([boxes[:, :2] @ rot.T + shift, boxes[:, 2:4], boxes[:, 4:] + angle], dim=-1)

    torch.testing.assert_close(rotated_bev_iou_aligned(move(a), move(b)), iou, rtol=0, atol=1e-12)
    # Yaw ± π and swapping (dx, dy) with yaw + π/2 describe the same rectangles.
    flipped = torch.cat([a[:, :4], a[:, 4:] + math.pi], dim=-1)
    swapped = torch.cat([a[:, :2], a[:, 3:4], a[:, 2:3], a[:, 4:] + math.pi / 2], dim=-1)
    torch.testing.assert_close(rotated_bev_iou_aligned(flipped, b), iou, rtol=0, atol=1e-12)
    torch.testing.assert_close(rotated_bev_iou_aligned(swapped, b), iou, rtol=0, atol=1e-12)


def test_float32_matches_float64_within_rounding(gen):
    boxes = _random_boxes(gen, 50)  # (50, 5) coordinates up to ~6, sizes up to ~3
    iou64 = rotated_bev_iou_pairwise(boxes, boxes)
    iou32 = rotated_bev_iou_pairwise(boxes.float(), boxes.float())
    assert iou32.dtype == torch.float32
    # float32 rounds the inputs and each vertex by ~1e-7 relative, i.e. ~1e-6 absolute for |c| ≲ 10;
    # an area moves by about perimeter (≤ 13) × 1e-6, and the IoU by that over the union (≥ 0.04, the
    # smallest box): ~3e-4 at worst (typically ~1e-6).
    torch.testing.assert_close(iou32.double(), iou64, rtol=0, atol=3e-4)


def test_broadcasts_leading_dims_and_handles_empty(gen):
    a = _random_boxes(gen, 2 * 3 * 4).view(2, 3, 4, 5)
    b = _random_boxes(gen, 3 * 6).view(1, 3, 6, 5)
    out = rotated_bev_iou_pairwise(a, b)  # (2, 3, 4, 6)
    assert out.shape == (2, 3, 4, 6)
    torch.testing.assert_close(out[1, 2], rotated_bev_iou_pairwise(a[1, 2], b[0, 2]), rtol=0, atol=0)
    assert rotated_bev_iou_pairwise(a[:, :, :0], b).shape == (2, 3, 0, 6)
    assert rotated_bev_iou_pairwise(a, b[:, :, :0]).shape == (2, 3, 4, 0)


def test_chunked_rows_match_unchunked(gen, monkeypatch):
    import drivetrain.geometry.rotated_iou as module

    a, b = _random_boxes(gen, 33), _random_boxes(gen, 17)
    full = rotated_bev_iou_pairwise(a, b)
    monkeypatch.setattr(module, "_PAIRS_PER_CHUNK", 40)  # 2 rows per chunk
    torch.testing.assert_close(rotated_bev_iou_pairwise(a, b), full, rtol=0, atol=0)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="last dim must be 5"):
        rotated_bev_iou_pairwise(torch.zeros(3, 4), torch.zeros(3, 5))
    with pytest.raises(ValueError, match="floating"):
        rotated_bev_iou_aligned(torch.zeros(3, 5, dtype=torch.int64), torch.zeros(3, 5))


def test_no_host_sync(gen):
    a, b = _random_boxes(gen, 12), _random_boxes(gen, 9)
    rotated_bev_iou_pairwise(a, b)  # warm the cached constants
    with no_host_sync():
        rotated_bev_iou_pairwise(a, b)
        rotated_bev_iou_aligned(a[:9], b)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(gen):
    boxes = _random_boxes(gen, 300)
    torch.testing.assert_close(
        rotated_bev_iou_pairwise(boxes.cuda(), boxes.cuda()).cpu(),
        rotated_bev_iou_pairwise(boxes, boxes),
        rtol=0,
        atol=1e-12,
    )


@pytest.mark.slow
def test_many_random_pairs_match_reference(gen):
    a, b = _random_boxes(gen, 3000, spread=3.0), _random_boxes(gen, 3000, spread=3.0)
    iou = rotated_bev_iou_aligned(a, b)
    expected = torch.tensor([_slow_iou(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)], dtype=torch.float64)
    torch.testing.assert_close(iou, expected, rtol=0, atol=1e-12)


def test_sparse_pairwise_is_the_dense_matrix():
    """Only pairs whose circumscribed circles meet are clipped; the others are exactly the dense path's 0."""
    from drivetrain.geometry.rotated_iou import rotated_bev_iou_pairwise

    g = torch.Generator().manual_seed(3)
    a = torch.cat([torch.rand(2, 3, 40, 2, generator=g) * 30, torch.rand(2, 3, 40, 2, generator=g) * 4 + 0.1,
                   torch.rand(2, 3, 40, 1, generator=g) * 6], dim=-1).double()  # fmt: skip
    a[0, 0, 5] = a[0, 0, 4]  # identical boxes
    a[1, 2, 7, 2] = 0.0  # degenerate
    b = a[:, :1, :25]  # broadcast over the middle dim
    dense = rotated_bev_iou_pairwise(a, b)
    sparse = rotated_bev_iou_pairwise(a, b, sparse=True)
    assert torch.equal(sparse, dense) and (dense > 0).sum() > 20 and (dense == 0).sum() > 1000
    assert rotated_bev_iou_pairwise(a[..., :0, :], b, sparse=True).shape == (2, 3, 0, 25)


def test_sparse_pairwise_is_the_dense_matrix_far_from_the_origin_in_float32():
    """The circles' gaps come from each pair's difference: cdist's matmul form ``|a|² + |b|² − 2a·b`` (its default
    beyond 25 rows) cancels in float32 a kilometre out (``|a|² ≈ 2e6``, whose rounding 0.125 is a square metre's
    tenth) and once dropped overlapping pairs there. The dense path works in each ``b``'s frame, so both are exact
    differences of the same float32 coordinates and must agree exactly."""
    g = torch.Generator().manual_seed(0)
    centre = torch.rand(400, 2, generator=g) * 10 + 995  # (400, 2) a crowd of small boxes 1 km out
    size = torch.rand(400, 2, generator=g) * 0.8 + 0.3  # (400, 2)
    boxes = torch.cat([centre, size, torch.rand(400, 1, generator=g) * 6], dim=-1)  # (400, 5) float32
    dense = rotated_bev_iou_pairwise(boxes, boxes)
    assert (dense > 0).sum() > 2 * 400  # overlapping pairs beside the diagonal
    assert torch.equal(rotated_bev_iou_pairwise(boxes, boxes, sparse=True), dense)
