"""StreamPETR's static path (``model.args.static_targets``, :mod:`drivetrain.models.streampetr.static`): the training
step on ground truth, denoising queries and 2D boxes padded to buckets computes what the eager step computes — bit
for bit when ``G`` is a bucket already, within the float32 bound of a reordered sum otherwise — the padded
forward and loss are one graph for dynamo, and a batch beyond the largest bucket is one error naming the key."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import drivetrain.match.assigners as assigners_module
from drivetrain.data.sources import frames
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.streampetr import StreamPETR
from drivetrain.models.streampetr.denoising import make_dn_queries, make_static_dn_queries, padded_noise
from drivetrain.models.streampetr.loss import BATCHED, STATIC
from drivetrain.models.streampetr.static import buckets, pad_ragged, pad_targets, target_bucket
from drivetrain.ragged import RaggedBatch
from helpers.nosync import allow_host_sync, no_host_sync
from helpers.partition import inductor_partition_backend
from helpers.streampetr import SMALL

ARGS = {**SMALL, "dropout": 0.0}  # dropout's draws would follow the DN query count, which the buckets change


@pytest.fixture(scope="module")
def train_frames(synth_index, synth_root):
    return frames(str(synth_root / "drivetrain_index.npz"), split="mini_train")


FIELDS_2D = ("gt_boxes_2d", "gt_labels_2d", "centers_2d", "depths_2d", "gt_index_2d")


def batch_with(ds, keys: tuple[int, ...], counts: tuple[int, ...], length_2d: int | None = None, dtype=None):
    """The frames ``keys`` with their first ``counts[b]`` 3D boxes each (fewer where a frame has fewer): ``G``
    chosen by the test, the padded length the largest count; with ``length_2d`` the first that many 2D boxes of
    every image; with ``dtype`` every floating tensor in it."""
    batch = ds.collate([ds[k] for k in keys])
    sizes = torch.minimum(batch.gt_boxes.sizes, torch.tensor(counts))
    length = int(sizes.max())
    crop = {name: RaggedBatch(getattr(batch, name).tensor[:, :length], sizes) for name in ("gt_boxes", "gt_labels")}
    if length_2d is not None:
        sizes_2d = batch.gt_boxes_2d.sizes.clamp(max=length_2d)
        assert int(sizes_2d.max()) == length_2d
        crop.update({name: RaggedBatch(getattr(batch, name).tensor[:, :, :length_2d], sizes_2d) for name in FIELDS_2D})
    batch = dataclasses.replace(batch, **crop)
    if dtype is not None:
        batch = batch._map(lambda t: t.to(dtype) if t.is_floating_point() else t)
    return batch


def model_of(dtype=torch.float32, **overrides) -> StreamPETR:
    torch.manual_seed(0)
    return StreamPETR(**{**ARGS, **overrides}).to(dtype).train()


def step(model: StreamPETR, batch) -> tuple[dict, dict]:
    """One training step's unweighted terms and parameter gradients."""
    model.zero_grad(set_to_none=True)
    terms = model.loss(model(batch), batch)
    weighted_total(terms, model.loss_weights).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in terms.items()}, grads


def eager_and_static(batch, gen: torch.Generator, dtype=torch.float32) -> tuple[tuple[dict, dict], tuple[dict, dict]]:
    """The eager (batched) step and the static one on the same parameters, batch and denoising noise."""
    sizes = batch.gt_boxes.sizes.tolist()
    groups = ARGS["dn_groups"]
    r = torch.rand((groups * sum(sizes), 3), generator=gen) * 2 - 1  # the eager draw's layout
    eager, static = model_of(dtype), model_of(dtype, static_targets=True)
    assert static.path is STATIC
    eager.path = dataclasses.replace(BATCHED, make_dn_queries=functools.partial(make_dn_queries, noise=r))
    bucket = target_bucket(batch.gt_boxes.max_size, static.args.max_targets)
    noise = padded_noise(r, sizes, groups, bucket)
    static.path = dataclasses.replace(STATIC, make_dn_queries=functools.partial(make_static_dn_queries, noise=noise))
    return step(eager, batch), step(static, batch)


# ------------------------------------------------------------------------------------------------ equality
@pytest.mark.parametrize("counts", [(8, 5), (16, 16)])
def test_the_padded_step_is_the_eager_step_bit_for_bit_when_g_is_a_bucket(train_frames, gen, counts):
    """``G`` (8, 16) and the 2D boxes' (8) at a bucket: nothing is padded, the DN rows are the eager ones in the
    eager order, the mask is the eager mask: every term and gradient bit-equal in float32."""
    batch = batch_with(train_frames, (0, 3), counts, length_2d=8)
    assert pad_targets(batch, 64) is batch
    (eager_terms, eager_grads), (static_terms, static_grads) = eager_and_static(batch, gen)
    assert list(static_terms) == list(eager_terms)
    for key, value in eager_terms.items():
        assert torch.equal(static_terms[key], value), key
    assert static_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        assert torch.equal(static_grads[name], grad), name


@pytest.mark.parametrize("counts", [(7, 3), (13, 9), (30, 2), (0, 0)])
def test_the_padded_step_equals_the_eager_step_in_every_bucket(train_frames, gen, counts):
    """``G`` = 7, 13, 30 and 0 (buckets 8, 16, 32 and the smallest for an empty batch): the padded step's terms
    and parameter gradients equal the eager step's. The padding adds exact zeros to sums (the loss terms, the
    self-attention's softmax over masked keys, weight gradients over query rows) whose blocking follows the length:
    the two steps differ by reordered sums only. The network runs in float64, so that this is the only difference
    (the 2D boxes are cut to a bucket, 8, so that the focal head's float32 loss sums the same elements on both).

    Bounds: a reordered sum of n terms moves by at most 2(n − 1)·u·Σ|x_i| (u = eps/2: each order is within
    (n − 1)·u·Σ|x_i| of the exact sum). The terms are float32 sums of non-negative elements (Σ|x_i| = the term) of at
    most n = B·(P'+Q)·C summands: rtol 2n·u₃₂. The gradients are float64 sums of at most n = B·(P'+Q)·E products
    (weight gradients over the query rows; the softmax's keys are fewer): 2n·u₆₄ of each tensor's largest element,
    ~1e-12 — far below what a visible padding row changes (the mask test below checks the mask itself)."""
    batch = batch_with(train_frames, (0, 3), counts, length_2d=8, dtype=torch.float64)
    (eager_terms, eager_grads), (static_terms, static_grads) = eager_and_static(batch, gen, torch.float64)
    rows = len(counts) * (ARGS["dn_groups"] * target_bucket(batch.gt_boxes.max_size, 64) + 56)  # B·(P'+Q)
    assert ARGS["num_query"] + ARGS["num_propagated"] == 56
    term_rtol = 2 * rows * 10 * torch.finfo(torch.float32).eps / 2  # C = 10 classes
    grad_bound = 2 * rows * ARGS["embed_dims"] * torch.finfo(torch.float64).eps / 2
    if sum(counts) == 0:  # no ground truth: the eager step has no DN queries, the static one has P' of padding
        extra = set(static_terms) - set(eager_terms)
        assert extra and all(k.split(".")[-1] in ("dn_loss_cls", "dn_loss_bbox") for k in extra)
        assert all(torch.equal(static_terms[k], torch.zeros((), dtype=static_terms[k].dtype)) for k in extra)
    else:
        assert list(static_terms) == list(eager_terms)
    for key, value in eager_terms.items():
        torch.testing.assert_close(static_terms[key], value, rtol=term_rtol, atol=0.0, msg=key)
    assert static_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        atol = grad_bound * float(grad.abs().max())
        torch.testing.assert_close(static_grads[name], grad, rtol=0.0, atol=atol, msg=name)


def test_padding_rows_neither_attend_nor_are_attended_and_real_rows_are_the_eager_ones(gen):
    """The DN builders side by side on sizes (3, 5) (``S`` = 5) padded to 8: every real row's reference, label,
    background flag and mask row and column are the eager ones at row ``g·S + i``; the bucket's rows (``i ≥ 5``)
    are background, blocked as keys for every query and see only themselves."""
    groups, sizes, s, bucket = 3, [3, 5], 5, 8
    boxes = torch.rand(2, s, 9, generator=gen) * 4
    labels = torch.randint(0, 10, (2, s), generator=gen)
    kwargs = dict(groups=groups, noise_scale=1.0, split=0.75, pc_range=(-10, -10, -5, 10, 10, 3), num_classes=10,
                  num_query=6, num_propagated=2, memory_len=4)  # fmt: skip
    r = torch.rand(groups * sum(sizes), 3, generator=gen) * 2 - 1
    eager = make_dn_queries(RaggedBatch(boxes, sizes), RaggedBatch(labels, sizes), noise=r, **kwargs)
    pad = torch.nn.functional.pad
    static = make_static_dn_queries(
        RaggedBatch(pad(boxes, (0, 0, 0, bucket - s)), sizes),
        RaggedBatch(pad(labels, (0, bucket - s)), sizes),
        noise=padded_noise(r, sizes, groups, bucket),
        **kwargs,
    )
    assert static.single_pad == bucket and static.reference.shape == (2, groups * bucket, 3)
    real = torch.tensor([g * bucket + i for g in range(groups) for i in range(s)])  # static rows of the eager ones
    tail = torch.arange(groups * s, groups * s + 6 + 4)  # matching and memory keys (rows: matching, propagated)
    assert torch.equal(static.reference[:, real], eager.reference)
    assert torch.equal(static.labels[:, real], eager.labels)
    assert torch.equal(static.background[:, real], eager.background)
    rows = torch.cat([real, tail[:8] + (groups * bucket - groups * s)])
    cols = torch.cat([real, tail + (groups * bucket - groups * s)])
    assert torch.equal(static.attn_mask[rows][:, cols], eager.attn_mask)
    padding = torch.tensor([g * bucket + i for g in range(groups) for i in range(s, bucket)])
    assert static.background[:, padding].all()
    assert static.attn_mask[:, padding].sum(0).tolist() == [static.attn_mask.shape[0] - 1] * len(padding)
    assert torch.equal(static.attn_mask[padding, :][:, padding], ~torch.eye(len(padding), dtype=torch.bool))
    assert static.attn_mask[padding].sum(1).tolist() == [static.attn_mask.shape[1] - 1] * len(padding)


# ---------------------------------------------------------------------------------------- graph and syncs
def test_the_padded_forward_and_loss_are_one_graph_with_the_solvers_inside(train_frames):
    """``torch._dynamo.explain`` of forward + loss: the eager path breaks at the DN queries' host read (its frames
    split into several graphs); the static one is one graph without a break, both SciPy solver calls in it as the
    custom operator — also when a bucket (the 2D boxes' 64) exceeds the tokens (60), where the eager loss warns
    once (a ``warnings.warn`` dynamo cannot trace)."""
    batch = batch_with(train_frames, (0, 3), (13, 9))
    explained = {}
    for static in (False, True):
        model = model_of(static_targets=static)
        feed = batch
        if static:  # what the compiled step is fed: G at its bucket; the 2D boxes at 64, above the 60 tokens
            feed = pad_targets(batch, 64)
            feed = dataclasses.replace(feed, **{name: pad_ragged(getattr(feed, name), 64) for name in FIELDS_2D})

        def step(b, model=model):
            return weighted_total(model.loss(model(b), b), model.loss_weights)

        torch._dynamo.reset()
        explained[static] = torch._dynamo.explain(step)(feed)
    torch._dynamo.reset()
    assert explained[False].graph_break_count > 0
    assert (explained[True].graph_count, explained[True].graph_break_count) == (1, 0)
    (graph,) = explained[True].graphs
    solvers = [n for n in graph.graph.nodes if n.op == "call_function" and "solve_scipy" in str(n.target)]
    assert len(solvers) == 2  # the 3D head's (every layer and sample) and the focal head's (every image)


@pytest.mark.slow  # ~10 s of compiles; one graph without a break: the test above (default set)
def test_one_graph_per_bucket_over_a_stream_of_frames(train_frames):
    """``fullgraph`` compiles of the padded step over successive frames fed at their buckets: the first frame
    (empty memory: another branch of the memory bank) and each new bucket compile once; a ``G`` met before in
    the same bucket (9 → 12 → 15 in 16) or a bucket seen before compiles nothing."""
    model = model_of(static_targets=True)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(b):
        return weighted_total(model.loss(model(b), b), model.loss_weights)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    seen = []
    for keys, counts in [
        ((0, 3), (13, 9)),
        ((1, 4), (10, 12)),
        ((2, 5), (9, 15)),
        ((0, 3), (20, 9)),
        ((1, 4), (13, 9)),
    ]:
        compiled(pad_targets(batch_with(train_frames, keys, counts), 64)).backward()
        seen.append(len(graphs))
    torch._dynamo.reset()
    assert seen == [1, 2, 2, 3, 3]


def test_the_padded_step_reads_nothing_on_the_host_but_the_two_solver_calls(train_frames, monkeypatch):
    """The eager step's documented DN read (``S``, ``T``) is gone: inside ``no_host_sync`` only the two SciPy
    solver calls (allowed, they read the costs) touch the host."""
    model = model_of(static_targets=True)
    batch = batch_with(train_frames, (0, 3), (13, 9))
    model(batch)  # first call: drivetrain.constants caches its per-device constants
    calls = []

    def solve(*args, **kwargs):
        calls.append("solve")
        with allow_host_sync():
            return assigners_module_solve(*args, **kwargs)

    assigners_module_solve = assigners_module.solve
    monkeypatch.setattr(assigners_module, "solve", solve)
    batch = pad_targets(batch, 64)  # the trainer pads before the step; padding inside it would not sync either
    with no_host_sync():
        weighted_total(model.loss(model(batch), batch), model.loss_weights).backward()
    assert calls == ["solve", "solve"]


# ------------------------------------------------------------------------------------------------- errors
def test_a_batch_beyond_the_largest_bucket_is_one_error_naming_the_key(train_frames):
    assert buckets(64) == (8, 16, 32, 64) and buckets(100) == (8, 16, 32, 64, 128) and buckets(5) == (8,)
    model = model_of(static_targets=True, max_targets=8)
    batch = batch_with(train_frames, (0, 3), (13, 9))
    with pytest.raises(ValueError, match=r"^model\.args\.max_targets: gt_boxes holds up to 13 boxes per sample, "):
        model(batch)
    with pytest.raises(ValueError, match=r"^model\.args\.max_targets: gt_boxes holds up to 13 "):
        model.loss({}, batch)
    small_3d = batch_with(train_frames, (0, 3), (8, 5))  # 3D within 8, the 2D boxes (11) beyond it
    with pytest.raises(ValueError, match=r"^model\.args\.max_targets: gt_boxes_2d holds up to 11 "):
        pad_targets(small_3d, 8)
    with pytest.raises(ValueError, match=r"^model\.args\.max_targets: must be ≥ 1, got 0"):
        model_of(static_targets=True, max_targets=0)
    with pytest.raises(ValueError, match="static_targets: needs impl 'batched'"):
        model_of(static_targets=True, impl="reference")
    assert model_of().path is BATCHED  # off by default


# -------------------------------------------------------------------------------------------- the compiled step
STEP_ARGS = {"static_targets": True, "step_images": (6, 90, 160), "step_targets": (64,)}  # the test frames; 1 bucket


def stream(ds) -> list:
    """Four frames of two batch slots: both scenes' first frames (the empty bank), their next two, then slot 0
    starting the second scene again mid-stream (a reset beside a slot that keeps its memory)."""
    frames_ = [ds.collate([ds[a], ds[b]]) for a, b in ((0, 3), (1, 4), (2, 5))]
    restart = ds.collate([ds[3], ds[2]])
    restart = dataclasses.replace(restart, prev_exists=torch.tensor([False, True]))
    assert frames_[0].prev_exists.tolist() == [False, False] and frames_[1].prev_exists.all()
    return [*frames_, restart]


@pytest.mark.parametrize("step_targets", [(64,), (48, 64)], ids=["solver-bucket", "finer-bucket"])
def test_the_step_loss_is_the_eager_forward_and_loss_over_a_stream_of_frames(train_frames, step_targets):
    """``step_loss`` on :meth:`step_inputs` (the memory bank passed in as fixed ``(B, K+M)`` tensors and written back
    in place, images normalised before it), called eagerly and compiled (``aot_eager``, ``fullgraph``), against
    ``forward`` then ``loss`` of the same padded batch over a stream through the empty bank, scene starts and a
    reset: every term, every gradient and the bank after every frame bit-equal in float32 (the same operations in
    the same order on the same values; the empty bank's zeros come out signed, which ``torch.equal`` counts equal),
    and one graph for all four frames. At a bucket that is not the solver's (48: the frames hold up to 41 boxes) the
    eager side takes the batch at that length as given (its path's padding to 64 left out), as the step does."""
    args = {**STEP_ARGS, "step_targets": step_targets}
    eager, stepped, compiled = (model_of(**args) for _ in range(3))
    if step_targets[0] != 64:
        eager.path = dataclasses.replace(eager.path, targets=lambda batch, max_targets: batch)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    fn = torch.compile(compiled.step_loss, fullgraph=True, dynamic=False, backend=backend)
    run = {stepped: stepped.step_loss, compiled: fn}
    cpu = torch.device("cpu")
    for i, batch in enumerate(stream(train_frames)):
        shapes = eager.step_shapes(batch)
        assert shapes.targets == shapes.targets_2d == step_targets[0]
        length = shapes.targets
        padded = {name: pad_ragged(getattr(batch, name), length) for name in ("gt_boxes", "gt_labels", *FIELDS_2D)}
        padded = dataclasses.replace(batch, **padded)
        torch.manual_seed(i)
        want, want_grads = step(eager, padded)
        for model, call in run.items():
            torch.manual_seed(i)  # the same DN noise
            model.zero_grad(set_to_none=True)
            terms = call(*model.step_inputs(batch, shapes, 2, cpu))
            weighted_total(terms, model.loss_weights).backward()
            assert terms.keys() == want.keys()
            assert all(torch.equal(terms[key].detach(), value) for key, value in want.items()), (i, model is compiled)
            assert all(torch.equal(p.grad, want_grads[n]) for n, p in model.named_parameters() if p.grad is not None)
            for name, value in eager.memory.state()._asdict().items():
                assert torch.equal(getattr(model.memory, name), value), (i, name)
    torch._dynamo.reset()
    assert len(graphs) == 1


def test_the_compiled_step_names_the_key_of_what_it_cannot_take(train_frames):
    """A batch beyond the largest bucket, images of another shape, and a model without the static path or with
    buckets that are not the solver's: one ValueError line naming the config key each."""
    model = model_of(**STEP_ARGS, max_targets=8)
    batch = batch_with(train_frames, (0, 3), (13, 9))
    with pytest.raises(ValueError, match=r"^model\.args\.max_targets: gt_boxes holds up to 13 boxes per sample, "):
        model.step_shapes(batch)
    with pytest.raises(ValueError, match=r"^model\.args\.step_images: the compiled step was built for \(6, 90, 170\) "):
        model_of(**{**STEP_ARGS, "step_images": (6, 90, 170)}).step_shapes(batch)
    with pytest.raises(ValueError, match=r"^model\.args\.static_targets: the compiled step runs the static path"):
        model_of().step_buckets(2)
    with pytest.raises(ValueError, match=r"^model\.args\.step_targets: expected multiples of 8 up to and with the "):
        model_of(**{**STEP_ARGS, "step_targets": (16, 24)}).step_buckets(2)  # without the largest, 64
    with pytest.raises(ValueError, match=r"^model\.args\.step_targets: .*, got \[20, 64\]$"):
        model_of(**{**STEP_ARGS, "step_targets": (20, 64)}).step_buckets(2)
    assert [s.targets for s in model_of(**{**STEP_ARGS, "step_targets": ()}).step_buckets(2)] == [8, 16, 32, 64]


def test_the_compiled_steps_bank_keeps_its_tensors_through_a_resume_an_evaluation_and_a_reset(train_frames):
    """The step's memory inputs are the same tensor objects at every step (CUDA graphs replay a graph that writes
    static inputs only at their recorded addresses; a new tensor would record the bucket again): a bank loaded from a
    checkpoint, or put back after an evaluation (new tensors either way), is copied into them with its values, and
    a reset zeroes them (``filled`` 0)."""
    model, cpu = model_of(**STEP_ARGS), torch.device("cpu")
    frames_ = stream(train_frames)

    def bank(batch):
        _, memory, filled, _ = model.step_inputs(batch, model.step_shapes(batch), 2, cpu)
        return memory, filled

    held, filled = bank(frames_[0])
    assert filled.tolist() == [0.0, 0.0]
    with torch.no_grad():
        model.step_loss(*model.step_inputs(frames_[0], model.step_shapes(frames_[0]), 2, cpu))
    saved = model.stream_state()  # clones: a checkpoint's, or what an evaluation puts back
    assert saved and all(value.abs().sum() > 0 for name, value in saved.items() if name == "embedding")
    model.load_stream_state({name: value.clone() for name, value in saved.items()})
    assert model.memory.embedding is not held.embedding  # the load set new tensors
    memory, filled = bank(frames_[1])
    assert all(mine is theirs for mine, theirs in zip(memory, held, strict=True)) and filled.tolist() == [1.0, 1.0]
    assert all(torch.equal(memory._asdict()[name], value) for name, value in saved.items())  # the loaded values
    model.load_stream_state({})  # a reset
    memory, filled = bank(frames_[1])
    assert all(mine is theirs for mine, theirs in zip(memory, held, strict=True)) and filled.tolist() == [0.0, 0.0]
    assert all(not tensor.any() for tensor in memory)


def test_the_backward_of_the_step_as_inductor_partitions_it_reads_no_bank_tensor_the_forward_wrote(train_frames):
    """AOTAutograd's min-cut partitioner (inductor's, on inductor's decompositions: ``aot_eager_decomp_partition``
    without code generation) keeps some graph inputs for the backward and recomputes from them there; it did so for
    a memory-bank tensor, which the step overwrites with the next frame's bank before the backward runs: from the
    second frame on ``ego_pose_memory``'s gradients were hundreds of times the eager ones. The step reads a copy of
    the bank (:meth:`~drivetrain.models.streampetr.StreamPETR.step_inputs`): no input the forward writes is kept for
    the backward, and the gradients of every layer the bank feeds are the eager step's."""
    backend, kept_written = inductor_partition_backend()
    stepped, compiled = model_of(**STEP_ARGS), model_of(**STEP_ARGS)
    torch._dynamo.reset()
    fn = torch.compile(compiled.step_loss, fullgraph=True, dynamic=False, backend=backend)
    cpu = torch.device("cpu")
    for i, batch in enumerate(stream(train_frames)[:2]):  # the empty bank, then the first frame that reads it
        grads = []
        for model, call in ((stepped, stepped.step_loss), (compiled, fn)):
            torch.manual_seed(i)
            model.zero_grad(set_to_none=True)
            terms = call(*model.step_inputs(batch, model.step_shapes(batch), 2, cpu))
            weighted_total(terms, model.loss_weights).backward()
            grads.append(dict(model.named_parameters()))
        for name, param in grads[0].items():
            if name.startswith(("ego_pose_memory.", "ego_pose_pe.", "time_embedding.")):  # layers the bank feeds
                # float32 sums reordered by the decompositions, over at most B·(K+M)·E = 2·40·32 products each:
                # the whole gradient within that many float32 epsilons of the eager one (the defect: ×100s)
                error, norm = (grads[1][name].grad - param.grad).norm(), param.grad.norm()  # both 0 at an empty bank
                assert error <= 2 * 40 * 32 * torch.finfo(torch.float32).eps * norm, (i, name, float(error / norm))
    torch._dynamo.reset()
    assert kept_written == [set()]  # one graph; none of the tensors it writes is kept for its backward
