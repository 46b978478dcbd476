"""models/streampetr/position.py: LID depth bins, camera rays through token pixels, the position embedding."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.data.synth.render import make_rig
from drivetrain.geometry.projection import lidar2img
from drivetrain.models.streampetr import PositionEmbedding3D, inverse_sigmoid, lid_depths, token_points

WIDTH, HEIGHT = 704, 256


def rig_lidar2img(dtype: torch.dtype) -> torch.Tensor:
    """``(1, 6, 4, 4)`` lidar → image of the synthetic camera ring (lidar frame = ego frame here)."""
    rig = make_rig(WIDTH, HEIGHT, 1266.0 * WIDTH / 1600)
    return torch.from_numpy(lidar2img(rig.intrinsics, rig.cam2ego)).to(dtype).unsqueeze(0), rig


def token_grid(stride: int = 16) -> torch.Tensor:
    """``(T, 2)`` token centres in pixels, ``(16 j + 8, 16 i + 8)`` row by row, as the original's locations."""
    ys, xs = torch.meshgrid(
        torch.arange(HEIGHT // stride) * stride + stride // 2,
        torch.arange(WIDTH // stride) * stride + stride // 2,
        indexing="ij",
    )
    return torch.stack([xs, ys], -1).reshape(-1, 2).double()


def test_lid_depths_follow_the_published_formula() -> None:
    depths = lid_depths(64, 1.0, 61.2)
    i = torch.arange(64, dtype=torch.float64)
    torch.testing.assert_close(depths.double(), 1.0 + 60.2 / (64 * 65) * i * (i + 1), rtol=2**-23, atol=0)
    assert depths[0] == 1.0 and depths[-1].item() == pytest.approx(1 + 60.2 * 63 / 65, rel=1e-6)  # ≈ 59.35 m
    assert (depths.diff() > 0).all()


def test_every_ray_point_projects_back_to_its_pixel_and_depth() -> None:
    l2i, _ = rig_lidar2img(torch.float64)
    grid = token_grid()
    centres = grid.expand(1, 6, *grid.shape)  # (1, 6, T, 2)
    depths = lid_depths(64, 1.0, 61.2).double()
    points = token_points(centres, l2i, depths)  # (1, 6, T, 64, 3)
    homogeneous = torch.cat([points, torch.ones_like(points[..., :1])], -1)  # (1, 6, T, 64, 4)
    image = (l2i[:, :, None, None] @ homogeneous.unsqueeze(-1)).squeeze(-1)  # (1, 6, T, 64, 4)
    depth = image[..., 2]
    torch.testing.assert_close(depth, depths.expand_as(depth), rtol=1e-12, atol=1e-12)
    uv = image[..., :2] / depth.unsqueeze(-1)
    torch.testing.assert_close(uv, centres.unsqueeze(-2).expand_as(uv), rtol=0, atol=1e-9)


def test_rays_leave_from_the_camera_in_its_viewing_direction() -> None:
    l2i, rig = rig_lidar2img(torch.float64)
    centre_pixel = torch.tensor([[WIDTH / 2, HEIGHT / 2]], dtype=torch.float64).expand(1, 6, 1, 2)
    points = token_points(centre_pixel, l2i, torch.tensor([1.0, 10.0], dtype=torch.float64))[0, :, 0]  # (6, 2, 3)
    for cam in range(6):
        position = torch.from_numpy(rig.cam2ego[cam][:3, 3])
        forward = torch.from_numpy(rig.cam2ego[cam][:3, 2])  # the camera's optical axis in the ego frame
        torch.testing.assert_close(points[cam, 0], position + forward * 1.0, rtol=0, atol=1e-9)
        torch.testing.assert_close(points[cam, 1], position + forward * 10.0, rtol=0, atol=1e-9)


def test_float32_rays_agree_with_float64() -> None:
    # The float32 path inverts lidar2img (entries up to f ≈ 557 px) and multiplies pixels scaled by depth
    # (u·d up to 704 · 59.3 ≈ 4e4): each product carries ~2^-24 relative error of 4e4, i.e. 2.5e-3 in
    # image units, divided by f ≈ 557 → ~5e-6 m per term, a few terms per coordinate: 1e-4 m bounds it.
    l2i, _ = rig_lidar2img(torch.float64)
    grid = token_grid().expand(1, 6, -1, 2)
    depths = lid_depths(64, 1.0, 61.2)
    exact = token_points(grid, l2i, depths.double())
    approx = token_points(grid.float(), l2i.float(), depths)
    assert approx.dtype == torch.float32
    torch.testing.assert_close(approx.double(), exact, rtol=0, atol=1e-4)


def test_embedding_shapes_and_the_cone() -> None:
    torch.manual_seed(0)
    module = PositionEmbedding3D(embed_dims=32, depth_num=64)
    l2i, rig = rig_lidar2img(torch.float32)
    intrinsics = torch.from_numpy(rig.intrinsics).float().unsqueeze(0)  # (1, 6, 3, 3)
    grid = token_grid().float().expand(1, 6, -1, 2)
    pos_embed, cone = module(grid, l2i, intrinsics)
    tokens = 6 * grid.shape[2]
    assert pos_embed.shape == (1, tokens, 32) and cone.shape == (1, tokens, 8)
    assert torch.isfinite(pos_embed).all()
    focal = rig.intrinsics[0, 0, 0] / 1e3
    torch.testing.assert_close(cone[0, :, :2], torch.full((tokens, 2), focal, dtype=torch.float32))
    points = token_points(grid, l2i, module.depths)  # (1, 6, T, 64, 3)
    normalised = ((points - module.range_min) / module.range_size).reshape(1, tokens, 64, 3)
    torch.testing.assert_close(cone[0, :, 2:5], normalised[0, :, -1])  # the last depth bin
    torch.testing.assert_close(cone[0, :, 5:8], normalised[0, :, 64 - 30])  # the original's [-90:-87]
    with pytest.raises(ValueError, match="depth_num"):
        PositionEmbedding3D(depth_num=16)


def test_inverse_sigmoid_inverts_and_clamps() -> None:
    x = torch.linspace(-6, 6, 25, dtype=torch.float64)
    torch.testing.assert_close(inverse_sigmoid(torch.sigmoid(x)), x, rtol=0, atol=1e-6)
    edges = inverse_sigmoid(torch.tensor([-0.5, 0.0, 1.0, 1.5]))
    bound = math.log(1e5)  # log(1 / eps): the clamped side is eps, the other 1
    assert edges[0].item() == edges[1].item() == pytest.approx(-bound, rel=1e-6)
    assert edges[2].item() == edges[3].item() == pytest.approx(bound, rel=1e-6)
    assert torch.isfinite(edges).all()


def test_token_points_invert_the_projections_without_the_singularity_check() -> None:
    """``torch.linalg.inv`` runs ``_linalg_check_errors``, which reads the info flags on the host to raise on a
    singular matrix (a sync on CUDA every forward; from C++, so only the profiler sees it on a CPU); the rays use
    ``inv_ex``, the same arithmetic without that read. (On the CPU, LAPACK's LU solve inside both reads twice more;
    whether CUDA's does is for the GPU profile to show: it names each sync's call site.)"""
    from torch.profiler import ProfilerActivity, profile

    from drivetrain.profile.trace import summarize

    gen = torch.Generator().manual_seed(0)
    l2i = torch.eye(4).repeat(2, 3, 1, 1) + 0.1 * torch.rand(2, 3, 4, 4, generator=gen)  # (B, N, 4, 4)
    centres = torch.rand(2, 3, 5, 2, generator=gen) * 100  # (B, N, T, 2)
    depths = lid_depths(1.0, 61.2, 4)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as ours:
        points = token_points(centres, l2i, depths)  # (B, N, T, D, 3)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as plain:
        torch.linalg.inv(l2i)
    assert not any(e.name == "aten::_linalg_check_errors" for e in ours.events())
    assert any(e.name == "aten::_linalg_check_errors" for e in plain.events())
    assert summarize(ours, steps=1)["syncs_per_step"] == summarize(plain, steps=1)["syncs_per_step"] - 1
    uv = centres.unsqueeze(-2) * depths.view(1, 1, 1, -1, 1)
    coords = torch.cat([uv, depths.view(1, 1, 1, -1, 1).expand_as(uv[..., :1]), torch.ones_like(uv[..., :1])], -1)
    expected = (torch.linalg.inv(l2i)[:, :, None, None] @ coords.unsqueeze(-1)).squeeze(-1)[..., :3]
    assert torch.equal(points, expected)  # inv_ex computes what inv computes


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_rays_and_the_embedding_take_no_host_sync_and_agree_with_float64() -> None:
    """Whether CUDA's inverse reads its info flags (the CPU's LU solve reads twice, see above): under CUDA's sync
    debug mode set to raise at any synchronising call, the rays (``inv_ex``) and the whole embedding run on the
    device. The rays are float32 arithmetic of the same products as on the CPU: the bound derived in
    test_float32_rays_agree_with_float64 (1e-4 m), against float64 on the CPU."""
    torch.manual_seed(0)
    module = PositionEmbedding3D(embed_dims=32, depth_num=64).to("cuda")
    l2i, rig = rig_lidar2img(torch.float64)
    grid = token_grid().expand(1, 6, -1, 2)
    exact = token_points(grid, l2i, lid_depths(64, 1.0, 61.2).double())
    centres, matrices = grid.float().cuda(), l2i.float().cuda()
    intrinsics = torch.from_numpy(rig.intrinsics).float().unsqueeze(0).cuda()  # (1, 6, 3, 3)
    torch.cuda.set_sync_debug_mode("error")
    try:
        points = token_points(centres, matrices, module.depths)  # (1, 6, T, 64, 3)
        pos_embed, cone = module(centres, matrices, intrinsics)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert points.device.type == "cuda" and points.dtype == torch.float32
    torch.testing.assert_close(points.cpu().double(), exact, rtol=0, atol=1e-4)
    assert pos_embed.shape == (1, 6 * grid.shape[2], 32) and torch.isfinite(pos_embed).all()
    normalised = ((points - module.range_min) / module.range_size).reshape(1, -1, 64, 3)
    torch.testing.assert_close(cone[0, :, 2:5], normalised[0, :, -1])  # as on the CPU (its test above)
