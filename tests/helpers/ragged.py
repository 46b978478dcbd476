"""Helpers of the ragged tests: random ragged batches with poisoned padding, per-sample loop
references, gradient helpers and a host-sync detector.

Conventions: a *layout* is ``(batch_shape, before, after)``; its tensor has shape
``(*batch_shape, *before, S, *after)`` with the ragged dim ``S`` at ``len(batch_shape) + len(before)``.
Padding of data is poisoned (NaN for floats, ``BIG_INT`` for integers); index padding alternates between
``+BIG_INT`` and ``-BIG_INT``, so reading either would show up as a wrong value, a NaN or an error.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from drivetrain.ragged import RaggedBatch

BIG_INT = 10**9
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int32, torch.int64)
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tolerance(dtype: torch.dtype) -> float:
    """Gradient tolerance of the ragged-op tests (atol and rtol): 1e-6 for float32/float64, 1e-2 for 16-bit.

    The ops' backward passes copy the upstream gradient ``cos(out)·w`` (|w| a normal draw) to the indexed
    entries, exactly as the per-sample loop does; what differs is the order in which repeated indices accumulate
    (at most S = 5 terms): ≤ 4·eps·Σ|terms|, i.e. a few float32 ulps (eps = 1.2e-7) of values below ~10, under
    1e-6 + 1e-6·|g|. 16-bit gradients accumulate in float32 and round once: one 16-bit ulp (bf16 eps = 7.8e-3)
    of |g| ≤ 1.3, under 1e-2 + 1e-2·|g|. Sums are checked against their own derived bound in test_ragged_reduce.
    """
    return 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6


@dataclass(frozen=True)
class Layout:
    """Shape of a data tensor ``(*batch, *before, S, *after)``."""

    batch: tuple[int, ...]
    before: tuple[int, ...] = ()
    after: tuple[int, ...] = ()

    @property
    def nb(self) -> int:
        return len(self.batch)

    @property
    def ragged_dim(self) -> int:
        return len(self.batch) + len(self.before)

    def shape(self, length: int) -> tuple[int, ...]:
        return (*self.batch, *self.before, length, *self.after)

    def __str__(self) -> str:
        names = iter("CKD")
        batch = ["B"] if self.nb == 1 else ["L", "B"]
        return ",".join(batch + [next(names) for _ in self.before] + ["S"] + [next(names) for _ in self.after])


# 1 and 2 batch dims, 0/1/2 trailing dims, ragged dim first or not after the batch dims.
LAYOUTS = (
    Layout((3,)),
    Layout((4,), after=(2,)),
    Layout((3,), after=(2, 3)),
    Layout((3,), before=(2,)),
    Layout((3,), before=(2,), after=(3,)),
    Layout((2, 3), after=(2,)),
    Layout((2, 3), before=(2,)),
)


def batch_indices(batch_shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Every sample's index tuple, in row-major order."""
    return list(itertools.product(*(range(s) for s in batch_shape)))


def random_sizes(batch_shape: Sequence[int], length: int, gen: torch.Generator) -> torch.Tensor:
    """Random int64 sizes in ``[0, length]``; with ≥ 2 samples one is empty and one is full."""
    sizes = torch.randint(0, length + 1, tuple(batch_shape), generator=gen)
    flat = sizes.view(-1)
    if flat.numel() >= 2:
        flat[0], flat[-1] = 0, length
    return sizes


def poison_value(dtype: torch.dtype) -> float:
    return float("nan") if dtype.is_floating_point else BIG_INT


def random_values(shape: Sequence[int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random data of ``dtype``: normal floats (distinct with probability 1), integers in [-50, 50)."""
    if dtype.is_floating_point:
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float64).to(dtype)
    return torch.randint(-50, 50, tuple(shape), generator=gen).to(dtype)


def random_ragged(
    layout: Layout,
    length: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    *,
    sizes: torch.Tensor | None = None,
    poison: bool = True,
) -> RaggedBatch:
    """A RaggedBatch of ``layout`` with padded length ``length`` and (by default) poisoned padding."""
    if sizes is None:
        sizes = random_sizes(layout.batch, length, gen)
    tensor = random_values(layout.shape(length), dtype, gen)
    if poison:
        positions = torch.arange(length).view(length, *([1] * len(layout.after)))
        valid = positions < sizes.view(*sizes.shape, *([1] * len(layout.before)), 1, *([1] * len(layout.after)))
        tensor = tensor.masked_fill(~valid, poison_value(dtype))
    return RaggedBatch(tensor, sizes, ragged_dim=layout.ragged_dim)


def random_index(
    limits: torch.Tensor | int,
    batch_shape: Sequence[int],
    length: int,
    gen: torch.Generator,
    *,
    sizes: torch.Tensor | None = None,
    distinct: bool = False,
    negative: bool = False,
    dtype: torch.dtype = torch.int64,
) -> RaggedBatch:
    """Random index RaggedBatch ``(*batch, length)`` with entries in ``[0, limit_b)`` per sample.

    Args:
        limits: per-sample bound (int64 ``batch_shape``) or one int for all samples.
        sizes: index sizes; default random, clipped so that every sample can be filled.
        distinct: no repeated index within a sample (then sizes ≤ limit).
        negative: write about half of the indices as their negative alias ``i - limit``.
    """
    limits_t = torch.as_tensor(limits, dtype=torch.int64).expand(tuple(batch_shape)).clone()
    if sizes is None:
        sizes = random_sizes(batch_shape, length, gen)
        sizes = torch.where(limits_t == 0, 0, sizes)
        if distinct:
            sizes = torch.minimum(sizes, limits_t)
    tensor = torch.empty((*batch_shape, length), dtype=torch.int64)
    for b in batch_indices(batch_shape):
        k, limit = int(sizes[b]), int(limits_t[b])
        assert k == 0 or limit > 0, "cannot draw indices below a limit of 0"
        if distinct:
            idx = torch.randperm(limit, generator=gen)[:k]
        else:
            idx = torch.randint(0, max(limit, 1), (k,), generator=gen)
        if negative:
            idx = torch.where(torch.rand(k, generator=gen) < 0.5, idx - limit, idx)
        pad = torch.tensor([BIG_INT, -BIG_INT]).repeat(length)[: length - k]
        tensor[b] = torch.cat([idx, pad])
    return RaggedBatch(tensor.to(dtype), sizes)


def sample_of(tensor: torch.Tensor, b: tuple[int, ...], dim: int) -> torch.Tensor:
    """Sample ``b`` of ``tensor`` (a view) with its dim ``dim`` (a dim of the full tensor) moved first."""
    return tensor[b].movedim(dim - len(b), 0)


def valid_samples(rb: RaggedBatch) -> list[torch.Tensor]:
    """Every sample's valid entries, ragged dim first, by plain indexing (not ``to_list``)."""
    return [sample_of(rb.tensor, b, rb.ragged_dim)[: int(rb.sizes[b])] for b in batch_indices(rb.batch_shape)]


def padding_samples(rb: RaggedBatch) -> list[torch.Tensor]:
    """Every sample's padding entries, ragged dim first."""
    return [sample_of(rb.tensor, b, rb.ragged_dim)[int(rb.sizes[b]) :] for b in batch_indices(rb.batch_shape)]


def assert_samples_equal(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> None:
    """Exact equality, sample by sample (dtype and shape included)."""
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.dtype == e.dtype, f"sample {i}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"sample {i}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        assert torch.equal(a, e), f"sample {i}: {a} != {e}"


def assert_identical(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Exact equality of dtype, shape and every element, NaN equal to NaN."""
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def assert_all_equal_to(tensors: Sequence[torch.Tensor], value: float) -> None:
    """Every element of every tensor equals ``value`` (NaN equals NaN)."""
    for t in tensors:
        expected = torch.full_like(t, value)
        assert torch.equal(t, expected) or (t.isnan().all() and expected.isnan().all()), f"{t} is not all {value}"


def weighted_sin_loss(samples: Sequence[torch.Tensor], seed: int = 1) -> torch.Tensor:
    """A non-trivial scalar loss ``sum_b (sin(x_b) * w_b).sum()`` with fixed random weights per sample.

    The weights depend only on ``seed`` and the samples' shapes, so a batched result and its loop
    reference get the same loss when their samples are equal.
    """
    gen = torch.Generator().manual_seed(seed)
    total = torch.zeros((), dtype=torch.float64)
    for s in samples:
        w = torch.randn(s.shape, generator=gen, dtype=torch.float64).to(s.dtype)
        total = total + (torch.sin(s) * w).double().sum()
    return total


def grads(loss: torch.Tensor, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(loss, list(inputs))


def assert_grads_close(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], dtype: torch.dtype) -> None:
    """Gradients are finite and match the reference within the dtype's tolerance."""
    tol = tolerance(dtype)
    for a, e in zip(actual, expected, strict=True):
        assert torch.isfinite(a).all(), "gradient has NaN or inf"
        torch.testing.assert_close(a, e, atol=tol, rtol=tol)


def rand_like_grad(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A random upstream gradient for ``t``."""
    return torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)


def leaf(t: torch.Tensor) -> torch.Tensor:
    """A fresh leaf copy that requires grad (for float data)."""
    return t.detach().clone().requires_grad_(t.is_floating_point())


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)
