"""FrameDataset + collate: the Batch fields, 2D ground truth, losses reading a Batch, workers, points."""

import numpy as np
import pytest
import torch

from drivetrain.batch import Batch
from drivetrain.data import DatasetConfig, FrameDataset, SequenceSampler, collate
from drivetrain.geometry.projection import project_boxes
from drivetrain.losses.focal_head import focal_head_loss
from drivetrain.models.streampetr.loss import streampetr_loss


@pytest.fixture(scope="module")
def dataset(synth_index, synth_root):
    return FrameDataset(synth_root / "drivetrain_index.npz")


@pytest.fixture(scope="module")
def batch(dataset) -> Batch:
    return collate([dataset[0], dataset[4]])


def test_batch_has_the_issue_fields_with_their_shapes(batch):
    assert batch.images.shape == (2, 6, 3, 90, 160) and batch.images.dtype == torch.uint8
    assert batch.intrinsics.shape == (2, 6, 3, 3) and batch.lidar2img.shape == (2, 6, 4, 4)
    assert batch.cam2ego.shape == (2, 6, 4, 4) and batch.ego_pose.shape == (2, 4, 4)
    torch.testing.assert_close(batch.ego_pose @ batch.ego_pose_inv, torch.eye(4).expand(2, 4, 4), atol=1e-3, rtol=0)
    assert batch.timestamps.dtype == torch.float64 and batch.prev_exists.tolist() == [False, True]
    assert batch.gt_boxes.batch_shape == (2,) and batch.gt_boxes.shape[-1] == 9
    assert batch.gt_boxes_2d.batch_shape == (2, 6) and batch.centers_2d.shape[-1] == 2
    assert batch.image_size == (160, 90)


def test_images_are_the_decoded_jpegs_in_camera_order(batch, dataset, synth_root):
    import simplejpeg

    path = synth_root / dataset.index.meta["image_files"][4][2]
    image = simplejpeg.decode_jpeg(path.read_bytes())
    assert dataset.index.meta["cameras"][2] in path.name
    assert torch.equal(batch.images[1, 2], torch.from_numpy(image).permute(2, 0, 1))


def test_gt_boxes_are_the_index_boxes_with_lidar_points(batch, dataset):
    arr = dataset.index.arrays
    for b, frame in enumerate((0, 4)):
        sl = dataset.index.boxes_of(frame)
        keep = arr["num_lidar_pts"][sl] > 0
        got = batch.gt_boxes.to_list()[b]
        np.testing.assert_array_equal(got.numpy(), arr["boxes"][sl][keep])
        np.testing.assert_array_equal(batch.gt_labels.to_list()[b].numpy(), arr["labels"][sl][keep])


def test_centers_2d_and_depths_are_lidar2img_projections_of_their_3d_boxes(batch):
    boxes, centres, depths, index = (
        batch.gt_boxes.to_list(),
        batch.centers_2d.to_list(),
        batch.depths_2d.to_list(),
        batch.gt_index_2d.to_list(),
    )
    checked = 0
    for b in range(2):
        for c in range(6):
            if len(index[b][c]) == 0:
                continue
            xyz = boxes[b][index[b][c], :3].double()
            hom = torch.cat([xyz, torch.ones(len(xyz), 1, dtype=torch.float64)], 1) @ batch.lidar2img[b, c].double().T
            torch.testing.assert_close(hom[:, :2] / hom[:, 2:3], centres[b][c].double(), atol=1e-2, rtol=0)
            torch.testing.assert_close(hom[:, 2], depths[b][c].double(), atol=1e-3, rtol=0)
            checked += len(xyz)
    assert checked > 0


def test_2d_boxes_lie_in_the_image_and_contain_their_centres(batch):
    w, h = batch.image_size
    for boxes, centres in zip(batch.gt_boxes_2d.to_list(), batch.centers_2d.to_list(), strict=True):
        for xyxy, c in zip(boxes, centres, strict=True):
            assert ((xyxy[:, 2] - xyxy[:, 0]) >= 2).all() and ((xyxy[:, 3] - xyxy[:, 1]) >= 2).all()
            assert (xyxy[:, :2] >= 0).all() and (xyxy[:, 2] <= w).all() and (xyxy[:, 3] <= h).all()
            assert ((c >= xyxy[:, :2] - 1e-3) & (c <= xyxy[:, 2:] + 1e-3)).all()


def test_projection_handles_boxes_reaching_behind_the_camera():
    # A long box from 5 m behind to 5 m in front of a camera looking along +z (camera = lidar frame here).
    box = np.array([[0.0, 0.0, 5.0, 2.0, 2.0, 20.0, 0.0, 0, 0]])  # dz along the optical axis
    box_cam_axis = np.array([[0.0, 1.0, 5.0, 2.0, 1.0, 4.0, 0.0, 0, 0]])
    k = np.array([[100.0, 0, 80], [0, 100.0, 45], [0, 0, 1]])
    out = project_boxes(np.concatenate([box, box_cam_axis]), k, np.eye(4), (160, 90))
    assert out.index.tolist() == [0, 1]
    assert np.isfinite(out.boxes).all()
    np.testing.assert_allclose(out.boxes[0], [0, 0, 160, 90])  # covers the whole image


def test_losses_read_a_batch_as_their_targets(batch):
    gen = torch.Generator().manual_seed(0)
    num_layers, queries = 2, 128
    outputs = {
        "cls_logits": torch.randn(num_layers, 2, queries, 10, generator=gen),
        "box_codes": torch.randn(num_layers, 2, queries, 10, generator=gen),
    }
    terms = streampetr_loss()(outputs, batch)
    assert terms and all(torch.isfinite(v) for v in terms.values())
    tokens = 5 * 10
    focal_out = {
        "cls_logits": torch.randn(2, 6, tokens, 10, generator=gen),
        "boxes": torch.rand(2, 6, tokens, 4, generator=gen),
        "centres": torch.rand(2, 6, tokens, 2, generator=gen),
        "centerness": torch.randn(2, 6, 5, 10, generator=gen),
    }
    terms_2d = focal_head_loss(stride=16)(focal_out, batch)
    assert terms_2d and all(torch.isfinite(v) for v in terms_2d.values())


def test_batch_to_moves_every_tensor(batch):
    moved = batch.to("meta")
    for name, value in vars(moved).items():
        if isinstance(value, torch.Tensor):
            assert value.device.type == "meta", name
        elif hasattr(value, "tensor"):
            assert value.tensor.device.type == "meta" and value.sizes.device.type == "meta", name
    assert moved.sample_tokens == batch.sample_tokens


@pytest.fixture(scope="module")
def batch_with_points(synth_index, synth_root) -> Batch:
    dataset = FrameDataset(synth_index, DatasetConfig(load_points=True), synth_root)
    out = collate([dataset[0], dataset[3]])
    _ = out.gt_boxes.mask  # a cached mask: it moves with its batch, once
    return out


def test_batch_to_copies_every_tensor_once_without_blocking_toward_a_device(batch_with_points):
    """Each tensor once — a ragged field's data, sizes and cached mask too (the data went over twice before) —
    and non-blocking toward a device; ``non_blocking=False`` forces blocking copies."""
    from drivetrain.pipeline.transfer import flatten
    from helpers.copies import CopyRecorder

    leaves = flatten(batch_with_points)[0]  # every tensor of the batch, ragged parts and the mask included
    with CopyRecorder() as copies:
        moved = batch_with_points.to("meta")
    assert sorted(copies.sources()) == sorted(map(id, leaves))
    assert all(call.non_blocking for call in copies.calls)
    assert moved.gt_boxes.cached_mask is not None and moved.gt_boxes.cached_mask.device.type == "meta"
    with CopyRecorder() as forced:
        batch_with_points.to("meta", non_blocking=False)
    assert len(forced.calls) == len(leaves) and not any(call.non_blocking for call in forced.calls)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_pinned_batch_copies_are_all_non_blocking_and_equal(batch_with_points):
    from drivetrain.pipeline import to_device
    from drivetrain.pipeline.transfer import flatten
    from helpers.copies import CopyRecorder

    pinned = batch_with_points.pin_memory()
    leaves = flatten(pinned)[0]
    assert all(t.is_pinned() for t in leaves if t.numel())  # sizes and masks too
    for move in (lambda b: b.to("cuda"), lambda b: to_device(b, torch.device("cuda"))):  # the trainer's call
        with CopyRecorder() as copies:
            moved = move(pinned)
        assert sorted(copies.sources()) == sorted(map(id, leaves))
        assert all(call.non_blocking for call in copies.calls)
        for got, want in zip(flatten(moved)[0], flatten(batch_with_points)[0], strict=True):
            assert got.is_cuda and got.dtype == want.dtype and torch.equal(got.cpu(), want)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batch_back_to_the_cpu_blocks_and_round_trips(batch_with_points):
    from drivetrain.pipeline.transfer import flatten
    from helpers.copies import CopyRecorder

    on_gpu = batch_with_points.to("cuda")
    with CopyRecorder() as copies:
        back = on_gpu.to("cpu")
    assert copies.calls and not any(call.non_blocking for call in copies.calls)  # the host reads them next
    for got, want in zip(flatten(back)[0], flatten(batch_with_points)[0], strict=True):
        assert not got.is_cuda and torch.equal(got, want)


def test_dataloader_with_two_workers_yields_the_same_batches(dataset):
    def run(workers):
        sampler = SequenceSampler(dataset.scene_lengths(), 2, seed=3)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers)
        return list(loader)

    serial, parallel = run(0), run(2)
    assert len(serial) == len(parallel) == 6
    for a, b in zip(serial, parallel, strict=True):
        assert a.sample_tokens == b.sample_tokens and torch.equal(a.frame_index, b.frame_index)
        assert torch.equal(a.images, b.images) and torch.equal(a.gt_boxes.tensor, b.gt_boxes.tensor)


def test_points_merge_sweeps_with_time_offsets(synth_root, synth_index):
    config = DatasetConfig(load_images=False, load_points=True, num_sweeps=1, sweep_choice="nearest")
    ds = FrameDataset(synth_index, config)
    sample = ds[2]
    assert sample.images is None and sample.points.shape[1] == 5
    dt = np.unique(sample.points[:, 4])
    np.testing.assert_allclose(dt, [0.0, 0.05])
    # ground returns of the sweep, moved into the key-frame lidar frame, still lie on the ground plane
    sweep = sample.points[sample.points[:, 4] > 0]
    ground = sweep[sweep[:, 3] < 10]
    np.testing.assert_allclose(ground[:, 2], -1.84, atol=1e-3)


def test_frames_with_all_boxes_filtered_collate_to_empty_ground_truth(synth_index):
    from dataclasses import replace

    arrays = dict(synth_index.arrays, num_lidar_pts=np.zeros_like(synth_index.arrays["num_lidar_pts"]))
    ds = FrameDataset(replace(synth_index, arrays=arrays), DatasetConfig(load_images=False))
    b = collate([ds[0], ds[1]])
    assert b.gt_boxes.sizes.tolist() == [0, 0] and b.gt_boxes.shape == (2, 0, 9)
    assert b.gt_boxes_2d.sizes.sum() == 0 and b.images is None
