"""drivetrain.ragged.ops: gather, scatter, write, map_pairs, mask_from_indices and combine, each held equal
to a per-sample Python loop (exactly for the forward copies, within the dtype's tolerance for gradients)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from drivetrain import ragged
from drivetrain.ragged import RaggedBatch
from helpers.ragged import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    LAYOUTS,
    Layout,
    assert_all_equal_to,
    assert_grads_close,
    assert_identical,
    assert_samples_equal,
    batch_indices,
    dtype_id,
    grads,
    leaf,
    rand_like_grad,
    random_index,
    random_ragged,
    random_sizes,
    random_values,
    sample_of,
    valid_samples,
    weighted_sin_loss,
)

N, J = 6, 4  # indexed (padded) length of the data, padded number of indices
TWO_LAYOUTS = (LAYOUTS[1], LAYOUTS[6])  # (B, S, C) and (L, B, C, S)


# ---------------------------------------------------------------------- per-sample loop references
def valid_index(index: RaggedBatch, b: tuple[int, ...]) -> torch.Tensor:
    return index.tensor[b][: int(index.sizes[b])].long()


def loop_gather(x: torch.Tensor, sizes: torch.Tensor | None, index: RaggedBatch, dim: int) -> list[torch.Tensor]:
    """``out[b] = data[b][:size_b][index[b, :k]]``; ``sizes`` None for a plain tensor (all ``N`` valid)."""
    out = []
    for b in batch_indices(index.batch_shape):
        sample = sample_of(x, b, dim)
        if sizes is not None:
            sample = sample[: int(sizes[b])]
        out.append(sample[valid_index(index, b)])
    return out


def loop_scatter(values: torch.Tensor, index: RaggedBatch, size: int, fill: float, dim: int) -> torch.Tensor:
    """``out[b][index[b, :k]] = values[b][:k]`` into a tensor full of ``fill``."""
    shape = list(values.shape)
    shape[dim] = size
    out = torch.full(shape, fill, dtype=values.dtype)
    for b in batch_indices(index.batch_shape):
        k = int(index.sizes[b])
        sample_of(out, b, dim)[valid_index(index, b)] = sample_of(values, b, dim)[:k]
    return out


def loop_write(
    into: torch.Tensor, sizes: torch.Tensor | None, index: RaggedBatch, values: torch.Tensor, dim: int
) -> torch.Tensor:
    """Copy of ``into`` with ``into[b][:size_b][index[b, :k]] = values[b][:k]``."""
    out = into.clone()
    for b in batch_indices(index.batch_shape):
        target = sample_of(out, b, dim)
        if sizes is not None:
            target = target[: int(sizes[b])]
        target[valid_index(index, b)] = sample_of(values, b, dim)[: int(index.sizes[b])]
    return out


def loop_map_pairs(
    src: torch.Tensor,
    src_sizes: torch.Tensor | None,
    src_index: RaggedBatch,
    dst_index: RaggedBatch,
    dst: torch.Tensor,
    dst_sizes: torch.Tensor | None,
    src_dim: int,
    dst_dim: int,
) -> torch.Tensor:
    """Copy of ``dst`` with ``dst[b][dst_index[b, :k]] = src[b][src_index[b, :k]]``."""
    out = dst.clone()
    for b in batch_indices(src_index.batch_shape):
        source = sample_of(src, b, src_dim)
        if src_sizes is not None:
            source = source[: int(src_sizes[b])]
        target = sample_of(out, b, dst_dim)
        if dst_sizes is not None:
            target = target[: int(dst_sizes[b])]
        target[valid_index(dst_index, b)] = source[valid_index(src_index, b)]
    return out


def paired_indices(
    src_limits: torch.Tensor | int, dst_limits: torch.Tensor | int, batch: tuple[int, ...], gen: torch.Generator
) -> tuple[RaggedBatch, RaggedBatch]:
    """``src_index`` (repeats allowed) and ``dst_index`` (distinct) with equal sizes (separate tensors)."""
    src_lim = torch.as_tensor(src_limits).expand(batch)
    dst_lim = torch.as_tensor(dst_limits).expand(batch)
    sizes = torch.minimum(random_sizes(batch, J, gen), dst_lim)
    sizes = torch.where(src_lim == 0, 0, sizes)
    src_index = random_index(src_lim, batch, J, gen, sizes=sizes.clone())
    dst_index = random_index(dst_lim, batch, J, gen, sizes=sizes.clone(), distinct=True)
    return src_index, dst_index


def as_ragged_like(tensor: torch.Tensor, like: RaggedBatch | torch.Tensor) -> RaggedBatch | None:
    return like.with_tensor(tensor) if isinstance(like, RaggedBatch) else None


def valid_entries(out: RaggedBatch | torch.Tensor) -> list[torch.Tensor]:
    return valid_samples(out) if isinstance(out, RaggedBatch) else [out]


# ---------------------------------------------------------------------- gather
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_gather_from_ragged_data_matches_per_sample_loop(layout, dtype, gen):
    data = random_ragged(layout, N, dtype, gen)
    index = random_index(data.sizes, layout.batch, J, gen)
    x = leaf(data.tensor)
    out = ragged.gather(data.with_tensor(x), index, fill=7)
    assert out.shape == layout.shape(J) and out.ragged_dim == layout.ragged_dim and out.dtype == dtype
    assert torch.equal(out.sizes, index.sizes)
    expected = loop_gather(x, data.sizes, index, layout.ragged_dim)
    assert_samples_equal(valid_samples(out), expected)
    assert_all_equal_to([out.tensor.masked_select(~out.broadcast_mask())], 7)
    if dtype.is_floating_point:
        actual_grads = grads(weighted_sin_loss(valid_samples(out)), [x])
        assert_grads_close(actual_grads, grads(weighted_sin_loss(expected), [x]), dtype)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=dtype_id)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_gather_from_plain_tensor_matches_per_sample_loop(layout, dtype, index_dtype, gen):
    x = leaf(random_values(layout.shape(N), dtype, gen))
    index = random_index(N, layout.batch, J, gen, dtype=index_dtype)
    out = ragged.gather(x, index, dim=layout.ragged_dim)
    assert out.shape == layout.shape(J) and out.ragged_dim == layout.ragged_dim
    expected = loop_gather(x, None, index, layout.ragged_dim)
    assert_samples_equal(valid_samples(out), expected)
    assert_all_equal_to([out.tensor.masked_select(~out.broadcast_mask())], 0)
    if dtype.is_floating_point:
        actual_grads = grads(weighted_sin_loss(valid_samples(out)), [x])
        assert_grads_close(actual_grads, grads(weighted_sin_loss(expected), [x]), dtype)


@pytest.mark.parametrize("ragged_data", [True, False], ids=["ragged", "plain"])
@pytest.mark.parametrize("layout", TWO_LAYOUTS, ids=str)
def test_gather_of_few_indices_from_long_samples_matches_per_sample_loop(layout, ragged_data, gen):
    """Long samples and few indices take another fill path (fill after the copy, not from an extra row)."""
    long_len, few = 40, 3
    data = random_ragged(layout, long_len, torch.float32, gen, poison=ragged_data)
    index = random_index(data.sizes if ragged_data else long_len, layout.batch, few, gen)
    x = leaf(data.tensor)
    source = data.with_tensor(x) if ragged_data else x
    out = ragged.gather(source, index, fill=7, dim=None if ragged_data else layout.ragged_dim)
    expected = loop_gather(x, data.sizes if ragged_data else None, index, layout.ragged_dim)
    assert_samples_equal(valid_samples(out), expected)
    assert_all_equal_to([out.tensor.masked_select(~out.broadcast_mask())], 7)
    actual_grads = grads(weighted_sin_loss(valid_samples(out)), [x])
    assert_grads_close(actual_grads, grads(weighted_sin_loss(expected), [x]), torch.float32)


@pytest.mark.parametrize("ragged_data", [True, False], ids=["ragged", "plain"])
@pytest.mark.parametrize("layout", TWO_LAYOUTS, ids=str)
def test_gather_negative_index_counts_from_the_end_of_each_sample(layout, ragged_data, gen):
    data = random_ragged(layout, N, torch.float64, gen, poison=ragged_data)
    limits = data.sizes if ragged_data else N
    index = random_index(limits, layout.batch, J, gen, negative=True)
    assert (index.tensor.masked_select(index.mask) < 0).any(), "the test needs some negative indices"
    x = leaf(data.tensor)
    source = data.with_tensor(x) if ragged_data else x
    out = ragged.gather(source, index, dim=None if ragged_data else layout.ragged_dim)
    expected = loop_gather(x, data.sizes if ragged_data else None, index, layout.ragged_dim)
    assert_samples_equal(valid_samples(out), expected)
    assert_grads_close(
        grads(weighted_sin_loss(valid_samples(out)), [x]), grads(weighted_sin_loss(expected), [x]), torch.float64
    )


def test_gather_index_minus_one_is_the_last_valid_entry_of_a_ragged_sample():
    data = RaggedBatch.from_list([torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0])], fill=float("nan"))
    index = RaggedBatch.from_list([torch.tensor([-1, -3]), torch.tensor([-1, -2])])
    assert ragged.gather(data, index).tensor.tolist() == [[3.0, 1.0], [5.0, 4.0]]
    # A plain tensor has N valid entries per sample: -1 is the last of N.
    assert ragged.gather(torch.arange(6.0).view(2, 3), index).tensor.tolist() == [[2.0, 0.0], [5.0, 4.0]]


@pytest.mark.parametrize("layout", TWO_LAYOUTS, ids=str)
def test_gather_without_fill_gives_the_same_valid_entries(layout, gen):
    data = random_ragged(layout, N, torch.float32, gen)
    index = random_index(data.sizes, layout.batch, J, gen)
    x = leaf(data.tensor)
    out = ragged.gather(data.with_tensor(x), index, fill=None)
    expected = loop_gather(x, data.sizes, index, layout.ragged_dim)
    assert_samples_equal(valid_samples(out), expected)
    actual_grads = grads(weighted_sin_loss(valid_samples(out)), [x])
    assert_grads_close(actual_grads, grads(weighted_sin_loss(expected), [x]), torch.float32)


def test_gather_with_plain_index_tensor_uses_every_entry(gen):
    x = random_values((2, 3, N, 2), torch.float32, gen)
    index = torch.randint(0, N, (2, 3, J), generator=gen)
    out = ragged.gather(x, index)
    assert torch.equal(out.sizes, torch.full((2, 3), J))
    for b in batch_indices((2, 3)):
        assert torch.equal(out.tensor[b], x[b][index[b]])


@pytest.mark.parametrize(("data_len", "index_len"), [(N, J), (N, 0), (0, J), (0, 0)])
def test_gather_on_an_all_empty_batch_gives_only_fill(data_len, index_len, gen):
    layout = Layout((2, 3), after=(2,))
    empty = torch.zeros(layout.batch, dtype=torch.int64)
    data = random_ragged(layout, data_len, torch.float32, gen, sizes=empty)
    index = random_index(data.sizes, layout.batch, index_len, gen, sizes=empty.clone())
    x = leaf(data.tensor)
    out = ragged.gather(data.with_tensor(x), index, fill=-1)
    assert out.shape == layout.shape(index_len)
    assert torch.equal(out.sizes, empty)
    assert torch.equal(out.tensor, torch.full(layout.shape(index_len), -1.0))
    if data_len > 0:
        (grad,) = grads(out.tensor.sum(), [x])
        assert torch.equal(grad, torch.zeros_like(x))


@settings(max_examples=30, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    before=st.lists(st.integers(1, 2), max_size=1),
    after=st.lists(st.integers(1, 3), max_size=2),
    data_len=st.integers(0, 5),
    index_len=st.integers(0, 5),
    ragged_data=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gather_matches_per_sample_loop_for_random_shapes(batch, before, after, data_len, index_len, ragged_data, seed):
    gen = torch.Generator().manual_seed(seed)
    layout = Layout(tuple(batch), tuple(before), tuple(after))
    data = random_ragged(layout, data_len, torch.float64, gen, poison=ragged_data)
    index = random_index(data.sizes if ragged_data else data_len, layout.batch, index_len, gen, negative=True)
    x = leaf(data.tensor)
    source = data.with_tensor(x) if ragged_data else x
    out = ragged.gather(source, index, fill=0.5, dim=None if ragged_data else layout.ragged_dim)
    assert out.shape == layout.shape(index_len)
    expected = loop_gather(x, data.sizes if ragged_data else None, index, layout.ragged_dim)
    assert_samples_equal(valid_samples(out), expected)
    assert_all_equal_to([out.tensor.masked_select(~out.broadcast_mask())], 0.5)
    if data_len > 0:
        actual_grads = grads(weighted_sin_loss(valid_samples(out)), [x])
        assert_grads_close(actual_grads, grads(weighted_sin_loss(expected), [x]), torch.float64)


# ---------------------------------------------------------------------- scatter
@pytest.mark.parametrize("values_kind", ["ragged", "plain"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_scatter_matches_per_sample_loop(layout, dtype, values_kind, gen):
    index = random_index(N, layout.batch, J, gen, distinct=True)
    values = random_ragged(layout, J, dtype, gen, sizes=index.sizes)  # padding poisoned: never read
    v = leaf(values.tensor)
    if values_kind == "ragged":
        out = ragged.scatter(values.with_tensor(v), index, N, fill=3)
    else:
        out = ragged.scatter(v, index, N, fill=3, dim=layout.ragged_dim)
    expected = loop_scatter(v, index, N, 3, layout.ragged_dim)
    assert_identical(out, expected)
    if dtype.is_floating_point:
        assert_grads_close(grads(weighted_sin_loss([out]), [v]), grads(weighted_sin_loss([expected]), [v]), dtype)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_scatter_is_the_inverse_of_gather(layout, gen):
    index = random_index(N, layout.batch, J, gen, distinct=True, negative=True)
    values = random_ragged(layout, J, torch.float64, gen, sizes=index.sizes)
    back = ragged.gather(ragged.scatter(values, index, N), index, dim=layout.ragged_dim)
    assert_samples_equal(valid_samples(back), valid_samples(values))

    rows = torch.stack([torch.randperm(N, generator=gen) for _ in batch_indices(layout.batch)])
    permutation = rows.view(*layout.batch, N)  # every position exactly once
    x = random_values(layout.shape(N), torch.float64, gen)
    round_trip = ragged.scatter(ragged.gather(x, permutation, dim=layout.ragged_dim), permutation, N)
    assert torch.equal(round_trip, x)


@pytest.mark.parametrize("layout", TWO_LAYOUTS, ids=str)
def test_scatter_negative_index_counts_from_the_end(layout, gen):
    index = random_index(N, layout.batch, J, gen, distinct=True, negative=True)
    values = random_ragged(layout, J, torch.float32, gen, sizes=index.sizes)
    out = ragged.scatter(values, index, N, fill=-2)
    assert_identical(out, loop_scatter(values.tensor, index, N, -2, layout.ragged_dim))
    assert ragged.scatter(torch.tensor([[1.0, 2.0]]), torch.tensor([[-1, 0]]), 3).tolist() == [[2.0, 0.0, 1.0]]


def test_scatter_of_an_all_empty_index_is_only_fill(gen):
    layout = Layout((2, 3), before=(2,))
    index = random_index(N, layout.batch, J, gen, sizes=torch.zeros(layout.batch, dtype=torch.int64))
    values = leaf(random_values(layout.shape(J), torch.float32, gen))
    out = ragged.scatter(values, index, N, fill=4, dim=layout.ragged_dim)
    assert torch.equal(out, torch.full(layout.shape(N), 4.0))
    (grad,) = grads((out * 2).sum(), [values])
    assert torch.equal(grad, torch.zeros_like(values))


# ---------------------------------------------------------------------- write
@pytest.mark.parametrize("into_kind", ["ragged", "plain"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_write_matches_per_sample_loop(layout, dtype, into_kind, gen):
    into = random_ragged(layout, N, dtype, gen, poison=into_kind == "ragged")
    limits = into.sizes if into_kind == "ragged" else N
    index = random_index(limits, layout.batch, J, gen, distinct=True)
    values = random_ragged(layout, J, dtype, gen, sizes=index.sizes)  # padding poisoned: never read
    x, v = leaf(into.tensor), leaf(values.tensor)
    if into_kind == "ragged":
        out = ragged.write(into.with_tensor(x), index, values.with_tensor(v))
        assert isinstance(out, RaggedBatch) and out.sizes is into.sizes and out.ragged_dim == layout.ragged_dim
        out_tensor = out.tensor
    else:
        out = out_tensor = ragged.write(x, index, v, dim=layout.ragged_dim)
        assert isinstance(out, torch.Tensor)
    expected = loop_write(x, into.sizes if into_kind == "ragged" else None, index, v, layout.ragged_dim)
    assert_identical(out_tensor, expected)
    if dtype.is_floating_point:
        actual_grads = grads(weighted_sin_loss(valid_entries(out)), [x, v])
        expected_grads = grads(weighted_sin_loss(valid_entries(as_ragged_like(expected, out) or expected)), [x, v])
        assert_grads_close(actual_grads, expected_grads, dtype)


@pytest.mark.parametrize("into_kind", ["ragged", "plain"])
def test_write_negative_index_counts_from_the_end_of_each_sample(into_kind, gen):
    layout = Layout((2, 3), after=(2,))
    into = random_ragged(layout, N, torch.float64, gen, poison=into_kind == "ragged")
    sizes = into.sizes if into_kind == "ragged" else None
    index = random_index(into.sizes if sizes is not None else N, layout.batch, J, gen, distinct=True, negative=True)
    values = random_ragged(layout, J, torch.float64, gen, sizes=index.sizes)
    out = ragged.write(into if sizes is not None else into.tensor, index, values)
    out_tensor = out.tensor if isinstance(out, RaggedBatch) else out
    assert_identical(out_tensor, loop_write(into.tensor, sizes, index, values.tensor, layout.ragged_dim))


@pytest.mark.parametrize("layout", TWO_LAYOUTS, ids=str)
def test_write_gradient_is_zero_where_overwritten_and_passes_through_elsewhere(layout, gen):
    index = random_index(N, layout.batch, J, gen, distinct=True)
    x = leaf(random_values(layout.shape(N), torch.float64, gen))
    v = leaf(random_ragged(layout, J, torch.float64, gen, sizes=index.sizes).tensor)
    out = ragged.write(x, index, v, dim=layout.ragged_dim)
    upstream = rand_like_grad(out, gen)
    grad_into, grad_values = torch.autograd.grad(out, [x, v], upstream)
    expected_into, expected_values = upstream.clone(), torch.zeros_like(v)
    rd = layout.ragged_dim
    for b in batch_indices(layout.batch):
        idx = valid_index(index, b)
        sample_of(expected_into, b, rd)[idx] = 0
        sample_of(expected_values, b, rd)[: len(idx)] = sample_of(upstream, b, rd)[idx]
    assert torch.equal(grad_into, expected_into)
    assert torch.equal(grad_values, expected_values)  # zero (not NaN) at the poisoned padding of values


# ---------------------------------------------------------------------- map_pairs
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_map_pairs_matches_per_sample_loop(layout, dtype, gen):
    src = random_ragged(layout, 5, dtype, gen)
    dst = random_ragged(layout, 7, dtype, gen)
    src_index, dst_index = paired_indices(src.sizes, dst.sizes, layout.batch, gen)
    x, y = leaf(src.tensor), leaf(dst.tensor)
    out = ragged.map_pairs(src.with_tensor(x), src_index, dst_index, dst.with_tensor(y))
    assert isinstance(out, RaggedBatch) and out.sizes is dst.sizes
    rd = layout.ragged_dim
    expected = loop_map_pairs(x, src.sizes, src_index, dst_index, y, dst.sizes, rd, rd)
    assert_identical(out.tensor, expected)
    if dtype.is_floating_point:
        actual_grads = grads(weighted_sin_loss(valid_samples(out)), [x, y])
        expected_grads = grads(weighted_sin_loss(valid_samples(out.with_tensor(expected))), [x, y])
        assert_grads_close(actual_grads, expected_grads, dtype)


@pytest.mark.parametrize(("src_kind", "dst_kind"), [("ragged", "plain"), ("plain", "ragged"), ("plain", "plain")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int64], ids=dtype_id)
def test_map_pairs_with_plain_tensors_matches_per_sample_loop(src_kind, dst_kind, dtype, gen):
    layout = Layout((2, 3), after=(2,))
    src = random_ragged(layout, 5, dtype, gen, poison=src_kind == "ragged")
    dst = random_ragged(layout, 7, dtype, gen, poison=dst_kind == "ragged")
    src_sizes = src.sizes if src_kind == "ragged" else None
    dst_sizes = dst.sizes if dst_kind == "ragged" else None
    src_index, dst_index = paired_indices(
        src.sizes if src_sizes is not None else 5, dst.sizes if dst_sizes is not None else 7, layout.batch, gen
    )
    x, y = leaf(src.tensor), leaf(dst.tensor)
    out = ragged.map_pairs(
        src.with_tensor(x) if src_sizes is not None else x,
        src_index,
        dst_index,
        dst.with_tensor(y) if dst_sizes is not None else y,
    )
    expected = loop_map_pairs(x, src_sizes, src_index, dst_index, y, dst_sizes, 2, 2)
    assert_identical(out.tensor if isinstance(out, RaggedBatch) else out, expected)
    if dtype.is_floating_point:
        actual_grads = grads(weighted_sin_loss(valid_entries(out)), [x, y])
        expected_out = as_ragged_like(expected, out) or expected
        assert_grads_close(actual_grads, grads(weighted_sin_loss(valid_entries(expected_out)), [x, y]), dtype)


def test_map_pairs_accumulates_gradients_of_repeated_sources():
    src = torch.tensor([[1.0, 2.0]], requires_grad=True)  # (B=1, G=2)
    src_index = torch.tensor([[0, 0, 1]])  # source 0 copied twice
    dst_index = torch.tensor([[3, 0, 1]])
    out = ragged.map_pairs(src, src_index, dst_index, torch.zeros(1, 4))
    assert out.tolist() == [[1.0, 2.0, 0.0, 1.0]]
    (grad,) = torch.autograd.grad(out, [src], torch.tensor([[10.0, 20.0, 30.0, 40.0]]))
    assert grad.tolist() == [[50.0, 20.0]]


def test_map_pairs_moves_between_different_ragged_dims(gen):
    src_layout, dst_layout = Layout((3,), before=(2,)), Layout((3,), after=(2,))  # (B, C, G) -> (B, Q, C)
    src = random_ragged(src_layout, 5, torch.float64, gen)
    dst = random_ragged(dst_layout, 7, torch.float64, gen)
    src_index, dst_index = paired_indices(src.sizes, dst.sizes, (3,), gen)
    x, y = leaf(src.tensor), leaf(dst.tensor)
    out = ragged.map_pairs(src.with_tensor(x), src_index, dst_index, dst.with_tensor(y))
    expected = loop_map_pairs(x, src.sizes, src_index, dst_index, y, dst.sizes, 2, 1)
    assert_identical(out.tensor, expected)
    actual_grads = grads(weighted_sin_loss(valid_samples(out)), [x, y])
    expected_grads = grads(weighted_sin_loss(valid_samples(out.with_tensor(expected))), [x, y])
    assert_grads_close(actual_grads, expected_grads, torch.float64)


# ---------------------------------------------------------------------- mask_from_indices
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=dtype_id)
@pytest.mark.parametrize("negative", [False, True], ids=["nonnegative", "negative"])
@pytest.mark.parametrize("batch", [(4,), (2, 3)], ids=str)
def test_mask_from_indices_matches_per_sample_loop(batch, negative, index_dtype, gen):
    index = random_index(N, batch, J, gen, negative=negative, dtype=index_dtype)  # repeats allowed
    expected = torch.zeros(*batch, N, dtype=torch.bool)
    for b in batch_indices(batch):
        expected[b][valid_index(index, b)] = True
    assert torch.equal(ragged.mask_from_indices(index, N), expected)


@pytest.mark.parametrize(("size", "index_len"), [(N, J), (N, 0), (0, J), (0, 0)])
def test_mask_from_indices_of_an_all_empty_index_is_all_false(size, index_len, gen):
    index = random_index(size, (2, 3), index_len, gen, sizes=torch.zeros(2, 3, dtype=torch.int64))
    assert torch.equal(ragged.mask_from_indices(index, size), torch.zeros(2, 3, size, dtype=torch.bool))


# ---------------------------------------------------------------------- combine
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_combine_matches_per_sample_concatenation(layout, dtype, gen):
    parts = [random_ragged(layout, length, dtype, gen) for length in (3, 0, 4)]
    xs = [leaf(part.tensor) for part in parts]
    out = ragged.combine([part.with_tensor(x) for part, x in zip(parts, xs, strict=True)], fill=5)
    assert out.shape == layout.shape(7) and out.ragged_dim == layout.ragged_dim and out.dtype == dtype
    assert out.sizes.dtype == torch.int64
    assert torch.equal(out.sizes, parts[0].sizes + parts[1].sizes + parts[2].sizes)
    rd = layout.ragged_dim
    expected = [
        torch.cat([sample_of(x, b, rd)[: int(part.sizes[b])] for part, x in zip(parts, xs, strict=True)])
        for b in batch_indices(layout.batch)
    ]
    assert_samples_equal(valid_samples(out), expected)
    assert_all_equal_to([out.tensor.masked_select(~out.broadcast_mask())], 5)
    if dtype.is_floating_point:
        actual_grads = grads(weighted_sin_loss(valid_samples(out)), xs)
        assert_grads_close(actual_grads, grads(weighted_sin_loss(expected), xs), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_combine_of_one_part_keeps_its_valid_entries(dtype, gen):
    part = random_ragged(LAYOUTS[2], N, dtype, gen)
    out = ragged.combine([part], fill=0)
    assert torch.equal(out.sizes, part.sizes) and out.shape == part.shape
    assert_samples_equal(valid_samples(out), valid_samples(part))
    assert not out.tensor.isnan().any()  # the poisoned padding is replaced by fill
