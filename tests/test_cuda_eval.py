"""The evaluation path on CUDA: the lidar detectors' ``detect`` (voxelization, the network, compact decoding with its
sparse rotated NMS, the class-order map) on the device, its batched path against the per-sample reference on the
same device's outputs, with TF32 off and on; and ``evaluate_model`` on CUDA (the batch copied to the device, the
detections and poses read back, the submission scored by the devkit), ground truth decoded on the device scoring a
perfect mAP."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from drivetrain.data import DatasetConfig, FrameDataset, collate
from drivetrain.data.sources import frames
from drivetrain.engine.eval_run import evaluate_model
from drivetrain.models.pointpillars.postprocess import decode, reference_decode
from drivetrain.models.streampetr import decode as decode_queries
from drivetrain.models.streampetr.box_code import encode_boxes
from test_models_pointpillars_detector import MODELS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICE = "cuda"


@pytest.fixture(scope="module")
def batch(synth_index, synth_root):
    config = DatasetConfig(load_images=False, load_points=True, num_sweeps=1, use_dim=(0, 1, 2, 4))
    dataset = FrameDataset(synth_index, config, synth_root)
    return collate([dataset[i] for i in (1, 4)]).to(DEVICE)


@pytest.mark.parametrize("tf32", [False, True], ids=["fp32", "tf32"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_detect_on_cuda_decodes_as_the_reference_on_the_same_outputs(batch, name, tf32):
    """As tests/test_models_pointpillars_detector.py on the CPU: the batched decoding (compact: its NMS over the
    circles that meet) and the reference (per sample and class, every pair clipped) of one forward's boxes on the
    device run the same float ops on the same values: bit-equal. The class logits are each sample's ``A·C`` distinct
    values in [−4, 0) (a quarter above the 0.05 threshold): topk orders equal values by the kernel it picks, which
    depends on the slice count (the batch at once or one sample), so ties would make the two differ. TF32
    (``speed.tf32``) changes the network's outputs, never what the decodings make of them: the sparse NMS's gaps take
    no matmul. ``detect`` itself (a second forward: hard voxels written once each, a pillar max, cuDNN's
    deterministic forward convolutions) gives the batched decoding of the network's own logits, labels mapped to
    the dataset's order."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32  # restored by conftest
    cls, args = MODELS[name]
    torch.manual_seed(0)
    model = cls(**{**args, "decode": {"nms_pre": 300, "max_num": 3000}}).to(DEVICE)
    with torch.no_grad():  # make every class score: a few hundred NMS candidates per sample
        for head in getattr(model.head, "heads", [model.head]):
            head.conv_cls.bias.add_(4.0)
    model.eval()
    with torch.no_grad():
        out = model(batch)
    cls_logits, box_preds, dir_logits = (out[key].float() for key in ("cls_logits", "box_preds", "dir_logits"))
    cfg = model.decode_config
    own = decode(cls_logits, box_preds, dir_logits, out["anchors"], cfg, compact=True)
    found = model.detect(batch)
    assert found[0].tensor.device.type == DEVICE and torch.equal(found[0].sizes, own[0].sizes)
    assert torch.equal(found[2].tensor, model._to_data[own[2].tensor])
    assert torch.equal(found[0].tensor, own[0].tensor) and torch.equal(found[1].tensor, own[1].tensor)

    num_batch, num_anchors, num_classes = cls_logits.shape
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    rank = torch.rand(num_batch, num_anchors * num_classes, generator=gen, device=DEVICE).argsort(dim=1)
    logits = (rank.float() / (num_anchors * num_classes) * 4 - 4).view_as(cls_logits)  # (B, A, C) distinct
    boxes, scores, labels = decode(logits, box_preds, dir_logits, out["anchors"], cfg, compact=True)
    reference = reference_decode(logits, box_preds, dir_logits, out["anchors"], cfg)
    assert boxes.sizes.tolist() == [r["boxes"].shape[0] for r in reference] and int(boxes.sizes.min()) > 10
    top = logits.amax(dim=2).topk(cfg.nms_pre, dim=1).indices  # (B, nms_pre): the anchors the NMS sees
    candidates = logits.gather(1, top.unsqueeze(-1).expand(-1, -1, num_classes)).sigmoid() > cfg.score_threshold
    assert (boxes.sizes < candidates.sum(dim=(1, 2))).all()  # the NMS suppressed some (max_num is not the cut)
    for b, ref in enumerate(reference):
        n = int(boxes.sizes[b])
        assert torch.equal(boxes.tensor[b, :n], ref["boxes"]) and torch.isfinite(ref["boxes"]).all()
        assert torch.equal(scores.tensor[b, :n], ref["scores"]) and torch.equal(labels.tensor[b, :n], ref["labels"])


class GroundTruthOnDevice(nn.Module):
    """Each frame's ground truth through StreamPETR's decoding, on the batch's device (tests/test_engine_eval_run.py's
    detector, its tensors made where the batch is)."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def detect(self, batch):
        boxes, labels = batch.gt_boxes, batch.gt_labels
        assert boxes.tensor.device.type == DEVICE  # predict copied the batch to the device
        b, g = labels.tensor.shape
        logits = torch.full((b, g, 10), -20.0, device=labels.tensor.device)  # (B, G, C)
        logits.scatter_(2, labels.tensor.clamp(min=0).unsqueeze(-1), 20.0)
        logits = torch.where(labels.mask.unsqueeze(-1), logits, -20.0)
        codes = encode_boxes(boxes.tensor.reshape(-1, 9)).view(b, g, 10)  # (B, G, 10)
        return decode_queries(logits, codes, max_num=min(300, g * 10), score_threshold=0.5)


def test_ground_truth_decoded_on_cuda_scores_a_perfect_map(synth_index, synth_root, tmp_path):
    dataset = frames(str(synth_root / "drivetrain_index.npz"), split="mini_val")
    result = evaluate_model(GroundTruthOnDevice().to(DEVICE), dataset, DEVICE, tmp_path, split="mini_val",
                            progress=False, quiet=True)  # fmt: skip
    assert result.frames == len(dataset) == 6 and result.skipped == 0
    assert result.metrics["mean_ap"] >= 0.99, result.metrics["mean_dist_aps"]
    submission = json.loads(result.predictions.read_text())
    counts = [len(records) for records in submission["results"].values()]
    expected = [int((dataset[i].gt_labels >= 0).sum()) for i in range(len(dataset))]
    assert sorted(counts) == sorted(expected) and sum(counts) > 0  # every box, once, decoded on the device


class JitteringDetector(GroundTruthOnDevice):
    """Ground truth moved by noise drawn from the device's generator: a detector that draws at test time."""

    def detect(self, batch):
        boxes, scores, labels = super().detect(batch)
        noise = torch.randn(boxes.tensor.shape, device=boxes.tensor.device) * 0.01  # the CUDA generator's draws
        return boxes.with_tensor(boxes.tensor + noise), scores, labels


def test_evaluation_on_cuda_leaves_the_devices_generator_as_it_was(synth_index, synth_root, tmp_path):
    """The module's promise (the global RNG states untouched, so a run that evaluates every N steps trains as one
    that does not) on CUDA: the device's generator too, not only the CPU's."""
    dataset = frames(str(synth_root / "drivetrain_index.npz"), split="mini_val")
    torch.cuda.manual_seed(0)
    before, host = torch.cuda.get_rng_state(), torch.get_rng_state()
    result = evaluate_model(JitteringDetector().to(DEVICE), dataset, DEVICE, tmp_path, split="mini_val",
                            progress=False, quiet=True)  # fmt: skip
    assert result.frames == 6 and result.metrics["mean_ap"] > 0.5  # the boxes moved by 1 cm: still found
    assert torch.equal(torch.cuda.get_rng_state(), before) and torch.equal(torch.get_rng_state(), host)
