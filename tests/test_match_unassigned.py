"""More ground truths than predictions (issue 31): a frame holding more boxes than the detector has queries (or an
image more 2D boxes than tokens) is matched as the original matches it — SciPy's ``linear_sum_assignment`` on the
rectangular ``(Q, M)`` cost matrix gives every query one ground truth and leaves the other ``M − Q`` unassigned —
on every path (scipy and gpu solver backends, reference and batched assigners and losses, the compiled loss), the
normalisers count the assigned pairs as the original's ``num_total_pos`` does, the number left over is counted
without a sync, and a training run on such frames finishes with a checkpoint and logs the count."""

from __future__ import annotations

import importlib
import json
import warnings

import numpy as np
import pytest
import torch
import torch._dynamo
from scipy.optimize import linear_sum_assignment

import drivetrain.match.assigners as assigners_module
from drivetrain.losses.focal_head import focal_head_loss, hungarian_2d
from drivetrain.match import solve
from drivetrain.match.solve import num_assigned, num_unassigned
from drivetrain.models.streampetr.loss import hungarian_3d, streampetr_loss
from drivetrain.ragged import RaggedBatch
from helpers.engine import ROOT, metrics
from helpers.heads import assert_paths_agree, focal_case, run, streampetr_case, total
from helpers.nosync import allow_host_sync, no_host_sync
from helpers.streampetr import SMALL
from test_losses_compile import Recorder, assert_bit_equal, both, cpu_assignment, graph_breaks
from test_match_solve import padded_costs

solve_module = importlib.import_module("drivetrain.match.solve")  # the package's `solve` is the function


def scipy_pairs(block: torch.Tensor) -> torch.Tensor:
    """What the original does with one ``(Q, M)`` matrix: SciPy's pairs, ``(min(Q, M), 2)``."""
    rows, cols = linear_sum_assignment(block.double().numpy())
    return torch.from_numpy(np.stack([rows, cols], axis=-1)).long().reshape(-1, 2)


def assert_original_pairs(costs: RaggedBatch, result: RaggedBatch) -> None:
    q, g = costs.shape[-2:]
    assert result.tensor.shape == (*costs.batch_shape, g, 2)
    assert torch.equal(result.sizes, costs.sizes.clamp(max=q))
    flat_costs, flat_pairs = costs.tensor.reshape(-1, q, g), result.tensor.reshape(-1, g, 2)
    for p, m in enumerate(costs.sizes.reshape(-1).tolist()):
        expected = scipy_pairs(flat_costs[p, :, :m])
        assert expected.shape[0] == min(q, m)
        assert torch.equal(flat_pairs[p, : expected.shape[0]], expected), f"problem {p} (Q={q}, M={m})"
        assert not flat_pairs[p, expected.shape[0] :].any(), "rows past the pairs are zero"


def more_targets_sizes(batch_shape: tuple[int, ...], q: int, g: int, gen: torch.Generator) -> torch.Tensor:
    """Target counts in [0, G] with 0, Q − 1, Q, Q + 1 and G present: fewer, as many and more than predictions."""
    sizes = torch.randint(0, g + 1, batch_shape, generator=gen)
    sizes.view(-1)[:5] = torch.tensor([0, q - 1, q, q + 1, g])
    return sizes


# ---------------------------------------------------------------------------------------------- solver
@pytest.mark.parametrize(("q", "g"), [(4, 11), (7, 8), (1, 5)])
def test_scipy_backend_assigns_min_q_m_pairs_like_the_original(q: int, g: int, gen: torch.Generator) -> None:
    sizes = more_targets_sizes((3, 4), q, g, gen)
    costs = padded_costs((3, 4), q, g, gen, sizes=sizes)  # padding columns poisoned with NaN / ±huge / ±inf
    result = solve(costs, backend="scipy")
    assert_original_pairs(costs, result)
    assert torch.equal(result.mask, torch.arange(g) < sizes.clamp(max=q)[..., None])


def test_gpu_backend_padding_keeps_the_original_pairs_when_targets_outnumber_predictions(
    gen: torch.Generator, monkeypatch
) -> None:
    """The gpu backend's padding columns (one cost above every real one) and pair extraction, with SciPy on
    the whole padded problem standing in for the Triton kernel (which solves the same rectangular problem):
    with G > Q a padding column cheaper than a real one would steal predictions; this one never does."""
    monkeypatch.setattr(solve_module, "gpu_solver_available", lambda device: True)
    monkeypatch.setattr(solve_module, "_triton_assignment", cpu_assignment)
    q, g = 5, 12
    sizes = more_targets_sizes((2, 6), q, g, gen)
    costs = padded_costs((2, 6), q, g, gen, sizes=sizes, dtype=torch.float32)
    assert_original_pairs(costs, solve(costs, backend="gpu"))
    # Real costs of both signs and far from 0 (the padding must exceed all of them, not just 0).
    shifted = RaggedBatch(costs.tensor * 40 - 300, sizes, ragged_dim=3)
    assert_original_pairs(shifted, solve(shifted, backend="gpu"))


def test_assigned_and_unassigned_counts_need_no_sync() -> None:
    sizes = torch.tensor([[0, 3, 9], [12, 5, 4]])
    with no_host_sync():
        assigned, left = num_assigned(sizes, 5, 12), num_unassigned(sizes, 5, 12)
        assert num_assigned(sizes, 12, 12) is sizes  # G ≤ Q: nothing to clamp, no kernel
        none_left = num_unassigned(sizes, 12, 12)
    assert assigned.tolist() == [[0, 3, 5], [5, 5, 4]]
    assert int(left) == 4 + 7 and int(none_left) == 0


# ---------------------------------------------------------------------------------------------- assigners
def test_3d_assigner_batched_equals_reference_with_more_ground_truth_than_queries(gen: torch.Generator) -> None:
    counts, q = [0, 13, 6, 30], 12
    boxes = [torch.randn(m, 9, generator=gen).abs() + 0.5 for m in counts]
    labels = [torch.randint(0, 10, (m,), generator=gen) for m in counts]
    logits, codes = torch.randn(3, 4, q, 10, generator=gen), torch.randn(3, 4, q, 10, generator=gen)
    assigner = hungarian_3d("scipy")
    batched = assigner.batched(logits, codes, RaggedBatch.from_list(boxes), RaggedBatch.from_list(labels))
    reference = assigner.reference(logits, codes, boxes, labels)
    assert batched.sizes.tolist() == [[min(m, q) for m in counts]] * 3
    for layer, row in enumerate(batched.to_list()):
        for b, pairs in enumerate(row):
            assert torch.equal(pairs, reference[layer][b])
            if counts[b] > q:  # every query matched once, to distinct ground truths
                assert torch.equal(pairs[:, 0], torch.arange(q)) and pairs[:, 1].unique().numel() == q


def test_2d_assigner_batched_equals_reference_with_more_ground_truth_than_tokens(gen: torch.Generator) -> None:
    outputs, targets = focal_case([[0, 30], [7, 12]], gen, hf=2, wf=5)  # 10 tokens per image
    assigner = hungarian_2d("scipy")
    args = (outputs["cls_logits"], outputs["boxes"], outputs["centres"])
    gt = (targets["gt_boxes_2d"], targets["gt_labels_2d"], targets["centers_2d"])
    batched = assigner.batched(*args, *gt, targets["image_size"])
    reference = assigner.reference(*args, *(t.to_list() for t in gt), targets["image_size"])
    assert batched.sizes.tolist() == [[0, 10], [7, 10]]
    for row, ref_row in zip(batched.to_list(), reference, strict=True):
        for pairs, ref in zip(row, ref_row, strict=True):
            assert torch.equal(pairs, ref)


# ---------------------------------------------------------------------------------------------- losses
@pytest.mark.parametrize("groups", [0, 2])
def test_streampetr_loss_paths_agree_with_more_ground_truth_than_queries(groups: int, gen: torch.Generator) -> None:
    outputs, targets = streampetr_case([0, 25, 7, 40], layers=3, queries=20, groups=groups, gen=gen)
    loss = streampetr_loss(backend="scipy")
    with pytest.warns(RuntimeWarning, match=r"up to 40 ground truths per sample, more than the 20 queries"):
        assert_paths_agree(loss, outputs, targets)  # terms and gradients, the tolerances of the other heads
    assert int(loss.counts["unassigned_gt"]) == 5 + 20


def test_streampetr_normalisers_count_the_assigned_pairs_as_the_original(gen: torch.Generator) -> None:
    """``loss_cls`` divides by the original's ``num_total_pos`` = assigned queries (Σ min(M_b, Q)), not by the
    number of ground truths: checked against the per-element focal loss summed by hand."""
    from drivetrain.losses.functional import class_mask, sigmoid_focal_loss

    outputs, targets = streampetr_case([3, 30], layers=1, queries=10, groups=0, gen=gen)
    loss = streampetr_loss(backend="scipy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        terms, _ = run(loss, outputs, targets, "batched")
        pairs = loss.assigner.reference(
            outputs["cls_logits"], outputs["box_codes"], targets["gt_boxes"].to_list(), targets["gt_labels"].to_list()
        )[0]
    labels = torch.full((2, 10), 10)
    for b, sample_pairs in enumerate(pairs):
        labels[b, sample_pairs[:, 0]] = targets["gt_labels"].to_list()[b][sample_pairs[:, 1]].long()
    focal = sigmoid_focal_loss(outputs["cls_logits"][0], class_mask(labels, 10).float()).sum()
    torch.testing.assert_close(terms["loss_cls"].detach(), focal / (3 + 10))


def test_focal_head_loss_paths_agree_with_more_ground_truth_than_tokens(gen: torch.Generator) -> None:
    outputs, targets = focal_case([[0, 30], [7, 12]], gen, hf=2, wf=5)  # 10 tokens per image
    loss = focal_head_loss(backend="scipy")
    with pytest.warns(RuntimeWarning, match=r"up to 30 2D ground truths per image, more than the 10"):
        assert_paths_agree(loss, outputs, targets)
    assert int(loss.counts["unassigned_gt_2d"]) == 20 + 2


@pytest.mark.parametrize("head", ["streampetr", "focal_head"])
def test_batched_losses_read_nothing_on_the_host_but_the_solver_with_more_ground_truth(head, gen, monkeypatch):
    """Clamping the pair counts and counting the ground truths left over add no host read to the batched path."""
    if head == "streampetr":
        outputs, targets = streampetr_case([0, 25, 7, 40], layers=2, queries=20, groups=2, gen=gen)
        loss = streampetr_loss(backend="scipy")
    else:
        outputs, targets = focal_case([[0, 30], [7, 12]], gen, hf=2, wf=5)
        loss = focal_head_loss(backend="scipy")
    real_solve, calls = assigners_module.solve, []

    def solve_with_sync(*args, **kwargs):
        calls.append(1)
        with allow_host_sync():
            return real_solve(*args, **kwargs)

    monkeypatch.setattr(assigners_module, "solve", solve_with_sync)
    leaves = {k: v.requires_grad_() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in outputs.items()}
    with warnings.catch_warnings(), no_host_sync():
        warnings.simplefilter("ignore", RuntimeWarning)
        terms = loss(leaves, targets)
        total(loss, terms).backward()
    assert calls == [1] and int(next(iter(loss.counts.values()))) > 0


def test_unassigned_count_warns_once_and_is_zero_when_every_target_fits(gen: torch.Generator) -> None:
    loss = streampetr_loss(backend="scipy")
    small, small_targets = streampetr_case([2, 5], layers=1, queries=20, groups=0, gen=gen)
    big, big_targets = streampetr_case([30, 1], layers=1, queries=20, groups=0, gen=gen)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss(small, small_targets)
        assert int(loss.counts["unassigned_gt"]) == 0
        loss(big, big_targets)
        loss(big, big_targets)
    assert int(loss.counts["unassigned_gt"]) == 10
    (warned,) = [w for w in caught if "ground truths" in str(w.message)]
    assert str(warned.message).startswith("gt_boxes: a batch holds up to 30 ground truths per sample")
    with pytest.raises(TypeError, match="gt_boxes: expected a RaggedBatch"):
        loss(small, {"gt_boxes": small_targets["gt_boxes"].to_list(), "gt_labels": small_targets["gt_labels"]})


def test_compiled_streampetr_loss_equals_eager_with_more_ground_truth_than_queries(gen: torch.Generator) -> None:
    torch._dynamo.reset()
    try:
        recorder = Recorder()
        loss = streampetr_loss(backend="scipy")
        outputs, targets = streampetr_case([0, 25, 7, 40], layers=2, queries=20, groups=2, gen=gen)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert_bit_equal(*both(loss, outputs, targets, {"backend": recorder}))
        assert graph_breaks() == 0 and recorder.calls("drivetrain.solve_scipy") == 1
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------- training
def test_training_on_frames_with_more_ground_truth_than_queries_finishes_and_logs_the_count(
    synth_index, synth_root, tmp_path, capsys
) -> None:
    """The issue's case end to end (531 boxes, 132 queries there; up to 41 boxes and 12 queries here): the run
    finishes, saves its checkpoint, warns once, and logs per step Σ max(M_b − Q, 0) over the step's frames."""
    from drivetrain.cli.main import main
    from drivetrain.data.sources import frames
    from drivetrain.engine import Checkpointer

    model = {**SMALL, "num_query": 8, "num_propagated": 4}
    queries = model["num_query"] + model["num_propagated"]
    index = synth_root / "drivetrain_index.npz"
    argv = ["train", "--config", str(ROOT / "configs" / "streampetr_tiny.yaml"), f"run.out_dir={tmp_path}",
            "run.threads=1", "run.deterministic=true", "log.progress=false", "log.tensorboard=false", "log.every=1",
            f"model.args={json.dumps(model)}", "data.name=drivetrain.data.sources:frames",
            f"data.args={{index: {index}, split: mini_train}}", "train.device=cpu", "train.steps=3",
            "checkpoint.every=100"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count(f"more than the {queries} queries") == 1
    assert [step for step, _ in Checkpointer(tmp_path / "checkpoints").committed()] == [3]

    dataset = frames(str(index), split="mini_train")
    sampler = iter(dataset.batch_sampler(2, seed=0, shuffle=True, rank=0, world_size=1))
    expected = []
    for _ in range(3):
        sizes = dataset.collate([dataset[key] for key in next(sampler)]).gt_boxes.sizes
        expected.append(float((sizes - queries).clamp(min=0).sum()))
    assert sum(expected) > 0, "the test frames must hold more boxes than queries"
    assert [m["count/unassigned_gt"] for m in metrics(tmp_path)] == expected
