"""The dense 3D middle encoder: voxels land in their cells of the volume, the height folds into the BEV
channels, channels_last_3d computes the same outputs (within the rounding of another summation order), the
detector with it learns, and a pillar grid (one cell along z) is refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drivetrain.data import DatasetConfig, FrameDataset, collate
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.pointpillars.middle import DenseMiddleEncoder, scatter_to_volume
from drivetrain.models.pointpillars.model import PointPillars

TINY_3D = dict(
    point_cloud_range=(-32.0, -32.0, -5.0, 32.0, 32.0, 3.0),
    voxel_size=(0.5, 0.5, 1.0),  # 8 cells along z
    max_points=16,
    max_voxels=6000,
    max_voxels_test=6000,
    vfe_channels=(16,),
    backbone_channels=(32, 64, 128),
    layer_nums=(1, 2, 2),
    neck_channels=(32, 32, 32),
    anchor_ranges=[(-31.75, -31.75, -1.84, 31.75, 31.75, -1.84)],
    anchor_sizes=[(4.6, 1.95, 1.72), (0.73, 0.66, 1.76), (0.49, 2.49, 0.98)],
    middle=dict(base_channels=16, blocks=2),
)
EPS32 = torch.finfo(torch.float32).eps


def test_scatter_puts_each_voxel_in_its_cell():
    g = torch.Generator().manual_seed(0)
    cells = torch.randperm(2 * 3 * 4 * 5, generator=g)[:17]  # unique (b, z, y, x)
    coors = torch.stack([cells // 60, cells // 20 % 3, cells // 5 % 4, cells % 5], 1)  # (17, 4)
    feats = torch.randn(17, 6, generator=g)
    volume = scatter_to_volume(feats, coors, 2, (5, 4, 3))  # grid (nx, ny, nz)
    assert volume.shape == (2, 6, 3, 4, 5)
    for (b, z, y, x), f in zip(coors.tolist(), feats, strict=True):
        assert torch.equal(volume[b, :, z, y, x], f)
    assert int((volume.abs().sum(1) > 0).sum()) == 17


def test_height_folds_into_channels_and_channels_last_3d_gives_the_same_outputs():
    torch.manual_seed(0)
    encoder = DenseMiddleEncoder(16, depth=8, base_channels=16, blocks=2)
    assert encoder.out_channels == 32 * 2  # 8 → 4 → 2 cells of 32 channels
    volume = torch.randn(2, 16, 8, 20, 24)
    out = encoder(volume)
    assert out.shape == (2, 64, 20, 24)
    # The same convolutions in another memory layout sum the same products in another order: per output value
    # at most n·eps32·Σ|w·x| apart (n = 27·C_in terms), bounded here by the first block's |W| * |x| and
    # propagated through GroupNorm's 1/σ; checked on the first conv, where the bound is exact.
    conv = encoder.blocks[0]
    reference = conv(volume)
    fast = conv.to(memory_format=torch.channels_last_3d)(volume.contiguous(memory_format=torch.channels_last_3d))
    bound = F.conv3d(volume.abs(), conv.weight.abs(), stride=(2, 1, 1), padding=1) * (27 * 16 * EPS32)
    assert ((fast - reference).abs() <= bound + 1e-30).all()
    # The whole encoder, in float64: per block at most 27·C_in·eps64·Σ|w·x| ≈ 864 · 2.2e-16 · 20 ≈ 4e-12 apart,
    # GroupNorm divides by σ ≈ 1 of unit-scale activations, two blocks: 1e-10 leaves a margin of ten.
    encoder = encoder.double().to(memory_format=torch.contiguous_format)
    reference = encoder(volume.double())
    cl = encoder.to(memory_format=torch.channels_last_3d)(
        volume.double().contiguous(memory_format=torch.channels_last_3d)
    )
    torch.testing.assert_close(cl, reference, rtol=0, atol=1e-10)


def test_a_detector_with_the_3d_middle_encoder_learns(synth_index, synth_root):
    config = DatasetConfig(load_images=False, load_points=True, num_sweeps=1, use_dim=(0, 1, 2, 4))
    dataset = FrameDataset(synth_index, config, synth_root)
    batch = collate([dataset[i] for i in (1, 4)])
    torch.manual_seed(0)
    model = PointPillars(**TINY_3D)
    assert model.middle is not None and model.backbone.blocks[0][0].in_channels == 64
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for _ in range(20):
        total = weighted_total(model.loss(model(batch), batch), model.loss_weights)
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(total.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_a_pillar_grid_is_refused_by_name():
    with pytest.raises(ValueError, match="voxel_size z"):
        PointPillars(**{**TINY_3D, "voxel_size": (0.5, 0.5, 8.0)})
