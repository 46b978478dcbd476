"""drivetrain.ragged.select: select and indices_from_mask against per-sample boolean
indexing; trimmed and untrimmed outputs hold the same valid entries."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from drivetrain import ragged
from drivetrain.ragged import RaggedBatch
from helpers.ragged import (
    ALL_DTYPES,
    LAYOUTS,
    Layout,
    assert_all_equal_to,
    assert_grads_close,
    assert_samples_equal,
    batch_indices,
    dtype_id,
    grads,
    leaf,
    random_ragged,
    random_sizes,
    sample_of,
    valid_samples,
    weighted_sin_loss,
)

N = 6


def random_mask(batch: tuple[int, ...], length: int, gen: torch.Generator) -> torch.Tensor:
    """Random bool ``(*batch, length)``; with ≥ 2 samples the first selects nothing, the last everything."""
    mask = torch.rand((*batch, length), generator=gen) < 0.5
    flat = mask.view(-1, length)
    if flat.shape[0] >= 2:
        flat[0], flat[-1] = False, True
    return mask


def loop_select(x: torch.Tensor, sizes: torch.Tensor | None, mask: torch.Tensor, dim: int) -> list[torch.Tensor]:
    """``data[b][:size_b][mask[b][:size_b]]`` sample by sample (``sizes`` None: plain data)."""
    out = []
    for b in batch_indices(mask.shape[:-1]):
        sample, keep = sample_of(x, b, dim), mask[b]
        if sizes is not None:
            sample, keep = sample[: int(sizes[b])], keep[: int(sizes[b])]
        out.append(sample[keep])
    return out


def loop_positions(mask: torch.Tensor) -> list[torch.Tensor]:
    """Positions of the True entries of every sample, in order."""
    return [
        torch.tensor([i for i in range(mask.shape[-1]) if mask[b][i]], dtype=torch.int64)
        for b in batch_indices(mask.shape[:-1])
    ]


def selected_counts(mask: torch.Tensor, sizes: torch.Tensor | None) -> torch.Tensor:
    if sizes is not None:
        mask = mask & (torch.arange(mask.shape[-1]) < sizes.unsqueeze(-1))
    return mask.sum(-1)


# ---------------------------------------------------------------------- select
@pytest.mark.parametrize("data_kind", ["ragged", "plain"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_select_matches_per_sample_boolean_indexing(layout, dtype, data_kind, gen):
    data = random_ragged(layout, N, dtype, gen, poison=data_kind == "ragged")
    sizes = data.sizes if data_kind == "ragged" else None
    mask = random_mask(layout.batch, N, gen)
    x = leaf(data.tensor)
    if sizes is not None:
        out = ragged.select(data.with_tensor(x), mask, fill=9)
    else:
        out = ragged.select(x, mask, ragged_dim=layout.ragged_dim, fill=9)
    counts = selected_counts(mask, sizes)
    assert out.sizes.dtype == torch.int64 and torch.equal(out.sizes, counts)
    assert out.max_size == int(counts.max()), "trim=True cuts the padded length to the longest selection"
    assert out.ragged_dim == layout.ragged_dim and out.shape == layout.shape(out.max_size)
    expected = loop_select(x, sizes, mask, layout.ragged_dim)
    assert_samples_equal(valid_samples(out), expected)
    assert_all_equal_to([out.tensor.masked_select(~out.broadcast_mask())], 9)
    if dtype.is_floating_point:
        actual_grads = grads(weighted_sin_loss(valid_samples(out)), [x])
        assert_grads_close(actual_grads, grads(weighted_sin_loss(expected), [x]), dtype)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_select_without_trim_keeps_the_length_and_the_same_valid_entries(layout, gen):
    data = random_ragged(layout, N, torch.float32, gen)
    mask = random_mask(layout.batch, N, gen)
    mask.view(-1, N)[-1] = False  # no sample selects N entries, so trimming would shorten
    trimmed = ragged.select(data, mask, trim=True, fill=-1)
    untrimmed = ragged.select(data, mask, trim=False, fill=-1)
    assert trimmed.max_size < N and untrimmed.max_size == N and untrimmed.shape == layout.shape(N)
    assert torch.equal(untrimmed.sizes, trimmed.sizes)
    assert torch.equal(untrimmed.mask, untrimmed.sizes.unsqueeze(-1) > torch.arange(N))
    assert_samples_equal(valid_samples(untrimmed), valid_samples(trimmed))
    assert_all_equal_to([untrimmed.tensor.masked_select(~untrimmed.broadcast_mask())], -1)


def test_select_of_few_entries_from_long_samples_fills_the_padding(gen):
    """Long samples and short selections take another fill path (fill after the copy, not from an extra row)."""
    layout = Layout((2, 3), after=(2,))
    data = random_ragged(layout, 40, torch.float32, gen)  # NaN padding
    mask = torch.rand(2, 3, 40, generator=gen) < 0.05
    mask[0, 0, :3] = True
    x = leaf(data.tensor)
    out = ragged.select(data.with_tensor(x), mask, fill=9)
    assert out.max_size * 8 < 40, "the test needs a short selection"
    expected = loop_select(x, data.sizes, mask, layout.ragged_dim)
    assert_samples_equal(valid_samples(out), expected)
    assert_all_equal_to([out.tensor.masked_select(~out.broadcast_mask())], 9)
    actual_grads = grads(weighted_sin_loss(valid_samples(out)), [x])
    assert_grads_close(actual_grads, grads(weighted_sin_loss(expected), [x]), torch.float32)


def test_select_sizes_equal_the_mask_counts(gen):
    x = torch.randn(2, 3, N, 2, generator=gen)
    mask = random_mask((2, 3), N, gen)
    for trim in (True, False):
        assert torch.equal(ragged.select(x, mask, trim=trim).sizes, mask.sum(-1))


def test_select_keeps_the_order_of_the_selected_entries():
    data = torch.tensor([[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]])
    mask = torch.tensor([[False, True, False, True, True], [True, False, False, False, True]])
    out = ragged.select(data, mask, fill=-1)
    assert out.tensor.tolist() == [[11, 13, 14], [20, 24, -1]]


def test_select_with_a_ragged_mask_counts_its_padding_as_false(gen):
    layout = Layout((2, 3), after=(2,))
    x = torch.randn(layout.shape(N), generator=gen)
    mask_sizes = random_sizes(layout.batch, N, gen)
    mask = RaggedBatch(random_mask(layout.batch, N, gen), mask_sizes)
    mask.tensor[..., -1] = True  # padding set True somewhere: it must still count as False
    out = ragged.select(x, mask)
    expected_mask = mask.tensor & mask.mask
    assert torch.equal(out.sizes, expected_mask.sum(-1))
    assert_samples_equal(valid_samples(out), loop_select(x, None, expected_mask, layout.ragged_dim))


def test_select_never_selects_the_padding_of_ragged_data(gen):
    layout = Layout((4,), before=(2,))
    data = random_ragged(layout, N, torch.float64, gen)  # NaN padding
    out = ragged.select(data, torch.ones(4, N, dtype=torch.bool))
    assert torch.equal(out.sizes, data.sizes)
    assert_samples_equal(valid_samples(out), valid_samples(data))
    assert not out.tensor.isnan().any()


@pytest.mark.parametrize("trim", [True, False])
def test_select_with_an_all_false_mask_is_all_empty(trim, gen):
    layout = Layout((2, 3), after=(2,))
    x = leaf(torch.randn(layout.shape(N), generator=gen, dtype=torch.float64))
    out = ragged.select(x, torch.zeros(2, 3, N, dtype=torch.bool), trim=trim, fill=1)
    assert torch.equal(out.sizes, torch.zeros(2, 3, dtype=torch.int64))
    assert out.shape == layout.shape(0 if trim else N)
    assert torch.equal(out.tensor, torch.ones(layout.shape(0 if trim else N), dtype=torch.float64))
    (grad,) = grads(out.tensor.sum(), [x])
    assert torch.equal(grad, torch.zeros_like(x))


@settings(max_examples=30, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    after=st.lists(st.integers(1, 2), max_size=2),
    length=st.integers(0, 6),
    ragged_data=st.booleans(),
    trim=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_select_matches_per_sample_boolean_indexing_for_random_shapes(batch, after, length, ragged_data, trim, seed):
    gen = torch.Generator().manual_seed(seed)
    layout = Layout(tuple(batch), after=tuple(after))
    data = random_ragged(layout, length, torch.float64, gen, poison=ragged_data)
    mask = torch.rand((*batch, length), generator=gen) < 0.5
    sizes = data.sizes if ragged_data else None
    out = ragged.select(data if ragged_data else data.tensor, mask, trim=trim, fill=2)
    counts = selected_counts(mask, sizes)
    assert torch.equal(out.sizes, counts)
    assert out.max_size == (int(counts.max()) if trim else length)
    assert_samples_equal(valid_samples(out), loop_select(data.tensor, sizes, mask, layout.ragged_dim))
    assert_all_equal_to([out.tensor.masked_select(~out.broadcast_mask())], 2)


# ---------------------------------------------------------------------- indices_from_mask, from_mask
@pytest.mark.parametrize("trim", [True, False])
@pytest.mark.parametrize("batch", [(5,), (2, 3)], ids=str)
def test_indices_from_mask_gives_the_true_positions_in_order(batch, trim, gen):
    mask = random_mask(batch, N, gen)
    out = ragged.indices_from_mask(mask, trim=trim)
    assert out.dtype == torch.int64 and out.sizes.dtype == torch.int64
    assert torch.equal(out.sizes, mask.sum(-1))
    assert out.max_size == (int(mask.sum(-1).max()) if trim else N)
    assert_samples_equal(valid_samples(out), loop_positions(mask))


def test_indices_from_mask_with_a_ragged_mask_ignores_its_padding(gen):
    sizes = random_sizes((4,), N, gen)
    mask = RaggedBatch(torch.ones(4, N, dtype=torch.bool), sizes)  # True in the padding too
    out = ragged.indices_from_mask(mask)
    assert torch.equal(out.sizes, sizes)
    assert_samples_equal(valid_samples(out), [torch.arange(int(s)) for s in sizes])


@pytest.mark.parametrize("length", [0, N])
def test_indices_from_an_all_false_mask_are_empty(length):
    out = ragged.indices_from_mask(torch.zeros(2, 3, length, dtype=torch.bool))
    assert out.shape == (2, 3, 0) and torch.equal(out.sizes, torch.zeros(2, 3, dtype=torch.int64))


@pytest.mark.parametrize("trim", [True, False])
def test_gather_at_indices_from_mask_equals_select(trim, gen):
    layout = Layout((2, 3), before=(2,))
    x = torch.randn(layout.shape(N), generator=gen)
    mask = random_mask(layout.batch, N, gen)
    selected = ragged.select(x, mask, ragged_dim=layout.ragged_dim, trim=trim)
    gathered = ragged.gather(x, ragged.indices_from_mask(mask, trim=trim), dim=layout.ragged_dim)
    assert torch.equal(gathered.tensor, selected.tensor) and torch.equal(gathered.sizes, selected.sizes)
