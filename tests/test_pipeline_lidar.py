"""The composed lidar input: sweep cache → collate → batched BEV augmentation → batched voxelization, for
nuScenes- and Lyft-format data."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drivetrain.data import DatasetConfig, FrameDataset, collate
from drivetrain.data.formats.lyft.synth import LYFT_SYNTH, LYFT_SYNTH_SCENES
from drivetrain.data.formats.lyft.tables import LYFT_CLASSES, LYFT_VERSION
from drivetrain.data.index import build_index
from drivetrain.data.io import read_points
from drivetrain.data.sweep_cache import build_cache
from drivetrain.data.synth import SynthConfig, generate
from drivetrain.models.pointpillars.recipe import LIDAR_AUG
from drivetrain.pipeline.lidar import lidar_input, reference_lidar_input
from drivetrain.pipeline.voxelize import VoxelGrid, reference_hard_voxelize_batch
from helpers.synth import SYNTH_TEST_CONFIG

# A small grid that still drops voxels (max_voxels) and points (max_points) on the synthetic clouds.
GRID = VoxelGrid((-16.0, -16.0, -5.0, 16.0, 16.0, 3.0), (0.5, 0.5, 8.0), max_points=8, max_voxels=600)
AUGMENT = dataclasses.replace(
    LIDAR_AUG,
    point_range=(-16.0, -16.0, -5.0, 16.0, 16.0, 3.0),
    object_range=(-16.0, -16.0, 16.0, 16.0),
    flip_vertical=0.5,
)


@pytest.fixture(scope="module", params=["nuscenes", "lyft"])
def batch(request, synth_root, synth_index, tmp_path_factory):
    """Three frames read from a sweep cache (N = 2, x y z Δt) of the shared nuScenes-format set or of a
    Lyft-format synthetic set, collated."""
    folder = tmp_path_factory.mktemp("lidar")
    root, index = synth_root, synth_index
    if request.param == "lyft":
        root = folder / "lyft"
        config = SynthConfig(**dict(SYNTH_TEST_CONFIG, scenes=LYFT_SYNTH_SCENES[:2]))
        generate(root, config, progress=False, synth_format=LYFT_SYNTH)
        index = build_index(root, LYFT_VERSION, progress=False)
        assert index.meta["classes"] == list(LYFT_CLASSES)
    config = DatasetConfig(load_images=False, load_points=True, num_sweeps=2, use_dim=(0, 1, 2, 4), filter_empty=False)
    build_cache(index, root, folder / "sweeps-2", config.sweep_config, read_points)
    dataset = FrameDataset(index, DatasetConfig(**{**vars(config), "sweep_cache": str(folder / "sweeps-2")}), root)
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, collate_fn=collate)
    batch = next(iter(loader))
    assert int(batch.gt_labels.sizes.min()) > 0 and int(batch.gt_labels.tensor.max()) < len(index.meta["classes"])
    return batch


def test_unaugmented_input_equals_the_per_sample_reference(batch):
    fast, ref = lidar_input(batch, GRID), reference_lidar_input(batch, GRID)
    assert fast.batch_size == 3 and fast.params is None
    assert torch.equal(fast.num_voxels, ref.num_voxels) and int(fast.num_voxels.max()) == GRID.max_voxels
    assert int(fast.num_points.max()) == GRID.max_points  # voxels over max_points were cut
    for name in ("voxels", "coors", "num_points"):
        assert torch.equal(getattr(fast, name), getattr(ref, name)), name


def test_augmented_input_follows_the_reference_stage_by_stage(batch):
    fast = lidar_input(batch, GRID, AUGMENT, torch.Generator().manual_seed(3))
    ref = reference_lidar_input(batch, GRID, AUGMENT, fast.params)
    # the augmentation: the same points, boxes and labels kept, in the same order
    for name in ("points", "gt_boxes", "gt_labels"):
        assert torch.equal(getattr(fast, name).sizes, getattr(ref, name).sizes), name
    for a, b in zip(fast.gt_labels.to_list(), ref.gt_labels.to_list(), strict=True):
        assert torch.equal(a, b)
    # coordinates: a rotation, scale and translation in float32; each of the paths rounds a three-term dot
    # product (≤ 3 roundings of terms up to s·‖p‖₁ plus |t|): 8 eps (1.05 ‖p‖₁ + |t|) covers both with margin
    eps = torch.finfo(torch.float32).eps
    bound = 8 * eps * (1.05 * batch.points.tensor[..., :3].abs().sum(-1).max() + 1.0)
    for a, b in zip(fast.points.to_list(), ref.points.to_list(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=float(bound))
    for a, b in zip(fast.gt_boxes.to_list(), ref.gt_boxes.to_list(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=float(bound))
    # the voxelization of the augmented points is exact
    again = reference_hard_voxelize_batch(fast.points.to_list(), GRID)
    for name in ("voxels", "coors", "num_points", "num_voxels"):
        assert torch.equal(getattr(fast, name), getattr(again, name)), name


def test_replayed_parameters_give_the_same_input(batch):
    first = lidar_input(batch, GRID, AUGMENT, torch.Generator().manual_seed(5))
    again = lidar_input(batch, GRID, AUGMENT, params=first.params)
    for name in ("voxels", "coors", "num_points"):
        assert torch.equal(getattr(first, name), getattr(again, name))
    other = lidar_input(batch, GRID, AUGMENT, torch.Generator().manual_seed(6))
    assert not torch.equal(first.params.angle, other.params.angle)


def test_misuse_is_named(batch):
    with pytest.raises(ValueError, match="generator"):
        lidar_input(batch, GRID, AUGMENT)
    from dataclasses import replace

    with pytest.raises(ValueError, match=r"batch\.points"):
        lidar_input(replace(batch, points=None), GRID)
