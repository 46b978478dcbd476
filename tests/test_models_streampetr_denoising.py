"""models/streampetr/denoising.py: batched DN queries == the original's prepare_for_dn bit for bit, where the
rows land, the split ball and the clamp, the attention mask's blocks, the one documented host sync, and
argument errors."""

from __future__ import annotations

import pytest
import torch

from drivetrain.models.streampetr.denoising import DNQueries, make_dn_queries, reference_make_dn_queries
from drivetrain.ragged import RaggedBatch
from helpers.boxes import random_boxes3d
from helpers.nosync import count_host_syncs

C = 10
PC_RANGE = (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0)
SETTINGS = dict(noise_scale=1.0, split=0.75, pc_range=PC_RANGE, num_classes=C)
SIZES = [[3, 0, 5], [1], [2, 2], [0, 4, 0, 1]]


def make_gt(sizes: list[int], gen: torch.Generator, extra_pad: int = 0) -> tuple[RaggedBatch, RaggedBatch]:
    """Ground truth with poisoned padding (NaN boxes, out-of-range labels), padded ``extra_pad`` beyond max M_b."""
    boxes = RaggedBatch.from_list([random_boxes3d(m, gen) for m in sizes], fill=float("nan"))
    labels = RaggedBatch.from_list([torch.randint(0, C, (m,), generator=gen) for m in sizes], fill=10**9)
    if extra_pad:
        boxes = RaggedBatch(torch.nn.functional.pad(boxes.tensor, (0, 0, 0, extra_pad), value=float("nan")), sizes)
        labels = RaggedBatch(torch.nn.functional.pad(labels.tensor, (0, extra_pad), value=10**9), sizes)
    return boxes, labels


def run(fn, boxes, labels, groups=3, num_query=4, num_propagated=2, memory_len=5, **kwargs) -> DNQueries:
    kwargs = {**SETTINGS, **kwargs}
    return fn(
        boxes, labels, groups=groups, num_query=num_query, num_propagated=num_propagated, memory_len=memory_len,
        **kwargs,
    )  # fmt: skip


def assert_identical(a: DNQueries, b: DNQueries) -> None:
    assert (a.groups, a.single_pad) == (b.groups, b.single_pad)
    for name in ("reference", "background", "labels"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
    assert (a.attn_mask is None) == (b.attn_mask is None)
    if a.attn_mask is not None:
        assert a.attn_mask.dtype == torch.bool and torch.equal(a.attn_mask, b.attn_mask)


@pytest.mark.parametrize("extra_pad", [0, 2])
@pytest.mark.parametrize("groups", [1, 3, 10])
@pytest.mark.parametrize("sizes", [*SIZES, [0, 0]], ids=str)
def test_batched_equals_the_original_loops_bit_for_bit(sizes, groups, extra_pad, gen) -> None:
    boxes, labels = make_gt(sizes, gen, extra_pad)
    noise = torch.rand(groups * sum(sizes), 3, generator=gen) * 2 - 1  # (groups·T, 3)
    batched = run(make_dn_queries, boxes, labels, groups, noise=noise)
    assert_identical(batched, run(reference_make_dn_queries, boxes, labels, groups, noise=noise))
    p = groups * max(sizes)
    assert batched.reference.shape == (len(sizes), p, 3) and batched.single_pad == max(sizes)
    assert torch.isfinite(batched.reference).all()  # the NaN padding of the ground truth is never read
    assert ((batched.reference >= 0) & (batched.reference <= 1)).all()


def test_a_generator_draws_the_same_noise_in_both_paths() -> None:
    boxes, labels = make_gt([3, 0, 5], torch.Generator().manual_seed(0))
    drawn = [run(fn, boxes, labels, 10, generator=torch.Generator().manual_seed(7)) for fn in (make_dn_queries,
             reference_make_dn_queries)]  # fmt: skip
    assert_identical(*drawn)
    explicit = torch.rand(10 * 8, 3, generator=torch.Generator().manual_seed(7)) * 2 - 1
    assert_identical(drawn[0], run(make_dn_queries, boxes, labels, 10, noise=explicit))


@pytest.mark.parametrize("fn", [make_dn_queries, reference_make_dn_queries])
def test_rows_land_at_group_offsets_and_padding_rows_are_zero_background(fn, gen) -> None:
    sizes, groups = [3, 0, 1], 4
    boxes, labels = make_gt(sizes, gen)
    dn = run(fn, boxes, labels, groups, noise=torch.zeros(groups * 4, 3))  # r = 0: clean centres, labels kept
    low, high = torch.tensor(PC_RANGE[:3]), torch.tensor(PC_RANGE[3:])
    for b, m in enumerate(sizes):
        clean = (boxes.tensor[b, :m, :3] - low) / (high - low)  # (M_b, 3)
        for g in range(groups):
            rows = slice(g * 3, g * 3 + m)
            assert torch.equal(dn.reference[b, rows], clean)
            assert torch.equal(dn.labels[b, rows], labels.tensor[b, :m]) and not dn.background[b, rows].any()
            pad = slice(g * 3 + m, (g + 1) * 3)
            assert (dn.reference[b, pad] == 0).all() and dn.background[b, pad].all() and (dn.labels[b, pad] == C).all()


@pytest.mark.parametrize("fn", [make_dn_queries, reference_make_dn_queries])
def test_noise_outside_the_split_ball_makes_background(fn, gen) -> None:
    boxes, labels = make_gt([4], gen)
    # norms 0.5, 0.75 (the boundary: kept, the test is ‖r‖ > split), 0.9 and √3
    noise = torch.tensor([[0.3, 0.4, 0.0], [0.0, 0.0, -0.75], [0.9, 0.0, 0.0], [1.0, -1.0, 1.0]])
    dn = run(fn, boxes, labels, 1, noise=noise)
    assert dn.background[0].tolist() == [False, False, True, True]
    assert dn.labels[0].tolist() == [*labels.tensor[0, :2].tolist(), C, C]


@pytest.mark.parametrize("fn", [make_dn_queries, reference_make_dn_queries])
def test_a_centre_noised_beyond_pc_range_clamps_to_the_unit_cube(fn) -> None:
    box = torch.tensor([[50.0, -50.0, 2.0, 10.0, 10.0, 4.0, 0.0, 0.0, 0.0]])  # noise moves it by up to ±5, ±5, ±2
    boxes, labels = RaggedBatch.from_list([box]), RaggedBatch.from_list([torch.tensor([2])])
    dn = run(fn, boxes, labels, 1, noise=torch.tensor([[1.0, -1.0, 0.5]]))  # → (55, −55, 3): x, y clamp; z = max
    assert torch.equal(dn.reference[0, 0], torch.tensor([1.0, 0.0, 1.0]))
    half = run(fn, boxes, labels, 1, noise=torch.tensor([[0.1, 0.1, -0.5]]), noise_scale=0.5)  # → (50.25, −49.75, 1.5)
    expected = (torch.tensor([50.25, -49.75, 1.5]) - torch.tensor(PC_RANGE[:3])) / 102.4  # x, y; z below
    torch.testing.assert_close(half.reference[0, 0, :2], expected[:2])
    torch.testing.assert_close(half.reference[0, 0, 2], torch.tensor(6.5 / 8))


@pytest.mark.parametrize("fn", [make_dn_queries, reference_make_dn_queries])
def test_attention_mask_blocks_dn_columns_from_matching_rows_and_other_groups(fn, gen) -> None:
    groups, s, num_query, num_propagated, memory_len = 3, 2, 4, 2, 5
    boxes, labels = make_gt([2, 1], gen)
    mask = run(fn, boxes, labels, groups, num_query, num_propagated, memory_len).attn_mask
    p = groups * s
    assert mask.shape == (p + num_query + num_propagated, p + num_query + memory_len) and mask.dtype == torch.bool
    assert mask[p:, :p].all()  # matching and propagated rows never see a DN column
    assert not mask[:, p:].any()  # matching, propagated and memory columns are visible to every row
    for g in range(groups):
        own = torch.zeros(p, dtype=torch.bool)
        own[g * s : (g + 1) * s] = True
        assert torch.equal(mask[g * s : (g + 1) * s, :p], ~own.expand(s, p))  # only its own group's DN columns
    expected_rows = ["001111", "001111", "110011", "110011", "111100", "111100"]  # DN rows, DN columns; 0 = sees
    assert ["".join(str(int(v)) for v in row) for row in mask[:p, :p].tolist()] == expected_rows


@pytest.mark.parametrize("fn", [make_dn_queries, reference_make_dn_queries])
@pytest.mark.parametrize(("sizes", "groups"), [([0, 0], 3), ([2, 1], 0)])
def test_no_ground_truth_or_no_groups_gives_no_dn_queries(fn, sizes, groups, gen) -> None:
    boxes, labels = make_gt(sizes, gen)
    dn = run(fn, boxes, labels, groups)
    assert dn.attn_mask is None and dn.reference.shape == (2, 0, 3)
    assert dn.background.shape == dn.labels.shape == (2, 0) and dn.single_pad == max(sizes)


def test_dn_labels_are_what_the_loss_rebuilds_from_background(gen) -> None:
    # StreamPETRLoss: label of DN query g·S + i = gt label i, or C where dn_background; counted while i < M_b
    sizes, groups = [3, 0, 5], 4
    boxes, labels = make_gt(sizes, gen)
    dn = run(make_dn_queries, boxes, labels, groups)
    slot = torch.arange(groups * 5) % 5  # (P,)
    exists = slot.unsqueeze(0) < boxes.sizes.unsqueeze(1)  # (B, P)
    rebuilt = labels.tensor.gather(1, slot.expand(3, -1)).masked_fill(dn.background, C)  # (B, P)
    assert torch.equal(rebuilt[exists], dn.labels[exists]) and dn.background[~exists].all()


@pytest.mark.parametrize("sizes", [[3, 0, 5], [0, 0]], ids=str)
def test_batched_path_reads_the_host_once(sizes, gen) -> None:
    boxes, labels = make_gt(sizes, gen)
    noise = torch.rand(10 * sum(sizes), 3, generator=gen) * 2 - 1
    run(make_dn_queries, boxes, labels, 10, noise=noise)  # warm-up: drivetrain.constants copies its constants once
    with count_host_syncs() as calls:
        run(make_dn_queries, boxes, labels, 10, noise=noise)
        run(make_dn_queries, boxes, labels, 10, generator=gen)
    assert calls == ["tolist", "tolist"]  # the documented `# sync:` (S and T), once per call
    with count_host_syncs() as calls:
        run(reference_make_dn_queries, boxes, labels, 10, noise=noise)
    assert calls and calls[0] == "tolist"  # the counter does see the original's host reads


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(groups=-1), "groups"),
        (dict(split=0.0), "split"),
        (dict(noise_scale=0.0), "noise_scale"),
        (dict(pc_range=(0.0, 0.0, 0.0, 1.0, 1.0)), "pc_range"),
        (dict(pc_range=(1.0, 0.0, 0.0, 1.0, 1.0, 1.0)), "pc_range"),
        (dict(num_propagated=6), "num_propagated"),
        (dict(noise=torch.zeros(5, 3)), "noise"),
        (dict(labels_sizes=[1, 2]), "gt_labels"),
    ],
)
@pytest.mark.parametrize("fn", [make_dn_queries, reference_make_dn_queries])
def test_bad_arguments_raise_value_error_naming_them(fn, change, message, gen) -> None:
    boxes, labels = make_gt([2, 0, 1], gen)
    change = dict(change)  # the parameter is shared between both functions
    if "labels_sizes" in change:
        labels = make_gt(change.pop("labels_sizes"), gen)[1]
    with pytest.raises(ValueError, match=message):
        run(fn, boxes, labels, **{"groups": 3, **change})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batched_on_cuda_equals_the_original_on_cpu(gen) -> None:
    boxes, labels = make_gt([3, 0, 5, 2], gen, extra_pad=1)
    noise = torch.rand(10 * 10, 3, generator=gen) * 2 - 1
    cuda = run(make_dn_queries, boxes.to("cuda"), labels.to("cuda"), 10, noise=noise.cuda(), memory_len=1024)
    cpu = run(reference_make_dn_queries, boxes, labels, 10, noise=noise, memory_len=1024)
    moved = DNQueries(cuda.reference.cpu(), cuda.background.cpu(), cuda.labels.cpu(), cuda.groups,
                      cuda.single_pad, cuda.attn_mask.cpu())  # fmt: skip
    assert_identical(moved, cpu)
