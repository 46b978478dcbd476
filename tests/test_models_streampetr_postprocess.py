"""models/streampetr/postprocess.py: batched NMS-free decoding == the original's per-sample decoding, the
range filter and threshold, no host sync, and ground truth fed as outputs decodes back to itself."""

from __future__ import annotations

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
