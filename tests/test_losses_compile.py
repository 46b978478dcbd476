"""The batched losses under torch.compile (drivetrain.compiled; the StreamPETR criteria's ``compile=``, the models'
``compile_loss``): one graph per criterion with no graph break, no recompile for new ground-truth counts, and
the terms and gradients of eager execution — bit for bit under aot_eager, within the float32 bound of reordered
sums under inductor (slow).

Why no graph break is expected, also with the SciPy solver: the solver enters the graph as the custom operator
``drivetrain::solve_scipy`` (its output shape ``(*batch, G, 2)`` follows from the cost shape), so dynamo traces
straight through the match; the one host transfer of the step happens inside that node when the graph runs.
Nothing else on the batched paths reads a value on the host. So every criterion is one graph with exactly one
solver node (the StreamPETR head solves all layers × samples in one call, the focal head all images), and the
lidar assignment + loss, which has no solver, is one graph too.
"""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo
from scipy.optimize import linear_sum_assignment
from torch._dynamo.utils import counters

from drivetrain.compiled import compile_options, compiled, dynamic, ragged_dynamic
from drivetrain.losses.focal_head import focal_head_loss
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.pointpillars import SSN, PointPillars
from drivetrain.models.pointpillars.args import PointPillarsArgs
from drivetrain.models.pointpillars.loss import AnchorHeadLoss
from drivetrain.models.pointpillars.loss_batched import batched_anchor_head_loss
from drivetrain.models.pointpillars.paths import model_path
from drivetrain.models.pointpillars.recipe import LOSS_WEIGHTS, NUS_CODE_WEIGHTS, NUS_DIR_OFFSET
from drivetrain.models.streampetr.loss import streampetr_loss
from drivetrain.profile import Profiler, active
from drivetrain.ragged import RaggedBatch
from helpers.heads import focal_case, run, streampetr_case

solve_module = importlib.import_module("drivetrain.match.solve")  # the package's `solve` is the function
EPS = torch.finfo(torch.float32).eps
# GT counts of three successive batches: the padded length G (and with it the DN query count P = groups·G)
# changes every call: 7 → 9 → 12 for the 3D head, 5 → 7 → 9 for the focal head's images.
SP_BATCHES = ([3, 5, 7], [2, 9, 4], [12, 0, 6])
FH_BATCHES = ([[0, 3], [5, 1]], [[2, 7], [4, 4]], [[9, 3], [0, 2]])
LIDAR_BATCHES = ((3, 0, 6), (2, 5, 9), (12, 4, 4))
NUS_ANCHOR_LOSS = {"code_weights": NUS_CODE_WEIGHTS, "dir_offset": NUS_DIR_OFFSET, "weights": LOSS_WEIGHTS}


class Recorder:
    """A torch.compile backend that keeps every graph dynamo hands it — one per compiled frame, so a graph break
    or a recompile adds one — and runs it with aot_eager: AOTAutograd's forward/backward graphs, executed with
    the ATen kernels eager mode calls, so results are bit-equal to eager."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self._aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs.append(gm)
        return self._aot_eager(gm, example_inputs)

    def calls(self, op_name: str) -> int:
        """Nodes of all recorded graphs that call the operator ``op_name`` (e.g. ``drivetrain.solve_scipy``)."""
        return sum(op_name in str(n.target) for gm in self.graphs for n in gm.graph.nodes if n.op == "call_function")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def assert_bit_equal(compiled: tuple, eager: tuple) -> None:
    (c_terms, c_grads), (e_terms, e_grads) = compiled, eager
    assert list(c_terms) == list(e_terms)
    for key, value in e_terms.items():
        assert torch.equal(c_terms[key], value), key
    for c, e in zip(c_grads, e_grads, strict=True):
        assert torch.equal(c, e)


def assert_no_marks(*tensors: torch.Tensor) -> None:
    """The caller's tensors carry no dynamo marks: ``dynamic`` marks views."""
    for t in tensors:
        assert not getattr(t, "_dynamo_dynamic_indices", None)


def both(loss: torch.nn.Module, outputs: dict, targets: dict, options: dict) -> tuple[tuple, tuple]:
    """(compiled, eager) terms and gradients of the batched path on the same values.

    Eager runs on contiguous copies: the compiled path makes strided predictions contiguous (``dense``), and
    eager's elementwise kernels round differently on strided memory (only contiguous memory is vectorised): an
    ulp in some logit gradients between the two layouts in eager alone.
    """
    loss.compile_options = options
    compiled = run(loss, outputs, targets, "batched")
    loss.compile_options = None
    contiguous = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
    return compiled, run(loss, contiguous, targets, "batched")


# ---------------------------------------------------------------------------------------------- options
def test_compile_options_read_bool_and_mapping():
    assert compile_options(False) is None and compile_options(None) is None
    assert compile_options(True) == {}
    mapping = {"backend": "aot_eager"}
    assert compile_options(mapping) == mapping and compile_options(mapping) is not mapping
    with pytest.raises(TypeError, match="compile"):
        compile_options("inductor")
    assert streampetr_loss().compile_options is None
    assert focal_head_loss(compile=True).compile_options == {}
    anchor_path = model_path(PointPillarsArgs(compile_loss={"mode": "max-autotune"}))  # the lidar models' one switch
    assert anchor_path.compile_options == {"mode": "max-autotune"}


def test_dynamic_marks_a_view_and_leaves_sizes_0_and_1_alone():
    t = torch.zeros(2, 5, 3)
    view = dynamic(t, -2)
    assert view is not t and view.data_ptr() == t.data_ptr()
    assert view._dynamo_dynamic_indices == {1}
    assert_no_marks(t)
    for size in (0, 1):
        small = torch.zeros(2, size, 3)
        assert dynamic(small, 1) is small
    rb = RaggedBatch.from_list([torch.zeros(3, 4), torch.zeros(1, 4)])
    rb.mask  # noqa: B018 — cache the mask: it is an input of the graph too
    marked = ragged_dynamic(rb)
    assert marked.tensor._dynamo_dynamic_indices == {1} and marked._mask._dynamo_dynamic_indices == {1}
    assert torch.equal(marked.sizes, rb.sizes)
    assert_no_marks(rb.tensor, rb._mask)


# ---------------------------------------------------------------------------------------------- camera
def as_model_slices(outputs: dict) -> dict:
    """The model's layout: main and DN queries are slices of one ``(L, B, P+Q, ·)`` tensor, so the main queries'
    strides and offset hold P (as the model's ``cls_logits[:, :, pad:]``)."""
    out = dict(outputs)
    for main, dn in (("cls_logits", "dn_cls_logits"), ("box_codes", "dn_box_codes")):
        pad = outputs[dn].shape[2]
        joint = torch.cat([outputs[dn], outputs[main]], dim=2)  # (L, B, P+Q, ·)
        out[dn], out[main] = joint[:, :, :pad], joint[:, :, pad:]
    return out


def test_streampetr_loss_is_one_graph_for_every_gt_count_and_equals_eager(gen):
    recorder = Recorder()
    loss = streampetr_loss()  # the "auto" solver backend: resolved once while tracing (scipy on the CPU)
    for i, num_gt in enumerate(SP_BATCHES):
        outputs, targets = streampetr_case(num_gt, layers=2, queries=30, groups=2, gen=gen)
        outputs = as_model_slices(outputs)
        if i == 2:  # library regions inside the compiled call must not break the graph while profiling
            with active(Profiler("cpu")):
                compiled, eager = both(loss, outputs, targets, {"backend": recorder})
        else:
            compiled, eager = both(loss, outputs, targets, {"backend": recorder})
        assert_bit_equal(compiled, eager)
        assert len(recorder.graphs) == 1, f"batch {i}: {len(recorder.graphs)} graphs"
        assert graph_breaks() == 0
        assert_no_marks(targets["gt_boxes"].tensor, outputs["dn_cls_logits"])
    assert recorder.calls("drivetrain.solve_scipy") == 1  # one solve of all layers × samples per call


def test_focal_head_loss_is_one_graph_for_every_gt_count_and_equals_eager(gen):
    recorder = Recorder()
    loss = focal_head_loss()  # the "auto" solver backend
    for i, num_gt in enumerate(FH_BATCHES):
        outputs, targets = focal_case(num_gt, gen)
        targets["gt_boxes_2d"].mask  # noqa: B018 — a mask cached by an earlier op is an input too
        assert_bit_equal(*both(loss, outputs, targets, {"backend": recorder}))
        assert len(recorder.graphs) == 1, f"batch {i}: {len(recorder.graphs)} graphs"
        assert graph_breaks() == 0
    assert recorder.calls("drivetrain.solve_scipy") == 1


def cpu_assignment(cost: torch.Tensor) -> torch.Tensor:
    """Stand-in for the Triton kernel on the CPU: ``(P, Q, G)`` → ``(P, Q)`` column of each row or −1."""
    out = torch.full(cost.shape[:2], -1, dtype=torch.long)
    for p in range(cost.shape[0]):
        rows, cols = linear_sum_assignment(cost[p].numpy())
        out[p, torch.from_numpy(rows)] = torch.from_numpy(cols)
    return out


def test_gpu_solver_path_is_one_graph_per_target_bucket_without_a_break(gen, monkeypatch):
    """The gpu backend's plumbing under torch.compile (nan_to_num, constant padding columns up to the target bucket,
    the kernel as the ``drivetrain::solve_gpu`` node, pairs without a sync), checked on the CPU with a SciPy stand-in
    for the Triton kernel: no break, the pairs of the scipy backend, and one graph per padded target count — the
    kernel's shape is a compile-time constant, so G 7 (bucket 8), 9 and 12 (bucket 16) make two graphs, not three.
    The real kernel needs CUDA."""
    monkeypatch.setattr(solve_module, "gpu_solver_available", lambda device: True)
    monkeypatch.setattr(solve_module, "_triton_assignment", cpu_assignment)
    recorder = Recorder()
    gpu_loss = streampetr_loss(backend="gpu")
    scipy_loss = streampetr_loss(backend="scipy")
    buckets = {solve_module.padded_target_count(max(num_gt)) for num_gt in SP_BATCHES}
    assert buckets == {8, 16}
    for num_gt in SP_BATCHES:
        outputs, targets = streampetr_case(num_gt, layers=2, queries=30, groups=2, gen=gen)
        gpu_loss.compile_options = {"backend": recorder}
        assert_bit_equal(run(gpu_loss, outputs, targets, "batched"), run(scipy_loss, outputs, targets, "batched"))
    assert len(recorder.graphs) == len(buckets) and graph_breaks() == 0
    assert recorder.calls("drivetrain.solve_gpu") == len(buckets) and recorder.calls("drivetrain.solve_scipy") == 0


# ---------------------------------------------------------------------------------------------- lidar
def lidar_case(anchors: torch.Tensor, sizes: tuple[int, ...], gen: torch.Generator) -> tuple:
    """Ground truth near the anchors (jittered copies, so the assigner finds positives) and head outputs."""
    boxes, labels = [], []
    for n in sizes:
        picks = anchors[torch.randint(0, anchors.shape[0], (n,), generator=gen)].clone()  # (n, 9)
        picks[:, :7] += torch.randn(n, 7, generator=gen) * torch.tensor([0.3, 0.3, 0.1, 0.2, 0.1, 0.1, 0.2])
        picks[:, 3:6] = picks[:, 3:6].abs() + 0.1
        boxes.append(picks)
        labels.append(torch.randint(0, 10, (n,), generator=gen))
    batch, num_anchors = len(sizes), anchors.shape[0]
    heads = {
        "cls_logits": torch.randn(batch, num_anchors, 10, generator=gen),
        "box_preds": torch.randn(batch, num_anchors, 9, generator=gen),
        "dir_logits": torch.randn(batch, num_anchors, 2, generator=gen),
    }
    return heads, RaggedBatch.from_list(boxes), RaggedBatch.from_list(labels)


def model_loss(model: PointPillars, heads: dict, gt_boxes: RaggedBatch, gt_labels: RaggedBatch, feature_size):
    """``model.loss`` on head outputs, and the gradients of its plain sum with respect to them."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in heads.items()}
    outputs = {**leaves, "feature_size": feature_size, "anchors": model.anchors(feature_size, "cpu")}
    # the batch's ground truth, labels in the dataset's order (the loss maps them back to the model's, the case's)
    batch = SimpleNamespace(gt_boxes=gt_boxes, gt_labels=gt_labels.apply(lambda t: model._to_data[t]))
    terms = model.loss(outputs, batch)
    return terms, torch.autograd.grad(sum(terms.values()), list(leaves.values()))


@pytest.mark.parametrize("model_class", [PointPillars, pytest.param(SSN, marks=pytest.mark.slow)])
def test_anchor_assignment_and_loss_are_one_graph_and_equal_eager(model_class, gen):
    feature_size = (8, 8)
    model = model_class()
    anchors = model.anchors(feature_size, "cpu")
    model.set_path(chunk=anchors.shape[0] // 2 + 1)  # the assigner's two passes over anchor slices, under compile too
    recorder = Recorder()
    for i, sizes in enumerate(LIDAR_BATCHES):
        heads, gt_boxes, gt_labels = lidar_case(anchors, sizes, gen)
        model.set_path(compile_loss={"backend": recorder})
        compiled = model_loss(model, heads, gt_boxes, gt_labels, feature_size)
        model.set_path(compile_loss=False)
        # the graph holds the dense assignment and loss; eager runs the same ops bit for bit (the default windowed
        # path's pair loss sums in another order: tests/test_models_pointpillars_loss.py compares it)
        model.set_path(window=False)
        eager = model_loss(model, heads, gt_boxes, gt_labels, feature_size)
        model.set_path(window=True)
        assert float(compiled[0]["loss_bbox"].detach()) > 0  # positives were assigned
        assert_bit_equal(compiled, eager)
        assert len(recorder.graphs) == 1, f"batch {i}: {len(recorder.graphs)} graphs"
        assert graph_breaks() == 0


def anchor_head_terms(loss: AnchorHeadLoss, options: dict | None, *inputs, gt_boxes, gt_labels) -> dict:
    """The anchor-head loss's batched terms: eager (``options`` None), or through ``torch.compile`` with these
    arguments and the ground-truth dim dynamic, as the compiled path runs it (there, with the assignment)."""
    if options is None:
        return loss.batched(*inputs, gt_boxes, gt_labels)
    gt_boxes, gt_labels = ragged_dynamic(gt_boxes), ragged_dynamic(gt_labels)  # G
    return compiled(batched_anchor_head_loss, options)(*inputs, gt_boxes, gt_labels, **loss.options)


def test_the_anchor_head_loss_compiles_to_one_graph(gen):
    model = PointPillars()
    anchors = model.anchors((8, 8), "cpu")
    recorder = Recorder()
    loss = AnchorHeadLoss(10, **NUS_ANCHOR_LOSS)
    for sizes in LIDAR_BATCHES[:2]:
        heads, gt_boxes, gt_labels = lidar_case(anchors, sizes, gen)
        assigned = model.assign((8, 8), gt_boxes, gt_labels)
        results = []
        for options in ({"backend": recorder}, None):
            leaves = [v.detach().clone().requires_grad_() for v in heads.values()]
            terms = anchor_head_terms(loss, options, *leaves, anchors, assigned, gt_boxes=gt_boxes, gt_labels=gt_labels)
            results.append((terms, torch.autograd.grad(weighted_total(terms, loss.weights), leaves)))
        assert_bit_equal(*results)
    assert len(recorder.graphs) == 1 and graph_breaks() == 0


# ---------------------------------------------------------------------------------------------- inductor
def assert_within_float32_bounds(compiled: tuple, eager: tuple, summands: int) -> None:
    """Inductor against eager.

    Terms: every term is a sum of at most ``summands`` non-negative float32 elements (focal, QFL, L1, GIoU,
    Gaussian focal, smooth-L1, cross-entropy), divided by a count. Inductor fuses and reorders the sum; any order
    of recursive summation of n non-negative numbers is within (n − 1)·u of the exact sum (u = eps/2), so two
    orders differ by at most (n − 1)·eps relative. The elementwise values differ by a few ulps (vectorised
    transcendental functions), i.e. a few eps relative of a sum of non-negative elements: n·eps covers both.

    Gradients: elementwise (no reduction), each entry a chain of at most ~30 float32 roundings (the longest:
    the quality focal loss, forward and backward, then 1/N and the term weight), each within u of a value no
    larger than the tensor's largest entry; for the two evaluations that is 2·30·u = 30·eps of that scale: 32.
    """
    (c_terms, c_grads), (e_terms, e_grads) = compiled, eager
    rtol = summands * EPS
    for key, value in e_terms.items():
        torch.testing.assert_close(c_terms[key], value, rtol=rtol, atol=0.0, msg=key)
    for c, e in zip(c_grads, e_grads, strict=True):
        scale = float(e.abs().max()) if e.numel() else 1.0
        torch.testing.assert_close(c, e, rtol=0.0, atol=32 * EPS * scale)


@pytest.mark.slow
def test_inductor_gives_the_eager_terms_and_gradients_within_the_float32_bound(gen):
    sp_loss = streampetr_loss(backend="scipy")
    fh_loss = focal_head_loss(backend="scipy")
    for sp_gt, fh_gt in zip(SP_BATCHES[:2], FH_BATCHES[:2], strict=True):
        outputs, targets = streampetr_case(sp_gt, layers=2, queries=30, groups=2, gen=gen)
        batch, queries, dn = len(sp_gt), 30, outputs["dn_cls_logits"].shape[2]
        assert_within_float32_bounds(*both(sp_loss, outputs, targets, {}), summands=batch * max(queries, dn) * 10)
        outputs, targets = focal_case(fh_gt, gen)
        summands = math.prod(outputs["cls_logits"].shape)  # (B, N, Q, C): the largest sum
        assert_within_float32_bounds(*both(fh_loss, outputs, targets, {}), summands=summands)
    model = PointPillars()
    anchors = model.anchors((8, 8), "cpu")
    for sizes in LIDAR_BATCHES[:2]:
        heads, gt_boxes, gt_labels = lidar_case(anchors, sizes, gen)
        model.set_path(compile_loss={})
        compiled = model_loss(model, heads, gt_boxes, gt_labels, (8, 8))
        model.set_path(compile_loss=False)
        eager = model_loss(model, heads, gt_boxes, gt_labels, (8, 8))
        assert_within_float32_bounds(compiled, eager, summands=math.prod(heads["cls_logits"].shape))
    assert graph_breaks() == 0 and counters["stats"]["unique_graphs"] == 3  # one per criterion, no recompile
