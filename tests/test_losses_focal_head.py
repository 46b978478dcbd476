"""FocalHeadLoss (losses/focal_head.py): batched == per-image reference on every term and
gradient, images without ground truth, no host sync in the batched path apart from the one solver transfer, bad
input."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.losses.focal_head import focal_head_loss
from helpers.heads import (
    assert_cuda_syncs_only_inside_the_solver,
    assert_paths_agree,
    assert_syncs_only_inside_the_one_solver_call,
    assert_warmed_auto_loss_uses_the_kernel,
    focal_case,
    run,
    total,
)


@pytest.mark.parametrize("num_gt", [[[0, 3, 1], [6, 0, 2]], [[0, 0], [0, 0]], [[9]]])
def test_focal_head_batched_equals_reference(num_gt, gen):
    outputs, targets = focal_case(num_gt, gen)
    loss = focal_head_loss(backend="scipy")
    terms = assert_paths_agree(loss, outputs, targets)
    assert set(terms) == set(loss.weights)


def test_focal_head_without_ground_truth_trains_only_background(gen):
    outputs, targets = focal_case([[0, 0]], gen)
    terms, grads = run(focal_head_loss(backend="scipy"), outputs, targets, "batched")
    for key in ("enc_loss_bbox", "enc_loss_iou", "centers2d_loss"):
        assert float(terms[key].detach()) == 0.0
    assert float(terms["enc_loss_cls"].detach()) > 0 and float(terms["centerness_loss"].detach()) > 0
    assert all(torch.isfinite(g).all() for g in grads)


def test_batched_loss_syncs_only_inside_the_one_solver_call(gen, monkeypatch):
    assert_syncs_only_inside_the_one_solver_call("focal_head", gen, monkeypatch)


def test_auto_loss_after_its_warm_up_runs_the_gpu_kernel_without_a_fallback(gen, monkeypatch):
    """What the CUDA sync check below relies on, on the CPU with the recording stand-in for the Triton kernel: after
    the warm-up call and the compile of what it met, the measured call takes the kernel, not SciPy."""
    import test_match_solve_buckets as buckets

    assert_warmed_auto_loss_uses_the_kernel("focal_head", gen, buckets.install_recording_kernel(monkeypatch))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batched_loss_on_cuda_syncs_only_inside_the_solver(gen, monkeypatch):
    assert_cuda_syncs_only_inside_the_solver("focal_head", gen, monkeypatch)


def test_bad_focal_head_loss_inputs_name_the_field(gen):
    focal_out, focal_targets = focal_case([[1, 2]], gen)
    with pytest.raises(ValueError, match="centerness"):
        focal_head_loss()({**focal_out, "centerness": focal_out["centerness"][..., :3]}, focal_targets)
    focal_loss = focal_head_loss(backend="scipy")
    assert math.isfinite(float(total(focal_loss, focal_loss(focal_out, focal_targets))))
