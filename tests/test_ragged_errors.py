"""Bad input to drivetrain.ragged gets a ValueError/IndexError/TypeError whose message starts with the name of
the offending argument (checked on the CPU, where value checks always run)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drivetrain import ragged
from drivetrain.ragged import RaggedBatch

B, S, N, J = 3, 4, 6, 2


def ragged_data() -> RaggedBatch:
    """``(B, S, 2)`` with sizes [0, 2, 4]: sample 0 is empty, sample 1 has padding, sample 2 is full."""
    return RaggedBatch(torch.randn(B, S, 2), [0, 2, 4])


def index_of(rows: list[list[int]], sizes: list[int] | None = None) -> RaggedBatch:
    tensor = torch.tensor(rows)
    return RaggedBatch(tensor, sizes if sizes is not None else [len(r) for r in rows])


# ---------------------------------------------------------------------- RaggedBatch construction
@pytest.mark.parametrize("sizes", [[0, 5, 1], [[1, 2, 9]]], ids=["one_batch_dim", "too_long_in_nested"])
def test_sizes_larger_than_the_padded_length_are_rejected(sizes):
    tensor = torch.zeros(B, S) if isinstance(sizes[0], int) else torch.zeros(1, B, S)
    with pytest.raises(ValueError, match=rf"^sizes: .*padded length {S}"):
        RaggedBatch(tensor, sizes)


def test_negative_sizes_are_rejected():
    with pytest.raises(ValueError, match=r"^sizes: negative"):
        RaggedBatch(torch.zeros(B, S), [0, -1, 2])


def test_validate_false_skips_the_size_range_check():
    rb = RaggedBatch(torch.zeros(B, S), [0, S + 1, 2], validate=False)
    assert rb.sizes.tolist() == [0, S + 1, 2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_sizes_must_be_integers(dtype):
    with pytest.raises(ValueError, match=r"^sizes: sizes must have an integer dtype"):
        RaggedBatch(torch.zeros(B, S), torch.ones(B, dtype=dtype))


def test_sizes_must_match_the_batch_dims_of_the_tensor():
    with pytest.raises(ValueError, match=r"^sizes: shape \(2,\) does not match"):
        RaggedBatch(torch.zeros(B, S), [1, 2])
    with pytest.raises(ValueError, match=r"^sizes: needs at least one batch dimension"):
        RaggedBatch(torch.zeros(B, S), torch.tensor(1))
    with pytest.raises(ValueError, match=r"^tensor: .*needs the batch dims plus a ragged dim"):
        RaggedBatch(torch.zeros(B), [1, 1, 1])
    with pytest.raises(TypeError, match=r"^tensor: expected a torch.Tensor"):
        RaggedBatch(np.zeros((B, S)), [1, 1, 1])


@pytest.mark.parametrize("ragged_dim", [0, 1, -4, 3], ids=["batch0", "batch1", "negative_batch", "past_end"])
def test_ragged_dim_inside_the_batch_dims_or_past_the_end_is_rejected(ragged_dim):
    with pytest.raises(ValueError, match=r"^ragged_dim: .*after the 2 batch dim"):
        RaggedBatch(torch.zeros(2, B, S), torch.zeros(2, B, dtype=torch.int64), ragged_dim=ragged_dim)


def test_from_dense_and_from_list_reject_a_ragged_dim_inside_the_batch_dims():
    with pytest.raises(ValueError, match=r"^ragged_dim: "):
        RaggedBatch.from_dense(torch.zeros(B, S), ragged_dim=0)
    with pytest.raises(ValueError, match=r"^num_batch_dims: "):
        RaggedBatch.from_dense(torch.zeros(B, S), num_batch_dims=2)
    with pytest.raises(ValueError, match=r"^ragged_dim: "):
        RaggedBatch.from_list([torch.zeros(2), torch.zeros(3)], ragged_dim=0)


# ---------------------------------------------------------------------- from_list
def test_from_list_rejects_samples_that_differ_outside_the_ragged_dim():
    with pytest.raises(ValueError, match=r"^samples\[1\]: shape \(2, 4\) differs from samples\[0\]"):
        RaggedBatch.from_list([torch.zeros(1, 3), torch.zeros(2, 4)])
    with pytest.raises(ValueError, match=r"^samples\[1\]: has 1 dims"):
        RaggedBatch.from_list([torch.zeros(1, 3), torch.zeros(2)])


def test_from_list_rejects_mixed_dtypes_unless_a_dtype_is_given():
    samples = [torch.zeros(2), torch.zeros(1, dtype=torch.int64)]
    with pytest.raises(ValueError, match=r"^samples\[1\]: dtype torch.int64 differs .*pass dtype="):
        RaggedBatch.from_list(samples)
    assert RaggedBatch.from_list(samples, dtype=torch.float32).dtype == torch.float32


def test_from_list_rejects_non_rectangular_nesting():
    with pytest.raises(ValueError, match=r"^samples\[1\]\[0\]: nested lists are not rectangular"):
        RaggedBatch.from_list([[torch.zeros(1), torch.zeros(2)], [torch.zeros(1)]])
    with pytest.raises(ValueError, match=r"^samples\[1\]: nested lists are not rectangular"):
        RaggedBatch.from_list([[torch.zeros(1)], torch.zeros(1)])
    with pytest.raises(ValueError, match=r"^samples\[1\]: empty nested list"):
        RaggedBatch.from_list([[torch.zeros(1)], []])


def test_from_list_rejects_an_empty_list_and_non_tensor_samples():
    with pytest.raises(ValueError, match=r"^samples: empty list"):
        RaggedBatch.from_list([])
    with pytest.raises(TypeError, match=r"^samples: expected a list"):
        RaggedBatch.from_list(torch.zeros(2, 3))
    with pytest.raises(TypeError, match=r"^samples\[1\]: expected a tensor or numpy array, got int"):
        RaggedBatch.from_list([torch.zeros(2), 3])
    with pytest.raises(ValueError, match=r"^samples\[0\]: a sample needs at least one dim"):
        RaggedBatch.from_list([torch.tensor(1.0), torch.tensor(2.0)])


# ---------------------------------------------------------------------- index arguments
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_index_with_a_non_integer_dtype_is_rejected_by_every_op(dtype):
    bad = torch.zeros(B, J, dtype=dtype)
    with pytest.raises(ValueError, match=r"^index: index must have an integer dtype"):
        ragged.gather(torch.zeros(B, N), bad)
    with pytest.raises(ValueError, match=r"^index: "):
        ragged.scatter(torch.zeros(B, J), bad, N)
    with pytest.raises(ValueError, match=r"^index: "):
        ragged.write(torch.zeros(B, N), bad, torch.zeros(B, J))
    with pytest.raises(ValueError, match=r"^index: "):
        ragged.mask_from_indices(bad, N)
    good = torch.zeros(B, J, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^src_index: "):
        ragged.map_pairs(torch.zeros(B, N), bad, good, torch.zeros(B, N))
    with pytest.raises(ValueError, match=r"^dst_index: "):
        ragged.map_pairs(torch.zeros(B, N), good, bad, torch.zeros(B, N))


def test_index_must_be_a_batch_of_one_dim_samples():
    with pytest.raises(ValueError, match=r"^index: a plain index tensor needs shape \(\*batch, J\)"):
        ragged.gather(torch.zeros(B, N), torch.zeros(J, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^index: must have shape \(\*batch, J\)"):
        ragged.gather(torch.zeros(B, N), RaggedBatch(torch.zeros(B, J, 2, dtype=torch.int64), [1, 1, 1]))
    with pytest.raises(TypeError, match=r"^index: expected a RaggedBatch"):
        ragged.gather(torch.zeros(B, N), [[0], [0], [0]])


@pytest.mark.parametrize(
    ("bad", "where"),
    [(N, "past the end"), (-N - 1, "before the start"), (10**9, "huge")],
    ids=["positive", "negative", "huge"],
)
def test_out_of_range_index_into_a_plain_tensor_raises_index_error(bad, where):
    index = index_of([[0, 1], [2, bad], [3, 4]])
    with pytest.raises(IndexError, match=r"^index: an index lies outside"):
        ragged.gather(torch.zeros(B, N), index)
    with pytest.raises(IndexError, match=r"^index: "):
        ragged.scatter(torch.zeros(B, J), index, N)
    with pytest.raises(IndexError, match=r"^index: "):
        ragged.write(torch.zeros(B, N), index, torch.zeros(B, J))
    with pytest.raises(IndexError, match=r"^index: "):
        ragged.mask_from_indices(index, N)


@pytest.mark.parametrize(
    ("rows", "sizes"),
    [
        ([[0, 0], [1, 2], [3, 0]], [0, 2, 1]),  # 2 is the padding of sample 1 (size 2)
        ([[0, 0], [0, -3], [3, 0]], [0, 2, 1]),  # -3 lies before the start of sample 1
        ([[0, 0], [0, 1], [3, 0]], [1, 2, 1]),  # sample 0 is empty: even 0 is out of range
        ([[-1, 0], [0, 1], [3, 0]], [1, 2, 1]),  # ... and so is -1
    ],
    ids=["into_padding", "negative_past_start", "zero_in_empty", "minus_one_in_empty"],
)
def test_index_into_the_padding_of_ragged_data_raises_index_error(rows, sizes):
    data, index = ragged_data(), index_of(rows, sizes)
    with pytest.raises(IndexError, match=r"^index: an index lies outside"):
        ragged.gather(data, index)
    with pytest.raises(IndexError, match=r"^index: "):
        ragged.write(data, index, torch.zeros(B, J, 2))
    with pytest.raises(IndexError, match=r"^src_index: "):
        ragged.map_pairs(data, index, index_of([[0, 1]] * B, sizes), torch.zeros(B, N, 2))
    with pytest.raises(IndexError, match=r"^dst_index: "):
        ragged.map_pairs(torch.zeros(B, N, 2), index_of([[0, 1]] * B, sizes), index, data)


def test_index_padding_is_never_checked():
    data = ragged_data()
    index = index_of([[10**9, -(10**9)], [1, 10**9], [3, -(10**9)]], [0, 1, 1])
    assert ragged.gather(data, index).tensor.shape == (B, J, 2)
    assert ragged.mask_from_indices(index, S).sum() == 2


@pytest.mark.parametrize("size", [0, 2])
def test_scatter_and_mask_from_indices_check_the_index_against_size(size):
    index = index_of([[0, 2], [1, 0], [0, 0]], [2, 1, 0])
    with pytest.raises(IndexError, match=r"^index: "):
        ragged.scatter(torch.zeros(B, J), index, size)
    with pytest.raises(IndexError, match=r"^index: "):
        ragged.mask_from_indices(index, size)


def test_negative_size_is_rejected():
    index = index_of([[0], [0], [0]], [0, 0, 0])
    with pytest.raises(ValueError, match=r"^size: must be ≥ 0"):
        ragged.scatter(torch.zeros(B, 1), index, -1)
    with pytest.raises(ValueError, match=r"^size: must be ≥ 0"):
        ragged.mask_from_indices(index, -1)


# ---------------------------------------------------------------------- batch shapes and dims
def test_mismatched_batch_shapes_name_both_arguments():
    index = torch.zeros(2, J, dtype=torch.int64)  # batch (2,), data has batch (3,)
    with pytest.raises(ValueError, match=r"^data: batch shape \(3,\) does not match the batch shape \(2,\) of index"):
        ragged.gather(torch.zeros(B, N), index)
    with pytest.raises(ValueError, match=r"^values: batch shape .* of index"):
        ragged.scatter(torch.zeros(B, J), index, N)
    with pytest.raises(ValueError, match=r"^into: batch shape .* of index"):
        ragged.write(torch.zeros(B, N), index, torch.zeros(2, J))
    good = torch.zeros(B, J, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^src_index: batch shape .* of dst_index"):
        ragged.map_pairs(torch.zeros(B, N), index, good, torch.zeros(B, N))
    with pytest.raises(ValueError, match=r"^src: batch shape .* of src_index"):
        ragged.map_pairs(torch.zeros(2, N), good, good, torch.zeros(B, N))
    with pytest.raises(ValueError, match=r"^dst: batch shape .* of dst_index"):
        ragged.map_pairs(torch.zeros(B, N), good, good, torch.zeros(2, N))
    with pytest.raises(ValueError, match=r"^data: has 1 batch dim\(s\), the index has 2"):
        ragged.gather(ragged_data(), torch.zeros(1, B, J, dtype=torch.int64))


def test_a_dim_inside_the_batch_dims_is_rejected():
    index = torch.zeros(B, J, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^dim: 0 must be a dim after the 1 batch dim"):
        ragged.gather(torch.zeros(B, N), index, dim=0)
    with pytest.raises(ValueError, match=r"^dim: "):
        ragged.scatter(torch.zeros(B, J), index, N, dim=0)
    with pytest.raises(ValueError, match=r"^dim: 2 differs from the ragged dim 1 of data"):
        ragged.gather(ragged_data(), index, dim=2)
    with pytest.raises(ValueError, match=r"^data: shape \(3,\) has no dim to index"):
        ragged.gather(torch.zeros(B), index)


def test_scatter_rejects_values_whose_length_differs_from_the_index():
    with pytest.raises(ValueError, match=r"^values: has length 3 at dim 1, the index has padded length 2"):
        ragged.scatter(torch.zeros(B, 3), torch.zeros(B, J, dtype=torch.int64), N)


# ---------------------------------------------------------------------- write values
def test_write_rejects_values_of_another_dtype():
    index = torch.zeros(B, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^values: dtype torch.float64 differs from the dtype torch.float32 of into"):
        ragged.write(torch.zeros(B, N), index, torch.zeros(B, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^src: dtype torch.int64 differs .* of dst"):
        ragged.map_pairs(torch.zeros(B, N, dtype=torch.int64), index, index, torch.zeros(B, N))


@pytest.mark.parametrize(
    "values_shape",
    [(B, J + 1, 2), (B, J, 3), (B, J)],
    ids=["index_length", "data_dims", "ndim"],
)
def test_write_rejects_values_of_the_wrong_shape(values_shape):
    with pytest.raises(ValueError, match=r"^values: (shape|has)"):
        ragged.write(torch.zeros(B, N, 2), torch.zeros(B, J, dtype=torch.int64), torch.zeros(values_shape))


def test_write_rejects_values_that_are_not_tensors():
    with pytest.raises(TypeError, match=r"^values: expected a RaggedBatch or tensor"):
        ragged.write(torch.zeros(B, N), torch.zeros(B, 1, dtype=torch.int64), [[0.0]] * B)


# ---------------------------------------------------------------------- map_pairs, combine, select
def test_map_pairs_rejects_indices_of_different_sizes():
    src_index, dst_index = index_of([[0, 1]] * B, [1, 2, 0]), index_of([[0, 1]] * B, [1, 1, 0])
    with pytest.raises(ValueError, match=r"^src_index: sizes differ from the sizes of dst_index"):
        ragged.map_pairs(torch.zeros(B, N), src_index, dst_index, torch.zeros(B, N))
    with pytest.raises(ValueError, match=r"^src_index: padded length 2 differs from 1 of dst_index"):
        ragged.map_pairs(torch.zeros(B, N), src_index, index_of([[0]] * B, [1, 1, 0]), torch.zeros(B, N))


def test_combine_rejects_parts_that_do_not_line_up():
    a = RaggedBatch(torch.zeros(B, S, 2), [1, 2, 3])
    with pytest.raises(ValueError, match=r"^parts: needs at least one"):
        ragged.combine([])
    with pytest.raises(ValueError, match=r"^parts\[1\]: batch shape \(2,\) does not match .* of parts\[0\]"):
        ragged.combine([a, RaggedBatch(torch.zeros(2, S, 2), [1, 2])])
    with pytest.raises(ValueError, match=r"^parts\[1\]: .*dtype torch.float64 do not line up"):
        ragged.combine([a, RaggedBatch(torch.zeros(B, S, 2, dtype=torch.float64), [1, 2, 3])])
    with pytest.raises(ValueError, match=r"^parts\[1\]: shape \(3, 4, 3\)"):
        ragged.combine([a, RaggedBatch(torch.zeros(B, S, 3), [1, 2, 3])])
    with pytest.raises(ValueError, match=r"^parts\[1\]: .*ragged dim 2"):
        ragged.combine([a, RaggedBatch(torch.zeros(B, 2, S), [1, 2, 3], ragged_dim=2)])
    with pytest.raises(TypeError, match=r"^parts\[1\]: expected a RaggedBatch"):
        ragged.combine([a, torch.zeros(B, S, 2)])


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.float32], ids=str)
def test_select_rejects_a_non_bool_mask(dtype):
    with pytest.raises(ValueError, match=r"^mask: must be (a )?bool"):
        ragged.select(torch.zeros(B, N), torch.ones(B, N, dtype=dtype))
    with pytest.raises(ValueError, match=r"^mask: must be (a )?bool"):
        ragged.indices_from_mask(torch.ones(B, N, dtype=dtype))
    with pytest.raises(ValueError, match=r"^mask: must be bool"):
        ragged.select(torch.zeros(B, N), RaggedBatch(torch.ones(B, N, dtype=dtype), [1, 2, 3]))


def test_select_rejects_a_mask_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"^mask: length 5 differs from length 6"):
        ragged.select(torch.zeros(B, N), torch.ones(B, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^mask: needs shape \(\*batch, N\)"):
        ragged.select(torch.zeros(B, N), torch.ones(N, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^data: batch shape \(3,\) does not match the batch shape \(2,\) of mask"):
        ragged.select(torch.zeros(B, N), torch.ones(2, N, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^data: has 1 batch dim\(s\), mask has 2"):
        ragged.select(ragged_data(), torch.ones(1, B, S, dtype=torch.bool))


# ---------------------------------------------------------------------- views and reductions
def test_with_tensor_rejects_a_tensor_that_does_not_fit_the_sizes():
    rb = ragged_data()
    with pytest.raises(ValueError, match=r"^tensor: shape \(2, 4\) does not start with the batch shape"):
        rb.with_tensor(torch.zeros(2, S))
    with pytest.raises(ValueError, match=r"^tensor: dim 1 has length 5, but the padded length is 4"):
        rb.with_tensor(torch.zeros(B, S + 1))
    with pytest.raises(ValueError, match=r"^tensor: dim 1 has length 3"):
        rb.apply(lambda t: t[:, :3])


def test_reshape_and_expand_reject_incompatible_batch_shapes():
    rb = ragged_data()
    with pytest.raises(ValueError, match=r"^shape: cannot reshape batch shape \(3,\) to \(2, 2\)"):
        rb.reshape_batch(2, 2)
    with pytest.raises(ValueError, match=r"^shape: cannot expand batch shape \(3,\) to \(2, 4\)"):
        rb.expand_batch(2, 4)
    with pytest.raises(ValueError, match=r"^shape: \(\) has fewer dims"):
        rb.expand_batch(())


@pytest.mark.parametrize(
    "op", [ragged.sum, ragged.mean, lambda t: ragged.fill_padding(t, 0)], ids=["sum", "mean", "fill_padding"]
)
def test_reductions_reject_plain_tensors(op):
    with pytest.raises(TypeError, match=r"^rb: expected a RaggedBatch"):
        op(torch.zeros(B, S))
