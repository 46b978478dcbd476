"""Tests for drivetrain.geometry.heatmap: radius rules and batched Gaussian drawing against the per-box loop."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from drivetrain.geometry.heatmap import draw_gaussians, focal_head_radius, gaussian_radius, reference_draw_gaussians
from drivetrain.ragged import RaggedBatch

H, W = 20, 28
MAX_R = 5
BIG = 10**9


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(23)


def random_targets(
    batch_shape: tuple[int, ...], g: int, gen: torch.Generator, *, num_classes: int = 0, max_r: int = MAX_R
) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch | None]:
    """Centres ``(*batch, G, 2)``, radii ``(*batch, G)`` and labels with poisoned padding.

    Real boxes: centres in ``[-3, W+3) × [-3, H+3)`` (some outside, some on the border), radii in
    ``[0, max_r]``. Padding alternates between huge values and a plausible in-image box, either of
    which would show up if drawn.
    """
    sizes = torch.randint(0, g + 1, batch_shape, generator=gen)
    flat = sizes.view(-1)
    flat[0], flat[-1] = 0, g
    cx = torch.randint(-3, W + 3, (*batch_shape, g), generator=gen)
    cy = torch.randint(-3, H + 3, (*batch_shape, g), generator=gen)
    centres = torch.stack([cx, cy], dim=-1)
    flat_centres = centres.view(-1, g, 2)
    flat_centres[0, :4] = torch.tensor([[0, 0], [W - 1, H - 1], [W - 1, 0], [0, H - 1]])
    flat_centres[-1, :4] = torch.tensor([[0, 0], [W - 1, H - 1], [W - 1, 0], [0, H - 1]])
    radii = torch.randint(0, max_r + 1, (*batch_shape, g), generator=gen)
    padding = torch.arange(g) >= sizes[..., None]  # (*batch, G)
    alternate = (torch.arange(g) % 2 == 0).expand_as(padding)
    poison_centre = torch.where(alternate[..., None], torch.tensor([BIG, -BIG]), torch.tensor([W // 2, H // 2]))
    centres = torch.where(padding[..., None], poison_centre, centres)
    radii = torch.where(padding, torch.where(alternate, BIG, 3), radii)
    labels = None
    if num_classes:
        real_labels = torch.randint(0, num_classes, (*batch_shape, g), generator=gen)
        labels_t = torch.where(padding, torch.where(alternate, -BIG, num_classes + 2), real_labels)
        labels = RaggedBatch(labels_t, sizes)
    return RaggedBatch(centres, sizes), RaggedBatch(radii, sizes), labels


def initial_heatmap(
    batch_shape: tuple[int, ...], num_classes: int, gen: torch.Generator, *, zero: bool
) -> torch.Tensor:
    shape = (*batch_shape, *((num_classes,) if num_classes else ()), H, W)
    if zero:
        return torch.zeros(shape)
    heat = torch.rand(shape, generator=gen)
    return heat * (torch.rand(shape, generator=gen) < 0.2)  # sparse existing peaks to merge with


def reference(
    heatmap: torch.Tensor, centres: RaggedBatch, radii: RaggedBatch, labels: RaggedBatch | None
) -> torch.Tensor:
    nb = centres.num_batch_dims
    images = heatmap.reshape(-1, *heatmap.shape[nb:])
    out = reference_draw_gaussians(
        images,
        centres.flatten_batch().to_list(),
        radii.flatten_batch().to_list(),
        labels.flatten_batch().to_list() if labels is not None else None,
    )
    return out.view(heatmap.shape)


# ---------------------------------------------------------------------- draw_gaussians
@pytest.mark.parametrize("batch_shape", [(4,), (2, 3)], ids=["B", "B,N"])
@pytest.mark.parametrize("num_classes", [0, 3], ids=["no_labels", "labels"])
@pytest.mark.parametrize("max_radius", [None, MAX_R, MAX_R + 2], ids=["dense", "window", "wide_window"])
@pytest.mark.parametrize("zero", [True, False], ids=["zeros", "existing"])
def test_batched_draw_matches_per_box_reference(
    batch_shape: tuple[int, ...], num_classes: int, max_radius: int | None, zero: bool, gen: torch.Generator
) -> None:
    centres, radii, labels = random_targets(batch_shape, 9, gen, num_classes=num_classes)
    heatmap = initial_heatmap(batch_shape, num_classes, gen, zero=zero)
    original = heatmap.clone()
    out = draw_gaussians(heatmap, centres, radii, labels, max_radius=max_radius)
    expected = reference(heatmap, centres, radii, labels)
    assert out.shape == heatmap.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)  # exact today; 1e-6 allows exp ulps
    assert torch.equal(heatmap, original), "the input heatmap was modified"
    # Something was drawn (the comparison is not between two untouched heatmaps).
    assert (out > heatmap).sum() > 20


def test_padding_is_never_drawn(gen: torch.Generator) -> None:
    centres, radii, labels = random_targets((5,), 6, gen, num_classes=2)
    empty = RaggedBatch(centres.tensor, torch.zeros(5, dtype=torch.int64))
    for max_radius in (None, MAX_R):
        out = draw_gaussians(
            torch.zeros(5, 2, H, W),
            empty,
            RaggedBatch(radii.tensor, empty.sizes),
            RaggedBatch(labels.tensor, empty.sizes),
            max_radius=max_radius,
        )
        assert torch.equal(out, torch.zeros(5, 2, H, W))


def test_no_boxes_at_all_returns_the_heatmap(gen: torch.Generator) -> None:
    centres = RaggedBatch(torch.zeros(3, 0, 2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    radii = RaggedBatch(torch.zeros(3, 0, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    heatmap = torch.rand(3, H, W, generator=gen)
    for max_radius in (None, 2):
        assert torch.equal(draw_gaussians(heatmap, centres, radii, max_radius=max_radius), heatmap)


def test_isolated_box_peaks_at_one_at_its_centre() -> None:
    centres = RaggedBatch.from_list([torch.tensor([[9, 7]])])
    radii = RaggedBatch.from_list([torch.tensor([3])])
    for max_radius in (None, 3, 6):
        out = draw_gaussians(torch.zeros(1, H, W), centres, radii, max_radius=max_radius)[0]
        assert out[7, 9].item() == 1.0
        assert out.max().item() == 1.0 and (out == 1.0).sum() == 1
        window = out[4:11, 6:13]
        assert (window > 0).all() and out.sum() == window.sum()
        assert torch.equal(window, window.flip(0)) and torch.equal(window, window.flip(1))
        assert torch.equal(window, window.T)
        # σ = (2r + 1) / 6 = 7/6: the value one cell off the centre is exp(-1 / (2σ²)).
        assert out[7, 10].item() == pytest.approx(math.exp(-1 / (2 * (7 / 6) ** 2)), rel=1e-6)


def test_overlapping_boxes_merge_with_max() -> None:
    centres = RaggedBatch.from_list([torch.tensor([[10, 10], [10, 10], [12, 10]])])
    radii = RaggedBatch.from_list([torch.tensor([1, 4, 2])])
    out = draw_gaussians(torch.zeros(1, H, W), centres, radii)
    singles = [
        draw_gaussians(
            torch.zeros(1, H, W), RaggedBatch.from_list([centres.tensor[0, g : g + 1]]), RaggedBatch.from_list([r])
        )
        for g, r in enumerate(radii.tensor[0].split(1))
    ]
    assert torch.equal(out, torch.stack(singles).amax(0))
    torch.testing.assert_close(out, reference(torch.zeros(1, H, W), centres, radii, None), rtol=0, atol=1e-6)


def test_centre_one_cell_past_the_border_draws_its_edge_as_the_original() -> None:
    # StreamPETR clips projected centres to the image, so a centre on the right or bottom image border lands on
    # cell x = W or y = H; mmdet3d's window slicing still draws the window's overlap with the map. Radius 1:
    # σ = 3/6, so the cell beside the centre gets exp(-1 / (2σ²)) = e^-2 and a diagonal one e^-4.
    past = torch.tensor([[W, 5], [7, H]])
    centres, radii = RaggedBatch.from_list([past]), RaggedBatch.from_list([torch.ones(2, dtype=torch.long)])
    expected = torch.zeros(H, W)
    expected[4:7, W - 1] = torch.tensor([math.exp(-4), math.exp(-2), math.exp(-4)])
    expected[H - 1, 6:9] = torch.tensor([math.exp(-4), math.exp(-2), math.exp(-4)])
    for max_radius in (None, 1):
        out = draw_gaussians(torch.zeros(1, H, W), centres, radii, max_radius=max_radius)[0]
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(reference(torch.zeros(1, H, W), centres, radii, None)[0], expected, rtol=0, atol=1e-7)


def test_window_entirely_off_the_map_draws_nothing() -> None:
    # Centres beyond their radius from every border: the window does not overlap the map.
    outside = torch.tensor([[-4, 5], [W + 3, 5], [5, -4], [5, H + 3]])
    centres = RaggedBatch.from_list([outside])
    radii = RaggedBatch.from_list([torch.full((4,), 3)])
    for max_radius in (None, 3):
        assert torch.equal(
            draw_gaussians(torch.zeros(1, H, W), centres, radii, max_radius=max_radius), torch.zeros(1, H, W)
        )
    assert torch.equal(reference(torch.zeros(1, H, W), centres, radii, None), torch.zeros(1, H, W))


def test_boxes_on_the_border_are_clipped_not_dropped() -> None:
    corners = torch.tensor([[0, 0], [W - 1, H - 1]])
    centres, radii = RaggedBatch.from_list([corners]), RaggedBatch.from_list([torch.tensor([3, 2])])
    for max_radius in (None, 3):
        out = draw_gaussians(torch.zeros(1, H, W), centres, radii, max_radius=max_radius)[0]
        assert out[0, 0].item() == 1.0 and out[H - 1, W - 1].item() == 1.0
        assert (out[:4, :4] > 0).all() and (out[H - 3 :, W - 3 :] > 0).all()
        torch.testing.assert_close(out, reference(torch.zeros(1, H, W), centres, radii, None)[0], rtol=0, atol=1e-6)


def test_radii_above_max_radius_keep_their_gaussian_cropped_to_the_window(gen: torch.Generator) -> None:
    bound = 2
    centres, radii, _ = random_targets((4,), 8, gen, max_r=6)
    heatmap = initial_heatmap((4,), 0, gen, zero=False)
    out = draw_gaussians(heatmap, centres, radii, max_radius=bound)
    # Expected: each box drawn alone by the reference loop, then cut to the (2·bound + 1)² window.
    expected = heatmap.clone()
    ys, xs = torch.arange(H).view(H, 1), torch.arange(W).view(1, W)
    for i, (image_centres, image_radii) in enumerate(zip(centres.to_list(), radii.to_list(), strict=True)):
        for (x, y), r in zip(image_centres.tolist(), image_radii.tolist(), strict=True):
            single = reference_draw_gaussians(torch.zeros(1, H, W), [torch.tensor([[x, y]])], [torch.tensor([r])])[0]
            window = ((ys - y).abs() <= bound) & ((xs - x).abs() <= bound)
            expected[i] = torch.maximum(expected[i], single * window)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    assert (radii.tensor[radii.mask] > bound).any(), "no radius exceeds the bound: the test would be vacuous"


def test_float64_heatmap_gives_float32_result(gen: torch.Generator) -> None:
    centres, radii, _ = random_targets((3,), 4, gen)
    heatmap = torch.rand(3, H, W, generator=gen, dtype=torch.float64)
    out = draw_gaussians(heatmap, centres, radii)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference(heatmap, centres, radii, None), rtol=0, atol=1e-6)


def test_bad_heatmap_shape_raises(gen: torch.Generator) -> None:
    centres, radii, labels = random_targets((3,), 4, gen, num_classes=2)
    with pytest.raises(ValueError, match="heatmap"):
        draw_gaussians(torch.zeros(3, H, W), centres, radii, labels)  # no class dim
    with pytest.raises(ValueError, match="heatmap"):
        draw_gaussians(torch.zeros(3, 2, H, W), centres, radii)  # class dim without labels
    with pytest.raises(ValueError, match="heatmap"):
        draw_gaussians(torch.zeros(4, H, W), centres, radii)  # batch mismatch
    with pytest.raises(ValueError, match="heatmap"):
        draw_gaussians(torch.zeros(H, W), centres, radii)
    short = RaggedBatch(radii.tensor[:, :3], radii.sizes.clamp(max=3))
    with pytest.raises(ValueError, match="radii"):
        draw_gaussians(torch.zeros(3, H, W), centres, short)


# ---------------------------------------------------------------------- radius rules
def test_focal_head_radius_matches_hand_computation(gen: torch.Generator) -> None:
    stride = 16.0
    low = torch.rand(40, 2, generator=gen) * 500
    boxes = torch.cat([low, low + 1 + torch.rand(40, 2, generator=gen) * 200], dim=-1)
    # Centres mostly inside, a few outside their box (negative edge distances).
    centres = low + (torch.rand(40, 2, generator=gen) * 1.2 - 0.1) * (boxes[:, 2:] - low)
    radius = focal_head_radius(centres, boxes, stride)
    assert radius.dtype == torch.int64 and radius.shape == (40,)
    for i in range(40):
        x, y = centres[i].tolist()
        x1, y1, x2, y2 = boxes[i].tolist()
        expected = max(1, math.ceil(min(x - x1, y - y1, x2 - x, y2 - y) / stride))
        assert radius[i].item() == expected
    assert (radius >= 1).all()


def test_focal_head_radius_broadcasts_leading_dims(gen: torch.Generator) -> None:
    low = torch.rand(2, 3, 5, 2, generator=gen) * 300
    boxes = torch.cat([low, low + 10 + torch.rand(2, 3, 5, 2, generator=gen) * 200], dim=-1)
    centres = (boxes[..., :2] + boxes[..., 2:]) / 2
    radius = focal_head_radius(centres, boxes, 16.0)
    assert radius.shape == (2, 3, 5)
    assert torch.equal(radius[1, 2], focal_head_radius(centres[1, 2], boxes[1, 2], 16.0))


def ref_gaussian_radius(h: float, w: float, o: float) -> float:
    """CenterNet's formula in Python floats (with its ``(b + sqrt(Δ)) / 2`` roots)."""
    b1, c1 = h + w, w * h * (1 - o) / (1 + o)
    r1 = (b1 + math.sqrt(b1**2 - 4 * c1)) / 2
    b2, c2 = 2 * (h + w), (1 - o) * w * h
    r2 = (b2 + math.sqrt(b2**2 - 16 * c2)) / 2
    a3, b3, c3 = 4 * o, -2 * o * (h + w), (o - 1) * w * h
    r3 = (b3 + math.sqrt(b3**2 - 4 * a3 * c3)) / 2
    return min(r1, r2, r3)


def test_gaussian_radius_matches_centernet_formula() -> None:
    for h, w, o in itertools.product([1.0, 4.5, 20.0, 73.0], [2.0, 9.0, 40.0], [0.1, 0.5, 0.7]):
        r = gaussian_radius(torch.tensor(h), torch.tensor(w), o)
        assert r.item() == pytest.approx(ref_gaussian_radius(h, w, o), rel=1e-5)


def test_gaussian_radius_is_symmetric_in_height_and_width(gen: torch.Generator) -> None:
    h, w = torch.rand(200, generator=gen) * 100 + 0.5, torch.rand(200, generator=gen) * 100 + 0.5
    torch.testing.assert_close(gaussian_radius(h, w), gaussian_radius(w, h), rtol=1e-6, atol=0)


def test_gaussian_radius_increases_with_box_size() -> None:
    sizes = torch.linspace(0.5, 120, 80)
    h, w = torch.meshgrid(sizes, sizes, indexing="ij")
    r = gaussian_radius(h, w)
    assert (r > 0).all()
    assert (r[1:] > r[:-1]).all() and (r[:, 1:] > r[:, :-1]).all()
    # Homogeneous of degree one: doubling both sides doubles the radius.
    torch.testing.assert_close(gaussian_radius(2 * h, 2 * w), 2 * r, rtol=1e-5, atol=1e-5)


def test_gaussian_radius_decreases_with_min_overlap() -> None:
    # In the range detectors use (≥ 0.3); the original formula's r3 rises again below 0.25.
    sizes = torch.linspace(0.5, 120, 40)
    h, w = torch.meshgrid(sizes, sizes, indexing="ij")
    radii = [gaussian_radius(h, w, o) for o in (0.3, 0.5, 0.7, 0.9)]
    for looser, tighter in itertools.pairwise(radii):
        assert (tighter < looser).all()
