"""The camera augmentation on CUDA against the CPU path on the same batch and the same parameters: the resize on
CUDA's float kernels within the derived bound of the CPU's integer kernels (flips, crops past the image, up- and
downscaling, test-time parameters, a rotation), the camera matrices and 2D annotations alike, the photometric
distortion within a few float32 ulps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drivetrain.pipeline.augment.camera import apply, sample_params
from drivetrain.pipeline.augment.image_ops import ImageAugParams, ida_matrix, resize_crop_flip, warp_images
from drivetrain.pipeline.augment.photometric import (
    IMAGENET_STD,
    PhotometricConfig,
    normalize,
    photometric_distort,
    sample_photometric_params,
)
from test_pipeline_augment_bev import rotation_atol
from test_pipeline_augment_camera import CFG, EPS32, FLOAT_PATH_LEVELS, _assert_ragged_equal, _batch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICE = "cuda"
# A warp (the rotation) after the resize: its bilinear weights are ≥ 0 and sum to ≤ 1, so the resize's
# FLOAT_PATH_LEVELS carry over; the two devices' source coordinates (< 256 px, float32 ulp ≤ 2^-16) differ by a few
# roundings (float64 → float32, grid_sample's unnormalisation, maybe fused on CUDA): ≤ 4 ulps = 6e-5 px moves a
# value by ≤ 255 · 6e-5 per axis, 0.03 level for both — 0.05 covers it and the four products' rounding.
ROTATION_LEVELS = FLOAT_PATH_LEVELS + 0.05
# Normalised values (|v| < 4): the level bound over the smallest std, plus each value's float32 rounding (2^-22).
NORMALISED_SLACK = 1e-6
# 2D boxes and centres: a 2×2 product plus a shift of coordinates below 256 px, three roundings on each device (FMA
# or not): ≤ 3 ulps of 256 (2^-15 each) apart; clipping to the image only shrinks that. 4 ulps: 2^-13.
BOX_ATOL = 2.0**-13


def _forced_flips(batch, config):
    params = sample_params(batch, config, torch.Generator().manual_seed(3))
    flips = torch.ones_like(params.image.flip)
    return config, dataclasses.replace(params, image=dataclasses.replace(params.image, flip=flips))


def _test_time(batch, config):
    return config, sample_params(batch, config, training=False)


def _wide(batch, config):
    """Down- and upscaling with a bottom cut: crops that start above the image (zero rows) and run past it (the
    draw of seed 2 has all three; the test checks it)."""
    image = dataclasses.replace(config.image, resize_lim=(0.5, 1.3), bot_pct_lim=(0.0, 0.3))
    config = dataclasses.replace(config, image=image)
    return config, sample_params(batch, config, torch.Generator().manual_seed(2))


def _rotated(batch, config):
    config = dataclasses.replace(config, image=dataclasses.replace(config.image, rot_lim=(-5.4, 5.4)))
    return config, sample_params(batch, config, torch.Generator().manual_seed(3))


VARIANTS = {"flips": _forced_flips, "test_time": _test_time, "wide_crops": _wide, "rotation": _rotated}


def _assert_geometry_equal(gpu, cpu, params) -> None:
    """Matrices within 1e-5 of each one's largest entry (float64 products rounded to float32 on both devices); 2D
    labels and indices exactly (the same boxes survive the crop and the invisible filter); 2D boxes and centres
    within BOX_ATOL; 3D boxes within the BEV step's float32 rotation bound."""
    for name in ("intrinsics", "lidar2img", "ego_pose", "ego_pose_inv", "lidar2ego"):
        a, b = getattr(gpu, name).cpu(), getattr(cpu, name)
        assert ((a - b).abs() <= 1e-5 * b.abs().amax(dim=(-2, -1), keepdim=True)).all(), name
    for name in ("gt_labels_2d", "gt_index_2d", "gt_labels"):
        _assert_ragged_equal(getattr(gpu, name).to("cpu"), getattr(cpu, name))
    for name in ("gt_boxes_2d", "centers_2d"):
        _assert_ragged_equal(getattr(gpu, name).to("cpu"), getattr(cpu, name), atol=BOX_ATOL)
    _assert_ragged_equal(gpu.depths_2d.to("cpu"), cpu.depths_2d)  # carried, not computed
    centres = torch.cat(cpu.gt_boxes.to_list())[:, :3]
    atol = rotation_atol(centres, torch.zeros(3)) if params.bev is not None else 0.0
    _assert_ragged_equal(gpu.gt_boxes.to("cpu"), cpu.gt_boxes, atol=atol)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_device_augmentation_on_cuda_equals_the_cpu_path(synth_index, synth_root, variant):
    batch = _batch(synth_root)
    config, params = VARIANTS[variant](batch, CFG)
    cpu = apply(batch, params, config)
    gpu = apply(batch.to(DEVICE), params, config)
    assert gpu.images.device.type == DEVICE and gpu.images.shape == cpu.images.shape
    levels = ROTATION_LEVELS if variant == "rotation" else FLOAT_PATH_LEVELS
    atol = levels / min(IMAGENET_STD) + NORMALISED_SLACK
    torch.testing.assert_close(gpu.images.cpu(), cpu.images, rtol=0, atol=atol)
    _assert_geometry_equal(gpu, cpu, params)
    if variant == "flips":
        assert params.image.flip.all()
    elif variant == "test_time":
        assert params.bev is None and not params.image.flip.any()
    elif variant == "wide_crops":  # a crop above the image and a resized image narrower than the output
        assert (params.image.crop[:, 1] < 0).any()
        assert (params.image.scale * 160 < 128).any() and (params.image.scale > 1).any()
    else:
        assert (params.image.rotate.abs() > 1).all()


@pytest.mark.parametrize("scale", [0.38, 0.55, 0.76, 1.1])
def test_resize_on_cuda_rounds_each_pass_within_the_bound_of_the_integer_kernels(synth_index, synth_root, scale):
    """CUDA's float kernels against the CPU's uint8 ones on black-and-white images (the sharpest edges overshoot
    most) and the test set's: FLOAT_PATH_LEVELS, integers in [0, 255] — at the published recipe's smallest scale,
    the tiny recipe's ends and a crop that starts left of and above the image with a flip."""
    batch = _batch(synth_root)
    g = torch.Generator().manual_seed(11)
    edges = torch.randint(0, 2, batch.images.shape, dtype=torch.uint8, generator=g) * 255  # (3, 6, 3, 90, 160)
    images = torch.cat([batch.images, edges])  # (6, 6, 3, 90, 160)
    num = images.shape[0]
    crop = torch.tensor([[0, 0], [-7, -5]]).repeat(num // 2, 1)  # (B, 2): every other sample starts off the image
    params = ImageAugParams(
        torch.full((num,), scale, dtype=torch.float64), crop, torch.arange(num) % 3 == 0,
        torch.zeros(num, dtype=torch.float64),
    )  # fmt: skip
    final = (int(160 * scale), int(90 * scale))
    cpu = resize_crop_flip(images, params, final)
    gpu = resize_crop_flip(images.to(DEVICE), params, final)
    assert gpu.dtype == torch.float32 and gpu.device.type == DEVICE
    gpu = gpu.cpu()
    assert torch.equal(gpu, gpu.round()) and gpu.min() >= 0 and gpu.max() <= 255
    torch.testing.assert_close(gpu, cpu, rtol=0, atol=FLOAT_PATH_LEVELS)
    assert (cpu[1::2, :, :, :5, :] == 0).all() and (cpu[1::2, :, :, 5:, 7:].amax() > 0)  # the crop's zero rows


def test_rotation_warp_on_cuda_equals_the_cpu_one(gen):
    """``warp_images`` on identical float images: the bilinear warp's own difference (see ROTATION_LEVELS)."""
    images = torch.rand(2, 3, 3, 48, 128, generator=gen) * 255  # (B, N, 3, H, W)
    params = ImageAugParams(
        torch.tensor([1.0, 1.0], dtype=torch.float64), torch.zeros(2, 2, dtype=torch.int64),
        torch.tensor([False, True]), torch.tensor([4.0, -5.4], dtype=torch.float64),
    )  # fmt: skip
    ida = ida_matrix(params, (128, 48))  # (B, 3, 3)
    cpu = warp_images(images, ida, (128, 48))
    gpu = warp_images(images.to(DEVICE), ida.to(DEVICE), (128, 48)).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=0, atol=ROTATION_LEVELS - FLOAT_PATH_LEVELS)
    assert (cpu == 0).any() and (cpu > 0).float().mean() > 0.9  # rotated: zero corners, the rest resampled


def test_photometric_distortion_on_cuda_equals_the_cpu_one(gen):
    """Every draw of PETR's distortion on identical float images: about 10 float32 operations per value on each
    device (the HSV round trip; divisions by a scalar become multiplications by its reciprocal on CUDA), so 16 ulps
    of the largest magnitude, as against OpenCV (tests/test_pipeline_augment_camera.py)."""
    images = torch.randint(0, 256, (4, 6, 3, 24, 40), generator=gen).float()  # (B, N, 3, H, W): resized levels
    params = sample_photometric_params(4, 6, PhotometricConfig(), gen)
    cpu = photometric_distort(images, params)
    gpu = photometric_distort(images.to(DEVICE), params.to(DEVICE)).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=0, atol=16 * EPS32 * float(cpu.abs().max()))
    assert (params.hue != 0).any() and (params.saturation != 1).any() and (params.contrast_first).any()
    assert not torch.allclose(cpu, images)  # the draws changed the images


def test_augmentation_with_photometric_distortion_on_cuda_composes_its_steps(synth_index, synth_root):
    """``apply`` on CUDA with the distortion on: the CPU's distortion and normalisation of the CUDA resize give its
    images (16 ulps of the distorted range, over the smallest std), and the geometry equals the CPU path's."""
    batch = _batch(synth_root)
    config = dataclasses.replace(CFG, photometric=PhotometricConfig())
    params = sample_params(batch, config, torch.Generator().manual_seed(4))
    moved = batch.to(DEVICE)
    gpu = apply(moved, params, config)
    resized = resize_crop_flip(moved.images, params.image, config.image.final_size).cpu()
    distorted = photometric_distort(resized, params.photometric)
    expected = normalize(distorted, config.mean, config.std)
    atol = 16 * EPS32 * float(distorted.abs().max()) / min(IMAGENET_STD) + NORMALISED_SLACK
    torch.testing.assert_close(gpu.images.cpu(), expected, rtol=0, atol=atol)
    _assert_geometry_equal(gpu, apply(batch, params, config), params)
