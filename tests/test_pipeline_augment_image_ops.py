"""Camera image augmentation: the image matrix is StreamPETR's ``_img_transform`` (ported step by step here),
test-time parameters are the published ones, one warp moves a pixel where the updated camera matrix projects
its 3D point (≤ 1 px, with flips and rotations), the identity warp is exact, and parameters replay."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from drivetrain.models.pointpillars.recipe import LIDAR_AUG
from drivetrain.models.streampetr.recipe import IMAGE_AUG
from drivetrain.pipeline.augment.image_ops import (
    ImageAugParams,
    ida_matrix,
    sample_image_params,
    update_cameras,
    warp_images,
)


def original_ida(resize: float, crop: tuple[int, int, int, int], flip: bool, rotate: float) -> np.ndarray:
    """A port of ``ResizeCropFlipRotImage._img_transform``'s matrix (StreamPETR transform_3d.py)."""
    ida_rot = np.eye(2) * resize
    ida_tran = -np.array(crop[:2], dtype=np.float64)
    if flip:
        a = np.array([[-1.0, 0.0], [0.0, 1.0]])
        b = np.array([crop[2] - crop[0], 0.0])
        ida_rot, ida_tran = a @ ida_rot, a @ ida_tran + b
    h = rotate / 180 * np.pi
    a = np.array([[np.cos(h), np.sin(h)], [-np.sin(h), np.cos(h)]])
    b = np.array([crop[2] - crop[0], crop[3] - crop[1]]) / 2
    b = a @ -b + b
    ida_rot, ida_tran = a @ ida_rot, a @ ida_tran + b
    out = np.eye(3)
    out[:2, :2], out[:2, 2] = ida_rot, ida_tran
    return out


def test_ida_matrix_is_the_originals():
    cfg = dataclasses.replace(IMAGE_AUG, rot_lim=(-5.4, 5.4))
    params = sample_image_params(16, cfg, torch.Generator().manual_seed(0))
    assert params.flip.any() and (~params.flip).any()
    ida = ida_matrix(params, cfg.final_size)
    for b in range(16):
        cw, ch = params.crop[b].tolist()
        crop = (cw, ch, cw + 704, ch + 256)
        expected = original_ida(float(params.scale[b]), crop, bool(params.flip[b]), float(params.rotate[b]))
        np.testing.assert_allclose(ida[b].numpy(), expected, rtol=0, atol=1e-12)


def test_training_draws_and_test_time_parameters_follow_the_recipe():
    cfg = IMAGE_AUG
    params = sample_image_params(64, cfg, torch.Generator().manual_seed(1))
    assert params.scale.min() >= 0.38 and params.scale.max() <= 0.55
    new_w = (1600 * params.scale).long()
    new_h = (900 * params.scale).long()
    assert torch.equal(params.crop[:, 1], new_h - 256)  # bot_pct 0: the crop takes the bottom rows
    assert (params.crop[:, 0] >= 0).all() and (params.crop[:, 0] <= (new_w - 704).clamp(min=0)).all()
    assert (new_w < 704).any()  # narrower than the crop at small scales: the original pads with black
    test = sample_image_params(2, cfg, training=False)
    assert test.scale.tolist() == [0.44, 0.44] and test.crop.tolist() == [[0, 140], [0, 140]]
    assert not test.flip.any() and not test.rotate.any()


def test_warped_pixel_lands_where_the_updated_matrix_projects_its_point():
    cfg = dataclasses.replace(
        IMAGE_AUG, source_size=(320, 180), final_size=(160, 96), resize_lim=(0.6, 0.8), rot_lim=(-20, 20)
    )
    params = sample_image_params(6, cfg, torch.Generator().manual_seed(2))
    params = ImageAugParams(params.scale, params.crop, torch.tensor([True, False] * 3), params.rotate)
    k = torch.tensor([[200.0, 0, 160], [0, 200.0, 90], [0, 0, 1]], dtype=torch.float64)
    lidar2cam = torch.eye(4, dtype=torch.float64)
    k4 = torch.eye(4, dtype=torch.float64)
    k4[:3, :3] = k
    intrinsics = k.expand(6, 1, 3, 3).clone()
    lidar2img = (k4 @ lidar2cam).expand(6, 1, 4, 4).clone()
    ida = ida_matrix(params, cfg.final_size)
    new_k, new_l2i = update_cameras(intrinsics, lidar2img, ida)
    g = torch.Generator().manual_seed(3)
    for b in range(6):
        # A 3D point seen near the middle of where the crop keeps: its pixel before and after.
        target = torch.linalg.inv(ida[b]) @ torch.tensor(
            [80.0 + 20 * (b - 3), 48.0 + 5 * (b - 3), 1.0], dtype=torch.float64
        )
        depth = 5.0 + float(torch.rand(1, generator=g)) * 20
        point = torch.linalg.inv(k) @ (target * depth)  # camera = lidar frame here
        uv = lidar2img[b, 0] @ torch.cat([point, torch.ones(1, dtype=torch.float64)])
        uv = uv[:2] / uv[2]
        image = torch.zeros(1, 1, 3, 180, 320, dtype=torch.uint8)
        col, row = int(uv[0]), int(uv[1])  # the pixel that contains the projected point
        image[..., row - 1 : row + 2, col - 1 : col + 2] = 255
        warped = warp_images(image, ida[b : b + 1], cfg.final_size)[0, 0, 0]  # (fH, fW)
        proj = new_l2i[b, 0] @ torch.cat([point, torch.ones(1, dtype=torch.float64)])
        expected = proj[:2] / proj[2]
        weights = warped.double()
        ys, xs = torch.meshgrid(torch.arange(96.0), torch.arange(160.0), indexing="ij")
        centroid = torch.stack([(xs * weights).sum(), (ys * weights).sum()]) / weights.sum()
        # The bright square's centre (pixel col, row ↔ continuous col+½, row+½) lands within 1 px.
        assert (
            torch.dist(
                centroid + 0.5,
                ida[b, :2, :2] @ torch.tensor([col + 0.5, row + 0.5], dtype=torch.float64) + ida[b, :2, 2],
            )
            < 1.0
        )
        assert torch.dist(expected, ida[b, :2, :2] @ uv + ida[b, :2, 2]) < 1e-9
        assert torch.dist(centroid + 0.5, expected) < 1.0  # the point's new projection is on the moved pixel
        torch.testing.assert_close(new_k[b, 0], ida[b] @ k, rtol=0, atol=1e-12)


def test_identity_warp_is_exact_and_params_replay():
    images = torch.randint(0, 256, (2, 3, 3, 20, 30), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    identity = ImageAugParams(torch.ones(2, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.int64),
                              torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.float64))  # fmt: skip
    out = warp_images(images, ida_matrix(identity, (30, 20)), (30, 20))
    # grid_sample's float32 grid puts each sample within a few W·eps32 of the pixel centre: the neighbour's
    # weight, and so the value error, is at most 255 · 4 · W · eps32 (W = 30).
    tolerance = 255 * 4 * 30 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(out, images.float(), rtol=0, atol=tolerance)
    cfg = dataclasses.replace(IMAGE_AUG, source_size=(30, 20), final_size=(16, 8), resize_lim=(0.6, 0.9))
    params = sample_image_params(2, cfg, torch.Generator().manual_seed(5))
    ida = ida_matrix(params, cfg.final_size)
    assert torch.equal(warp_images(images, ida, cfg.final_size), warp_images(images, ida, cfg.final_size))
    flipped = ImageAugParams(identity.scale, identity.crop, torch.ones(2, dtype=torch.bool), identity.rotate)
    mirrored = warp_images(images, ida_matrix(flipped, (30, 20)), (30, 20))
    torch.testing.assert_close(mirrored, images.float().flip(-1), rtol=0, atol=tolerance)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="resize_lim"):
        dataclasses.replace(IMAGE_AUG, resize_lim=(0.0, 0.5))
    with pytest.raises(ValueError, match="final_size"):
        dataclasses.replace(IMAGE_AUG, final_size=(0, 256))
    assert math.isclose(IMAGE_AUG.resize_lim[0], 0.38)


def test_2d_annotations_follow_the_originals_bboxes_transform():
    """All samples and cameras at once vs ``_bboxes_transform`` per image (float64: the same formulas in
    another association, so ≤ a few ulp of 1600 px), with boxes cut by the crop and dropped below 2 px."""
    from drivetrain.pipeline.augment.image_ops import reference_transform_boxes_2d, transform_boxes_2d
    from drivetrain.ragged import RaggedBatch

    cfg = IMAGE_AUG
    g = torch.Generator().manual_seed(6)
    params = sample_image_params(4, cfg, g)
    params = ImageAugParams(params.scale, params.crop, torch.tensor([True, False, True, False]), params.rotate)
    boxes, centers, labels, depths = [], [], [], []
    for _ in range(4):
        per_cam = [], [], [], []
        for _ in range(6):
            n = int(torch.randint(0, 25, (1,), generator=g))
            xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * torch.tensor([1600.0, 900.0])
            wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 200 + 0.5
            per_cam[0].append(torch.cat([xy, xy + wh], 1))
            per_cam[1].append(xy + wh / 2)
            per_cam[2].append(torch.randint(0, 10, (n,), generator=g))
            per_cam[3].append(torch.rand(n, generator=g, dtype=torch.float64) * 50)
        for store, values in zip((boxes, centers, labels, depths), per_cam, strict=True):
            store.append(values)
    rb = [RaggedBatch.from_list(x) for x in (boxes, centers, labels, depths)]  # (B, N, G, ·)
    ida = ida_matrix(params, cfg.final_size)
    new_boxes, new_centers, others = transform_boxes_2d(rb[0], rb[1], {"labels": rb[2], "depths": rb[3]}, ida,
                                                        cfg.final_size)  # fmt: skip
    dropped = 0
    for b in range(4):
        cw, ch = params.crop[b].tolist()
        for n in range(6):
            extra = {"labels": labels[b][n].numpy(), "depths": depths[b][n].numpy()}
            ref = reference_transform_boxes_2d(
                boxes[b][n].numpy(), centers[b][n].numpy(), extra, float(params.scale[b]), (cw, ch),
                bool(params.flip[b]), cfg.final_size,
            )  # fmt: skip
            k = int(new_boxes.sizes[b, n])
            assert k == len(ref[0])
            dropped += len(boxes[b][n]) - k
            np.testing.assert_allclose(new_boxes.tensor[b, n, :k].numpy(), ref[0], rtol=0, atol=1e-9)
            np.testing.assert_allclose(new_centers.tensor[b, n, :k].numpy(), ref[1], rtol=0, atol=1e-9)
            assert np.array_equal(others["labels"].tensor[b, n, :k].numpy(), ref[2]["labels"])
            np.testing.assert_array_equal(others["depths"].tensor[b, n, :k].numpy(), ref[2]["depths"])
    assert dropped > 20  # the crop cut many boxes away


def test_bev_augmentation_of_a_camera_batch_keeps_every_projection_and_world_position():
    """After a BEV rotation/scale/flip of the boxes, the updated lidar2img projects each augmented box centre to
    the pixel the original centre projected to, and the updated ego pose puts it at the same global position."""
    from drivetrain.pipeline.augment.bev import apply_bev_aug, sample_bev_params
    from drivetrain.pipeline.augment.image_ops import bev_aug_cameras
    from drivetrain.ragged import RaggedBatch

    g = torch.Generator().manual_seed(7)
    boxes = RaggedBatch.from_list([torch.cat([torch.rand(5, 3, generator=g) * 20 + torch.tensor([5.0, -10, -1]),
                                              torch.rand(5, 3, generator=g) + 1, torch.rand(5, 3, generator=g)], 1)
                                   for _ in range(3)])  # fmt: skip
    labels = RaggedBatch.from_list([torch.zeros(5, dtype=torch.int64)] * 3)
    points = RaggedBatch.from_list([torch.zeros(0, 4)] * 3)
    cfg = dataclasses.replace(LIDAR_AUG, flip_vertical=0.5, point_range=None, object_range=None, shuffle=False)
    params = sample_bev_params(points, cfg, torch.Generator().manual_seed(8))
    _, moved, _ = apply_bev_aug(points, boxes, labels, params, cfg)
    lidar2img = torch.eye(4).repeat(3, 2, 1, 1)
    lidar2img[..., :3, :3] = torch.tensor([[0.0, -300, 320], [0, 0, 180], [1, 0, 0]]) @ torch.eye(3)  # x forward
    lidar2img[:, 1, :3, 3] = torch.tensor([10.0, -5.0, 0.2])
    pose = torch.eye(4).repeat(3, 1, 1)
    pose[:, :3, 3] = torch.tensor([100.0, 50.0, 2.0])
    new_l2i, new_pose, new_pose_inv = bev_aug_cameras(lidar2img, pose, torch.linalg.inv(pose), params.matrix)
    # float32 boxes within 35 m carry δ ≈ 35·eps32·4 ≈ 2e-5 m of rounding; a pixel u = 300·y/x moves by at most
    # 300·δ/x + 300·|y|·δ/x² ≤ 3.6e-3 px for depths x ≥ 5 m and |y| ≤ 10 m: bound 5e-3 px; positions 1e-3 m.
    for b in range(3):
        old = torch.cat([boxes.tensor[b, :, :3], torch.ones(5, 1)], 1).double()  # (5, 4)
        new = torch.cat([moved.tensor[b, :, :3], torch.ones(5, 1)], 1).double()
        for n in range(2):
            before, after = old @ lidar2img[b, n].double().T, new @ new_l2i[b, n].double().T
            torch.testing.assert_close(after[:, :2] / after[:, 2:3], before[:, :2] / before[:, 2:3], rtol=0, atol=5e-3)
        torch.testing.assert_close(new @ new_pose[b].double().T, old @ pose[b].double().T, rtol=0, atol=1e-3)
        torch.testing.assert_close(new_pose_inv[b] @ new_pose[b], torch.eye(4), rtol=0, atol=1e-5)
    assert params.flip_v.any() and (params.angle != 0).all()
