"""Inputs of the two detection-head criteria (StreamPETR, focal head) and the checks both run: reference ==
batched on every term and gradient, and no host sync outside the one solver call."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import drivetrain.match.assigners as assigners_module
from drivetrain.losses.focal_head import focal_head_loss
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.streampetr.loss import streampetr_loss
from drivetrain.ragged import RaggedBatch
from helpers.boxes import random_boxes3d
from helpers.nosync import HostSyncError, allow_host_sync, no_host_sync

C = 10


def streampetr_case(num_gt: list[int], layers: int, queries: int, groups: int, gen: torch.Generator) -> tuple:
    batch = len(num_gt)
    targets = {
        "gt_boxes": RaggedBatch.from_list([random_boxes3d(n, gen) for n in num_gt]),
        "gt_labels": RaggedBatch.from_list([torch.randint(0, C, (n,), generator=gen) for n in num_gt]),
    }
    outputs = {
        "cls_logits": torch.randn(layers, batch, queries, C, generator=gen),
        "box_codes": torch.randn(layers, batch, queries, 10, generator=gen) * 2,
    }
    if groups:
        num_dn = groups * max(num_gt)  # one DN query per ground truth and group (none without ground truth)
        outputs["dn_cls_logits"] = torch.randn(layers, batch, num_dn, C, generator=gen)
        outputs["dn_box_codes"] = torch.randn(layers, batch, num_dn, 10, generator=gen)
        outputs["dn_background"] = torch.rand(batch, num_dn, generator=gen) > 0.7
        outputs["dn_groups"] = groups
    return outputs, targets


def focal_case(num_gt: list[list[int]], gen: torch.Generator, hf: int = 4, wf: int = 11) -> tuple:
    stride, width, height = 16, wf * 16, hf * 16
    boxes, labels, centres = [], [], []
    for row in num_gt:
        boxes.append([])
        labels.append([])
        centres.append([])
        for n in row:
            centre = torch.rand(n, 2, generator=gen) * torch.tensor([width - 8.0, height - 8.0]) + 4
            half = torch.rand(n, 2, generator=gen) * 20 + 2
            shift = (torch.rand(n, 2, generator=gen) - 0.5) * half
            xyxy = torch.cat([centre - half + shift, centre + half + shift], -1).clamp(min=0)
            boxes[-1].append(torch.minimum(xyxy, torch.tensor([width, height, width, height], dtype=torch.float32)))
            labels[-1].append(torch.randint(0, C, (n,), generator=gen))
            centres[-1].append(centre)
    batch, cams, q = len(num_gt), len(num_gt[0]), hf * wf
    outputs = {
        "cls_logits": torch.randn(batch, cams, q, C, generator=gen),
        "boxes": torch.rand(batch, cams, q, 4, generator=gen) * 0.3 + 0.1,
        "centres": torch.rand(batch, cams, q, 2, generator=gen),
        "centerness": torch.randn(batch, cams, hf, wf, generator=gen),
    }
    targets = {
        "gt_boxes_2d": RaggedBatch.from_list(boxes),
        "gt_labels_2d": RaggedBatch.from_list(labels),
        "centers_2d": RaggedBatch.from_list(centres),
        "image_size": (width, height),
    }
    assert stride == 16
    return outputs, targets


def path(loss: torch.nn.Module, impl: str) -> Callable[..., dict[str, torch.Tensor]]:
    """A camera loss's ``impl`` path: calling the loss is the batched path, its ``reference`` method the other."""
    return {"batched": loss, "reference": loss.reference}[impl]


def total(loss: torch.nn.Module, terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """The training objective of ``terms``: their sum weighted by ``loss.weights``, as the engine weights them."""
    return weighted_total(terms, loss.weights)


def run(loss: torch.nn.Module, outputs: dict, targets: dict, impl: str, dtype: torch.dtype = torch.float32):
    leaves = {
        k: v.detach().to(dtype).requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in outputs.items()
    }
    terms = path(loss, impl)(leaves, targets)
    tensors = [v for v in leaves.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    grads = torch.autograd.grad(total(loss, terms), tensors)
    return terms, grads


def assert_paths_agree(loss: torch.nn.Module, outputs: dict, targets: dict, rel: float = 1e-5) -> dict:
    """The reference and batched paths agree in every term and gradient.

    The loss terms are sums of non-negative per-element losses over up to L·B·Q·C = 6·8·900·10 elements,
    summed in float32 in different orders (one flat reduction vs per layer and sample, then a Python sum).
    torch sums cascaded: each order is within (log2 n + 2)·eps ≈ 21·1.2e-7 relative of the exact sum of
    non-negative terms, so the two differ by < 5e-6 relative: rel = 1e-5. Gradients are elementwise
    (no reduction) apart from the normaliser: 1e-7 absolute, scaled by the gradient's magnitude.
    """
    ref_terms, ref_grads = run(loss, outputs, targets, "reference")
    bat_terms, bat_grads = run(loss, outputs, targets, "batched")
    assert set(ref_terms) == set(bat_terms)
    for key, ref in ref_terms.items():
        assert torch.isfinite(bat_terms[key]), key
        torch.testing.assert_close(bat_terms[key], ref, rtol=rel, atol=1e-7, msg=key)
    for ref, bat in zip(ref_grads, bat_grads, strict=True):
        assert torch.isfinite(bat).all()
        scale = float(ref.abs().max()) if ref.numel() else 1.0
        torch.testing.assert_close(bat, ref, rtol=rel, atol=1e-7 * max(1.0, scale))
    return bat_terms


def head_case(head: str, backend: str, gen: torch.Generator) -> tuple:
    """Inputs and loss module of one head, with 0-GT, few-GT and more-GT samples (or images)."""
    if head == "streampetr":
        outputs, targets = streampetr_case([0, 4, 9], layers=2, queries=30, groups=2, gen=gen)
        return outputs, targets, streampetr_loss(backend=backend)
    outputs, targets = focal_case([[0, 3], [5, 1]], gen)
    return outputs, targets, focal_head_loss(backend=backend)


def assert_syncs_only_inside_the_one_solver_call(head: str, gen: torch.Generator, monkeypatch) -> None:
    """The batched loss and its backward read nothing on the host except inside the single solver call."""
    outputs, targets, loss = head_case(head, "scipy", gen)
    real_solve, calls = assigners_module.solve, []

    def solve_with_sync(*args, **kwargs):
        calls.append(1)
        with allow_host_sync():
            return real_solve(*args, **kwargs)

    monkeypatch.setattr(assigners_module, "solve", solve_with_sync)
    leaves = {
        k: v.requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in outputs.items()
    }
    with no_host_sync():
        terms = loss(leaves, targets)
        total(loss, terms).backward()
    assert calls == [1]
    # The harness does catch syncs: the reference path reads sizes and moves each matrix to the host.
    with pytest.raises(HostSyncError), no_host_sync():
        loss.reference(leaves, targets)


def warmed_auto_loss(head: str, device: str, gen: torch.Generator) -> tuple:
    """``head``'s batched loss with ``backend="auto"`` on ``device``, called once as a warm-up and its solver shapes
    then compiled (:func:`~drivetrain.match.warm_pending`, as the trainer does between steps): the next call takes
    the GPU solver wherever it is usable, not the SciPy fallback of a shape met uncompiled. Returns
    ``(loss, outputs, targets)`` on ``device`` (floating outputs are leaves that require grad)."""
    from drivetrain.match import warm_pending

    outputs, targets, loss = head_case(head, "auto", gen)
    loss = loss.to(device)
    outputs = {
        k: v.to(device).requires_grad_() if torch.is_tensor(v) and v.is_floating_point() else v
        for k, v in outputs.items()
    }
    outputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in outputs.items()}
    targets = {k: v.to(device) if hasattr(v, "to") else v for k, v in targets.items()}
    loss(outputs, targets)  # warm-up: lazy CUDA initialisation may sync once; the solver meets its shapes
    warm_pending()
    return loss, outputs, targets


def assert_warmed_auto_loss_uses_the_kernel(head: str, gen: torch.Generator, kernel) -> None:
    """The measured call of :func:`warmed_auto_loss` runs the GPU solver's kernel (``kernel``: the recording
    stand-in of tests/test_match_solve_buckets.py, installed on the CPU) and falls back to SciPy for no shape."""
    import warnings

    from drivetrain.match import gpu_solver_shapes

    with pytest.warns(UserWarning, match="not compiled yet"):  # the warm-up met its shapes uncompiled
        loss, outputs, targets = warmed_auto_loss(head, "cpu", gen)
    fallbacks = gpu_solver_shapes()["fallbacks"]
    kernel.shapes.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn
        terms = loss(outputs, targets)
    assert gpu_solver_shapes()["fallbacks"] == fallbacks and kernel.shapes
    assert all(torch.isfinite(v) for v in terms.values())


def assert_cuda_syncs_only_inside_the_solver(head: str, gen: torch.Generator, monkeypatch) -> None:
    """On CUDA (sync debug mode "error"), the batched loss syncs only inside the solver (or not at all: the GPU
    solver, warmed by :func:`warmed_auto_loss`, makes no sync)."""
    from drivetrain.match import gpu_solver_available

    loss, outputs, targets = warmed_auto_loss(head, "cuda", gen)
    real_solve = assigners_module.solve

    def solve_allowing_sync(*args, **kwargs):
        if gpu_solver_available("cuda"):
            return real_solve(*args, **kwargs)  # the gpu backend must not sync either
        torch.cuda.set_sync_debug_mode("default")
        try:
            return real_solve(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(assigners_module, "solve", solve_allowing_sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        terms = loss(outputs, targets)
        total(loss, terms).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(v).item() for v in terms.values())


# Ground-truth counts per rank, chosen so that every count differs from its mean over the two ranks.
RANK_GT_3D = {0: [0, 3, 7], 1: [5, 1]}
RANK_GT_2D = {0: [[0, 3], [5, 1]], 1: [[2, 0], [0, 1]]}


def rank_cases(rank: int) -> dict[str, tuple]:
    """Each loss with ``rank``'s own batch: ``{name: (loss_of(sync_cls_avg_factor), outputs, targets)}``."""
    gen = torch.Generator().manual_seed(100 + rank)
    sp_outputs, sp_targets = streampetr_case(RANK_GT_3D[rank], layers=2, queries=30, groups=2, gen=gen)
    fh_outputs, fh_targets = focal_case(RANK_GT_2D[rank], gen)
    return {
        "streampetr": (
            lambda sync: streampetr_loss(backend="scipy", sync_cls_avg_factor=sync),
            sp_outputs,
            sp_targets,
        ),
        "focal_head": (
            lambda sync: focal_head_loss(backend="scipy", sync_cls_avg_factor=sync),
            fh_outputs,
            fh_targets,
        ),
    }
