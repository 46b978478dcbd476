"""models/streampetr/postprocess.py: batched NMS-free decoding == the original's per-sample decoding, the
range filter and threshold, no host sync, and ground truth fed as outputs decodes back to itself."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.models.streampetr import decode, reference_decode
from drivetrain.models.streampetr.box_code import encode_boxes
from helpers.boxes import random_boxes3d
from helpers.nosync import no_host_sync

B, Q, C = 3, 40, 10
# The same float32 logit's sigmoid can differ between PyTorch's vectorised loop and its scalar tail loop, and
# which elements fall in the tail depends on the tensor's length: (B, Q, C) in one call vs (Q, C) per sample
# (seen on an AVX-512 CPU, where the tail is 16 elements; none on AVX2 here). Each path is within 2 ulp of the
# exact value, so the two differ by at most 4 ulp: 4·eps32 relative.
SIGMOID_RTOL = 4 * torch.finfo(torch.float32).eps


def outputs(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(B, Q, C, generator=gen) * 3
    codes = encode_boxes(random_boxes3d(B * Q, gen)).view(B, Q, 10)
    codes[:, :5, 0] = 70.0  # some centres beyond the post-centre range (61.2 m)
    return logits, codes


@pytest.mark.parametrize("threshold", [None, 0.5])
@pytest.mark.parametrize("max_num", [1, 25, Q * C])
def test_batched_decoding_equals_the_per_sample_original(max_num: int, threshold: float | None, gen) -> None:
    logits, codes = outputs(gen)
    boxes, scores, labels = decode(logits, codes, max_num=max_num, score_threshold=threshold)
    expected = reference_decode(logits, codes, max_num=max_num, score_threshold=threshold)
    for b, ref in enumerate(expected):
        k = int(boxes.sizes[b])
        assert k == len(ref["scores"])
        assert torch.equal(boxes.tensor[b, :k], ref["boxes"]) and torch.equal(labels.tensor[b, :k], ref["labels"])
        torch.testing.assert_close(scores.tensor[b, :k], ref["scores"], rtol=SIGMOID_RTOL, atol=0)
        assert (ref["boxes"][:, 0] <= 61.2).all()
        if threshold is not None:
            assert (ref["scores"] >= threshold).all()
    assert labels.tensor.dtype == torch.int64 and boxes.tensor.shape == (B, max_num, 9)


def test_decoding_does_not_sync(gen) -> None:
    logits, codes = outputs(gen)
    with no_host_sync():
        decode(logits, codes, max_num=50, score_threshold=0.3)


def test_ground_truth_fed_as_outputs_decodes_back_to_itself(gen) -> None:
    gt = random_boxes3d(7, gen)  # (7, 9) gravity-centre boxes inside the range
    labels = torch.randint(0, C, (7,), generator=gen)
    logits = torch.full((1, Q, C), -20.0)
    logits[0, torch.arange(7), labels] = 20.0  # queries 0..6 are the ground truth, certain
    codes = torch.zeros(1, Q, 10)
    codes[0, :7] = encode_boxes(gt)
    codes[0, 7:, 7] = 1.0  # other queries: any valid code
    boxes, scores, out_labels = decode(logits, codes, max_num=7)
    assert int(boxes.sizes[0]) == 7 and (scores.tensor[0] > 0.99).all()
    # Each ground-truth box comes back once, with its label. float32 round trip (exp of log sizes, atan2 of
    # sin/cos, centres up to ~60 m with an ulp of 4e-6): 1e-4 bounds every coordinate.
    hits = []
    for box, label in zip(gt, labels, strict=True):
        distances = (boxes.tensor[0] - box).abs().amax(-1)  # (7,)
        hit = int(distances.argmin())
        assert distances[hit] < 1e-4 and out_labels.tensor[0, hit] == label
        hits.append(hit)
    assert sorted(hits) == list(range(7))


def test_bad_shapes_are_named(gen) -> None:
    logits, codes = outputs(gen)
    with pytest.raises(ValueError, match="box_codes"):
        decode(logits, codes[..., :9])
    with pytest.raises(ValueError, match="max_num"):
        decode(logits, codes, max_num=Q * C + 1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("threshold", [None, 0.5])
def test_decoding_on_cuda_equals_the_original_on_the_cpu_without_a_host_sync(threshold, gen) -> None:
    """The batched decoding on the device, under CUDA's sync debug mode set to raise at any synchronising call (the
    post-centre range is copied to the device once, before), against the per-sample original on the CPU. A sample's
    logits are the Q·C distinct values of a grid 0.03 apart in [−6, 6): neighbouring scores differ by ≥ 7e-5, far
    beyond the devices' sigmoids (each within 2 ulp), so topk picks and orders the same (query, class) pairs.
    Centres and velocities are copies: exact. Scores: SIGMOID_RTOL; sizes (exp) and yaw (atan2): each device within
    2 ulp of the exact value, 4·eps32 apart (relative; for a yaw near 0, 4·eps32·π absolute)."""
    _, codes = outputs(gen)
    rank = torch.rand(B, Q * C, generator=gen).argsort(dim=1)
    logits = (rank.double() * (12 / (Q * C)) - 6.0).float().view(B, Q, C)  # (B, Q, C) distinct, 0.03 apart
    logits_gpu, codes_gpu = logits.cuda(), codes.cuda()
    decode(logits_gpu, codes_gpu, max_num=50, score_threshold=threshold)  # the range's one copy to the device
    torch.cuda.set_sync_debug_mode("error")
    try:
        boxes, scores, labels = decode(logits_gpu, codes_gpu, max_num=50, score_threshold=threshold)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    boxes, scores, labels = (rb.to("cpu") for rb in (boxes, scores, labels))
    expected = reference_decode(logits, codes, max_num=50, score_threshold=threshold)
    eps = torch.finfo(torch.float32).eps
    for b, ref in enumerate(expected):
        k = int(boxes.sizes[b])
        assert k == len(ref["scores"]) > 0 and torch.equal(labels.tensor[b, :k], ref["labels"])
        got = boxes.tensor[b, :k]
        assert torch.equal(got[:, [0, 1, 2, 7, 8]], ref["boxes"][:, [0, 1, 2, 7, 8]])
        torch.testing.assert_close(got[:, 3:6], ref["boxes"][:, 3:6], rtol=4 * eps, atol=0)
        torch.testing.assert_close(got[:, 6], ref["boxes"][:, 6], rtol=4 * eps, atol=4 * eps * math.pi)
        torch.testing.assert_close(scores.tensor[b, :k], ref["scores"], rtol=SIGMOID_RTOL, atol=0)
