"""drivetrain.ragged.padded: RaggedBatch properties, constructors, conversions and batch-dim views."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drivetrain import ragged
from drivetrain.ragged import RaggedBatch
from helpers.ragged import (
    LAYOUTS,
    Layout,
    assert_samples_equal,
    batch_indices,
    grads,
    leaf,
    random_index,
    random_ragged,
    valid_samples,
    weighted_sin_loss,
)

S = 5


# ---------------------------------------------------------------------- properties
def test_properties_describe_the_padded_tensor():
    tensor = torch.randn(2, 3, 4, S, 6)
    rb = RaggedBatch(tensor, torch.tensor([[0, 1, 5], [2, 5, 3]], dtype=torch.int32), ragged_dim=3)
    assert rb.tensor is tensor
    assert rb.sizes.dtype == torch.int64 and rb.sizes.device == tensor.device
    assert rb.sizes.tolist() == [[0, 1, 5], [2, 5, 3]]
    assert rb.batch_shape == torch.Size([2, 3]) and rb.num_batch_dims == 2
    assert rb.ragged_dim == 3 and rb.max_size == S
    assert rb.shape == tensor.shape and rb.dtype == tensor.dtype and rb.device == tensor.device
    assert not rb.requires_grad and RaggedBatch(tensor.requires_grad_(), rb.sizes, 3).requires_grad
    assert "batch_shape=(2, 3)" in repr(rb) and "ragged_dim=3" in repr(rb)


@pytest.mark.parametrize(("ragged_dim", "expected"), [(None, 1), (1, 1), (2, 2), (-1, 3), (-2, 2)])
def test_ragged_dim_defaults_to_the_first_dim_after_the_batch_and_counts_negative_from_the_end(ragged_dim, expected):
    rb = RaggedBatch(torch.zeros(2, S, S, S), [1, 2], ragged_dim=ragged_dim)
    assert rb.ragged_dim == expected and rb.max_size == S


def test_sizes_given_as_a_nested_list_become_int64_with_the_batch_shape():
    rb = RaggedBatch(torch.zeros(2, 2, 3), [[0, 3], [1, 2]])
    assert rb.sizes.dtype == torch.int64 and rb.sizes.shape == (2, 2) and rb.sizes.tolist() == [[0, 3], [1, 2]]


def test_mask_is_computed_once_and_cached():
    rb = RaggedBatch(torch.zeros(3, 4, 2), [0, 2, 4])
    first = rb.mask
    assert first is rb.mask
    assert first.tolist() == [[False] * 4, [True, True, False, False], [True] * 4]


def test_broadcast_mask_lines_up_with_the_ragged_dim(gen):
    layout = Layout((2, 3), before=(2,), after=(3,))
    rb = random_ragged(layout, S, torch.float32, gen)
    assert rb.broadcast_mask().shape == (2, 3, 1, S, 1)
    assert torch.equal(rb.broadcast_mask().expand(rb.shape), ~rb.tensor.isnan())  # padding is the NaN poison


# ---------------------------------------------------------------------- from_list / to_list
def test_from_list_pads_samples_and_records_their_sizes():
    samples = [torch.ones(3, 2), torch.ones(0, 2), torch.full((1, 2), 2.0)]
    rb = RaggedBatch.from_list(samples, fill=-1)
    assert rb.shape == (3, 3, 2) and rb.ragged_dim == 1 and rb.sizes.tolist() == [3, 0, 1]
    assert rb.sizes.dtype == torch.int64
    assert_samples_equal(valid_samples(rb), samples)
    assert torch.equal(rb.tensor[1], torch.full((3, 2), -1.0)) and torch.equal(rb.tensor[2, 1:], -torch.ones(2, 2))


def test_from_list_with_nested_lists_has_two_batch_dims(gen):
    samples = [[torch.randn(n, 2, generator=gen) for n in (2, 0, 4)] for _ in range(2)]
    rb = RaggedBatch.from_list(samples)
    assert rb.batch_shape == (2, 3) and rb.shape == (2, 3, 4, 2) and rb.sizes.tolist() == [[2, 0, 4]] * 2
    assert_samples_equal(valid_samples(rb), [s for row in samples for s in row])


def test_from_list_accepts_numpy_arrays():
    rb = RaggedBatch.from_list([np.arange(3, dtype=np.int32), np.arange(1, dtype=np.int32)])
    assert rb.dtype == torch.int32 and rb.sizes.tolist() == [3, 1]
    assert rb.tensor.tolist() == [[0, 1, 2], [0, 0, 0]]


@pytest.mark.parametrize("ragged_dim", [2, -1])
def test_from_list_with_the_ragged_dim_not_first_in_the_sample(ragged_dim, gen):
    samples = [torch.randn(3, n, generator=gen) for n in (4, 0, 2)]  # (C, n)
    rb = RaggedBatch.from_list(samples, ragged_dim=ragged_dim)
    assert rb.shape == (3, 3, 4) and rb.ragged_dim == 2 and rb.sizes.tolist() == [4, 0, 2]
    assert_samples_equal(valid_samples(rb), [s.movedim(1, 0) for s in samples])
    assert_samples_equal(rb.to_list(), samples)


def test_from_list_converts_to_the_requested_dtype():
    rb = RaggedBatch.from_list([torch.tensor([1, 2]), torch.tensor([3.5])], dtype=torch.float64)
    assert rb.dtype == torch.float64 and rb.sizes.dtype == torch.int64
    assert rb.tensor.tolist() == [[1.0, 2.0], [3.5, 0.0]]


def test_from_list_of_only_empty_samples_has_padded_length_zero():
    rb = RaggedBatch.from_list([torch.zeros(0, 3), torch.zeros(0, 3)])
    assert rb.shape == (2, 0, 3) and rb.sizes.tolist() == [0, 0] and rb.mask.shape == (2, 0)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_to_list_round_trips_with_from_list(layout, gen):
    rb = random_ragged(layout, S, torch.float64, gen)
    samples = rb.to_list()
    if layout.nb == 2:
        assert len(samples) == layout.batch[0] and all(len(row) == layout.batch[1] for row in samples)
    back = RaggedBatch.from_list(samples, ragged_dim=layout.ragged_dim, fill=float("nan"))
    assert torch.equal(back.sizes, rb.sizes) and back.ragged_dim == rb.ragged_dim
    # The round trip gives back the padded length of the longest sample (S here: one sample is full).
    torch.testing.assert_close(back.tensor, rb.tensor, rtol=0, atol=0, equal_nan=True)


def test_to_list_crops_samples_to_their_sizes():
    rb = RaggedBatch(torch.arange(12).view(2, 2, 3), [[3, 0], [1, 2]])
    assert [[s.tolist() for s in row] for row in rb.to_list()] == [[[0, 1, 2], []], [[6], [9, 10]]]


# ---------------------------------------------------------------------- from_dense, to, detach
def test_from_dense_marks_every_sample_full():
    tensor = torch.randn(2, 3, 4, S)
    rb = RaggedBatch.from_dense(tensor, num_batch_dims=2, ragged_dim=-1)
    assert rb.tensor is tensor and rb.ragged_dim == 3 and rb.batch_shape == (2, 3)
    assert rb.sizes.dtype == torch.int64 and torch.equal(rb.sizes, torch.full((2, 3), S))
    assert rb.mask.all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.int32])
def test_to_dtype_converts_the_data_and_keeps_int64_sizes(dtype, gen):
    rb = random_ragged(Layout((4,), after=(2,)), S, torch.float32, gen, poison=False)
    mask = rb.mask
    out = rb.to(dtype)
    assert out.dtype == dtype and out.sizes.dtype == torch.int64 and torch.equal(out.sizes, rb.sizes)
    assert out.ragged_dim == rb.ragged_dim and torch.equal(out.mask, mask)
    assert torch.equal(out.tensor, rb.tensor.to(dtype))


def test_detach_cuts_the_graph_and_keeps_the_sizes():
    x = torch.randn(3, S, requires_grad=True)
    rb = RaggedBatch(x * 2, [1, 2, 3])
    out = rb.detach()
    assert not out.requires_grad and out.tensor.data_ptr() == rb.tensor.data_ptr()
    assert out.sizes is rb.sizes and out.ragged_dim == rb.ragged_dim


# ---------------------------------------------------------------------- with_padding, apply, with_tensor
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_with_padding_sets_the_padding_and_zeroes_its_gradient(layout, gen):
    rb = random_ragged(layout, S, torch.float32, gen)
    x = leaf(rb.tensor)
    out = rb.with_tensor(x).with_padding(0.25)
    mask = rb.broadcast_mask().expand(rb.shape)
    assert torch.equal(out.tensor, torch.where(mask, rb.tensor, 0.25)) and out.sizes is rb.sizes
    (grad,) = grads(torch.sin(out.tensor).sum(), [x])
    assert torch.equal(grad.masked_select(~mask), torch.zeros(int((~mask).sum())))  # not NaN, not cos(0.25)
    assert torch.equal(grad.masked_select(mask), torch.cos(x).masked_select(mask).detach())


def test_apply_runs_a_function_on_the_padded_data_and_keeps_the_sizes(gen):
    rb = random_ragged(Layout((2, 3), after=(4,)), S, torch.float32, gen, poison=False)
    out = rb.apply(lambda t: t.sum(-1))  # (L, B, S, 4) -> (L, B, S)
    assert out.sizes is rb.sizes and out.ragged_dim == 2 and torch.equal(out.tensor, rb.tensor.sum(-1))
    moved = rb.apply(lambda t: t.transpose(2, 3), ragged_dim=3)  # (L, B, 4, S)
    assert moved.ragged_dim == 3 and moved.shape == (2, 3, 4, S)
    assert_samples_equal(valid_samples(moved), valid_samples(rb))


def test_with_tensor_wraps_a_tensor_of_another_dtype_and_trailing_shape(gen):
    rb = random_ragged(Layout((3,)), S, torch.float32, gen)
    out = rb.with_tensor(torch.zeros(3, S, 7, dtype=torch.int64))
    assert out.sizes is rb.sizes and out.shape == (3, S, 7) and out.dtype == torch.int64 and out.ragged_dim == 1


# ---------------------------------------------------------------------- flatten, reshape, expand
def test_flatten_batch_and_reshape_batch_round_trip(gen):
    layout = Layout((2, 3), before=(2,))
    rb = random_ragged(layout, S, torch.float32, gen)
    rb.mask  # noqa: B018 - cache the mask so that it is carried along too
    flat = rb.flatten_batch()
    assert flat.batch_shape == (6,) and flat.ragged_dim == 2 and flat.shape == (6, 2, S)
    assert torch.equal(flat.sizes, rb.sizes.flatten())
    assert torch.equal(flat.mask, torch.arange(S) < flat.sizes.unsqueeze(-1))
    assert_samples_equal(valid_samples(flat), valid_samples(rb))
    back = flat.reshape_batch(2, -1)
    assert back.batch_shape == (2, 3) and back.ragged_dim == rb.ragged_dim
    torch.testing.assert_close(back.tensor, rb.tensor, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(back.sizes, rb.sizes) and torch.equal(back.mask, rb.mask)
    assert flat.reshape_batch((3, 2)).batch_shape == (3, 2)


def test_flatten_batch_of_one_batch_dim_is_the_same_batch(gen):
    rb = random_ragged(Layout((4,)), S, torch.float32, gen)
    assert rb.flatten_batch() is rb


def test_expand_batch_is_a_view_over_the_same_memory(gen):
    rb = random_ragged(Layout((3,), after=(2,)), S, torch.float32, gen)
    rb.mask  # noqa: B018 - a cached mask must follow the expansion
    wide = rb.expand_batch(4, 3)
    assert wide.batch_shape == (4, 3) and wide.ragged_dim == 2 and wide.shape == (4, 3, S, 2)
    assert wide.tensor.data_ptr() == rb.tensor.data_ptr() and wide.tensor.stride(0) == 0
    assert wide.sizes.data_ptr() == rb.sizes.data_ptr() and wide.sizes.stride(0) == 0
    assert torch.equal(wide.mask, rb.mask.expand(4, 3, S))
    assert torch.equal(rb.expand_batch((2, 3)).sizes, rb.sizes.expand(2, 3))


def test_expand_batch_broadcasts_size_one_batch_dims(gen):
    rb = random_ragged(Layout((1,), after=(2,)), S, torch.float32, gen)
    wide = rb.expand_batch(2, 4)
    assert wide.batch_shape == (2, 4) and wide.tensor.stride(1) == 0
    assert torch.equal(wide.sizes, rb.sizes.expand(2, 4))


def explicitly_repeated(rb: RaggedBatch, times: int) -> RaggedBatch:
    """``rb`` copied ``times`` times along a new leading batch dim (through from_list, not expand)."""
    samples = [[rb.tensor[b][: int(rb.sizes[b])] for b in range(rb.batch_shape[0])] for _ in range(times)]
    return RaggedBatch.from_list(samples, dtype=rb.dtype)


def test_ops_on_an_expanded_batch_equal_ops_on_an_explicitly_repeated_batch(gen):
    layers = 3
    gt = random_ragged(Layout((4,), after=(2,)), S, torch.float64, gen)
    x = leaf(gt.tensor)
    expanded = gt.with_tensor(x).expand_batch(layers, 4)
    repeated = explicitly_repeated(gt, layers)
    y = leaf(repeated.tensor)
    repeated = repeated.with_tensor(y)
    assert torch.equal(expanded.sizes, repeated.sizes)
    index = random_index(expanded.sizes, (layers, 4), S, gen)
    dst_index = random_index(9, (layers, 4), S, gen, sizes=index.sizes.clone(), distinct=True)

    def run(batch: RaggedBatch) -> list[torch.Tensor]:
        return [
            *valid_samples(ragged.gather(batch, index, fill=0)),
            ragged.sum(batch),
            ragged.mean(batch),
            ragged.map_pairs(batch, index, dst_index, torch.zeros(layers, 4, 9, 2, dtype=torch.float64)),
            *valid_samples(ragged.select(batch, torch.ones(layers, 4, S, dtype=torch.bool), trim=False)),
            *valid_samples(batch.with_padding(0)),
        ]

    outs_expanded, outs_repeated = run(expanded), run(repeated)
    assert_samples_equal(outs_expanded, outs_repeated)
    (grad_expanded,) = grads(weighted_sin_loss(outs_expanded), [x])
    (grad_repeated,) = grads(weighted_sin_loss(outs_repeated), [y])
    # The gradient of the view accumulates over the layers it was expanded to.
    valid = gt.broadcast_mask().expand(gt.shape)
    torch.testing.assert_close(grad_expanded.masked_select(valid), grad_repeated.sum(0).masked_select(valid))
    assert torch.equal(grad_expanded.masked_select(~valid), torch.zeros(int((~valid).sum()), dtype=torch.float64))


def test_reshape_batch_then_ops_match_the_unreshaped_batch(gen):
    rb = random_ragged(Layout((2, 3), after=(2,)), S, torch.float32, gen)
    flat = rb.flatten_batch()
    index = random_index(rb.sizes, (2, 3), 4, gen)
    flat_index = RaggedBatch(index.tensor.reshape(6, 4), index.sizes.reshape(6))
    direct = ragged.gather(rb, index)
    via_flat = ragged.gather(flat, flat_index).reshape_batch(2, 3)
    assert torch.equal(direct.tensor, via_flat.tensor) and torch.equal(direct.sizes, via_flat.sizes)
    for b in batch_indices((2, 3)):
        assert torch.equal(ragged.sum(rb)[b], ragged.sum(flat).view(2, 3, 2)[b])
