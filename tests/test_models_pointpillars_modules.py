"""PointPillars modules against ports of the mmdetection3d originals: HardVFE, SECOND/SECONDFPN, the head."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.models.pointpillars.backbone import SECOND, SECONDFPN
from drivetrain.models.pointpillars.head import Anchor3DHead, ShapeAwareHead
from drivetrain.models.pointpillars.voxel_encoder import HardVFE
from drivetrain.pipeline.voxelize import VoxelGrid, hard_voxelize
from drivetrain.ragged import RaggedBatch

GRID = VoxelGrid((-16.0, -16.0, -5.0, 16.0, 16.0, 3.0), (0.5, 0.5, 8.0), max_points=8, max_voxels=300)


def original_hard_vfe(vfe: HardVFE, features, num_points, coors, voxel_size, pc_range):
    """A port of HardVFE.forward (mmdet3d/models/voxel_encoders/voxel_encoder.py) with its VFELayers
    (utils.py), using the weights of ``vfe``."""
    vx, vy, vz = voxel_size
    x_off, y_off, z_off = vx / 2 + pc_range[0], vy / 2 + pc_range[1], vz / 2 + pc_range[2]
    ls = [features]
    points_mean = features[:, :, :3].sum(dim=1, keepdim=True) / num_points.type_as(features).view(-1, 1, 1)
    ls.append(features[:, :, :3] - points_mean)
    f_center = features.new_zeros(size=(features.size(0), features.size(1), 3))
    f_center[:, :, 0] = features[:, :, 0] - (coors[:, 3].type_as(features).unsqueeze(1) * vx + x_off)
    f_center[:, :, 1] = features[:, :, 1] - (coors[:, 2].type_as(features).unsqueeze(1) * vy + y_off)
    f_center[:, :, 2] = features[:, :, 2] - (coors[:, 1].type_as(features).unsqueeze(1) * vz + z_off)
    ls.append(f_center)
    voxel_feats = torch.cat(ls, dim=-1)
    count = voxel_feats.shape[1]
    mask = torch.arange(count, dtype=torch.int).view(1, -1) < num_points.unsqueeze(1).int()  # get_paddings_indicator
    voxel_feats = voxel_feats * mask.unsqueeze(-1).type_as(voxel_feats)
    for i, layer in enumerate(vfe.layers):
        x = layer.linear(voxel_feats)
        x = layer.norm(x.permute(0, 2, 1).contiguous()).permute(0, 2, 1).contiguous()
        pointwise = torch.relu(x)
        aggregated = torch.max(pointwise, dim=1, keepdim=True)[0]
        if i == len(vfe.layers) - 1:
            voxel_feats = aggregated.squeeze(1)
        else:
            voxel_feats = torch.cat([pointwise, aggregated.repeat(1, count, 1)], dim=2)
    return voxel_feats


@pytest.fixture
def voxels(gen):
    clouds = [
        torch.rand(600, 4, generator=gen) * torch.tensor([34.0, 34.0, 9.0, 1.0]) - torch.tensor([17.0, 17.0, 5.5, 0.0])
        for _ in range(2)
    ]
    return hard_voxelize(RaggedBatch.from_list(clouds), GRID)


@pytest.mark.parametrize("train", [True, False])
def test_hard_vfe_equals_a_port_of_the_original(voxels, train):
    torch.manual_seed(0)
    vfe = HardVFE(4, (64, 64), GRID).train(train)
    port = HardVFE(4, (64, 64), GRID).train(train)
    port.load_state_dict(vfe.state_dict())
    ours = vfe(voxels.voxels, voxels.num_points, voxels.coors)
    theirs = original_hard_vfe(
        port, voxels.voxels, voxels.num_points, voxels.coors, GRID.voxel_size, GRID.point_cloud_range
    )
    assert ours.shape == (voxels.voxels.shape[0], 64) and vfe.in_channels == 10
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    if train:  # the running statistics moved the same way
        torch.testing.assert_close(vfe.layers[0].norm.running_mean, port.layers[0].norm.running_mean, rtol=0, atol=0)


def test_decoration_by_hand():
    vfe = HardVFE(4, (8,), GRID)
    voxels = torch.zeros(1, 3, 4)
    voxels[0, 0] = torch.tensor([0.1, 0.2, -1.0, 0.5])
    voxels[0, 1] = torch.tensor([0.3, 0.4, 0.0, 0.5])
    coors = torch.tensor([[0, 0, 32, 32]])  # cell (x 32, y 32, z 0): centre (0.25, 0.25, -1.0)
    feats = vfe.decorate(voxels, torch.tensor([2]), coors)
    expected = torch.tensor(
        [
            [0.1, 0.2, -1.0, 0.5, -0.1, -0.1, -0.5, -0.15, -0.05, 0.0],
            [0.3, 0.4, 0.0, 0.5, 0.1, 0.1, 0.5, 0.05, 0.15, 1.0],
            [0.0] * 10,  # padding stays zero
        ]
    )
    torch.testing.assert_close(feats[0], expected, rtol=0, atol=1e-6)


def test_second_and_fpn_shapes_and_init():
    torch.manual_seed(0)
    backbone = SECOND(64, (64, 128, 256), (3, 5, 5), (2, 2, 2))
    neck = SECONDFPN((64, 128, 256), (128, 128, 128), (1, 2, 4))
    feats = backbone(torch.randn(1, 64, 64, 64))
    assert [tuple(f.shape) for f in feats] == [(1, 64, 32, 32), (1, 128, 16, 16), (1, 256, 8, 8)]
    assert neck(feats).shape == (1, 384, 32, 32) and neck.out_channels == 384
    conv = backbone.blocks[1][0]
    fan_out = conv.out_channels * 9  # Kaiming normal, fan_out, ReLU gain √2
    assert abs(conv.weight.std().item() - math.sqrt(2 / fan_out)) < 0.1 * math.sqrt(2 / fan_out)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in backbone.modules()) == 3 + 3 + 5 + 5
    with pytest.raises(ValueError, match="one entry per stage"):
        SECOND(64, (64, 128), (3,), (2, 2))


def test_head_layout_and_init():
    torch.manual_seed(0)
    head = Anchor3DHead(16, num_anchors=6, num_classes=3, code_size=9)
    assert torch.allclose(head.conv_cls.bias, torch.full((18,), -math.log(99.0)))
    assert head.conv_reg.bias.abs().max() == 0 and abs(head.conv_reg.weight.std().item() - 0.01) < 0.002
    x = torch.randn(2, 16, 4, 5)
    out = head(x)
    assert out["cls_logits"].shape == (2, 4 * 5 * 6, 3) and out["box_preds"].shape == (2, 120, 9)
    assert out["dir_logits"].shape == (2, 120, 2)
    raw = head.conv_cls(x)  # (B, A·C, H, W)
    b, y, xx, a, c = 1, 2, 3, 4, 2
    assert out["cls_logits"][b, (y * 5 + xx) * 6 + a, c] == raw[b, a * 3 + c, y, xx]
    assert "dir_logits" not in Anchor3DHead(16, 6, 3, 7, use_direction_classifier=False)(x)


SSN_TASKS = (
    (2, (64, 64), (1, 1)),
    (1, (64, 64), (1, 1)),
    (2, (64, 64), (1, 1)),
    (1, (64, 64, 64), (2, 1, 1)),
    (4, (64, 64, 64), (2, 1, 1)),
)


def test_shape_aware_head_anchor_counts_layout_and_init():
    torch.manual_seed(0)
    head = ShapeAwareHead(32, SSN_TASKS, num_classes=10)
    x = torch.randn(1, 32, 8, 8)
    out = head(x)
    # 200²·2·5 + 100²·2·5 at nuScenes size; here 8² · 2 · (2+1+2) + 4² · 2 · (1+4)
    assert out["cls_logits"].shape == (1, 64 * 10 + 16 * 10, 10) and out["box_preds"].shape[-1] == 9
    branch = head.heads[3]  # car: stride 2, A = 2
    raw = branch.conv_cls(branch.shared_conv(x))  # (B, A·C, 4, 4)
    a, y, xx, c = 1, 2, 3, 5
    offset = 64 * 10  # the first three tasks' anchors come first
    assert out["cls_logits"][0, offset + (a * 4 + y) * 4 + xx, c] == raw[0, a * 10 + c, y, xx]  # anchor-major
    assert torch.allclose(branch.conv_dir_cls.bias, torch.full((4,), -math.log(99.0)))
    assert branch.shared_conv[1].eps == 1e-5 and branch.shared_conv[1].momentum == 0.1  # BN2d defaults, as mmdet3d
    with pytest.raises(ValueError, match="add up"):
        ShapeAwareHead(32, SSN_TASKS, num_classes=9)


def test_hard_vfe_gradients_equal_the_original_within_the_summation_order_bound(voxels):
    """Our BatchNorm backward gets a contiguous gradient; the original's a transposed one. The two differ only in
    the order of BatchNorm's per-channel sums Σg and Σg·x̂ over N = V·T slots. dx = w·σ⁻¹/N · (N·g − Σg − x̂·Σg·x̂),
    and recursive summation in any order is within γ_N·Σ|·| of the exact sum (γ_N = N·ε/(1 − N·ε)), so two orders
    differ by at most 2·γ_N·Σ|·|, per channel; the first layer's gradient is checked against that bound (the
    later layers' gradients feed it, so it carries their differences too — checked on the last layer alone)."""
    torch.manual_seed(0)
    vfe = HardVFE(4, (16,), GRID).train()
    port = HardVFE(4, (16,), GRID).train()
    port.load_state_dict(vfe.state_dict())
    feats = vfe.decorate(voxels.voxels, voxels.num_points, voxels.coors).detach()  # (V, T, 10)
    grad_out = torch.randn(feats.shape[0], 16, generator=torch.Generator().manual_seed(1))
    ours_in, theirs_in = feats.clone().requires_grad_(), feats.clone().requires_grad_()
    vfe.layers[0](ours_in).backward(grad_out)
    layer = port.layers[0]
    x = layer.norm(layer.linear(theirs_in).permute(0, 2, 1).contiguous()).permute(0, 2, 1).contiguous()
    torch.relu(x).max(dim=1).values.backward(grad_out)
    assert not torch.equal(ours_in.grad, torch.zeros_like(ours_in.grad))
    # the bound, through the linear layer: |Δdx_in| ≤ |Δdy| @ |Wᵀ|
    with torch.no_grad():
        y = layer.linear(feats).permute(0, 2, 1)  # (V, C, T)
        n = y.shape[0] * y.shape[2]
        var, mean = torch.var_mean(y, dim=(0, 2), correction=0)
        inv = torch.rsqrt(var + layer.norm.eps)  # (C,)
        xhat = (y - mean[None, :, None]) * inv[None, :, None]
        out = torch.relu(xhat * layer.norm.weight[None, :, None] + layer.norm.bias[None, :, None])
        # the gradient reaching BatchNorm: grad_out at each channel's argmax slot, through the ReLU
        g = torch.zeros_like(out).scatter_(2, out.argmax(dim=2, keepdim=True), grad_out.unsqueeze(2))
        g = g * (out > 0)
        eps = torch.finfo(torch.float32).eps
        gamma = n * eps / (1 - n * eps)
        delta_sums = 2 * gamma * (g.abs().sum(dim=(0, 2)) + xhat.abs().amax(dim=(0, 2)) * (g * xhat).abs().sum((0, 2)))
        delta_dy = layer.norm.weight.abs() * inv / n * delta_sums  # (C,), per slot
        bound = (delta_dy[None, None, :] @ layer.linear.weight.abs()).expand_as(feats)  # (V, T, 10)
    diff = (ours_in.grad - theirs_in.grad).abs()
    assert bool((diff <= bound + 1e-30).all()), float((diff - bound).max())


# ------------------------------------------------------------------------------------- HardVFE compact path
def _voxels_with_ties(gen: torch.Generator, dtype: torch.dtype):
    """Voxels with few and full slots, duplicated points (ties in the max over slots) and single points."""
    clouds = []
    for _ in range(2):
        cloud = torch.rand(700, 4, generator=gen) * torch.tensor([34.0, 34.0, 9.0, 1.0]) - torch.tensor(
            [17.0, 17.0, 5.5, 0.0]
        )
        dense_spot = torch.rand(20, 4, generator=gen) * torch.tensor([0.4, 0.4, 1.0, 1.0]) + torch.tensor(
            [1.05, 1.05, -1.0, 0.0]
        )  # one voxel with more points than slots: a full voxel (no padding)
        cloud = torch.cat([dense_spot, cloud, cloud[:40]])  # repeated points: equal slots within voxels
        clouds.append(cloud)
    vox = hard_voxelize(RaggedBatch.from_list(clouds), GRID)
    assert int((vox.num_points == GRID.max_points).sum()) >= 1 and int((vox.num_points == 1).sum()) >= 1
    return vox.voxels.to(dtype), vox.num_points, vox.coors, vox.num_stored


def _both_vfe(train: bool, dtype: torch.dtype, gen: torch.Generator):
    voxels, num_points, coors, stored = _voxels_with_ties(gen, dtype)
    torch.manual_seed(0)
    dense = HardVFE(4, (64, 64), GRID).to(dtype).train(train)
    compact = HardVFE(4, (64, 64), GRID).to(dtype).train(train)
    compact.load_state_dict(dense.state_dict())
    outs, grads = [], []
    for module, num_stored in ((dense, None), (compact, stored)):
        x = voxels.clone().requires_grad_()
        out = module(x, num_points, coors, num_stored=num_stored)
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=dtype)
        (out * weight).sum().backward()
        outs.append(out.detach())
        grads.append([x.grad] + [p.grad for p in module.parameters()])
    return dense, compact, outs, grads


@pytest.mark.parametrize("train", [True, False])
def test_compact_hard_vfe_equals_the_original_layout_in_float64(train, gen):
    """In float64 the two layouts differ only by the order of BatchNorm's sums over N = V·T ≤ 5k slots: each within
    N·ε₆₄·Σ|·| ≈ 1e-12 relative; outputs, every gradient (the input's per slot: the max's first-slot choice
    among tied points included) and the running statistics agree to 1e-10 of their scale."""
    dense, compact, outs, grads = _both_vfe(train, torch.float64, gen)
    scale = outs[0].abs().max()
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-10 * float(scale))
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10 * float(want.abs().max()))
    for a, b in zip(dense.layers, compact.layers, strict=True):
        torch.testing.assert_close(b.norm.running_mean, a.norm.running_mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(b.norm.running_var, a.norm.running_var, rtol=1e-10, atol=1e-12)
        assert int(b.norm.num_batches_tracked) == int(a.norm.num_batches_tracked) == int(train)


def test_compact_hard_vfe_is_as_accurate_as_the_original_layout_in_float32(gen):
    """In float32 both layouts round; against the float64 computation of the original layout the compact path's
    error is at most twice the original layout's own (both sum BatchNorm's statistics with ATen's cascade sums,
    whose error grows with log N), plus 8 ulps of the scale for the elementwise operations."""
    reference = _both_vfe(True, torch.float64, gen)
    single = _both_vfe(True, torch.float32, torch.Generator().manual_seed(1234))
    exact = [reference[2][0]] + reference[3][0]
    dense32 = [single[2][0]] + single[3][0]
    compact32 = [single[2][1]] + single[3][1]
    ulp = torch.finfo(torch.float32).eps
    for name, want, theirs, ours in zip(
        ["out", "input", "w1", "g1", "b1", "w2", "g2", "b2"], exact, dense32, compact32, strict=True
    ):
        own = (theirs.double() - want).abs().max()
        err = (ours.double() - want).abs().max()
        assert err <= 2 * own + 8 * ulp * want.abs().max(), (name, float(err), float(own))


def test_compact_hard_vfe_in_the_model_and_the_voxel_count_read(gen):
    """The batched path runs the compact layout with the stored-point count the voxelization read with the voxel
    count (one host read); the reference path runs the original layout."""
    from helpers.nosync import count_host_syncs

    clouds = [torch.rand(500, 4, generator=gen) * 30 - 15 for _ in range(3)]
    batch = RaggedBatch.from_list(clouds)
    with count_host_syncs() as calls:
        vox = hard_voxelize(batch, GRID)
    assert calls == ["tolist"] and vox.num_stored == int(vox.num_points.sum())
