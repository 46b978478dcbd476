"""Tests for drivetrain.match.solve: batched linear assignment against SciPy's linear_sum_assignment."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from drivetrain.match import gpu_solver_available, pairs_from_assignment, solve
from drivetrain.ragged import RaggedBatch
from helpers.gpu_solver import needs_gpu_solver

POISONS = (float("nan"), 1e30, -1e30, float("inf"), float("-inf"))


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(5)


def problem_sizes(batch_shape: tuple[int, ...], q: int, g: int, gen: torch.Generator) -> torch.Tensor:
    """Random target counts in [0, min(Q, G)], with 0, 1 and the largest count always present."""
    top = min(q, g)
    sizes = torch.randint(0, top + 1, batch_shape, generator=gen)
    flat = sizes.view(-1)
    flat[:3] = torch.tensor([0, 1, top])
    return sizes


def padded_costs(
    batch_shape: tuple[int, ...],
    q: int,
    g: int,
    gen: torch.Generator,
    *,
    dtype: torch.dtype = torch.float64,
    poison: bool = True,
    sizes: torch.Tensor | None = None,
) -> RaggedBatch:
    """RaggedBatch ``(*batch, Q, G)`` of tie-free random costs; columns ≥ M hold NaN / ±huge / ±inf."""
    if sizes is None:
        sizes = problem_sizes(batch_shape, q, g, gen)
    tensor = (torch.rand((*batch_shape, q, g), generator=gen, dtype=torch.float64) * 10 - 3).to(dtype)
    if poison:
        padding = torch.arange(g) >= sizes[..., None]  # (*batch, G)
        noise = torch.randint(0, len(POISONS), tensor.shape, generator=gen)
        poisoned = torch.tensor(POISONS, dtype=dtype)[noise]
        tensor = torch.where(padding[..., None, :], poisoned, tensor)
    return RaggedBatch(tensor, sizes, ragged_dim=len(batch_shape) + 1)


def scipy_pairs(block: torch.Tensor) -> torch.Tensor:
    """SciPy's (row, col) pairs of a ``(Q, M)`` block, int64 ``(M, 2)``."""
    if block.shape[1] == 0:
        return torch.zeros(0, 2, dtype=torch.int64)
    rows, cols = linear_sum_assignment(block.double().numpy())
    return torch.from_numpy(np.stack([rows, cols], axis=-1)).long()


def assert_matches_scipy(costs: RaggedBatch, result: RaggedBatch, *, mapped: bool = False) -> None:
    batch_shape = tuple(costs.batch_shape)
    q, g = costs.shape[-2:]
    assert result.tensor.dtype == torch.int64
    assert result.tensor.shape == (*batch_shape, g, 2)
    assert result.ragged_dim == len(batch_shape)
    assert torch.equal(result.sizes, costs.sizes)
    for b in itertools.product(*(range(s) for s in batch_shape)):
        m = int(costs.sizes[b])
        block = costs.tensor[b][:, :m].double()
        if mapped:
            block = torch.nan_to_num(block, nan=100.0, posinf=100.0, neginf=-100.0)
        expected = scipy_pairs(block)
        actual = result.tensor[b][:m]
        assert torch.equal(actual, expected), f"problem {b} (Q={q}, M={m}): {actual.tolist()} != {expected.tolist()}"


# ---------------------------------------------------------------------- scipy backend
@pytest.mark.parametrize("batch_shape", [(14,), (3, 5)], ids=["B", "L,B"])
@pytest.mark.parametrize(("q", "g"), [(9, 6), (7, 7), (12, 12), (30, 17)], ids=["Q>G", "square", "M=Q", "large"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_scipy_backend_matches_linear_sum_assignment(
    batch_shape: tuple[int, ...], q: int, g: int, dtype: torch.dtype, gen: torch.Generator
) -> None:
    costs = padded_costs(batch_shape, q, g, gen, dtype=dtype)
    assert_matches_scipy(costs, solve(costs, backend="scipy"))


@pytest.mark.parametrize("num_threads", [1, 2, 4])
def test_scipy_backend_thread_count_does_not_change_result(num_threads: int, gen: torch.Generator) -> None:
    costs = padded_costs((4, 6), 15, 10, gen)
    result = solve(costs, backend="scipy", num_threads=num_threads)
    assert_matches_scipy(costs, result)
    assert torch.equal(result.tensor, solve(costs, backend="scipy", num_threads=1).tensor)


def test_poisoned_padding_gives_the_same_pairs_as_clean_padding(gen: torch.Generator) -> None:
    poisoned = padded_costs((3, 4), 10, 8, gen)
    clean_tensor = poisoned.tensor.masked_fill(~poisoned.mask[..., None, :], 0.0)
    clean = RaggedBatch(clean_tensor, poisoned.sizes, ragged_dim=3)
    a, b = solve(poisoned, backend="scipy"), solve(clean, backend="scipy")
    for x, y in zip(a.to_list(), b.to_list(), strict=True):
        for xs, ys in zip(x, y, strict=True):
            assert torch.equal(xs, ys)


def test_auto_backend_on_cpu_matches_scipy(gen: torch.Generator) -> None:
    costs = padded_costs((6,), 8, 5, gen)
    assert_matches_scipy(costs, solve(costs))
    assert_matches_scipy(costs, solve(costs, backend="auto"))


def test_pairs_are_sorted_by_prediction(gen: torch.Generator) -> None:
    costs = padded_costs((8,), 20, 12, gen)
    for pairs in solve(costs, backend="scipy").to_list():
        rows = pairs[:, 0]
        assert torch.equal(rows, rows.sort().values)
        assert rows.unique().numel() == rows.numel()
        assert torch.equal(pairs[:, 1].sort().values, torch.arange(pairs.shape[0]))


def test_non_finite_costs_in_real_block_are_mapped_like_the_original(gen: torch.Generator) -> None:
    costs = padded_costs((2, 5), 8, 6, gen, sizes=torch.tensor([[6, 5, 4, 6, 3], [2, 6, 1, 0, 6]]))
    tensor = costs.tensor.clone()
    real = costs.mask[..., None, :].expand(tensor.shape)  # (L, B, Q, G)
    pick = torch.rand(tensor.shape, generator=gen)
    tensor = torch.where(real & (pick < 0.08), float("nan"), tensor)
    tensor = torch.where(real & (pick >= 0.08) & (pick < 0.14), float("inf"), tensor)
    tensor = torch.where(real & (pick >= 0.14) & (pick < 0.18), float("-inf"), tensor)
    assert tensor[real].isnan().any() and tensor[real].isposinf().any() and tensor[real].isneginf().any()
    costs = RaggedBatch(tensor, costs.sizes, ragged_dim=3)
    assert_matches_scipy(costs, solve(costs, backend="scipy"), mapped=True)


def test_half_precision_costs_are_solved_in_fp32(gen: torch.Generator) -> None:
    for dtype in (torch.float16, torch.bfloat16):
        costs = padded_costs((5,), 9, 7, gen, dtype=dtype, poison=False)
        as_float = RaggedBatch(costs.tensor.float(), costs.sizes, ragged_dim=2)
        assert torch.equal(solve(costs, backend="scipy").tensor, solve(as_float, backend="scipy").tensor)


def test_costs_that_require_grad_are_solved_without_tracking(gen: torch.Generator) -> None:
    costs = padded_costs((4,), 6, 4, gen, poison=False)
    leaf = costs.tensor.clone().requires_grad_()
    result = solve(RaggedBatch(leaf * 2, costs.sizes, ragged_dim=2), backend="scipy")
    assert not result.tensor.requires_grad
    assert_matches_scipy(costs, result)


@pytest.mark.parametrize("q", [5, 0])
def test_batch_where_every_problem_has_no_targets_gives_no_pairs(q: int) -> None:
    costs = RaggedBatch(torch.zeros(3, 4, q, 0), torch.zeros(3, 4, dtype=torch.int64), ragged_dim=3)
    result = solve(costs, backend="scipy")
    assert result.tensor.shape == (3, 4, 0, 2)
    assert torch.equal(result.sizes, costs.sizes)


def test_more_targets_than_predictions_leave_the_extra_targets_unassigned() -> None:
    """As SciPy on the rectangular block (the original): Q pairs, sizes min(M, Q); tests/test_match_unassigned.py
    covers every path."""
    costs = RaggedBatch(torch.rand(3, 4, 6, dtype=torch.float64), torch.tensor([2, 5, 1]), ragged_dim=2)
    result = solve(costs, backend="scipy")
    assert result.sizes.tolist() == [2, 4, 1]
    rows, cols = linear_sum_assignment(costs.tensor[1, :, :5].numpy())
    assert result.to_list()[1].tolist() == [[int(r), int(c)] for r, c in zip(rows, cols, strict=True)]


# ---------------------------------------------------------------------- errors


def test_ragged_dim_not_last_raises() -> None:
    with pytest.raises(ValueError, match="ragged dim last"):
        solve(RaggedBatch(torch.rand(3, 5, 4), torch.tensor([2, 5, 1]), ragged_dim=1), backend="scipy")
    with pytest.raises(ValueError, match="ragged dim last"):
        solve(RaggedBatch(torch.rand(3, 5, 4, 2), torch.tensor([2, 4, 1]), ragged_dim=2), backend="scipy")


def test_plain_tensor_raises_type_error() -> None:
    with pytest.raises(TypeError, match="RaggedBatch"):
        solve(torch.rand(3, 5, 4))  # type: ignore[arg-type]


def test_unknown_backend_raises() -> None:
    costs = RaggedBatch(torch.rand(2, 5, 4), torch.tensor([2, 4]), ragged_dim=2)
    with pytest.raises(ValueError, match="backend"):
        solve(costs, backend="lapjv")


def test_gpu_backend_on_cpu_raises_runtime_error() -> None:
    costs = RaggedBatch(torch.rand(2, 5, 4), torch.tensor([2, 4]), ragged_dim=2)
    assert not gpu_solver_available("cpu")
    with pytest.raises(RuntimeError, match=r"backend='gpu' needs a CUDA device"):
        solve(costs, backend="gpu")


# ---------------------------------------------------------------------- gpu backend's padding rule
def scipy_assignment_of_padded_problem(costs: RaggedBatch) -> torch.Tensor:
    """Per-row assignment ``(P, Q)`` (column or -1) of each whole padded ``Q × G`` problem, padding cost 0."""
    q, g = costs.shape[-2:]
    clean = torch.where(costs.mask[..., None, :], costs.tensor, 0.0).reshape(-1, q, g)  # (P, Q, G)
    assignment = torch.full((clean.shape[0], q), -1, dtype=torch.int64)
    for p in range(clean.shape[0]):
        rows, cols = linear_sum_assignment(clean[p].numpy())
        assignment[p, torch.from_numpy(rows)] = torch.from_numpy(cols)
    return assignment


@pytest.mark.parametrize(("q", "g"), [(9, 6), (8, 8), (25, 11)])
def test_pairs_from_padded_assignment_equal_pairs_of_unpadded_problem(q: int, g: int, gen: torch.Generator) -> None:
    costs = padded_costs((3, 5), q, g, gen)
    assignment = scipy_assignment_of_padded_problem(costs)
    pairs = pairs_from_assignment(assignment, costs.sizes.reshape(-1), g)
    assert pairs.shape == (15, g, 2) and pairs.dtype == torch.int64
    result = RaggedBatch(pairs.view(3, 5, g, 2), costs.sizes)
    assert_matches_scipy(costs, result)
    # Padding rows of the output are zero.
    assert torch.equal(pairs * ~costs.mask.reshape(15, g, 1), torch.zeros_like(pairs))


def test_pairs_from_assignment_by_hand() -> None:
    # Row 0 → column 2 (padding), row 1 → unassigned, row 2 → column 1, row 3 → column 0.
    assignment = torch.tensor([[2, -1, 1, 0], [-1, 0, -1, -1], [-1, -1, -1, -1]])
    pairs = pairs_from_assignment(assignment, torch.tensor([2, 1, 0]), 3)
    expected = torch.tensor([[[2, 1], [3, 0], [0, 0]], [[1, 0], [0, 0], [0, 0]], [[0, 0], [0, 0], [0, 0]]])
    assert torch.equal(pairs, expected)


# ---------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@needs_gpu_solver()
@pytest.mark.parametrize("batch_shape", [(14,), (3, 5)], ids=["B", "L,B"])
def test_gpu_backend_matches_scipy(batch_shape: tuple[int, ...], gen: torch.Generator) -> None:
    costs = padded_costs(batch_shape, 30, 17, gen, dtype=torch.float32)
    result = solve(costs.to("cuda"), backend="gpu")
    assert result.tensor.device.type == "cuda"
    assert_matches_scipy(costs, result.to("cpu"))
    assert_matches_scipy(costs, solve(costs.to("cuda"), backend="scipy").to("cpu"))
