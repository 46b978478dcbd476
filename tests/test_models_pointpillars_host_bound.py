"""The compiled step's bucket bounded on the host before the device's augmentation (issue 46, deliverable 2):
:func:`~drivetrain.pipeline.augment.bev.bev_aug_bounds` replays the augmentation's geometry on the host with a bound
on how far the device's float products may land, :func:`~drivetrain.pipeline.voxelize.voxel_count_bound` counts every
cell a point may fall in, :meth:`~drivetrain.models.pointpillars.static.StaticPillarStep.bound_shapes` takes the
bucket. The bound must hold for *any* device result within the replay's error (checked by moving the replayed points
and box centres anywhere within it, faces included), and be tight where no point is near a face."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from drivetrain.data import DatasetConfig, FrameDataset, collate
from drivetrain.models.pointpillars.model import SSN, PointPillars
from drivetrain.pipeline.augment.bev import BevAugConfig, bev_aug_bounds, draw_bev_params, make_bev_params
from drivetrain.pipeline.augment.stage import AugmentConfig, AugmentParams, apply
from drivetrain.pipeline.voxelize import VoxelGrid, voxel_count_bound, voxel_counts
from drivetrain.ragged import RaggedBatch, select
from test_models_pointpillars_static import TINY, TINY_SSN

RANGE = TINY["point_cloud_range"]
AUG = BevAugConfig(  # the published PointPillars recipe's steps at the tiny grid's ranges
    rot_range=(-0.3925, 0.3925), scale_range=(0.95, 1.05), translation_std=(0.2, 0.2, 0.2), flip_horizontal=0.5,
    flip_vertical=0.5, point_range=RANGE, object_range=(RANGE[0], RANGE[1], RANGE[3], RANGE[4]), shuffle=True,
)  # fmt: skip
F32 = 2.0**-24  # IEEE float32's unit roundoff
TF32 = 2.0**-11  # a loose device (TF32 products): wide errors, many points near a face


@pytest.fixture(scope="module")
def batch(synth_index, synth_root):
    config = DatasetConfig(load_images=False, load_points=True, num_sweeps=1, use_dim=(0, 1, 2, 4))
    dataset = FrameDataset(synth_index, config, synth_root)
    return collate([dataset[i] for i in (1, 4)])


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    common = {"max_points_per_sample": 1 << 15, "max_targets": 100}
    return {"pointpillars": PointPillars(**TINY, **common).train(), "ssn": SSN(**TINY_SSN, **common).train()}


def _params(batch, seed: int):
    return draw_bev_params(2, batch.points.shape[1], AUG, torch.Generator().manual_seed(seed))


def _moved_within(value: torch.Tensor, error: torch.Tensor, gen: torch.Generator, faces: torch.Tensor | None = None):
    """``value`` moved anywhere within ``± error`` (float32), a third of the entries to an end of the interval and,
    with ``faces`` (a cell size), a third onto the nearest cell face the interval reaches."""
    wide, error = value.double(), error.double()
    u = 2 * torch.rand(value.shape, generator=gen, dtype=torch.float64) - 1  # (...)
    pick = torch.randint(0, 3, value.shape, generator=gen)  # (...)
    out = wide + torch.where(pick == 0, u, torch.sign(u)) * error  # inside, or at an end
    if faces is not None:
        low = torch.tensor(RANGE[:3], dtype=torch.float64)
        face = low + faces * torch.round((wide - low) / faces)  # (..., 3) the nearest face
        out = torch.where((pick == 2) & ((face - wide).abs() <= error), face, out)
    shrink = torch.nextafter(out.float(), value)  # one float32 step towards the replay: stays within the bound
    return torch.where((shrink.double() - wide).abs() <= error, out.float(), shrink)


def _device_voxels(xyz: torch.Tensor, mask: torch.Tensor, grid: VoxelGrid) -> torch.Tensor:
    """The device's count for points at ``xyz``: its strict point-range filter, then the voxelization's count."""
    lo, hi = torch.tensor(RANGE[:3]), torch.tensor(RANGE[3:])
    keep = mask & ((xyz > lo) & (xyz < hi)).all(dim=-1)  # (B, P)
    return voxel_counts(select(xyz, keep, trim=False), grid, stored=False)[0]  # (B,)


@pytest.mark.parametrize("roundoff", [F32, TF32], ids=["float32", "tf32"])
def test_the_voxel_bound_holds_for_any_device_result_within_the_replays_error(batch, models, roundoff):
    grid, gen = models["pointpillars"].grid, torch.Generator().manual_seed(7)
    size = torch.tensor(grid.voxel_size, dtype=torch.float64)
    for seed in range(4):
        bounds = bev_aug_bounds(batch.points, batch.gt_boxes, _params(batch, seed), AUG, roundoff)
        bound = voxel_count_bound(bounds.xyz, bounds.point_error, bounds.points_kept, grid)
        assert bound is not None
        exact = voxel_counts(apply_points(batch, seed), grid, stored=False)[0]  # the augmentation itself
        assert (bound >= exact).all(), (seed, bound, exact)
        for _ in range(3):  # a device anywhere within the error, faces included
            moved = _moved_within(bounds.xyz, bounds.point_error, gen, faces=size)
            assert (bound >= _device_voxels(moved, batch.points.mask, grid)).all(), seed


def apply_points(batch, seed: int) -> RaggedBatch:
    return apply(batch, AugmentParams(None, _params(batch, seed)), AugmentConfig(lidar=AUG)).points


def test_the_voxel_bound_is_the_count_plus_at_most_the_cells_of_the_points_near_a_face(batch, models):
    """The excess is derived: a point within its error of a face adds at most the other cells its interval reaches
    (2³ − 1 corners), a point away from every face none."""
    grid = models["pointpillars"].grid
    low, size = torch.tensor(RANGE[:3], dtype=torch.float64), torch.tensor(grid.voxel_size, dtype=torch.float64)
    for seed, roundoff in ((0, F32), (1, F32), (2, TF32)):
        bounds = bev_aug_bounds(batch.points, batch.gt_boxes, _params(batch, seed), AUG, roundoff)
        bound = voxel_count_bound(bounds.xyz, bounds.point_error, bounds.points_kept, grid)
        exact = voxel_counts(apply_points(batch, seed), grid, stored=False)[0]
        offset = (bounds.xyz.double() - low) / size  # (B, P, 3) in cells
        near = ((offset - offset.round()).abs() * size <= bounds.point_error).any(dim=-1) & bounds.points_kept
        assert (bound <= exact + 7 * near.sum(dim=1)).all(), (seed, bound, exact, near.sum(dim=1))
    assert bool((bound > exact).any())  # the TF32 errors reach faces: the bound is above the count there


def test_the_replay_keeps_a_superset_and_moves_boxes_as_the_device(batch):
    params = _params(batch, 3)
    bounds = bev_aug_bounds(batch.points, batch.gt_boxes, params, AUG, F32)
    out = apply(batch, AugmentParams(None, params), AugmentConfig(lidar=AUG))
    assert int(bounds.points_kept.sum()) >= int(out.points.sizes.sum())
    assert torch.equal(bounds.boxes_kept.sum(dim=1), out.gt_boxes.sizes)  # no box near the range's edge here
    kept = select(bounds.boxes, bounds.boxes_kept, trim=False)
    assert torch.equal(kept.tensor[kept.mask], out.gt_boxes.tensor[out.gt_boxes.mask])  # the same op, the same bits


@pytest.mark.parametrize("name", ["pointpillars", "ssn"])
@pytest.mark.parametrize("roundoff", [F32, TF32], ids=["float32", "tf32"])
def test_the_bucket_bounded_on_the_host_holds_any_device_augmentation_within_the_error(batch, models, name, roundoff):
    """Voxels and window pairs: the bucket of the bound holds the exact augmented batch and every batch whose points
    and box centres lie anywhere within the replay's error of it."""
    model, gen = models[name], torch.Generator().manual_seed(11)
    config = AugmentConfig(lidar=AUG)
    size = torch.tensor(model.grid.voxel_size, dtype=torch.float64)
    for seed in range(3):
        params = AugmentParams(None, _params(batch, seed))
        shapes = model.step_shapes_augmented(batch, params, config, roundoff)
        augmented = apply(batch, params, config)
        assert shapes is not None and _holds(model, shapes, augmented)
        bounds = bev_aug_bounds(batch.points, batch.gt_boxes, params.lidar, AUG, roundoff)
        for _ in range(3):
            xyz = _moved_within(bounds.xyz, bounds.point_error, gen, faces=size)
            centre = _moved_within(bounds.boxes[..., :2], bounds.box_error[..., None].expand(-1, -1, 2), gen)
            boxes = torch.cat([centre, bounds.boxes[..., 2:]], dim=-1)
            lo, hi = torch.tensor(RANGE[:3]), torch.tensor(RANGE[3:])
            keep = batch.points.mask & ((xyz > lo) & (xyz < hi)).all(dim=-1)
            x, y = boxes[..., 0], boxes[..., 1]
            keep_box = batch.gt_boxes.mask & (x > RANGE[0]) & (y > RANGE[1]) & (x < RANGE[3]) & (y < RANGE[4])
            device = dataclasses.replace(
                batch, points=select(torch.cat([xyz, batch.points.tensor[..., 3:]], -1), keep, trim=False),
                gt_boxes=select(boxes, keep_box, trim=False),
                gt_labels=select(batch.gt_labels.tensor, keep_box, trim=False),
            )  # fmt: skip
            assert _holds(model, shapes, device), (name, seed)


@pytest.mark.parametrize("name", ["pointpillars", "ssn"])
def test_the_pairs_bound_grows_each_window_by_its_centres_error(batch, models, name):
    """Centre errors of a third of an anchor cell and more (beyond the windows' own eighth-cell margin): the pairs of
    the bound hold every placement of the centres within them, the pairs of the replay alone do not."""
    model, gen = models[name], torch.Generator().manual_seed(5)
    params = _params(batch, 1)
    bounds = bev_aug_bounds(batch.points, batch.gt_boxes, params, AUG, F32)
    wide = dataclasses.replace(bounds, box_error=torch.full_like(bounds.box_error, 0.3))
    step = model._static_step()
    widest, tight = step.bound_counts(batch, wide)[2], step.bound_counts(batch, bounds)[2]
    below = 0
    for _ in range(6):
        centre = _moved_within(bounds.boxes[..., :2], wide.box_error[..., None].expand(-1, -1, 2), gen)
        boxes = torch.cat([centre, bounds.boxes[..., 2:]], dim=-1)
        moved = dataclasses.replace(
            batch, gt_boxes=select(boxes, bounds.boxes_kept, trim=False),
            gt_labels=select(batch.gt_labels.tensor, bounds.boxes_kept, trim=False),
        )  # fmt: skip
        pairs = int(step._pair_total(moved))  # the windows' pairs of the moved batch, as the step counts them
        assert widest >= pairs
        below += tight < pairs
    assert below  # the error matters: without growing the windows some placement needs more pairs


def test_the_replays_error_bounds_the_distance_to_the_exact_product_for_both_sides(batch):
    """The error is twice ``γ₄·m``: each side's float product lies within half of it from the exact one. Checked
    for the host's float32 product, and for an emulated TF32 device (inputs rounded to 10 mantissa bits, the three
    products summed in float32 in a random order)."""
    params = _params(batch, 2)
    xyz = batch.points.tensor[..., :3]  # (B, P, 3)
    matrix = params.matrix  # (B, 4, 4)
    linear_t, shift = matrix[:, :3, :3].transpose(1, 2), matrix[:, :3, 3].unsqueeze(1)
    exact = torch.baddbmm(shift.double(), xyz.double(), linear_t.double())  # (B, P, 3)
    host = bev_aug_bounds(batch.points, batch.gt_boxes, params, AUG, F32)
    mask = batch.points.mask[..., None]
    assert ((host.xyz.double() - exact).abs() <= host.point_error / 2)[mask.expand_as(exact)].all()

    def tf32(t: torch.Tensor) -> torch.Tensor:  # round to nearest, 10 explicit mantissa bits
        bits = t.float().view(torch.int32)
        return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)

    products = tf32(xyz)[..., :, None] * tf32(linear_t)[:, None, :, :]  # (B, P, 3, 3) exact in float32
    order = torch.randperm(3, generator=torch.Generator().manual_seed(0))
    device = shift.expand_as(exact).float().clone()
    for j in order.tolist():
        device = device + products[..., j, :]
    loose = bev_aug_bounds(batch.points, batch.gt_boxes, params, AUG, TF32)
    assert ((device.double() - loose.xyz.double()).abs() <= loose.point_error)[mask.expand_as(exact)].all()


def _holds(model, shapes, augmented) -> bool:
    """Whether ``shapes`` holds the batch by the step's own counts (its exact bucket's counts)."""
    exact = model.step_shapes(augmented)
    return shapes.voxels >= exact.voxels and shapes.pairs >= exact.pairs and shapes.targets >= exact.targets


def test_boxes_near_a_quarter_turn_count_the_windows_of_either_nearest_rectangle(batch, models):
    """A yaw an ulp from ±π/4 (after the wrap) may turn the nearest BEV rectangle either way on the device: the
    bound counts the square of the longer side."""
    model = models["pointpillars"]
    boxes = batch.gt_boxes.tensor.clone()
    boxes[..., 3], boxes[..., 4], boxes[..., 6] = 4.0, 1.0, math.pi / 4  # long boxes at a quarter turn,
    boxes[..., 0], boxes[..., 1] = RANGE[3] - 1.0, 0.0  # at the map's edge: a window the edge clips (else a swap of
    # the rectangle's sides keeps its count on a square grid of anchors)
    turned = dataclasses.replace(batch, gt_boxes=batch.gt_boxes.with_tensor(boxes))
    identity = make_bev_params(
        torch.zeros(2), torch.ones(2), torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool),
        torch.zeros(2, dtype=torch.bool), torch.zeros(2, batch.points.shape[1]),
    )  # fmt: skip
    step = model._static_step()
    bounds = bev_aug_bounds(turned.points, turned.gt_boxes, identity, BevAugConfig(), F32)
    widest = step.bound_counts(turned, bounds)[2]
    for yaw in (math.pi / 4 - 1e-6, math.pi / 4 + 1e-6):  # either side of the turn
        boxes[..., 6] = yaw
        either = dataclasses.replace(batch, gt_boxes=batch.gt_boxes.with_tensor(boxes.clone()))
        assert widest >= int(step._pair_total(either)), yaw


def test_no_cheap_bound_is_none_and_the_step_counts_on_the_device(batch):
    big = VoxelGrid((-50, -50, -5, 50, 50, 3), (0.05, 0.05, 0.2), max_points=4, max_voxels=1000)  # 2000²·40 cells
    bounds = bev_aug_bounds(batch.points, batch.gt_boxes, _params(batch, 0), AUG, F32)
    assert voxel_count_bound(bounds.xyz, bounds.point_error, bounds.points_kept, big) is None
    fine = VoxelGrid(RANGE, (0.5, 0.5, 8.0), max_points=4, max_voxels=1000)
    far = torch.full_like(bounds.point_error, 0.6)  # an error across more than two cells of an axis
    assert voxel_count_bound(bounds.xyz, far, bounds.points_kept, fine) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tf32", [False, True], ids=["float32", "tf32"])
def test_on_cuda_the_host_bound_holds_the_devices_own_augmentation(batch, models, tf32):
    """The claim itself, on a GPU: the bucket bounded on the host holds the batch the CUDA augmentation makes, with
    IEEE float32 products and with TF32 allowed (the bound's roundoff read from torch's settings)."""
    from drivetrain.pipeline.augment.bev import matmul_roundoff
    from drivetrain.pipeline.transfer import to_device

    cuda, config = torch.device("cuda"), AugmentConfig(lidar=AUG)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        for name in ("pointpillars", "ssn"):
            model = models[name]
            for seed in range(8):
                params = AugmentParams(None, _params(batch, seed))
                shapes = model.step_shapes_augmented(batch, params, config, matmul_roundoff(cuda))
                on_device = apply(to_device(batch, cuda), params, config)  # the parameters copied, applied there
                exact = model.step_shapes(to_device(on_device, torch.device("cpu")))
                assert shapes.voxels >= exact.voxels and shapes.pairs >= exact.pairs, (name, seed)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def test_a_float64_cloud_is_bounded_in_the_voxelizations_float64_arithmetic(batch, models):
    grid, gen = models["pointpillars"].grid, torch.Generator().manual_seed(3)
    points = batch.points.apply(lambda t: t.double())
    bounds = bev_aug_bounds(points, batch.gt_boxes, _params(batch, 0), AUG, 2.0**-53)
    assert bounds.xyz.dtype == torch.float64
    bound = voxel_count_bound(bounds.xyz, bounds.point_error, bounds.points_kept, grid)
    size = torch.tensor(grid.voxel_size, dtype=torch.float64)
    low = torch.tensor(RANGE[:3], dtype=torch.float64)
    for _ in range(3):  # a device anywhere within the error, on a face where the error reaches one
        u = 2 * torch.rand(bounds.xyz.shape, generator=gen, dtype=torch.float64) - 1
        moved = bounds.xyz + u * bounds.point_error
        face = low + size * torch.round((bounds.xyz - low) / size)
        moved = torch.where((face - bounds.xyz).abs() <= bounds.point_error, face, moved)
        assert (bound >= _device_voxels(moved, points.mask, grid)).all()
