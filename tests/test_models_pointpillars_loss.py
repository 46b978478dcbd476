"""PointPillars' anchor-head loss: batched == per-sample reference (terms and gradients), hand-worked numbers,
the no-positive and zero-GT cases, and no host sync in the batched path."""

from __future__ import annotations

import math

import pytest
import torch
from tests.helpers.boxes import random_boxes3d
from tests.helpers.nosync import no_host_sync

from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.pointpillars.args import PointPillarsArgs
from drivetrain.models.pointpillars.loss import (
    AVG_EPS,
    AnchorHeadLoss,
    batched_anchor_head_loss,
    reference_anchor_head_loss,
)
from drivetrain.models.pointpillars.paths import model_path
from drivetrain.models.pointpillars.recipe import LOSS_WEIGHTS, LYFT_CODE_WEIGHTS, NUS_CODE_WEIGHTS, NUS_DIR_OFFSET
from drivetrain.ragged import RaggedBatch

TERMS = ("loss_cls", "loss_bbox", "loss_dir")
NUM_CLASSES = 10
NUM_ANCHORS = 96
NUS = {"code_weights": NUS_CODE_WEIGHTS, "dir_offset": NUS_DIR_OFFSET}  # the nuScenes PointPillars' constants


# Tolerance. The box and direction summands are the same float32 ops on the same values (bit for bit); the
# focal summands come from two formulas (the reference's BCE·(αt + (1−α)(1−t))·pt^γ; the batched path's
# (1−α)σ(s)^γ softplus(s), or ασ(−s)^γ softplus(−s) at the label), each a product of ≤ 7 correctly rounded or
# ≤ 2-ulp library results of non-negative factors: ≤ ~16 u = 9.6e-7 relative apart per element (u = 2^-24).
# The order of the final sums differs too ((B·A, C) rows concatenated vs per-row sums of a (B, A, C) tensor,
# positives selected vs masked); every summand is ≥ 0 and torch reduces float32 in blocked/pairwise order, so
# each sum carries ≤ ⌈log2 K⌉·eps with K ≤ 3·96·10 < 2^12 summands: ≤ 1.4e-6 per path. In all ≤ ~3.8e-6
# between the two paths, under the 1e-5 bound used here. Gradients are elementwise (∂ℓ_i/∂x_i / N with
# the same N; the batched path's in closed form, a sum of same-sign terms, no cancellation) and need no sum: the
# same relative bound, with an absolute floor of 1e-9 for entries near zero (where the reference's autograd
# chain, through 1 − σ(s) rounded near s ≫ 0, is the less accurate of the two; measured against float64).
RTOL = 1e-5
GRAD_ATOL = 1e-9


def _criterion(num_classes: int = NUM_CLASSES) -> AnchorHeadLoss:
    """The loss as PointPillars builds it for nuScenes (its recipe's constants)."""
    return AnchorHeadLoss(num_classes, **NUS, weights=LOSS_WEIGHTS)


def _batch(
    sizes: list[int],
    gen: torch.Generator,
    *,
    dim: int = 9,
    no_positives: bool = False,
    num_anchors: int = NUM_ANCHORS,
):
    """Random predictions, anchors, GT and an assignment with ignored, negative and positive anchors."""
    batch = len(sizes)
    velocity = dim == 9
    anchors = random_boxes3d(num_anchors, gen, velocity=velocity)  # (A, D)
    gt_list = [random_boxes3d(n, gen, velocity=velocity) for n in sizes]
    labels_list = [torch.randint(0, NUM_CLASSES, (n,), generator=gen) for n in sizes]
    assigned = []
    for n in sizes:
        draw = torch.randint(-1, n + 1, (num_anchors,), generator=gen)  # −1 ignore, 0 negative, k ≥ 1 positive
        if no_positives or n == 0:
            draw = draw.clamp(max=0)  # only ignored and negative anchors
        assigned.append(draw)
    pred_cls = torch.randn(batch, num_anchors, NUM_CLASSES, generator=gen).requires_grad_()
    pred_boxes = torch.randn(batch, num_anchors, dim, generator=gen).requires_grad_()
    pred_dir = torch.randn(batch, num_anchors, 2, generator=gen).requires_grad_()
    gt_boxes = RaggedBatch.from_list(gt_list)
    gt_labels = RaggedBatch.from_list(labels_list)
    return pred_cls, pred_boxes, pred_dir, anchors, torch.stack(assigned), gt_boxes, gt_labels


def _both(inputs, code_weights=NUS_CODE_WEIGHTS):
    pred_cls, pred_boxes, pred_dir, anchors, assigned, gt_boxes, gt_labels = inputs
    options = {"code_weights": code_weights, "dir_offset": NUS_DIR_OFFSET}
    batched = batched_anchor_head_loss(
        pred_cls, pred_boxes, pred_dir, anchors, assigned, gt_boxes, gt_labels, **options
    )
    reference = reference_anchor_head_loss(
        list(pred_cls),
        list(pred_boxes),
        list(pred_dir),
        anchors,
        list(assigned),
        gt_boxes.to_list(),
        gt_labels.to_list(),
        **options,
    )
    return batched, reference


def _grads(term: torch.Tensor, preds) -> list[torch.Tensor]:
    return list(torch.autograd.grad(term, preds, allow_unused=True, retain_graph=True))


def _assert_paths_agree(inputs, code_weights=NUS_CODE_WEIGHTS) -> dict[str, torch.Tensor]:
    batched, reference = _both(inputs, code_weights)
    preds = inputs[:3]
    assert set(batched) == set(reference) == set(TERMS)
    for name in TERMS:
        torch.testing.assert_close(batched[name], reference[name], rtol=RTOL, atol=0.0, msg=name)
        for got, want in zip(_grads(batched[name], preds), _grads(reference[name], preds), strict=True):
            got = torch.zeros_like(preds[0]) if got is None else got
            want = torch.zeros_like(got) if want is None else want
            torch.testing.assert_close(got, want, rtol=RTOL, atol=GRAD_ATOL, msg=f"grad of {name}")
    return batched


@pytest.mark.parametrize(
    ("sizes", "dim"),
    [([4], 9), ([5, 0, 3], 9), ([0, 7, 2], 7), ([1], 7)],
    ids=["B1", "B3-zero-gt", "B3-lyft", "B1-lyft-one-gt"],
)
def test_batched_matches_reference_terms_and_gradients(sizes: list[int], dim: int) -> None:
    gen = torch.Generator().manual_seed(len(sizes) * 10 + dim)
    inputs = _batch(sizes, gen, dim=dim)
    assert bool((inputs[4] > 0).any()) and bool((inputs[4] == -1).any())  # positives and ignored anchors exist
    code_weights = NUS_CODE_WEIGHTS if dim == 9 else LYFT_CODE_WEIGHTS
    terms = _assert_paths_agree(inputs, code_weights)
    assert all(float(terms[name].detach()) > 0 for name in TERMS)


def test_zero_gt_sample_ignores_its_assignment_as_the_original() -> None:
    # A sample without GT makes every anchor a negative (label weight 1), even ones the assigner left at −1.
    gen = torch.Generator().manual_seed(3)
    inputs = list(_batch([0, 2], gen))
    inputs[4][0] = torch.full((NUM_ANCHORS,), -1)
    batched = _assert_paths_agree(tuple(inputs))
    inputs[4][0] = 0
    again = batched_anchor_head_loss(*inputs, **NUS)
    for name in TERMS:
        torch.testing.assert_close(again[name], batched[name], rtol=0, atol=0)


@pytest.mark.parametrize("sizes", [[3], [2, 0, 4], [0, 0]], ids=["B1", "B3", "no-gt"])
def test_no_positive_gives_zero_box_and_dir_terms_with_zero_gradient(sizes: list[int]) -> None:
    gen = torch.Generator().manual_seed(4)
    inputs = _batch(sizes, gen, no_positives=True)
    terms = _assert_paths_agree(inputs)
    pred_boxes, pred_dir = inputs[1:3]
    for name in ("loss_bbox", "loss_dir"):
        assert float(terms[name].detach()) == 0.0
        grads = torch.autograd.grad(terms[name], (pred_boxes, pred_dir), allow_unused=True, retain_graph=True)
        assert all(g is None or not bool(g.any()) for g in grads)
    # N = Σ_b max(0, 1) = B: the classification term is the focal sum over non-ignored anchors divided by B.
    assert float(terms["loss_cls"].detach()) > 0


def test_non_finite_predictions_of_non_positive_anchors_do_not_reach_the_box_terms() -> None:
    # The original never reads the box and direction predictions of non-positive anchors: an inf or a NaN there
    # must leave the batched box and direction terms and their gradients as they were.
    gen = torch.Generator().manual_seed(8)
    inputs = list(_batch([4, 2], gen))
    clean = batched_anchor_head_loss(*inputs, **NUS)
    grads = _grads(clean["loss_bbox"] + clean["loss_dir"], inputs[1:3])
    outside = inputs[4] <= 0  # (B, A) ignored and negative anchors
    boxes, dirs = inputs[1].detach().clone(), inputs[2].detach().clone()
    boxes[outside], dirs[outside] = float("nan"), float("inf")
    inputs[1], inputs[2] = boxes.requires_grad_(), dirs.requires_grad_()
    dirty = batched_anchor_head_loss(*inputs, **NUS)
    for name in ("loss_bbox", "loss_dir"):
        torch.testing.assert_close(dirty[name], clean[name], rtol=0, atol=0)
    for got, want in zip(_grads(dirty["loss_bbox"] + dirty["loss_dir"], inputs[1:3]), grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_hand_worked_two_anchors_one_gt() -> None:
    # Anchor 0 matches the GT (label 1), anchor 1 is a negative; C = 2; all class and box predictions 0.
    anchors = torch.tensor(
        [[0.0, 0.0, -1.0, 3.0, 4.0, 2.0, 0.0, 0.0, 0.0], [10.0, 10.0, -1.0, 3.0, 4.0, 2.0, 1.57, 0.0, 0.0]]
    )
    gt = torch.tensor([[1.5, -2.5, 0.0, 6.0, 2.0, 1.0, 0.5, 1.0, -2.0]])
    pred_cls = torch.zeros(1, 2, 2, requires_grad=True)
    pred_boxes = torch.zeros(1, 2, 9, requires_grad=True)
    pred_dir = torch.tensor([[[1.0, 0.0], [0.0, 3.0]]], requires_grad=True)
    assigned = torch.tensor([[1, 0]])
    gt_boxes, gt_labels = RaggedBatch.from_list([gt]), RaggedBatch.from_list([torch.tensor([1])])
    n = 1 + AVG_EPS  # one positive; mmdet divides by avg_factor + eps

    # Focal at p = 0.5: BCE = ln 2, factor α·0.5² for a positive entry, (1 − α)·0.5² for a negative one.
    # Anchor 0: class 0 negative, class 1 positive; anchor 1: two negatives.
    loss_cls = (0.75 * 0.25 + 0.25 * 0.25 + 2 * 0.75 * 0.25) * math.log(2) / n
    # Targets (see the coder test): (0.3, −0.5, 0.5, ln 2, −ln 2, −ln 2, 0.5, 1, −2); the sine difference turns
    # slot 6 into sin(0)·cos(0.5) − cos(0)·sin(0.5). Every |d| ≥ β = 1/9, so each entry is |d| − 1/18.
    diffs = [0.3, 0.5, 0.5, math.log(2), math.log(2), math.log(2), math.sin(0.5), 1.0, 2.0]
    weights = [1.0] * 7 + [0.2, 0.2]
    loss_bbox = sum(w * (d - 1 / 18) for w, d in zip(weights, diffs, strict=True)) / n
    # Yaw 0.5 + 0.7854 < π: bin 0; CE of logits (1, 0) for class 0 is ln(1 + e^−1).
    loss_dir = math.log(1 + math.exp(-1)) / n
    expected = {"loss_cls": loss_cls, "loss_bbox": loss_bbox, "loss_dir": loss_dir}

    criterion = _criterion(num_classes=2)
    for impl in ("batched", "reference"):
        terms = getattr(criterion, impl)(pred_cls, pred_boxes, pred_dir, anchors, assigned, gt_boxes, gt_labels)
        for name, value in expected.items():
            assert float(terms[name].detach()) == pytest.approx(value, rel=1e-6), (impl, name)
        total = weighted_total(terms, criterion.weights)
        assert float(total.detach()) == pytest.approx(loss_cls + loss_bbox + 0.2 * loss_dir, rel=1e-6)


def test_the_weights_given_are_applied_once() -> None:
    criterion = _criterion()
    assert criterion.weights == {"loss_cls": 1.0, "loss_bbox": 1.0, "loss_dir": 0.2}  # the configs' loss_weight
    terms = {name: torch.tensor(float(i + 1)) for i, name in enumerate(TERMS)}
    assert float(weighted_total(terms, criterion.weights)) == pytest.approx(1.0 + 2.0 + 0.2 * 3.0)
    other = AnchorHeadLoss(NUM_CLASSES, **NUS, weights={"loss_cls": 2.0, "loss_bbox": 0.5, "loss_dir": 1.0})
    assert float(weighted_total(terms, other.weights)) == pytest.approx(2.0 + 0.5 * 2.0 + 1.0 * 3.0)
    with pytest.raises(ValueError, match="weights"):
        AnchorHeadLoss(NUM_CLASSES, **NUS, weights={"loss_cls": 1.0, "loss_bbox": 1.0})


def test_criterion_runs_both_paths_and_checks_shapes() -> None:
    gen = torch.Generator().manual_seed(5)
    inputs = _batch([3, 1], gen)
    criterion = _criterion()
    batched, reference = criterion.batched(*inputs), criterion.reference(*inputs)
    for name in TERMS:
        torch.testing.assert_close(batched[name], reference[name], rtol=RTOL, atol=0.0)
    with pytest.raises(ValueError, match="pred_boxes"):
        criterion.batched(inputs[0], inputs[1][..., :7], *inputs[2:])
    with pytest.raises(ValueError, match="code_weights"):
        criterion.batched(inputs[0], inputs[1][..., :7], inputs[2], inputs[3][:, :7], *inputs[4:])
    with pytest.raises(ValueError, match="impl"):
        model_path(PointPillarsArgs(impl="fast"))  # the one place that reads impl


def test_batched_loss_has_no_host_sync() -> None:
    gen = torch.Generator().manual_seed(6)
    inputs = _batch([4, 0, 2], gen)
    batched_anchor_head_loss(*inputs, **NUS)  # warm-up: constant() copies the code weights once per device
    with no_host_sync():
        terms = batched_anchor_head_loss(*inputs, **NUS)
        total = weighted_total(terms, _criterion().weights)
        total.backward()
    assert inputs[0].grad is not None and inputs[1].grad is not None and inputs[2].grad is not None


def test_half_inputs_are_computed_in_fp32() -> None:
    gen = torch.Generator().manual_seed(7)
    pred_cls, pred_boxes, pred_dir, *rest = _batch([3, 2], gen)
    half = [t.detach().half() for t in (pred_cls, pred_boxes, pred_dir)]
    terms = batched_anchor_head_loss(*half, *rest, **NUS)
    assert all(terms[name].dtype == torch.float32 for name in TERMS)
    reference = batched_anchor_head_loss(*[t.float() for t in half], *rest, **NUS)
    for name in TERMS:
        torch.testing.assert_close(terms[name], reference[name], rtol=0, atol=0)


# ------------------------------------------------------------------------------------------- window pairs
# The pair path sums the same summands (each positive once, at its own GT's pair; computed by the same float32
# operations on the same values, so equal up to the library's vectorised/scalar transcendental paths, ≤ 1 ulp
# each) in pair order instead of anchor order: the RTOL derivation above covers it (K < 2^17 summands here:
# ≤ 17 eps = 2.0e-6 per sum). Gradients are elementwise and need no sum: the same bound.
def _windowed(per_class: bool, sizes: list[int], gen: torch.Generator, grid_size: int = 32):
    from drivetrain.match.anchor_window import windowed_max_iou_assign_with_pairs
    from drivetrain.match.max_iou import anchor_thresholds
    from drivetrain.models.pointpillars.anchors import grid_anchors, grid_layout, per_class_anchors, per_class_layout
    from drivetrain.models.pointpillars.recipe import NUS_PP_ASSIGNER
    from test_match_max_iou import PER_CLASS_SIZES, SSN_CFGS, TINY, batch_of, scene

    if per_class:
        sizes_per_class = tuple((4 * ny, 4 * nx) for ny, nx in PER_CLASS_SIZES)  # large enough for sparse windows
        anchors, classes = per_class_anchors(TINY, sizes_per_class)
        grid, th = per_class_layout(TINY, sizes_per_class), anchor_thresholds(SSN_CFGS, anchor_classes=classes)
    else:
        anchors, classes = grid_anchors(TINY, (grid_size, grid_size)), None
        grid = grid_layout(TINY, (grid_size, grid_size))
        th = anchor_thresholds(NUS_PP_ASSIGNER, num_anchors=anchors.shape[0])
    gt_boxes, gt_labels = batch_of([scene(anchors, n, 3, gen) for n in sizes])
    assigned, pairs = windowed_max_iou_assign_with_pairs(anchors, grid, gt_boxes, gt_labels, th, anchor_classes=classes)
    assert pairs is not None and int((assigned > 0).sum()) >= 1  # positives: the box terms are not empty
    batch, num_anchors = len(sizes), anchors.shape[0]
    pred_cls = torch.randn(batch, num_anchors, NUM_CLASSES, generator=gen).requires_grad_()
    pred_boxes = torch.randn(batch, num_anchors, 9, generator=gen).requires_grad_()
    pred_dir = torch.randn(batch, num_anchors, 2, generator=gen).requires_grad_()
    return (pred_cls, pred_boxes, pred_dir, anchors, assigned, gt_boxes, gt_labels), pairs


@pytest.mark.parametrize("per_class", [False, True], ids=["pointpillars", "ssn-per-class"])
@pytest.mark.parametrize("sizes", [[6, 0, 9], [4]], ids=["B3-zero-gt", "B1"])
def test_window_pairs_give_the_dense_terms_and_gradients(per_class: bool, sizes: list[int]) -> None:
    gen = torch.Generator().manual_seed(11 + len(sizes))
    inputs, pairs = _windowed(per_class, sizes, gen)
    assert pairs.flat.numel() < inputs[4].numel()  # fewer pairs than anchors: the pair path runs
    dense = batched_anchor_head_loss(*inputs, **NUS)
    sparse = batched_anchor_head_loss(*inputs, **NUS, pairs=pairs)
    via_criterion = _criterion().batched(*inputs, pairs=pairs)
    for name in TERMS:
        torch.testing.assert_close(sparse[name], dense[name], rtol=RTOL, atol=0.0, msg=name)
        torch.testing.assert_close(via_criterion[name], sparse[name], rtol=0, atol=0, msg=name)
        pairs_of = zip(_grads(sparse[name], inputs[:3]), _grads(dense[name], inputs[:3]), inputs[:3], strict=True)
        for got, want, pred in pairs_of:
            got = torch.zeros_like(pred) if got is None else got
            want = torch.zeros_like(pred) if want is None else want
            torch.testing.assert_close(got, want, rtol=RTOL, atol=GRAD_ATOL, msg=f"grad of {name}")
    assert float(sparse["loss_bbox"].detach()) > 0 and float(sparse["loss_dir"].detach()) > 0
    if not per_class:  # and the original's per-sample loss
        _assert_paths_agree(inputs)


def test_more_pairs_than_anchors_take_the_dense_path() -> None:
    gen = torch.Generator().manual_seed(23)
    inputs, pairs = _windowed(False, [24, 30], gen, grid_size=4)  # small grid, many GTs: windows overlap
    assert pairs.flat.numel() >= inputs[4].numel()
    dense = batched_anchor_head_loss(*inputs, **NUS)
    given = batched_anchor_head_loss(*inputs, **NUS, pairs=pairs)
    for name in TERMS:
        torch.testing.assert_close(given[name], dense[name], rtol=0, atol=0)


def test_window_pairs_keep_non_finite_predictions_of_non_positive_anchors_out() -> None:
    gen = torch.Generator().manual_seed(21)
    inputs, pairs = _windowed(False, [5, 7], gen)
    inputs = list(inputs)
    clean = batched_anchor_head_loss(*inputs, **NUS, pairs=pairs)
    grads = _grads(clean["loss_bbox"] + clean["loss_dir"], inputs[1:3])
    outside = inputs[4] <= 0  # (B, A): inside some window, but not a positive
    boxes, dirs = inputs[1].detach().clone(), inputs[2].detach().clone()
    boxes[outside], dirs[outside] = float("nan"), float("inf")
    inputs[1], inputs[2] = boxes.requires_grad_(), dirs.requires_grad_()
    dirty = batched_anchor_head_loss(*inputs, **NUS, pairs=pairs)
    for name in ("loss_bbox", "loss_dir"):
        torch.testing.assert_close(dirty[name], clean[name], rtol=0, atol=0)
    for got, want in zip(_grads(dirty["loss_bbox"] + dirty["loss_dir"], inputs[1:3]), grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_window_pair_loss_has_no_host_sync() -> None:
    gen = torch.Generator().manual_seed(22)
    inputs, pairs = _windowed(True, [4, 0, 3], gen)
    batched_anchor_head_loss(*inputs, **NUS, pairs=pairs)  # warm-up (code weights copied once per device)
    with no_host_sync():
        terms = batched_anchor_head_loss(*inputs, **NUS, pairs=pairs)
        weighted_total(terms, _criterion().weights).backward()
    assert all(t.grad is not None for t in inputs[:3])
