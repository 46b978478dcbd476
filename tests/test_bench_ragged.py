"""``drivetrain bench ragged``'s agreement check of the sums and means: it passes the same float32 terms added in
another order (what the per-sample loop and the batched reduction do on CUDA, where a reduction's order follows its
launch shape) and stops a sum that lost a term."""

from __future__ import annotations

import pytest
import torch

from drivetrain.cli import bench


@pytest.fixture(scope="module")
def ragged_bench():
    """The benchmark module and its ops on the default shapes (L 6, B 8, Q 900, 0-60 targets, seed 0) on the CPU."""
    module = bench.load(bench.available()["ragged"])
    data = module.make_data(6, 8, 900, 10, 60, 0, torch.device("cpu"))
    return module, data, {name: (reference, check) for name, reference, _, check in module.cases(data)}


def _per_pair(data) -> list[torch.Tensor]:
    values = data["list"]["values"]
    return [values[layer][b] for layer in range(len(values)) for b in range(len(values[layer]))]


def _added_last_to_first(t: torch.Tensor) -> torch.Tensor:
    """The float32 sum over dim 0 of ``t``, one term at a time from the last: another order than torch.sum's."""
    total = torch.zeros(t.shape[1:], dtype=t.dtype)
    for row in t.flip(0):
        total = total + row
    return total


def test_sums_and_means_in_another_order_pass_the_check(ragged_bench):
    _, data, cases = ragged_bench
    L, B, _, D = data["dims"]
    terms = _per_pair(data)
    reordered = torch.stack([_added_last_to_first(t) for t in terms]).view(L, B, D)
    reference, check = cases["sum"]
    ref = reference()
    assert not torch.equal(ref, reordered)  # the order shows in the last bits, and went past the old 1e-5 / 1e-6
    check(ref, reordered)
    counts = torch.tensor([max(len(t), 1) for t in terms], dtype=torch.float32).view(L, B, 1)
    reference, check = cases["mean"]
    check(reference(), reordered / counts)


def test_a_sum_that_lost_a_term_is_stopped(ragged_bench):
    _, data, cases = ragged_bench
    L, B, _, D = data["dims"]
    terms = _per_pair(data)
    first = next(i for i, t in enumerate(terms) if len(t) > 1)
    wrong = [t[1:].sum(0) if i == first else t.sum(0) for i, t in enumerate(terms)]
    reference, check = cases["sum"]
    with pytest.raises(AssertionError, match="another order"):
        check(reference(), torch.stack(wrong).view(L, B, D))


def test_the_bound_is_zero_for_one_term_and_grows_with_the_count(ragged_bench):
    module, _, _ = ragged_bench
    one, many = torch.ones(1, 3), torch.ones(60, 3)
    sums, means = module.reordered_sum_bounds([one, many, torch.zeros(0, 3)])
    assert torch.equal(sums[0], torch.zeros(3)) and torch.equal(sums[2], torch.zeros(3))  # one term: exact
    assert torch.allclose(sums[1], torch.full((3,), 2 * 59 * 2.0**-24 / (1 - 59 * 2.0**-24) * 60, dtype=torch.float64))
    assert bool((means[1] < sums[1]).all()) and torch.equal(means[2], torch.zeros(3, dtype=torch.float64))
