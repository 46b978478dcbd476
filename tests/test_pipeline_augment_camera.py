"""The camera augmentation of a whole batch: a 3D point projected with the augmented ``lidar2img`` lands where the
augmented image moved its pixel; the batched device path agrees with the per-sample reference (PIL, NumPy,
OpenCV, mmdet3d's box ops) that runs in the workers; parameters replay; the identity recipe changes nothing;
the invisible-box filter and the photometric distortion equal their originals; bad configs are named; the trainer
resumes bit-exactly with augmentation on, on either path, and evaluates on the test-time transform."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from drivetrain.data.sources import frames
from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.models.streampetr.recipe import CAMERA_AUG, IMAGE_AUG
from drivetrain.pipeline.augment.camera import (
    CameraAugConfig,
    apply,
    augment_seeds,
    reference_apply,
    sample_params,
)
from drivetrain.pipeline.augment.image_ops import (
    ImageAugParams,
    filter_invisible,
    reference_filter_invisible,
    reference_img_transform,
    resize_crop_flip,
)
from drivetrain.pipeline.augment.photometric import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    PhotometricConfig,
    normalize,
    photometric_distort,
    reference_normalize,
    reference_photometric,
    sample_photometric_params,
)
from drivetrain.pipeline.augment.stage import Augmentation, AugmentConfig
from drivetrain.ragged import RaggedBatch
from helpers.engine import assert_same_weights, final_state

ROOT = Path(__file__).resolve().parents[1]
EPS32 = float(np.finfo(np.float32).eps)
# The test set's 160×90 images, scaled as configs/streampetr_tiny_aug.yaml scales the published recipe.
CFG = dataclasses.replace(
    CAMERA_AUG,
    image=dataclasses.replace(IMAGE_AUG, source_size=(160, 90), final_size=(128, 48), resize_lim=(0.76, 1.1)),
)
STAGE = AugmentConfig(camera=CFG)  # the trainer's stage with this camera recipe
# PIL resizes in two passes and stores the first pass as rounded uint8: ≤ 0.5 level, carried through the second
# pass's kernel (absolute weight sum ≤ 1 + 2·0.0625 for the bicubic a = −0.5), ≤ 0.63 level; both results are
# rounded to integers (≤ 0.5 each): below 2 levels, as long as no intermediate value is clipped to [0, 255] —
# which cannot happen for inputs in [64, 192] (the kernel's negative lobes overshoot by ≤ 0.125 · 128 = 16).
PIL_LEVELS = 2.0
# The float path (CUDA's, and a float input's on the CPU: the same code) against ATen's integer kernels (the uint8
# CPU path): both run PIL's two passes, rows then columns, each rounded half up and clamped. What is left is the
# weights' rounding: the integer kernels round each to a multiple of 2^-p in int16 (p ≥ 14, as the largest weight is
# ≤ 1: ≤ 2^-15 off), the float path's are float32 (2^-24 relative, negligible). Row pass: K ≤ 2⌈2/s⌉ + 1 taps of
# ≤ 255 (7 at s ≥ 0.76, 13 at the published recipe's 0.38), sums < 13·255·2^-15 = 0.11 apart, so the rounded
# levels are ≤ 1 apart. Column pass: those ±1 levels through weights whose absolute sum is ≤ 1.27 (the cubic's
# negative lobes, renormalised where the border cuts taps), plus its own 0.11: < 2 apart, so ≤ 2 levels. (Rounding
# once at the end instead carries the row pass's overshoot beyond [0, 255] at sharp edges into the column pass:
# tens of levels.)
FLOAT_PATH_LEVELS = 2.0


def _batch(synth_root, frames_=(0, 1, 2), split="mini_train"):
    dataset = frames(str(synth_root / "drivetrain_index.npz"), split=split)
    return dataset.collate([dataset[i] for i in frames_])


def _flat(nested):
    return [nested] if isinstance(nested, torch.Tensor) else [t for item in nested for t in _flat(item)]


def _assert_ragged_equal(a: RaggedBatch, b: RaggedBatch, atol: float = 0.0):
    for x, y in zip(_flat(a.to_list()), _flat(b.to_list()), strict=True):
        assert x.shape == y.shape
        torch.testing.assert_close(x.double(), y.double(), rtol=0, atol=atol)


def test_a_projected_point_lands_where_the_augmented_image_moved_its_pixel(synth_index, synth_root):
    """A Gaussian blob drawn at a 3D point's pixel in every camera; after resize/crop/flip and the BEV step, the
    blob's centroid is where the augmented lidar2img projects the augmented point: ≤ 1 px (the original's pixels
    follow the scale int(W·s)/W while its matrices use s: < 1/W · u ≤ 1 px at the far edge)."""
    batch = _batch(synth_root)
    b, n, _, h, w = batch.images.shape
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    uv = torch.tensor([0.55 * w, 0.8 * h], dtype=torch.float64)  # inside every crop of the recipe
    images = torch.exp(-((xs + 0.5 - uv[0]) ** 2 + (ys + 0.5 - uv[1]) ** 2) / (2 * 2.5**2)) * 200  # (H, W)
    batch = dataclasses.replace(batch, images=images.round().to(torch.uint8).expand(b, n, 3, h, w).contiguous())
    depth = 15.0
    pixel = torch.tensor([uv[0] * depth, uv[1] * depth, depth, 1.0], dtype=torch.float64)
    points = torch.linalg.solve(batch.lidar2img.double(), pixel.expand(b, n, 4).unsqueeze(-1))  # (B, N, 4, 1)
    config = dataclasses.replace(CFG, normalize=False)
    params = sample_params(batch, config, torch.Generator().manual_seed(3))
    flips = torch.tensor([True, False, True])
    params = dataclasses.replace(params, image=dataclasses.replace(params.image, flip=flips))
    out = apply(batch, params, config)
    moved = params.bev.matrix.double()[:, None] @ points  # (B, N, 4, 1): the augmented 3D point
    projected = (out.lidar2img.double() @ moved).squeeze(-1)  # (B, N, 4)
    expected = projected[..., :2] / projected[..., 2:3]  # (B, N, 2)
    fh, fw = out.images.shape[-2:]
    oy, ox = torch.meshgrid(torch.arange(fh, dtype=torch.float64), torch.arange(fw, dtype=torch.float64), indexing="ij")
    for i in range(b):
        for c in range(n):
            weight = out.images[i, c, 0].double()
            centroid = torch.stack([(weight * (ox + 0.5)).sum(), (weight * (oy + 0.5)).sum()]) / weight.sum()
            assert torch.dist(centroid, expected[i, c]) <= 1.0, (i, c, centroid, expected[i, c])
    assert (params.bev.angle != 0).all() and (params.bev.scale != 1).all()


def test_device_path_agrees_with_the_per_sample_original(synth_index, synth_root):
    batch = _batch(synth_root)
    batch = dataclasses.replace(batch, images=batch.images.clamp(64, 192))  # see PIL_LEVELS
    params = sample_params(batch, CFG, torch.Generator().manual_seed(0))
    device, worker = apply(batch, params, CFG), reference_apply(batch, params, CFG)
    assert device.images.shape == worker.images.shape == (3, 6, 3, 48, 128)
    assert device.image_size == worker.image_size == (128, 48) and device.images_normalized
    torch.testing.assert_close(device.images, worker.images, rtol=0, atol=PIL_LEVELS / min(IMAGENET_STD))
    # Matrices: float64 products rounded to float32 vs the original's float32 products (a few ulps relative);
    # 1e-5 relative of each matrix's largest entry.
    for name in ("intrinsics", "lidar2img", "ego_pose", "ego_pose_inv", "lidar2ego"):
        a, b = getattr(device, name), getattr(worker, name)
        scale = b.abs().amax(dim=(-2, -1), keepdim=True)
        assert ((a - b).abs() <= 1e-5 * scale).all(), name
    for name in ("gt_boxes_2d", "centers_2d", "gt_labels_2d", "depths_2d", "gt_index_2d", "gt_labels"):
        _assert_ragged_equal(getattr(device, name), getattr(worker, name))
    _assert_ragged_equal(device.gt_boxes, worker.gt_boxes, atol=1e-5 * float(batch.gt_boxes.tensor.abs().max()))
    kept, loaded = int(device.gt_boxes_2d.sizes.sum()), int(batch.gt_boxes_2d.sizes.sum())
    assert 0 < kept < loaded  # the crop and the filter dropped some


def test_parameters_replay_and_the_identity_recipe_changes_nothing(synth_index, synth_root):
    batch = _batch(synth_root)
    params = sample_params(batch, CFG, torch.Generator().manual_seed(1))
    again = sample_params(batch, CFG, torch.Generator().manual_seed(1))
    first, second = apply(batch, params, CFG), apply(batch, again, CFG)
    assert torch.equal(first.images, second.images) and torch.equal(first.lidar2img, second.lidar2img)
    assert torch.equal(first.gt_boxes.tensor, second.gt_boxes.tensor)
    image = dataclasses.replace(
        IMAGE_AUG, source_size=(160, 90), final_size=(160, 90), resize_lim=(1.0, 1.0), rand_flip=False
    )
    identity = dataclasses.replace(
        CAMERA_AUG, image=image, bev=None, normalize=False, filter_invisible=False,
    )  # fmt: skip
    out = apply(batch, sample_params(batch, identity, torch.Generator().manual_seed(2)), identity)
    assert torch.equal(out.images, batch.images.float())
    for name in ("intrinsics", "lidar2img", "ego_pose", "lidar2ego"):
        assert torch.equal(getattr(out, name), getattr(batch, name)), name
    for name in ("gt_boxes_2d", "centers_2d", "gt_labels_2d", "depths_2d", "gt_index_2d", "gt_boxes"):
        _assert_ragged_equal(getattr(out, name), getattr(batch, name))


def test_test_time_parameters_draw_nothing_and_skip_the_bev_step(synth_index, synth_root):
    batch = _batch(synth_root)
    out = Augmentation(STAGE).test_time(batch)
    assert out.images.shape[-2:] == (48, 128) and torch.equal(out.ego_pose, batch.ego_pose)
    _assert_ragged_equal(out.gt_boxes, batch.gt_boxes)
    again = Augmentation(STAGE).test_time(batch)
    assert torch.equal(out.images, again.images)


def test_image_op_matches_pil_and_fills_outside_with_zeros():
    g = torch.Generator().manual_seed(4)
    images = torch.randint(64, 193, (2, 2, 3, 45, 80), dtype=torch.uint8, generator=g)
    params = ImageAugParams(
        torch.tensor([0.7, 1.3], dtype=torch.float64), torch.tensor([[3, 10], [-4, 30]]),
        torch.tensor([False, True]), torch.zeros(2, dtype=torch.float64),
    )  # fmt: skip
    out = resize_crop_flip(images, params, (64, 32))
    for b in range(2):
        for n in range(2):
            ref = reference_img_transform(
                images[b, n].permute(1, 2, 0).numpy(), float(params.scale[b]), tuple(params.crop[b].tolist()),
                bool(params.flip[b]), (64, 32),
            )  # fmt: skip
            torch.testing.assert_close(out[b, n], torch.from_numpy(ref).permute(2, 0, 1), rtol=0, atol=PIL_LEVELS)
    # sample 0: resized to 56×31, the crop (3, 10)-(67, 42) runs past it: zeros right and below
    assert (out[0, :, :, 21:] == 0).all() and (out[0, :, :, :, 53:] == 0).all()
    assert (out[1, :, :, :, -4:] == 0).all()  # sample 1: crop starts at x = −4, mirrored to the right edge


@pytest.mark.parametrize("scale", [0.76, 0.85, 0.97, 1.0, 1.007, 1.04, 1.1])
def test_float_images_resize_as_the_integer_kernels_round_each_pass(synth_index, synth_root, scale):
    """The device path's arithmetic on the CPU (float images take CUDA's code): within FLOAT_PATH_LEVELS of the
    uint8 kernels on the test set's images and on random black-and-white ones (the sharpest edges overshoot most);
    integers in [0, 255]; equal where no pass runs (s = 1) — and s = 1.007 runs the row pass only (161 × 90)."""
    batch = _batch(synth_root)
    g = torch.Generator().manual_seed(5)
    edges = torch.randint(0, 2, batch.images.shape, dtype=torch.uint8, generator=g) * 255  # (3, 6, 3, 90, 160)
    images = torch.cat([batch.images, edges])  # (6, 6, 3, 90, 160)
    num = images.shape[0]
    params = ImageAugParams(
        torch.full((num,), scale, dtype=torch.float64), torch.zeros(num, 2, dtype=torch.int64),
        torch.zeros(num, dtype=torch.bool), torch.zeros(num, dtype=torch.float64),
    )  # fmt: skip
    final = (int(160 * scale), int(90 * scale))  # the whole resized image
    integer = resize_crop_flip(images, params, final)
    floating = resize_crop_flip(images.float(), params, final)
    assert torch.equal(floating, floating.round()) and floating.min() >= 0 and floating.max() <= 255
    torch.testing.assert_close(floating, integer, rtol=0, atol=FLOAT_PATH_LEVELS)
    if final == (160, 90):
        assert torch.equal(floating, integer)


def test_filter_invisible_is_the_originals_for_random_and_tied_boxes():
    rng = np.random.default_rng(0)
    width, height = 64, 32
    for trial in range(60):
        per = []
        for _ in range(2 * 3):
            g = int(rng.integers(0, 9))
            xy = rng.random((g, 2)) * [width, height]
            box = np.concatenate([xy, np.minimum(xy + rng.random((g, 2)) * [32, 16] + 2, [width, height])], 1)
            box = np.round(box).astype(np.float32) if trial % 3 == 0 else box.astype(np.float32)  # integer edges
            depth = rng.integers(1, 4, g) if trial % 2 else rng.random(g) * 50  # tied depths: the stable order
            per.append((box, (box[:, :2] + box[:, 2:]) / 2, depth.astype(np.float32), np.arange(g)))

        def ragged(k, per=per):
            return RaggedBatch.from_list([[torch.from_numpy(per[3 * b + n][k]) for n in range(3)] for b in range(2)])

        boxes, centers, depths, index = filter_invisible(
            ragged(0), ragged(1), ragged(2), {"index": ragged(3)}, (width, height), chunk=3
        )
        for b in range(2):
            for n in range(3):
                box, centre, depth, idx = per[3 * b + n]
                k = int(boxes.sizes[b, n])
                if len(box) == 0:
                    assert k == 0
                    continue
                e_box, e_centre, e_depth, e_other = reference_filter_invisible(box, centre, depth, {"i": idx}, (64, 32))
                assert np.array_equal(boxes.tensor[b, n, :k].numpy(), e_box)
                assert np.array_equal(centers.tensor[b, n, :k].numpy(), e_centre)
                assert np.array_equal(depths.tensor[b, n, :k].numpy(), e_depth)
                assert np.array_equal(index["index"].tensor[b, n, :k].numpy(), e_other["i"])


def test_photometric_distortion_and_normalisation_equal_the_originals():
    pytest.importorskip("cv2")
    g = torch.Generator().manual_seed(5)
    images = torch.rand(3, 2, 3, 12, 20, generator=g) * 255
    params = sample_photometric_params(3, 2, PhotometricConfig(), g)
    out = photometric_distort(images, params)
    normed = normalize(images)
    for b in range(3):
        for n in range(2):
            ref = torch.from_numpy(reference_photometric(images[b, n].permute(1, 2, 0).numpy(), params.image(b, n)))
            # ~10 float32 operations per value on both sides (OpenCV's SIMD may order them differently): 16 ulps
            # of the image's largest magnitude.
            bound = 16 * EPS32 * float(ref.abs().max())
            torch.testing.assert_close(out[b, n].permute(1, 2, 0), ref, rtol=0, atol=bound)
            ref = reference_normalize(images[b, n].permute(1, 2, 0).numpy(), IMAGENET_MEAN, IMAGENET_STD)
            # x − mean: ours subtracts the float32 mean, mmcv the float64 one: ≤ eps32·255 apart, then · 1/std
            atol = EPS32 * 255 / min(IMAGENET_STD)
            torch.testing.assert_close(normed[b, n].permute(1, 2, 0), torch.from_numpy(ref), rtol=2 * EPS32, atol=atol)
    assert (params.brightness != 0).any() and (params.brightness == 0).any()
    assert (params.channels != torch.arange(3)).any() and (params.contrast_first.any())
    neutral = dataclasses.replace(
        params, brightness=torch.zeros(3, 2), contrast=torch.ones(3, 2), saturation=torch.ones(3, 2),
        hue=torch.zeros(3, 2), channels=torch.arange(3).expand(3, 2, 3),
    )  # fmt: skip
    # an all-neutral draw is the HSV round trip only: a few ulps of 255
    torch.testing.assert_close(photometric_distort(images, neutral), images, rtol=0, atol=16 * EPS32 * 255)


def test_bad_configs_and_batches_are_named(synth_index, synth_root):
    with pytest.raises(ValueError, match=r"data\.augment\.camera: unknown field"):
        CameraAugConfig.from_dict({"imag": {}}, CAMERA_AUG)
    with pytest.raises(ValueError, match=r"data\.augment\.camera\.image: .*resize_lim"):
        CameraAugConfig.from_dict({"image": {"resize_lim": [0, 1]}}, CAMERA_AUG)
    with pytest.raises(ValueError, match="BEV flips"):
        CameraAugConfig.from_dict({"bev": {"flip_horizontal": 0.5}}, CAMERA_AUG)
    with pytest.raises(ValueError, match="object_range"):
        CameraAugConfig.from_dict({"bev": {"object_range": [-50, -50, 50, 50]}}, CAMERA_AUG)
    with pytest.raises(ConfigError, match=r"data\.augment_on"):
        load_config(ROOT / "configs" / "streampetr_tiny_aug.yaml", ["data.augment_on=gpu"])
    batch = _batch(synth_root)
    with pytest.raises(ValueError, match="source_size"):
        sample_params(batch, CAMERA_AUG, torch.Generator())
    out = apply(batch, sample_params(batch, CFG, torch.Generator()), CFG)
    with pytest.raises(ValueError, match="augmented already"):
        apply(out, sample_params(batch, CFG, torch.Generator()), CFG)
    with pytest.raises(ValueError, match="no rotation"):
        rotating = dataclasses.replace(CFG, image=dataclasses.replace(CFG.image, rot_lim=(-5.0, 5.0)))
        reference_apply(batch, sample_params(batch, rotating, torch.Generator().manual_seed(0)), rotating)


def test_both_paths_draw_the_same_parameters_for_a_batch(synth_index, synth_root):
    batch = _batch(synth_root)
    position = {"epoch": 2, "step": 5}
    on_device = Augmentation(STAGE, seed=7, rank=1, on="device").params(batch, position).camera
    in_worker = Augmentation(STAGE, seed=7, rank=1, on="worker").params(batch, position).camera
    assert torch.equal(on_device.image.scale, in_worker.image.scale)
    assert torch.equal(on_device.bev.matrix, in_worker.bev.matrix)
    seeds = augment_seeds(7, 1, position, 3)
    assert len(set(seeds)) == 3 and seeds != augment_seeds(7, 0, position, 3)
    assert seeds != augment_seeds(7, 1, {"epoch": 2, "step": 6}, 3)


def _seeds_by_row(batch_size: int, world_size: int, accumulation: int) -> dict[int, int]:
    """Every row's augmentation seed over two epochs of 40 rows, each rank reading its ShuffledBatches."""
    from drivetrain.engine.batches import ShuffledBatches

    out = {}
    for rank in range(world_size):
        sampler = ShuffledBatches(40, batch_size, seed=1, rank=rank, world_size=world_size, accumulation=accumulation)
        for epoch in range(2):
            for keys in sampler:  # the state read right after a batch is the position after it
                seeds = augment_seeds(7, rank, sampler.state_dict(), len(keys))
                out.update({(epoch, row): seed for row, seed in zip(keys, seeds, strict=True)})
    return out


def test_a_row_draws_the_same_seed_on_any_split_of_the_global_batch():
    """Global batch 16: one rank × 16, 1 × 8 × accumulation 2, 2 ranks × 4 × 2 and 4 ranks × 4 give every row of
    an epoch the same seed, and different rows (and epochs) different ones."""
    reference = _seeds_by_row(16, 1, 1)
    assert len(reference) == 64 and len(set(reference.values())) == 64
    for split in [(8, 1, 2), (4, 2, 2), (4, 4, 1)]:
        assert _seeds_by_row(*split) == reference, split


def test_a_frame_draws_the_same_seed_on_any_split_of_the_same_streams():
    """Four scene streams as 1 rank × 4, 2 × 2 or 4 × 1: every frame of an epoch gets the same seed."""
    from drivetrain.data.sampler import SequenceSampler

    def seeds(batch_size: int, world_size: int) -> dict[int, int]:
        out = {}
        for rank in range(world_size):
            sampler = SequenceSampler([5, 3, 7, 4, 6, 2], batch_size, seed=2, rank=rank, world_size=world_size)
            for keys in sampler:
                drawn = augment_seeds(7, rank, sampler.state_dict(), len(keys))
                out.update({key.index: seed for key, seed in zip(keys, drawn, strict=True)})
        return out

    reference = seeds(4, 1)
    assert len(set(reference.values())) == len(reference) > 0
    assert seeds(2, 2) == reference and seeds(1, 4) == reference


def _aug_overrides(out: Path, synth_root: Path, *extra: str) -> list[str]:
    return [
        f"run.out_dir={out}", "run.threads=1", "run.deterministic=true", "log.progress=false",
        "log.tensorboard=false", "log.every=1", "train.steps=4", "checkpoint.every=2", "checkpoint.keep=3",
        "data.name=drivetrain.data.sources:frames", f"data.args={{index: {synth_root / 'drivetrain_index.npz'}, "
        "split: mini_train}", "data.augment.camera.image.source_size=[160,90]",
        "data.augment.camera.image.final_size=[128,48]", "data.augment.camera.image.resize_lim=[0.76,1.1]", *extra,
    ]  # fmt: skip


# worker: ~2 s, slow set; both paths draw the same parameters: test_both_paths_draw_the_same_parameters_for_a_batch
@pytest.mark.parametrize("where", ["device", pytest.param("worker", marks=pytest.mark.slow)])
def test_training_with_augmentation_resumes_bit_exactly(synth_index, synth_root, tmp_path, where):
    config = ROOT / "configs" / "streampetr_tiny_aug.yaml"

    def run(out, resume=None):
        cfg = load_config(config, _aug_overrides(out, synth_root, f"data.augment_on={where}"))
        Trainer(cfg, resume=resume).fit()

    run(tmp_path / "full")
    run(tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-00000004")
    run(tmp_path / "resumed", resume="auto")
    assert_same_weights(final_state(tmp_path / "resumed")["model"], final_state(tmp_path / "full")["model"])


def test_evaluation_runs_the_test_time_transform(synth_index, synth_root, tmp_path, monkeypatch):
    from drivetrain.engine import eval_run
    from drivetrain.models.streampetr import StreamPETR
    from helpers.streampetr import SMALL

    seen = []
    model = StreamPETR(**SMALL)
    original = model.detect

    def spy(batch):
        seen.append((tuple(batch.images.shape), batch.images_normalized))
        return original(batch)

    monkeypatch.setattr(model, "detect", spy)
    val = frames(str(synth_root / "drivetrain_index.npz"), split="mini_val")
    eval_run.predict(model, val, "cpu", progress=False, transform=Augmentation(STAGE).test_time)
    assert seen and all(shape == (1, 6, 3, 48, 128) and normed for shape, normed in seen)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_path_equals_the_cpu_one(synth_index, synth_root):
    batch = _batch(synth_root)
    params = sample_params(batch, CFG, torch.Generator().manual_seed(0))
    cpu = apply(batch, params, CFG)
    gpu = apply(batch.to("cuda"), params, CFG)
    # CUDA runs the float path (FLOAT_PATH_LEVELS); normalised, plus each value's float32 rounding (|v| < 4: 2^-22)
    atol = FLOAT_PATH_LEVELS / min(IMAGENET_STD) + 1e-6
    torch.testing.assert_close(gpu.images.cpu(), cpu.images, rtol=0, atol=atol)
    for name in ("intrinsics", "lidar2img", "ego_pose", "ego_pose_inv"):
        a, b = getattr(gpu, name).cpu(), getattr(cpu, name)
        assert ((a - b).abs() <= 1e-5 * b.abs().amax(dim=(-2, -1), keepdim=True)).all(), name
    for name in ("gt_labels_2d", "gt_index_2d"):
        _assert_ragged_equal(getattr(gpu, name).to("cpu"), getattr(cpu, name))


def test_frozen_encoder_overlap_learns_exactly_what_the_plain_run_learns(synth_index, synth_root, tmp_path):
    """``speed.encoder_overlap`` runs the frozen encoder for the next batch ahead (on a CPU right after the batch is
    read): the same weights as computing it inside the forward, and the frozen weights never move."""
    config = ROOT / "configs" / "streampetr_tiny_aug.yaml"
    runs = {}
    for overlap in ("false", "true"):
        extra = ["model.args.freeze_backbone=true", f"speed.encoder_overlap={overlap}"]
        cfg = load_config(config, _aug_overrides(tmp_path / overlap, synth_root, *extra))
        trainer = Trainer(cfg)
        initial = {k: v.clone() for k, v in trainer.model.backbone.state_dict().items()}
        trainer.fit()
        runs[overlap] = final_state(tmp_path / overlap)["model"]
        for key, value in trainer.model.backbone.state_dict().items():
            assert torch.equal(value, initial[key]), key
    assert_same_weights(runs["true"], runs["false"])
    moved = [k for k in runs["true"] if not k.startswith("backbone.")]
    assert moved  # the trainable rest is there (and trained: assert_same_weights compares every tensor)
    with pytest.raises(ConfigError, match="no frozen encoder"):
        Trainer(load_config(config, _aug_overrides(tmp_path / "bad", synth_root, "speed.encoder_overlap=true")))


@pytest.mark.heavy
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_side_stream_augmentation_and_encoder_overlap_match_the_inline_run(synth_index, synth_root, tmp_path):
    config = ROOT / "configs" / "streampetr_tiny_aug.yaml"
    frozen = ["model.args.freeze_backbone=true", "train.device=cuda"]
    inline = ["data.prefetch=false", "speed.encoder_overlap=false"]
    ahead = ["data.prefetch=true", "speed.encoder_overlap=true"]
    for name, extra in (("inline", inline), ("ahead", ahead)):
        Trainer(load_config(config, _aug_overrides(tmp_path / name, synth_root, *frozen, *extra))).fit()
    assert_same_weights(final_state(tmp_path / "ahead")["model"], final_state(tmp_path / "inline")["model"])


def test_eval_cli_runs_an_augmented_runs_test_time_transform(synth_index, synth_root, tmp_path, monkeypatch, capsys):
    """``drivetrain eval --checkpoint`` of a run trained with data.augment feeds the model the test-time transform
    of the recipe (the images at the model's size, normalised) — spied on the model's detect."""
    from drivetrain.cli.main import main
    from drivetrain.models.streampetr import StreamPETR

    config = ROOT / "configs" / "streampetr_tiny_aug.yaml"
    Trainer(load_config(config, _aug_overrides(tmp_path / "run", synth_root, "train.steps=2"))).fit()
    seen = []
    original = StreamPETR.detect

    def spy(self, batch):
        seen.append((tuple(batch.images.shape[-2:]), batch.images_normalized))
        return original(self, batch)

    monkeypatch.setattr(StreamPETR, "detect", spy)
    assert main(["eval", "--checkpoint", str(tmp_path / "run"), "--device", "cpu"]) == 0
    assert seen and set(seen) == {((48, 128), True)}
    assert '"mAP"' in capsys.readouterr().out
