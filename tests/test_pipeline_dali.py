"""The DALI loader (CPU-only DALI here): without augmentation its batches equal the PyTorch loader's; with it a 3D point
projected with the augmented ``lidar2img`` lands on its moved pixel and everything but the pixels equals the worker path
(the pixels within PIL's rounding); it walks the same frames in the same order, shards ranks disjointly, resumes the
same stream, and the trainer resumes bit-exactly with it (slow set); a bad image is named at the batch the PyTorch
loader names it (tests/test_engine_step_outcome_data.py runs the trainer on one). Skipped without DALI."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali")

import simplejpeg

from drivetrain.data.sampler import SequenceSampler
from drivetrain.data.sources import frames
from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.engine.batches import BatchStream
from drivetrain.engine.config import DataConfig
from drivetrain.models.streampetr.recipe import CAMERA_AUG, IMAGE_AUG
from drivetrain.pipeline.augment.photometric import IMAGENET_MEAN, IMAGENET_STD, PhotometricConfig
from drivetrain.pipeline.augment.stage import Augmentation, AugmentConfig
from drivetrain.pipeline.dali import DaliSource, DaliStream
from helpers.engine import assert_same_weights, final_state

ROOT = Path(__file__).resolve().parents[1]
CFG = dataclasses.replace(
    CAMERA_AUG,
    image=dataclasses.replace(IMAGE_AUG, source_size=(160, 90), final_size=(128, 48), resize_lim=(0.76, 1.1)),
)
# Both paths decode with libjpeg-turbo (DALI's CPU decoder and simplejpeg gave identical pixels here); the resize
# differs: PIL rounds its first pass to uint8 (≤ 0.5 level, ≤ 0.63 after the second pass's kernel, absolute
# weight sum ≤ 1.125 for the cubic a = −0.5) and both round their result (≤ 0.5 each) — below 2 levels where
# nothing is clipped to [0, 255], which the blob images (values 68–188) guarantee.
RESIZE_LEVELS = 2.0
BLOB = (0.55, 0.8)  # the blob's pixel as fractions of (W, H): inside every crop of the recipe


@pytest.fixture(scope="module")
def blob_root(synth_index, synth_root, tmp_path_factory):
    """The test set with every camera image replaced by a grey image with one Gaussian blob (values 68–188)."""
    root = tmp_path_factory.mktemp("blob") / "synth"
    shutil.copytree(synth_root, root)
    h, w = 90, 160
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    blob = 128 + 60 * np.exp(-((xs + 0.5 - BLOB[0] * w) ** 2 + (ys + 0.5 - BLOB[1] * h) ** 2) / (2 * 3.0**2))
    image = np.repeat(np.round(blob).astype(np.uint8)[..., None], 3, axis=2)
    data = simplejpeg.encode_jpeg(np.ascontiguousarray(image), quality=98)
    for path in (root / "samples").rglob("*.jpg"):
        path.write_bytes(data)
    return root


def _frames(root, split="mini_train"):
    return frames(str(root / "drivetrain_index.npz"), root=str(root), split=split)


def _flat(nested):
    return [nested] if isinstance(nested, torch.Tensor) else [t for item in nested for t in _flat(item)]


def _assert_same_batch(a, b, images_atol=0.0):
    torch.testing.assert_close(a.images.float(), b.images.float(), rtol=0, atol=images_atol)
    for name in ("intrinsics", "lidar2img", "cam2ego", "lidar2ego", "ego_pose", "ego_pose_inv", "timestamps",
                 "prev_exists", "frame_index"):  # fmt: skip
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in ("gt_boxes", "gt_labels", "gt_boxes_2d", "centers_2d", "gt_labels_2d", "depths_2d", "gt_index_2d"):
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x.sizes, y.sizes), name
        for u, v in zip(_flat(x.to_list()), _flat(y.to_list()), strict=True):  # the valid rows
            assert torch.equal(u, v), name
    assert a.sample_tokens == b.sample_tokens and a.image_size == b.image_size


def test_without_augmentation_dali_batches_equal_the_pytorch_loaders(synth_index, synth_root):
    dataset = _frames(synth_root)
    dali = DaliStream(dataset, 2, seed=3)
    torch_stream = BatchStream(dataset, DataConfig(batch_size=2), seed=3)
    try:
        for _ in range(4):  # 3 batches an epoch: across the epoch boundary
            (a, rows_a), (b, rows_b) = dali.next(), torch_stream.next()
            assert a.images.dtype == torch.uint8 and torch.equal(rows_a, rows_b)
            _assert_same_batch(a, b)
            assert dali.state_dict() == torch_stream.state_dict()
    finally:
        dali.close()


def test_augmented_point_lands_on_its_moved_pixel_and_matches_the_worker_path(blob_root):
    dataset = _frames(blob_root)
    dali = DaliStream(dataset, 2, seed=5, augment=CFG)
    worker = BatchStream(
        dataset, DataConfig(batch_size=2), seed=5, transform=Augmentation(AugmentConfig(CFG), seed=5, on="worker")
    )
    try:
        for _ in range(2):
            (a, _), (b, _) = dali.next(), worker.next()
            _assert_same_batch(a, b, images_atol=RESIZE_LEVELS / min(IMAGENET_STD))
            original = _frames(blob_root)
            for i, frame in enumerate(a.frame_index.tolist()):
                raw = original.collate([original[frame]])
                w, h = raw.image_size
                depth = 15.0
                pixel = torch.tensor([BLOB[0] * w * depth, BLOB[1] * h * depth, depth, 1.0], dtype=torch.float64)
                point = torch.linalg.solve(raw.lidar2img[0].double(), pixel.expand(6, 4).unsqueeze(-1))  # (6, 4, 1)
                projected = (a.lidar2img[i].double() @ _moved(raw, a, i, point)).squeeze(-1)  # (6, 4)
                expected = projected[:, :2] / projected[:, 2:3]
                std = torch.tensor(IMAGENET_STD, dtype=torch.float64).view(3, 1, 1)
                mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float64).view(3, 1, 1)
                for n in range(6):
                    image = a.images[i, n].double() * std + mean  # (3, fH, fW) back to 0–255
                    weight = (image[0] - 128).clamp(min=0)
                    fh, fw = weight.shape
                    oy, ox = torch.meshgrid(torch.arange(fh) + 0.5, torch.arange(fw) + 0.5, indexing="ij")
                    centroid = torch.stack([(weight * ox).sum(), (weight * oy).sum()]) / weight.sum()
                    assert torch.dist(centroid, expected[n]) <= 1.0, (frame, n, centroid, expected[n])
    finally:
        dali.close()


def _moved(raw, augmented, i, point):
    """The augmented 3D point: the BEV step maps the lidar frame by M, and ego_pose' = ego_pose·M⁻¹, so
    M = ego_pose'⁻¹ · ego_pose (the same world point before and after)."""
    m = torch.linalg.inv(augmented.ego_pose[i].double()) @ raw.ego_pose[0].double()  # (4, 4)
    return m @ point


def test_resume_continues_the_same_stream(synth_index, synth_root):
    dataset = _frames(synth_root)
    through = DaliStream(dataset, 2, seed=1, augment=CFG)
    resumed = DaliStream(dataset, 2, seed=1, augment=CFG)
    try:
        for _ in range(2):
            through.next()
        state = through.state_dict()
        expected = [through.next()[0] for _ in range(2)]  # the second crosses into the next epoch
        resumed.load_state_dict(state)
        for batch in expected:
            _assert_same_batch(resumed.next()[0], batch)
    finally:
        through.close()
        resumed.close()


def test_ranks_take_disjoint_frames_in_the_pytorch_loaders_order(synth_index, synth_root):
    dataset = _frames(synth_root, split=None)  # 4 scenes: 2 ranks × 2 slots
    seen = []
    for rank in range(2):
        sampler = SequenceSampler(dataset.frames.scene_lengths(), 2, seed=4, rank=rank, world_size=2)
        source = DaliSource(dataset.frames, sampler, (0, 0), None, seed=4)
        steps = sampler.steps_in_epoch(0)
        keys = [[tuple(source.key(i, slot)[0]) for slot in range(2)] for i in range(steps)]
        assert keys == [[tuple(k) for k in batch] for batch in sampler]  # the same batches as the PyTorch sampler
        seen.extend(k[0] for batch in keys for k in batch)
    assert len(seen) == len(set(seen)) == len(dataset)  # every frame once per epoch across the two ranks


# ~7 s; DALI's stream resumes: the test above; a DALI run resumed: tests/test_engine_step_outcome_data.py
@pytest.mark.slow
def test_training_with_dali_resumes_bit_exactly(synth_index, synth_root, tmp_path):
    config = ROOT / "configs" / "streampetr_tiny_aug.yaml"
    index = synth_root / "drivetrain_index.npz"

    def run(out, resume=None):
        cfg = load_config(config, [
            f"run.out_dir={out}", "run.threads=1", "run.deterministic=true", "log.progress=false",
            "log.tensorboard=false", "log.every=1", "train.steps=4", "checkpoint.every=2", "checkpoint.keep=3",
            "data.name=drivetrain.data.sources:frames", f"data.args={{index: {index}, split: mini_train}}",
            "data.augment.camera.image.source_size=[160,90]", "data.augment.camera.image.final_size=[128,48]",
            "data.augment.camera.image.resize_lim=[0.76,1.1]", "data.loader=dali",
        ])  # fmt: skip
        trainer = Trainer(cfg, resume=resume)
        try:
            trainer.fit()
        finally:
            trainer.close()

    run(tmp_path / "full")
    run(tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-00000004")
    run(tmp_path / "resumed", resume="auto")
    assert_same_weights(final_state(tmp_path / "resumed")["model"], final_state(tmp_path / "full")["model"])


def test_what_dali_cannot_carry_is_refused_by_name(synth_index, synth_root, tmp_path):
    index = str(synth_root / "drivetrain_index.npz")
    with pytest.raises(ValueError, match="load_points"):
        DaliStream(frames(index, split="mini_train", load_points=True), 2)
    with pytest.raises(ValueError, match="on_error=raise"):
        DaliStream(frames(index, split="mini_train", on_error="skip"), 2)
    with pytest.raises(ValueError, match="photometric"):
        DaliStream(_frames(synth_root), 2, augment=dataclasses.replace(CFG, photometric=PhotometricConfig()))
    with pytest.raises(ConfigError, match=r"data\.loader"):
        load_config(ROOT / "configs" / "streampetr_tiny_aug.yaml", ["data.loader=nvjpeg"])


def test_a_jpeg_only_the_decoder_rejects_is_named_at_the_batch_the_pytorch_loader_names_it(
    synth_index, synth_root, tmp_path
):
    """A JPEG cut short after its header passes the source's check and fails in DALI's decoder, which reads ahead:
    the stream still hands out the batches before it and raises the PyTorch loader's one-line DataError (naming
    the file) at the same batch."""
    from drivetrain.data.errors import DataError

    root = tmp_path / "synth"
    shutil.copytree(synth_root, root)
    dataset = _frames(root)
    order = list(SequenceSampler(dataset.frames.scene_lengths(), 2, seed=3))
    frame = order[2][1][0]  # read in the third batch: DALI prepares it while the first is asked for
    image = root / dataset.frames.index.meta["image_files"][frame][4]
    data = image.read_bytes()
    image.write_bytes(data[: int(len(data) * 0.8)])
    simplejpeg.decode_jpeg_header(image.read_bytes())  # the header is intact: only decoding finds the fault

    def failure(stream):
        for i in range(len(order)):
            try:
                stream.next()
            except DataError as err:
                return i, str(err)
        return None

    dali = DaliStream(dataset, 2, seed=3)
    try:
        found = failure(dali)
    finally:
        dali.close()
    assert found == failure(BatchStream(dataset, DataConfig(batch_size=2), seed=3))
    assert found[0] == 2 and found[1].startswith(f"{image}: corrupt or non-JPEG image")
