"""The detection losses on CUDA against the per-sample references on the CPU, on the same predictions and ground
truth: StreamPETR's 3D head and its focal head (SciPy solver on both devices), PointPillars' anchor head (the windowed
assignment and pair loss on CUDA, the original's loops on the CPU), the three criteria compiled by inductor on CUDA
(one graph for changing ground-truth counts, the eager terms and gradients within the float32 bound), and the ragged
copies under the losses in half, bfloat16 and single precision."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from drivetrain import ragged
from drivetrain.losses.focal_head import focal_head_loss
from drivetrain.models.pointpillars import PointPillars
from drivetrain.models.streampetr.loss import streampetr_loss
from drivetrain.ragged import RaggedBatch
from helpers.heads import focal_case, run, streampetr_case
from helpers.ragged import assert_identical, dtype_id, leaf, random_index, random_ragged
from test_losses_compile import (
    FH_BATCHES,
    LIDAR_BATCHES,
    SP_BATCHES,
    as_model_slices,
    assert_within_float32_bounds,
    both,
    graph_breaks,
    lidar_case,
)
from test_ragged_ops import TWO_LAYOUTS, J, N, paired_indices

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICE = "cuda"
# CUDA batched against the CPU reference. Terms: sums of non-negative float32 elements in two orders, each within
# (log2 n + 2)·eps of the exact sum for n ≤ 2^14 summands (≤ 2e-6 relative; tests/helpers/heads.py), and each
# element a chain of ≤ 7 library results (sigmoid, log, exp, pow) that CUDA and the CPU round ≤ 2 ulps apart
# (≤ 1.7e-6 relative, summands ≥ 0 keep it relative): < 6e-6, so 1e-5 relative. Gradients are element-wise with the
# same normaliser: the same relative bound, and 1e-7 of the largest entry for entries that cancel to near zero.
RTOL = 1e-5


def _to(values: dict, device: str) -> dict:
    """Tensors and RaggedBatches of ``values`` on ``device`` (ints and tuples as they are)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor | RaggedBatch) else v for k, v in values.items()}


def _assert_close_to_reference(gpu: tuple, cpu: tuple) -> None:
    (gpu_terms, gpu_grads), (ref_terms, ref_grads) = gpu, cpu
    assert set(gpu_terms) == set(ref_terms)
    for key, ref in ref_terms.items():
        assert gpu_terms[key].device.type == DEVICE and torch.isfinite(gpu_terms[key]), key
        torch.testing.assert_close(gpu_terms[key].cpu(), ref, rtol=RTOL, atol=1e-7, msg=key)
    for gpu_grad, ref in zip(gpu_grads, ref_grads, strict=True):
        scale = float(ref.abs().max()) if ref.numel() else 1.0
        torch.testing.assert_close(gpu_grad.cpu(), ref, rtol=RTOL, atol=1e-7 * max(1.0, scale))


@pytest.mark.parametrize(("num_gt", "groups"), [([0, 1, 7, 12], 3), ([5, 2], 0)], ids=["denoising_zero_gt", "plain"])
def test_streampetr_loss_batched_on_cuda_equals_the_reference_on_the_cpu(num_gt, groups, gen):
    outputs, targets = streampetr_case(num_gt, layers=3, queries=40, groups=groups, gen=gen)
    reference = run(streampetr_loss(backend="scipy"), outputs, targets, "reference")
    gpu = run(streampetr_loss(backend="scipy").to(DEVICE), _to(outputs, DEVICE), _to(targets, DEVICE), "batched")
    _assert_close_to_reference(gpu, reference)
    assert float(reference[0]["loss_bbox"].detach()) > 0 and (
        not groups or float(reference[0]["dn_loss_bbox"].detach()) > 0
    )


@pytest.mark.parametrize("num_gt", [[[0, 3], [5, 1]], [[2, 7], [4, 4], [0, 0]]], ids=["two_samples", "three_samples"])
def test_focal_head_loss_batched_on_cuda_equals_the_reference_on_the_cpu(num_gt, gen):
    """The 2D head: costs and the image-wise solve, the heatmap of centres, focal, GIoU, L1 and centerness terms."""
    outputs, targets = focal_case(num_gt, gen)
    reference = run(focal_head_loss(backend="scipy"), outputs, targets, "reference")
    gpu = run(focal_head_loss(backend="scipy").to(DEVICE), _to(outputs, DEVICE), _to(targets, DEVICE), "batched")
    _assert_close_to_reference(gpu, reference)
    assert all(float(v.detach()) > 0 for v in reference[0].values())


def _pointpillars_terms(model: PointPillars, heads: dict, gt_boxes, gt_labels, feature_size, device: str) -> tuple:
    """``model.loss`` on ``device`` and the gradients of the terms' plain sum with respect to the head outputs."""
    leaves = {k: v.detach().clone().to(device).requires_grad_() for k, v in heads.items()}
    outputs = {**leaves, "feature_size": feature_size, "anchors": model.anchors(feature_size, device)}
    labels = gt_labels.to(device)
    batch = SimpleNamespace(gt_boxes=gt_boxes.to(device), gt_labels=labels.apply(lambda t: model._to_data[t]))
    terms = model.loss(outputs, batch)
    return terms, torch.autograd.grad(sum(terms.values()), list(leaves.values()))


@pytest.mark.parametrize("sizes", [LIDAR_BATCHES[0], LIDAR_BATCHES[2]], ids=str)
def test_anchor_head_loss_batched_on_cuda_equals_the_reference_on_the_cpu(sizes, gen):
    """PointPillars' assignment and loss: the anchor windows and the pair loss on CUDA against the per-sample
    assigner and loss on the CPU (tests/test_models_pointpillars_loss.py derives 1e-5 between the two formulas; the
    devices add ≤ 2 ulps per library result, inside it)."""
    feature_size = (8, 8)
    batched, reference = PointPillars().to(DEVICE), PointPillars(impl="reference")
    heads, gt_boxes, gt_labels = lidar_case(reference.anchors(feature_size, "cpu"), sizes, gen)
    gpu = _pointpillars_terms(batched, heads, gt_boxes, gt_labels, feature_size, DEVICE)
    cpu = _pointpillars_terms(reference, heads, gt_boxes, gt_labels, feature_size, "cpu")
    _assert_close_to_reference(gpu, cpu)
    assert float(cpu[0]["loss_bbox"].detach()) > 0  # positives were assigned


# ---------------------------------------------------------------------------------------------- compiled
@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


@pytest.mark.heavy
@pytest.mark.compiles
def test_compiled_streampetr_loss_on_cuda_is_one_graph_within_the_float32_bound(fresh_dynamo, gen):
    """Inductor's CUDA kernels for the 3D head's batched loss, for two batches whose ground-truth count differs
    (7, then 9: no recompile), against eager CUDA (tests/test_losses_compile.py derives the bound)."""
    loss = streampetr_loss(backend="scipy").to(DEVICE)
    for num_gt in SP_BATCHES[:2]:
        outputs, targets = streampetr_case(num_gt, layers=2, queries=30, groups=2, gen=gen)
        outputs, targets = as_model_slices(_to(outputs, DEVICE)), _to(targets, DEVICE)
        batch, dn = len(num_gt), outputs["dn_cls_logits"].shape[2]
        compiled, eager = both(loss, outputs, targets, {})
        assert all(t.device.type == DEVICE for t in compiled[0].values())
        assert_within_float32_bounds(compiled, eager, summands=batch * max(30, dn) * 10)
    assert graph_breaks() == 0 and counters["stats"]["unique_graphs"] == 1


@pytest.mark.heavy
@pytest.mark.compiles
def test_compiled_focal_head_loss_on_cuda_is_one_graph_within_the_float32_bound(fresh_dynamo, gen):
    loss = focal_head_loss(backend="scipy").to(DEVICE)
    for num_gt in FH_BATCHES[:2]:
        outputs, targets = focal_case(num_gt, gen)
        outputs, targets = _to(outputs, DEVICE), _to(targets, DEVICE)
        compiled, eager = both(loss, outputs, targets, {})
        assert_within_float32_bounds(compiled, eager, summands=math.prod(outputs["cls_logits"].shape))
    assert graph_breaks() == 0 and counters["stats"]["unique_graphs"] == 1


@pytest.mark.heavy
@pytest.mark.compiles
def test_compiled_anchor_assignment_and_loss_on_cuda_is_one_graph_within_the_float32_bound(fresh_dynamo, gen):
    """PointPillars' dense assignment and loss in one inductor graph on CUDA against its eager windowed path."""
    feature_size = (8, 8)
    model = PointPillars().to(DEVICE)
    anchors = model.anchors(feature_size, "cpu")
    for sizes in LIDAR_BATCHES[:2]:
        heads, gt_boxes, gt_labels = lidar_case(anchors, sizes, gen)
        model.set_path(compile_loss={})
        compiled = _pointpillars_terms(model, heads, gt_boxes, gt_labels, feature_size, DEVICE)
        model.set_path(compile_loss=False)
        eager = _pointpillars_terms(model, heads, gt_boxes, gt_labels, feature_size, DEVICE)
        assert float(eager[0]["loss_bbox"].detach()) > 0
        assert_within_float32_bounds(compiled, eager, summands=math.prod(heads["cls_logits"].shape))
    assert graph_breaks() == 0 and counters["stats"]["unique_graphs"] == 1


# ---------------------------------------------------------------------------------------------- ragged
def _exact_upstream(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """An upstream gradient of quarters in [−1, 1]: sums of up to 2·J = 8 of them (gather and map_pairs read the
    same entries) are multiples of 1/4 below 8 in magnitude, exact in float16 and bfloat16 (8 significant bits
    suffice), so any accumulation order — CUDA's atomics included — gives the same gradient."""
    return (torch.randint(-4, 5, t.shape, generator=gen).double() / 4).to(t.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=dtype_id)
def test_ragged_copies_and_their_gradients_on_cuda_equal_the_cpu_ones(dtype, gen):
    """gather, scatter, map_pairs and select (the copies the batched losses build their targets with) in each
    layout: the same values as on the CPU, poisoned padding never read, and exactly the same gradients."""
    for layout in TWO_LAYOUTS:
        data = random_ragged(layout, N, dtype, gen)
        dst = random_ragged(layout, 7, dtype, gen)
        index = random_index(data.sizes, layout.batch, J, gen)
        distinct = random_index(N, layout.batch, J, gen, distinct=True, negative=True)
        values = random_ragged(layout, J, dtype, gen, sizes=distinct.sizes)
        src_index, dst_index = paired_indices(data.sizes, dst.sizes, layout.batch, gen)
        mask = torch.rand(*layout.batch, N, generator=gen) < 0.5  # (*batch, N)
        results = []
        for device in ("cpu", DEVICE):
            x, v, y = (leaf(t.tensor.to(device)) for t in (data, values, dst))
            on = {name: t.to(device) for name, t in (("index", index), ("distinct", distinct),
                                                     ("src", src_index), ("dst", dst_index))}  # fmt: skip
            outs = [
                ragged.gather(data.to(device).with_tensor(x), on["index"], fill=7).tensor,
                ragged.scatter(values.to(device).with_tensor(v), on["distinct"], N, fill=3),
                ragged.map_pairs(
                    data.to(device).with_tensor(x), on["src"], on["dst"], dst.to(device).with_tensor(y)
                ).tensor,
            ]
            upstream = [_exact_upstream(t, torch.Generator().manual_seed(i)).to(device) for i, t in enumerate(outs)]
            grads = torch.autograd.grad(outs, [x, v, y], upstream)
            picked = ragged.select(data.to(device), mask.to(device), trim=True)  # padding never selected
            results.append([t.detach().cpu() for t in (*outs, *grads, picked.tensor)] + [picked.sizes.cpu()])
        for got, want in zip(results[1], results[0], strict=True):
            assert_identical(got, want)
        assert results[0][3].abs().sum() > 0 and results[0][5].abs().sum() > 0  # gradients reached x and y
