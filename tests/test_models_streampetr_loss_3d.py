"""StreamPETRLoss (models/streampetr/loss.py): batched == per-sample reference on every term and gradient, edge
cases, the published normalisation and weights, fp32 for half inputs, no host sync in the batched path apart
from the one solver transfer, bad input."""

from __future__ import annotations

import pytest
import torch

from drivetrain.losses.term_weights import base_name, weighted_total
from drivetrain.models.streampetr.loss import streampetr_loss
from helpers.heads import (
    assert_cuda_syncs_only_inside_the_solver,
    assert_paths_agree,
    assert_syncs_only_inside_the_one_solver_call,
    assert_warmed_auto_loss_uses_the_kernel,
    run,
    streampetr_case,
)


@pytest.mark.parametrize("groups", [0, 3])
@pytest.mark.parametrize("num_gt", [[0, 1, 7, 12], [5], [0, 0, 3]])
def test_streampetr_batched_equals_reference(num_gt, groups, gen):
    outputs, targets = streampetr_case(num_gt, layers=3, queries=40, groups=groups, gen=gen)
    loss = streampetr_loss(backend="scipy")
    terms = assert_paths_agree(loss, outputs, targets)
    expected = {"loss_cls", "loss_bbox", "d0.loss_cls", "d0.loss_bbox", "d1.loss_cls", "d1.loss_bbox"}
    if groups:
        expected |= {"dn_loss_cls", "dn_loss_bbox", "d0.dn_loss_cls", "d0.dn_loss_bbox", "d1.dn_loss_cls"}
    assert expected <= set(terms)


def test_streampetr_without_ground_truth_gives_zero_box_loss_and_finite_gradients(gen):
    outputs, targets = streampetr_case([0, 0], layers=2, queries=20, groups=2, gen=gen)
    loss = streampetr_loss(backend="scipy")
    for impl in ("reference", "batched"):
        terms, grads = run(loss, outputs, targets, impl)
        assert float(terms["loss_bbox"].detach()) == 0.0 and float(terms["dn_loss_bbox"].detach()) == 0.0
        assert float(terms["loss_cls"].detach()) > 0  # every query is background and still trained
        assert all(torch.isfinite(g).all() for g in grads)
    assert_paths_agree(loss, outputs, targets)


def test_streampetr_normalisation_matches_the_published_formula(gen):
    outputs, targets = streampetr_case([4, 2], layers=1, queries=30, groups=2, gen=gen)
    loss = streampetr_loss(backend="scipy")
    terms, _ = run(loss, outputs, targets, "batched")
    # DN classification is divided by groups·T·(3.14159/6)·0.75³ with T = 6 ground truths.
    dn_factor = 2 * 6 * 3.14159 / 6 * 0.75**3
    loss_plain = streampetr_loss(backend="scipy", dn_split=1.0)
    terms_plain, _ = run(loss_plain, outputs, targets, "batched")
    ratio = float(terms["dn_loss_cls"].detach() / terms_plain["dn_loss_cls"].detach())
    assert ratio == pytest.approx((2 * 6 * 3.14159 / 6) / dn_factor, rel=1e-5)
    total = weighted_total(terms, loss.weights)
    manual = sum(loss.weights[base_name(k)] * v for k, v in terms.items())
    assert torch.allclose(total, manual)
    assert loss.weights[base_name("d2.loss_cls")] == 2.0 and loss.weights["loss_bbox"] == 0.25


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_losses_compute_in_fp32_for_half_inputs(dtype, gen):
    outputs, targets = streampetr_case([3, 5], layers=2, queries=30, groups=2, gen=gen)
    loss = streampetr_loss(backend="scipy")
    terms, grads = run(loss, outputs, targets, "batched", dtype=dtype)
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in terms.values())
    assert all(g.dtype == dtype for g in grads)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        terms = loss(outputs, targets)
    assert all(v.dtype == torch.float32 for v in terms.values())


def test_batched_loss_syncs_only_inside_the_one_solver_call(gen, monkeypatch):
    assert_syncs_only_inside_the_one_solver_call("streampetr", gen, monkeypatch)


def test_auto_loss_after_its_warm_up_runs_the_gpu_kernel_without_a_fallback(gen, monkeypatch):
    """What the CUDA sync check below relies on, on the CPU with the recording stand-in for the Triton kernel: after
    the warm-up call and the compile of what it met, the measured call takes the kernel, not SciPy."""
    import test_match_solve_buckets as buckets

    assert_warmed_auto_loss_uses_the_kernel("streampetr", gen, buckets.install_recording_kernel(monkeypatch))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batched_loss_on_cuda_syncs_only_inside_the_solver(gen, monkeypatch):
    assert_cuda_syncs_only_inside_the_solver("streampetr", gen, monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batched_streampetr_loss_on_cuda_matches_cpu(gen):
    outputs, targets = streampetr_case([2, 7, 0], layers=2, queries=50, groups=3, gen=gen)
    loss = streampetr_loss(backend="scipy")
    cpu_terms, _ = run(loss, outputs, targets, "batched")
    cuda_out = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
    cuda_targets = {k: v.to("cuda") for k, v in targets.items()}
    cuda_terms, _ = run(loss.cuda(), cuda_out, cuda_targets, "batched")
    for key, value in cpu_terms.items():
        torch.testing.assert_close(cuda_terms[key].cpu(), value, rtol=1e-4, atol=1e-6)


def test_bad_streampetr_loss_inputs_name_the_field(gen):
    outputs, targets = streampetr_case([2, 3], layers=2, queries=20, groups=2, gen=gen)
    loss = streampetr_loss(backend="scipy")
    with pytest.raises(KeyError, match="gt_labels"):
        loss(outputs, {"gt_boxes": targets["gt_boxes"]})
    with pytest.raises(ValueError, match="cls_logits"):
        loss({**outputs, "cls_logits": outputs["cls_logits"][0]}, targets)
    with pytest.raises(ValueError, match="classes"):
        loss({**outputs, "cls_logits": outputs["cls_logits"][..., :5]}, targets)
    with pytest.raises(ValueError, match="dn_groups"):
        loss({**outputs, "dn_groups": 4}, targets)
    with pytest.raises(ValueError, match="dn_background"):
        loss({**outputs, "dn_background": outputs["dn_background"].float()}, targets)
