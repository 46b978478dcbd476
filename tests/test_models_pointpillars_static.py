"""The padded, bucketed PointPillars/SSN training step (:mod:`drivetrain.models.pointpillars.static`): the same
terms and gradients as the eager forward + loss, at any bucket holding the batch; one graph per bucket with no
graph break under ``torch.compile(fullgraph=True)``."""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest
import torch

from drivetrain.data import DatasetConfig, FrameDataset, collate
from drivetrain.match.anchor_window import window_pair_total
from drivetrain.models.pointpillars.model import SSN, PointPillars
from drivetrain.models.pointpillars.static import (
    Buckets,
    StaticPillarStep,
    StaticShapes,
    _feature_size,
    _pad_dim1,
    geometric_buckets,
    static_loss,
    voxel_ladder,
    window_pairs_per_target,
)
from drivetrain.pipeline.transfer import to_device
from drivetrain.pipeline.voxelize import voxel_counts
from drivetrain.ragged import RaggedBatch
from helpers.nosync import no_host_sync
from helpers.partition import inductor_partition_backend

TINY = dict(
    point_cloud_range=(-16.0, -16.0, -5.0, 16.0, 16.0, 3.0),  # a 64×64 canvas: a quarter of the tiny config's
    voxel_size=(0.5, 0.5, 8.0),
    max_points=16,
    max_voxels=4000,
    max_voxels_test=4000,
    vfe_channels=(32,),
    backbone_channels=(32, 64, 128),
    layer_nums=(1, 2, 2),
    neck_channels=(32, 32, 32),
    anchor_ranges=[(-15.75, -15.75, -1.84, 15.75, 15.75, -1.84)],
    anchor_sizes=[(4.6, 1.95, 1.72), (0.73, 0.66, 1.76), (0.49, 2.49, 0.98)],
)
TINY_SSN = {
    **{k: v for k, v in TINY.items() if k not in ("anchor_ranges", "anchor_sizes")},
    "anchor_ranges": [(-16.0, -16.0, -1.84, 16.0, 16.0, -1.84)] * 10,
    "tasks": [(2, (32,), (1,)), (1, (32,), (1,)), (2, (32,), (1,)), (1, (32,), (2,)), (4, (32,), (2,))],
}
MODELS = {"pointpillars": (PointPillars, TINY), "ssn": (SSN, TINY_SSN)}
EPS32 = torch.finfo(torch.float32).eps
EPS64 = torch.finfo(torch.float64).eps


@pytest.fixture(scope="module")
def batch(synth_index, synth_root):
    config = DatasetConfig(load_images=False, load_points=True, num_sweeps=1, use_dim=(0, 1, 2, 4))
    dataset = FrameDataset(synth_index, config, synth_root)
    out = collate([dataset[i] for i in (1, 4)])
    return dataclasses.replace(out, points=out.points.apply(lambda t: t.double()))  # float64: see below


def _total(model: torch.nn.Module, terms: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(model.criterion.weights[name] * value for name, value in terms.items())


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_buckets_are_at_most_a_quarter_apart_and_end_at_the_cap():
    for low, high in ((1000, 8000), (256, 30000), (1024, 1100)):
        buckets = geometric_buckets(low, high)
        assert buckets[0] >= low and buckets[-1] == high and all(b % 64 == 0 for b in buckets[:-1])
        assert all(lo < hi <= 1.25 * lo for lo, hi in itertools.pairwise(buckets))


def test_a_batch_beyond_the_largest_bucket_names_the_key(batch):
    model = PointPillars(**TINY).double().train()
    small = Buckets(voxels=(64, 128), points=(1 << 20,))
    with pytest.raises(ValueError, match=r"^model\.args\.max_voxels: a batch needs \d+, above the largest bucket 128$"):
        StaticPillarStep(model, small).shapes(batch)
    with pytest.raises(ValueError, match=r"^model\.args\.max_targets: "):
        dataclasses.replace(small, max_targets=1).targets(batch.gt_boxes.shape[1])


def test_the_compiled_steps_buckets_are_few_and_a_batch_beyond_them_names_the_argument(batch):
    model = PointPillars(**TINY, max_points_per_sample=1 << 15, step_voxels=64, max_targets=100).double().train()
    buckets = Buckets.for_compiled_step(model.args, model.grid)
    assert buckets.voxels == (64,) and buckets.points == (1 << 15,) and buckets.targets_ladder == (64, 100)
    assert len(buckets.all_shapes(2, windowed=False)) == 2 and len(buckets.all_shapes(2, windowed=True)) == 10
    with pytest.raises(ValueError, match=r"^model\.args\.step_voxels: a batch needs \d+, above the largest bucket 64$"):
        StaticPillarStep(model, buckets).shapes(batch)
    small = PointPillars(**TINY, max_points_per_sample=64).double().train()
    with pytest.raises(ValueError, match=r"^model\.args\.max_points_per_sample: a batch needs \d+, above the "):
        StaticPillarStep(small, Buckets.for_compiled_step(small.args, small.grid)).shapes(batch)


@pytest.mark.parametrize("windowed", [False, True], ids=["dense", "windowed"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_padded_step_gives_the_eager_terms_and_gradients_at_any_bucket(batch, name, windowed):
    """The network runs in float64 (the loss is float32 either way: ``fp32``), so that what differs between the
    two layouts — the order of HardVFE's BatchNorm sums over ``N`` rows, the box and direction sums over window
    pairs instead of anchors — is rounding, bounded by recursive summation's ``γ_n = n·ε``: float32 terms
    within ``n·ε₃₂`` (``n = B·A`` summands), float64 gradients within ``64·N·ε₆₄`` (the slot sums of every
    BatchNorm the difference crosses; in float32 the backbone's near-empty BEV channels amplify ulps to ~1 %)."""
    cls, args = MODELS[name]
    torch.manual_seed(0)
    eager = cls(**args).double().train()
    padded = copy.deepcopy(eager)
    out = eager(batch)
    terms = eager.loss(out, batch)
    _total(eager, terms).backward()
    want = _grads(eager)
    step = StaticPillarStep(padded, Buckets.for_grid(padded.grid, 1 << 15), windowed=windowed)
    tight = step.shapes(batch)
    assert (tight.pairs > 0) == windowed
    loose = StaticShapes(tight.points + 640, tight.voxels + 320, tight.rows + 1280, 64, 2 * tight.pairs)  # all dims
    num_summands = out["cls_logits"].shape[0] * out["cls_logits"].shape[1]
    for shapes in (tight, loose):
        padded.zero_grad(set_to_none=True)
        got = step(batch, shapes)
        _total(padded, got).backward()
        for key, value in terms.items():
            torch.testing.assert_close(got[key], value, rtol=num_summands * EPS32, atol=0.0, msg=key)
        rows = 2 * shapes.voxels * padded.grid.max_points
        for key, grad in _grads(padded).items():
            scale = want[key].abs().max().item()
            torch.testing.assert_close(grad, want[key], rtol=0.0, atol=64 * rows * EPS64 * scale, msg=key)
        assert set(_grads(padded)) == set(want)


def _static_args(model: torch.nn.Module, batch, shapes: StaticShapes) -> tuple:
    anchors, classes, thresholds = model.anchor_set(_feature_size(model), batch.points.device)
    return (
        model,
        _pad_dim1(batch.points.tensor, shapes.points),
        batch.points.sizes,
        _pad_dim1(batch.gt_boxes.tensor, shapes.targets),
        _pad_dim1(batch.gt_labels.tensor, shapes.targets),
        batch.gt_boxes.sizes,
        anchors,
        thresholds,
        classes,
        shapes.voxels,
        shapes.rows,
        model.windowed_anchors(_feature_size(model), batch.points.device) if shapes.pairs else None,
        shapes.pairs,
    )


# One case of each model in the default set (PointPillars windowed, SSN dense); the other two in the slow set.
ONE_GRAPH_CASES = [
    pytest.param(name, windowed, id=f"{name}-{'windowed' if windowed else 'dense'}",
                 marks=() if (name, windowed) in {("pointpillars", True), ("ssn", False)} else pytest.mark.slow)
    for name in sorted(MODELS)
    for windowed in (False, True)
]  # fmt: skip


@pytest.mark.parametrize(("name", "windowed"), ONE_GRAPH_CASES)
def test_the_step_is_one_graph_without_a_break(batch, name, windowed):
    cls, args = MODELS[name]
    model = cls(**args).double().train()
    step = StaticPillarStep(model, Buckets.for_grid(model.grid, 1 << 15), windowed=windowed)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(static_loss)(*_static_args(model, batch, step.shapes(batch)))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize(("name", "windowed"), ONE_GRAPH_CASES)
def test_the_backward_as_inductor_partitions_the_step_reads_no_input_the_forward_wrote(batch, name, windowed):
    """The step writes inputs in place (the BatchNorms' running statistics); AOTAutograd's min-cut partitioner may
    keep a graph input for the backward and recompute from it there, which must never be one of those (StreamPETR's
    memory bank was: tests/test_models_streampetr_static.py). Checked as inductor partitions, without code
    generation."""
    cls, args = MODELS[name]
    model = cls(**args).double().train()  # the batch's float64 (the partition does not depend on the dtype)
    step = StaticPillarStep(model, Buckets.for_grid(model.grid, 1 << 15), windowed=windowed)
    backend, kept_written = inductor_partition_backend()
    torch._dynamo.reset()
    try:
        compiled = torch.compile(static_loss, fullgraph=True, dynamic=False, backend=backend)
        _total(model, compiled(*_static_args(model, batch, step.shapes(batch)))).backward()
    finally:
        torch._dynamo.reset()
    assert kept_written == [set()]  # one graph; none of the inputs it writes is kept for its backward


@pytest.mark.slow
def test_one_compile_per_bucket_and_none_on_return(batch):
    from torch._dynamo.testing import CompileCounter

    model = PointPillars(**TINY).double().train()
    step = StaticPillarStep(model, Buckets.for_grid(model.grid, 1 << 15))
    shapes = step.shapes(batch)
    torch._dynamo.reset()
    counter = CompileCounter()
    step.fn = torch.compile(static_loss, backend=counter, fullgraph=True, dynamic=False)
    other = StaticShapes(shapes.points, shapes.voxels, shapes.rows, shapes.targets * 2)
    for s in (shapes, shapes, other, shapes, other):  # crossing buckets and back
        _total(model, step(batch, s)).backward()
    assert counter.frame_count == 2  # one per bucket, none again on return


@pytest.mark.parametrize(("voxel_buckets", "windowed"), [(False, False), (True, False), (False, True)])
def test_the_padded_step_reads_the_host_once_with_buckets_to_choose_and_never_without(batch, voxel_buckets, windowed):
    model = PointPillars(**TINY).double().train()
    buckets = Buckets.for_grid(model.grid, 1 << 15, voxel_buckets=voxel_buckets)
    step = StaticPillarStep(model, buckets, windowed=windowed)
    _total(model, step(batch)).backward()  # the anchors and the feature size are cached before the step
    with no_host_sync(documented=1) as documented:
        _total(model, step(batch)).backward()
    assert len(documented) == int(voxel_buckets or windowed)


# ------------------------------------------------------------------------------- the compiled step's chain of buckets
def test_the_voxel_ladder_is_at_most_a_quarter_apart_from_a_quarter_of_max_voxels_up_to_it():
    for cap in (300, 4000, 8000, 30000, 60000):
        ladder = voxel_ladder(cap)
        assert ladder[-1] == cap and ladder[0] <= max(-(-cap // 4 // 64) * 64, 256)
        assert all(lo < hi <= 1.25 * lo for lo, hi in itertools.pairwise(ladder))
    assert voxel_ladder(200) == (200,)  # below 4·64 one bucket


@pytest.mark.parametrize("windowed", [False, True], ids=["dense", "windowed"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_default_compiled_step_climbs_the_voxel_ladder_in_steps_of_at_most_a_quarter(name, windowed):
    cls, args = MODELS[name]
    model = cls(**args, window=windowed).train()
    chain = model.step_buckets(2)
    first = [s.voxels for s in chain if s.targets == 64]
    assert len(first) > 1 and first[-1] == model.grid.max_voxels and first[0] <= model.grid.max_voxels // 4 + 64
    assert all(lo < hi <= 1.25 * lo for lo, hi in itertools.pairwise(first))
    # a chain, not a product: the larger ground-truth bucket and the overflow pairs at the largest voxel bucket only
    assert len(chain) == len(first) + 1 + int(windowed) and len(set(chain)) == len(chain)
    assert all(s.voxels == model.grid.max_voxels for s in chain if s.targets > 64)
    per_target = model._static_step().buckets.pairs_per_target
    assert (per_target > 0) == windowed
    for s in chain[: len(first) + 1]:  # the pair slots follow the ground truth's bucket: B·G_b·W, aligned
        assert s.pairs == (-(-2 * s.targets * per_target // 64) * 64 if windowed else 0)
    if windowed:
        assert chain[-1].pairs == 1 << 20 and chain[-1].targets == 256


def test_window_pairs_per_target_is_the_windows_of_boxes_of_the_anchors_sizes():
    model = PointPillars(**TINY).train()
    feature = _feature_size(model)
    anchors, _, thresholds = model.anchor_set(feature, torch.device("cpu"))
    prepared = model.windowed_anchors(feature, torch.device("cpu"))
    per_box = []
    for size in model.anchor_config.sizes:  # one box at a time, as the assignment windows it
        box = torch.tensor([[[0.0, 0.0, 0.0, *size, 0.0, 0.0, 0.0]]])  # (1, 1, 9) at the map's centre
        one = torch.tensor([1])
        boxes, labels = RaggedBatch(box, one), RaggedBatch(torch.zeros(1, 1, dtype=torch.long), one)
        per_box.append(int(window_pair_total(anchors, prepared.grid, boxes, labels, thresholds, prepared=prepared)))
    assert window_pairs_per_target(model) == -(-sum(per_box) // len(per_box)) and min(per_box) > 0


@pytest.fixture(scope="module")
def chain_models():
    """PointPillars and SSN with the compiled step's buckets (the default voxel ladder, ground truth 64 and 100,
    window pairs tied to them), the network in float64 (see the equality test above)."""
    torch.manual_seed(0)
    return {name: cls(**args, max_points_per_sample=1 << 15, max_targets=100).double().train()
            for name, (cls, args) in MODELS.items()}  # fmt: skip


def _chain_kinds(step: StaticPillarStep, batch) -> dict[str, StaticShapes]:
    """A bucket of each kind of the chain that holds ``batch``: its own (a ladder rung below max_voxels, pairs tied
    to G_b 64), a larger voxel rung, the larger ground-truth bucket and the overflow pairs."""
    chain = step.buckets.all_shapes(batch.points.shape[0], step.windowed)
    own = step.shapes(batch)
    return {
        "own": own,
        "next rung": chain[chain.index(own) + 1],
        "targets 100": next(s for s in chain if s.targets == 100),
        "overflow": chain[-1],
    }


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_padded_step_gives_the_eager_terms_and_gradients_at_each_kind_of_chain_bucket(batch, chain_models, name):
    """As the equality test above (float64 network, the same derived tolerances), at the chain's buckets; the
    overflow bucket at 2^16 pair slots instead of 2^20 (the same kind, an eager test's size)."""
    model = chain_models[name]
    eager, padded = copy.deepcopy(model), copy.deepcopy(model)
    out = eager(batch)
    terms = eager.loss(out, batch)
    _total(eager, terms).backward()
    want = _grads(eager)
    step = padded._static_step()
    step.buckets = dataclasses.replace(step.buckets, pairs=(1 << 16,))
    step._chains.clear()
    kinds = _chain_kinds(step, batch)
    assert kinds["own"].voxels < padded.grid.max_voxels and kinds["own"].targets == 64  # a rung of the ladder
    assert kinds["overflow"].pairs == 1 << 16 > kinds["targets 100"].pairs > kinds["own"].pairs > 0
    num_summands = out["cls_logits"].shape[0] * out["cls_logits"].shape[1]
    for kind, shapes in kinds.items():
        padded.zero_grad(set_to_none=True)
        got = padded.step_loss(*padded.step_inputs(batch, shapes, 2, batch.points.device))
        _total(padded, got).backward()
        for key, value in terms.items():
            torch.testing.assert_close(got[key], value, rtol=num_summands * EPS32, atol=0.0, msg=f"{kind} {key}")
        rows = 2 * shapes.voxels * padded.grid.max_points
        for key, grad in _grads(padded).items():
            scale = want[key].abs().max().item()
            torch.testing.assert_close(grad, want[key], rtol=0.0, atol=64 * rows * EPS64 * scale, msg=f"{kind} {key}")
        assert set(_grads(padded)) == set(want)


def test_a_batch_takes_the_first_chain_bucket_that_holds_it_with_one_host_read(batch, chain_models):
    model = chain_models["pointpillars"]
    model.step_shapes(batch)  # the anchors and the feature size are cached before the step
    chain = model.step_buckets(2)
    num_voxels, _ = voxel_counts(batch.points, model.grid)
    boxes, labels = model.gt_targets(batch)
    feature = _feature_size(model)
    anchors, _, thresholds = model.anchor_set(feature, batch.points.device)
    prepared = model.windowed_anchors(feature, anchors.device)
    pairs = int(window_pair_total(anchors, prepared.grid, boxes, labels, thresholds, prepared=prepared))
    with no_host_sync(documented=1) as documented:
        own = model.step_shapes(batch)
    assert len(documented) == 1  # the largest voxel count and the window pairs, in one read
    holds = [s.voxels >= int(num_voxels.max()) and s.targets >= batch.gt_boxes.shape[1] and s.pairs >= pairs
             for s in chain]  # fmt: skip
    assert own == chain[holds.index(True)] and own.voxels < model.grid.max_voxels


def test_a_batch_beyond_the_chains_pairs_names_model_args_window(batch):
    model = PointPillars(**TINY).double().train()
    tight = Buckets.for_compiled_step(model.args, model.grid, pairs_per_target=1)
    tight = dataclasses.replace(tight, pairs=(128,))  # 2·64·1 = 128 slots at G_b 64, no larger overflow bucket
    with pytest.raises(ValueError, match=r"^model\.args\.window: a batch needs \d+ window pairs, above the largest "):
        StaticPillarStep(model, tight, windowed=True).shapes(batch)
    single = PointPillars(**TINY, step_voxels=64).double().train()  # the explicit single bucket still names its key
    buckets = Buckets.for_compiled_step(single.args, single.grid, pairs_per_target=1)
    assert buckets.voxels == (64,)
    with pytest.raises(ValueError, match=r"^model\.args\.step_voxels: a batch needs \d+, above the largest bucket 64$"):
        StaticPillarStep(single, buckets, windowed=True).shapes(batch)


@pytest.mark.parametrize("cut", ["voxels", "pairs"])
def test_a_bucket_that_does_not_hold_the_batch_fails_on_the_device_rather_than_cutting(batch, cut):
    """The guards of the graph (``torch._assert_async``: no host read on a GPU; an error at the step's next read):
    a bucket chosen from a count that is not the step's own cuts nothing silently."""
    model = PointPillars(**TINY).double().train()
    step = StaticPillarStep(model, Buckets.for_grid(model.grid, 1 << 15), windowed=True)
    fits = step.shapes(batch)
    static_loss(*_static_args(model, batch, fits))  # the bucket that holds the batch passes
    most = int(voxel_counts(batch.points, model.grid)[0].max())
    feature = _feature_size(model)
    anchors, _, thresholds = model.anchor_set(feature, batch.points.device)
    prepared = model.windowed_anchors(feature, anchors.device)
    boxes, labels = model.gt_targets(batch)
    total = int(window_pair_total(anchors, prepared.grid, boxes, labels, thresholds, prepared=prepared))
    # one slot short of the batch's largest sample's voxels, or of its window pairs
    short = (
        dataclasses.replace(fits, voxels=most - 1) if cut == "voxels" else dataclasses.replace(fits, pairs=total - 1)
    )
    name = "voxels" if cut == "voxels" else "pairs"
    with pytest.raises(RuntimeError, match=rf"^speed\.compile_step: .* more {name} than the \d+ slots of its bucket"):
        static_loss(*_static_args(model, batch, short))


def test_the_bucket_chosen_on_the_host_is_the_one_chosen_on_the_device(batch, chain_models):
    """``step_shapes_on_host`` reads host tensors only (the loader's batch, before the copy) and picks what
    ``step_shapes`` picks from the device's copy."""
    model = chain_models["ssn"]  # per-class windows: the labels mapped to the model's order on the host
    model.step_shapes(batch)  # the anchors and the feature size are cached before the step
    with no_host_sync(documented=1) as documented:
        on_device = model.step_shapes(batch)
    assert len(documented) == 1
    assert model.step_shapes_on_host(batch) == on_device


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_bucket_chosen_on_the_host_matches_the_cuda_copys(batch):
    torch.manual_seed(0)
    model = SSN(**TINY_SSN, max_points_per_sample=1 << 15, max_targets=100).double().cuda().train()
    host = dataclasses.replace(batch, points=batch.points.apply(lambda t: t.float()))
    on_cuda = to_device(host, torch.device("cuda"))
    assert model.step_shapes_on_host(host) == model.step_shapes(on_cuda)
