"""The PointPillars detector end to end on the synthetic lidar set: shapes, both loss paths, learning, resume."""

from __future__ import annotations

import io

import pytest
import torch

from drivetrain.data import DatasetConfig, FrameDataset, collate
from drivetrain.models.pointpillars.model import PointPillars

TINY = dict(
    point_cloud_range=(-32.0, -32.0, -5.0, 32.0, 32.0, 3.0),
    voxel_size=(0.5, 0.5, 8.0),
    max_points=16,
    max_voxels=4000,
    max_voxels_test=4000,
    vfe_channels=(32,),
    backbone_channels=(32, 64, 128),
    layer_nums=(1, 2, 2),
    neck_channels=(32, 32, 32),
    anchor_ranges=[(-31.75, -31.75, -1.84, 31.75, 31.75, -1.84)],
    anchor_sizes=[(4.6, 1.95, 1.72), (0.73, 0.66, 1.76), (0.49, 2.49, 0.98)],
    augment=dict(point_range=(-32.0, -32.0, -5.0, 32.0, 32.0, 3.0), object_range=(-32.0, -32.0, 32.0, 32.0)),
)


@pytest.fixture(scope="module")
def batch(synth_index, synth_root):
    config = DatasetConfig(load_images=False, load_points=True, num_sweeps=1, use_dim=(0, 1, 2, 4))
    dataset = FrameDataset(synth_index, config, synth_root)
    return collate([dataset[i] for i in (1, 4)])


def test_forward_shapes_and_anchor_count(batch):
    torch.manual_seed(0)
    model = PointPillars(**TINY)
    out = model(batch)
    num_anchors = 64 * 64 * 3 * 2  # 128×128 canvas → 64×64 map, 3 sizes × 2 rotations
    assert out["cls_logits"].shape == (2, num_anchors, 10) and out["box_preds"].shape == (2, num_anchors, 9)
    assert out["dir_logits"].shape == (2, num_anchors, 2) and out["anchors"].shape == (num_anchors, 9)
    terms = model.loss(out, batch)
    assert set(terms) == {"loss_cls", "loss_bbox", "loss_dir"} and all(torch.isfinite(t) for t in terms.values())


def test_both_paths_give_the_same_assignment_and_terms(batch):
    torch.manual_seed(0)
    fast = PointPillars(**TINY).eval()
    ref = PointPillars(**{**TINY, "impl": "reference"}).eval()
    ref.load_state_dict(fast.state_dict())
    out = fast(batch)
    assigned = fast.assign(out["anchors"], out["gt_boxes"], out["gt_labels"])
    assert torch.equal(assigned, ref.assign(out["anchors"], out["gt_boxes"], out["gt_labels"]))
    assert int((assigned > 0).sum()) > 0  # the scenes give positives
    a, b = fast.loss(out, batch), ref.loss(out, batch)
    for name in a:  # per-element terms are identical; only the order of the final sums differs (≤ 1e-5 rel.)
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=0)


def test_twenty_steps_on_two_frames_reduce_the_loss(batch):
    torch.manual_seed(0)
    model = PointPillars(**{**TINY, "augment": None})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for _ in range(20):
        terms = model.loss(model(batch), batch)
        total = model.criterion.total(terms)
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(total.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_augmentation_generator_state_resumes_exactly(batch):
    torch.manual_seed(0)
    model = PointPillars(**TINY)
    model(batch)  # one augmented step: the generator has moved
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    after = model(batch)["gt_boxes"].tensor
    clone = PointPillars(**TINY)
    buffer.seek(0)
    clone.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(clone(batch)["gt_boxes"].tensor, after)


def test_bad_impl_is_named():
    with pytest.raises(ValueError, match="impl"):
        PointPillars(**{**TINY, "impl": "fast"})
