"""The PointPillars and SSN detectors end to end on the synthetic lidar set: shapes, both loss paths, learning,
resume, detection and the class-order maps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drivetrain.data import DatasetConfig, FrameDataset, collate
from drivetrain.data.formats.nuscenes.tables import CLASSES
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.pointpillars.model import SSN, PointPillars
from drivetrain.models.pointpillars.recipe import SSN_NUS_CLASSES

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
)
# SSN at the same scale: one size per class (the published ones), small classes on the 64×64 map, cars and
# large vehicles at stride 2 (32×32), one thin shared conv per task.
TINY_SSN = {
    **{k: v for k, v in TINY.items() if k not in ("anchor_ranges", "anchor_sizes")},
    "anchor_ranges": [(-32.0, -32.0, -1.84, 32.0, 32.0, -1.84)] * 10,
    "tasks": [(2, (32,), (1,)), (1, (32,), (1,)), (2, (32,), (1,)), (1, (32,), (2,)), (4, (32,), (2,))],
}
MODELS = {"pointpillars": (PointPillars, TINY), "ssn": (SSN, TINY_SSN)}


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


def test_ssn_forward_shapes_follow_the_tasks(batch):
    torch.manual_seed(0)
    model = SSN(**TINY_SSN)
    out = model(batch)
    num_anchors = 2 * (5 * 64 * 64 + 5 * 32 * 32)  # 2 rotations × (5 small classes at 64², 5 large at 32²)
    assert out["cls_logits"].shape == (2, num_anchors, 10) and out["anchors"].shape == (num_anchors, 9)
    _, classes, _ = model.anchor_set(out["feature_size"], out["anchors"].device)
    assert torch.equal(classes.bincount(), torch.tensor([2 * 64 * 64] * 5 + [2 * 32 * 32] * 5))
    # The GT labels reach the loss in SSN's class order.
    _, gt_labels = model.gt_targets(batch)
    original = batch.gt_labels.tensor[0, : int(batch.gt_labels.sizes[0])]
    assert [SSN_NUS_CLASSES[i] for i in gt_labels.tensor[0, : len(original)].tolist()] == [
        CLASSES[i] for i in original.tolist()
    ]
    assert "gt_boxes" not in out and "gt_labels" not in out  # the ground truth stays in the batch


@pytest.mark.parametrize("name", sorted(MODELS))
def test_both_paths_give_the_same_assignment_and_terms(batch, name):
    cls, args = MODELS[name]
    torch.manual_seed(0)
    fast = cls(**args).eval()
    ref = cls(**{**args, "impl": "reference"}).eval()
    ref.load_state_dict(fast.state_dict())
    out = fast(batch)
    assigned = fast.assign(out["feature_size"], *fast.gt_targets(batch))
    assert torch.equal(assigned, ref.assign(out["feature_size"], *ref.gt_targets(batch)))
    assert int((assigned > 0).sum()) > 0  # the scenes give positives
    a, b = fast.loss(out, batch), ref.loss(out, batch)
    for name in a:  # per-element terms are identical; only the order of the final sums differs (≤ 1e-5 rel.)
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=0)


@pytest.mark.parametrize(  # ssn: ~2 s, slow set (its loss paths and shapes: the tests above)
    "name", [pytest.param(name, marks=pytest.mark.slow) if name == "ssn" else name for name in sorted(MODELS)]
)
def test_twenty_steps_on_two_frames_reduce_the_loss(batch, name):
    cls, args = MODELS[name]
    torch.manual_seed(0)
    model = cls(**args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for _ in range(20):
        terms = model.loss(model(batch), batch)
        total = weighted_total(terms, model.loss_weights)
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(total.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_the_model_draws_nothing_and_the_loss_reads_the_batchs_ground_truth(batch):
    """No augmentation generator or extra state in the model: a training forward is a function of the batch and
    the weights, and the loss follows the ground truth it is handed (the trainer's augmentation stage moves it)."""
    torch.manual_seed(0)
    model = PointPillars(**TINY)
    assert not [k for k in model.state_dict() if k.endswith("_extra_state")]
    for name in ("augment", "seed"):
        with pytest.raises(TypeError, match=name):
            PointPillars(**{**TINY, name: None})
    first, again = model(batch), model(batch)
    assert torch.equal(first["cls_logits"], again["cls_logits"])  # nothing random in a training forward
    moved = dataclasses.replace(batch, gt_boxes=batch.gt_boxes.apply(lambda t: t + torch.tensor([3.0] + [0.0] * 8)))
    terms, shifted = model.loss(first, batch), model.loss(first, moved)
    assert not torch.equal(terms["loss_bbox"], shifted["loss_bbox"])


def test_bad_impl_is_named():
    with pytest.raises(ValueError, match="impl"):
        PointPillars(**{**TINY, "impl": "fast"})


def test_ssn_class_order_must_be_the_datasets():
    with pytest.raises(ValueError, match="classes"):
        SSN(**{**TINY_SSN, "classes": (*SSN_NUS_CLASSES[:-1], "lorry")})
    with pytest.raises(ValueError, match="one size per class"):
        SSN(**{**TINY_SSN, "anchor_sizes": [(1.0, 1.0, 1.0)], "anchor_ranges": TINY_SSN["anchor_ranges"][:1]})
    with pytest.raises(ValueError, match="triple per class"):
        SSN(**{**TINY_SSN, "assigner": (0.6, 0.3, 0.3)})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_detect_paths_agree_and_labels_come_back_in_dataset_order(batch, name):
    cls, args = MODELS[name]
    torch.manual_seed(0)
    model = cls(**{**args, "decode": {"nms_pre": 300}})
    with torch.no_grad():  # make every class score: a few hundred NMS candidates per sample
        for head in getattr(model.head, "heads", [model.head]):
            head.conv_cls.bias.add_(4.0)
    boxes, scores, labels = model.detect(batch)
    model.set_path(impl="reference")
    ref_boxes, ref_scores, ref_labels = model.detect(batch)
    assert model.training  # detect leaves the mode as it found it
    assert torch.equal(boxes.sizes, ref_boxes.sizes) and int(boxes.sizes.min()) > 10
    for b in range(2):
        n = int(boxes.sizes[b])
        torch.testing.assert_close(boxes.tensor[b, :n], ref_boxes.tensor[b, :n], rtol=0, atol=0)
        assert torch.equal(scores.tensor[b, :n], ref_scores.tensor[b, :n])
        assert torch.equal(labels.tensor[b, :n], ref_labels.tensor[b, :n])
    # Label k of the output names CLASSES[k]: the model's own order maps back through its class list.
    names = [model.class_names[i] for i in model._to_model[labels.tensor[0, : int(labels.sizes[0])]].tolist()]
    assert names == [CLASSES[i] for i in labels.tensor[0, : int(labels.sizes[0])].tolist()]
    assert boxes.tensor.shape[-1] == 9


@pytest.mark.parametrize(  # one resume in the default set; the other two (~2 s each) in the slow set
    ("name", "where"),
    [
        ("pointpillars", "device"),
        pytest.param("ssn", "device", marks=pytest.mark.slow),
        pytest.param("pointpillars", "worker", marks=pytest.mark.slow),
    ],
)
def test_a_resumed_run_ends_bit_exactly_where_the_uninterrupted_run_does(
    name, where, synth_index, synth_root, tmp_path
):
    """Through the engine on the synthetic lidar: 4 steps straight vs 2 steps, a checkpoint, and 2 resumed steps
    (sampler, optimizer and weights come back from the checkpoint; the lidar augmentation of data.augment.lidar,
    on the device or per sample in the loader, draws each batch's parameters from the seed and its position)."""
    import shutil
    from pathlib import Path

    from drivetrain.engine import Trainer, load_config
    from helpers.engine import assert_same_weights, final_state

    config = Path(__file__).resolve().parents[1] / "configs" / f"{name}_tiny.yaml"
    index = synth_root / "drivetrain_index.npz"

    def run(out, *extra, resume=None):
        cfg = load_config(
            config,
            [
                f"run.out_dir={out}",
                "run.threads=1",
                "run.deterministic=true",
                "log.progress=false",
                "log.tensorboard=false",
                "data.name=drivetrain.data.sources:frames",
                f"data.args={{index: {index}, split: mini_train, load_images: false, load_points: true, "
                "num_sweeps: 1, use_dim: [0, 1, 2, 4]}",
                "model.args.max_voxels=2000",
                "train.device=cpu",
                "train.steps=4",
                "checkpoint.every=2",
                "eval.every=0",
                "eval.at_start=false",
                f"data.augment_on={where}",
                *extra,
            ],
        )
        Trainer(cfg, resume=resume).fit()

    run(tmp_path / "straight")
    run(tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-00000004")  # as if killed after step 2's checkpoint
    run(tmp_path / "resumed", resume="auto")
    assert_same_weights(final_state(tmp_path / "resumed")["model"], final_state(tmp_path / "straight")["model"])


def test_a_lidar_submission_says_it_used_the_lidar(synth_index, synth_root):
    from drivetrain.data.sources import StreamingFrames
    from drivetrain.engine.eval_run import predict
    from drivetrain.models.streampetr import StreamPETR

    config = DatasetConfig(load_images=False, load_points=True, num_sweeps=1, use_dim=(0, 1, 2, 4))
    frames = StreamingFrames(FrameDataset(synth_index, config, synth_root, split="mini_val"))
    first_two = torch.utils.data.Subset(frames, [0, 1])
    first_two.collate = frames.collate  # predict collates with the dataset's own collate
    submission, _ = predict(PointPillars(**TINY), first_two, "cpu", progress=False)
    assert submission["meta"]["use_lidar"] is True and submission["meta"]["use_camera"] is False
    assert len(submission["results"]) == 2
    assert StreamPETR.input_modalities == ("camera",)  # a camera model's submissions say camera


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_batched_training_step_reads_the_host_twice(batch, name):
    """The voxelization reads the voxel and stored-point counts (one read; output shapes and the compact HardVFE),
    the windowed assignment its pair count; nothing else in forward, loss or backward."""
    from helpers.nosync import count_host_syncs

    cls, args = MODELS[name]
    torch.manual_seed(0)
    model = cls(**args)
    weighted_total(model.loss(model(batch), batch), model.loss_weights).backward()  # warm-up: anchors, tables cached
    with count_host_syncs() as calls:
        weighted_total(model.loss(model(batch), batch), model.loss_weights).backward()
    assert calls == ["tolist", "__int__"], calls
