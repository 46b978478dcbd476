"""drivetrain.ragged.reduce: sum, mean and fill_padding against per-sample loops; empty samples give exactly 0
with zero gradient, and NaN/inf in the padding never reaches values or gradients."""

from __future__ import annotations

import pytest
import torch

from drivetrain import ragged
from drivetrain.ragged import RaggedBatch
from helpers.ragged import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    LAYOUTS,
    Layout,
    assert_grads_close,
    assert_samples_equal,
    batch_indices,
    dtype_id,
    grads,
    leaf,
    padding_samples,
    random_ragged,
    sample_of,
    valid_samples,
)

S = 5


def loop_reduce(x: torch.Tensor, rb: RaggedBatch, how: str) -> torch.Tensor:
    """Per-sample ``sum``/``mean`` over the valid entries, stacked to ``(*batch, ...)``; empty -> 0."""
    out = []
    for b in batch_indices(rb.batch_shape):
        valid = sample_of(x, b, rb.ragged_dim)[: int(rb.sizes[b])]
        total = valid.sum(0)
        if how == "mean":
            if not total.is_floating_point():
                total = total.to(torch.get_default_dtype())
            total = total / valid.shape[0] if valid.shape[0] > 0 else torch.zeros_like(total)
        out.append(total)
    return torch.stack(out).view(*rb.batch_shape, *out[0].shape)


def assert_reduction_close(actual: torch.Tensor, expected: torch.Tensor, abs_sum: torch.Tensor | None) -> None:
    """Equal up to the rounding of two summation orders.

    ``abs_sum`` is the per-output sum of |x| over the summed entries (None for integer inputs).
    float32/float64 sums of n ≤ S terms are each within (n − 1)·eps·Σ|x| of the exact sum (Higham,
    recursive summation; torch's vectorised and cascaded orders obey the same bound for n ≤ S), so two orders
    differ by at most 2·(S − 1)·eps·Σ|x|; a mean divides once more (one rounding of the result).
    float16/bfloat16 are summed in a float32 accumulator and rounded once, so the two results differ by at
    most one 16-bit ulp of the result (rtol = eps).
    """
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if not actual.is_floating_point():
        assert torch.equal(actual, expected)
        return
    eps = torch.finfo(actual.dtype).eps
    if actual.dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(actual, expected, rtol=eps, atol=eps)
        return
    bound = eps * expected.abs()  # the mean of integers: an exact int64 sum, divided once
    if abs_sum is not None:
        bound = bound + 2 * (S - 1) * eps * abs_sum.to(actual.dtype)
    excess = (actual - expected).abs() - bound
    assert (excess <= 0).all(), f"max excess over the derived bound: {excess.max().item():.3g}"


def data_shape_without_ragged_dim(layout: Layout) -> tuple[int, ...]:
    return (*layout.batch, *layout.before, *layout.after)


@pytest.mark.parametrize("how", ["sum", "mean"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_reduction_matches_per_sample_loop(layout, dtype, how, gen):
    data = random_ragged(layout, S, dtype, gen)  # NaN / huge-int padding
    x = leaf(data.tensor)
    reduce = ragged.sum if how == "sum" else ragged.mean
    out = reduce(data.with_tensor(x))
    assert out.shape == data_shape_without_ragged_dim(layout)
    expected = loop_reduce(x, data, how)
    abs_sum = loop_reduce(x.detach().abs(), data, "sum") if dtype.is_floating_point else None
    assert_reduction_close(out, expected, abs_sum)
    if dtype.is_floating_point:
        weights = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(dtype)
        (grad,) = grads((torch.sin(out) * weights).sum(), [x])
        (expected_grad,) = grads((torch.sin(expected) * weights).sum(), [x])
        assert_grads_close([grad], [expected_grad], dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool], ids=dtype_id)
def test_sum_of_integers_is_int64_as_in_torch_sum(dtype, gen):
    data = random_ragged(Layout((4,), after=(2,)), S, torch.int64, gen)
    data = data.with_tensor(data.tensor.to(dtype) if dtype != torch.bool else data.tensor > 0)
    out = ragged.sum(data)
    assert out.dtype == torch.int64
    assert torch.equal(out, loop_reduce(data.tensor, data, "sum"))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool], ids=dtype_id)
def test_mean_of_integers_is_floating_point(dtype):
    data = RaggedBatch(torch.tensor([[1, 2, 4], [7, 9, 10**6], [3, 10**6, 10**6]]).to(dtype), [3, 1, 0])
    out = ragged.mean(data)
    assert out.dtype == torch.get_default_dtype()
    if dtype == torch.bool:
        assert out.tolist() == [1.0, 1.0, 0.0]
    else:
        torch.testing.assert_close(out, torch.tensor([7 / 3, 7.0, 0.0]))


@pytest.mark.parametrize("how", ["sum", "mean"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_empty_sample_reduces_to_exactly_zero_with_zero_gradient(dtype, how):
    x = torch.full((3, 4, 2), float("nan"), dtype=dtype)
    x[1, :2] = 1.5
    x = leaf(x)
    out = (ragged.sum if how == "sum" else ragged.mean)(RaggedBatch(x, [0, 2, 0]))
    assert torch.equal(out[0], torch.zeros(2, dtype=dtype)) and torch.equal(out[2], torch.zeros(2, dtype=dtype))
    assert torch.equal(out[1], torch.full((2,), 3.0 if how == "sum" else 1.5, dtype=dtype))
    (grad,) = grads(out.sum(), [x])
    assert torch.equal(grad[0], torch.zeros(4, 2, dtype=dtype)) and torch.equal(grad[2], grad[0])
    expected_valid = torch.full((2, 2), 1.0 if how == "sum" else 0.5, dtype=dtype)
    assert torch.equal(grad[1, :2], expected_valid) and torch.equal(grad[1, 2:], torch.zeros(2, 2, dtype=dtype))


@pytest.mark.parametrize("how", ["sum", "mean"])
@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_padding_never_reaches_values_or_gradients(poison, how, gen):
    layout = Layout((2, 3), before=(2,))
    data = random_ragged(layout, S, torch.float32, gen, poison=False)
    x = leaf(data.tensor.masked_fill(~data.broadcast_mask(), poison))
    out = (ragged.sum if how == "sum" else ragged.mean)(data.with_tensor(x))
    assert torch.isfinite(out).all()
    (grad,) = grads((out * torch.randn(out.shape, generator=gen)).sum(), [x])
    assert torch.isfinite(grad).all()
    assert torch.equal(grad.masked_select(~data.broadcast_mask()), torch.zeros(int((~data.mask).sum()) * 2))


@pytest.mark.parametrize("length", [0, S])
def test_reductions_of_an_all_empty_batch_are_zero(length):
    x = leaf(torch.full((2, 3, length, 4), float("nan")))
    rb = RaggedBatch(x, torch.zeros(2, 3, dtype=torch.int64))
    for reduce in (ragged.sum, ragged.mean):
        out = reduce(rb)
        assert torch.equal(out, torch.zeros(2, 3, 4))
        (grad,) = grads(out.sum(), [x])
        assert torch.equal(grad, torch.zeros_like(x))


# ---------------------------------------------------------------------- fill_padding
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_fill_padding_sets_the_padding_and_keeps_the_valid_entries(layout, dtype, gen):
    data = random_ragged(layout, S, dtype, gen)
    x = leaf(data.tensor)
    out = ragged.fill_padding(data.with_tensor(x), -3)
    assert out.shape == data.shape and out.dtype == dtype and out.sizes is data.sizes
    assert_samples_equal(valid_samples(out), valid_samples(data))
    for pad in padding_samples(out):
        assert torch.equal(pad, torch.full_like(pad, -3))
    if dtype.is_floating_point:
        (grad,) = grads(out.tensor.sum(), [x])  # the loss reads the padding too: its gradient must be 0
        assert torch.equal(grad, data.broadcast_mask().expand_as(x).to(dtype))


def test_fill_padding_of_a_zero_length_batch_is_the_batch(gen):
    rb = RaggedBatch(torch.zeros(3, 0, 2), [0, 0, 0])
    out = ragged.fill_padding(rb, 1)
    assert out.shape == (3, 0, 2) and torch.equal(out.sizes, rb.sizes)
