"""The gpu backend's shape buckets: a few kernel shapes for any ground-truth count, compiled outside the step.

On the CPU the Triton kernel is replaced by a recording stand-in (SciPy on the padded problem it is handed, the
same rectangular problem the kernel solves), so the shape logic, the fallback of ``auto`` and the warm-up run
here; the ``cuda`` tests at the end run the real kernel.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from drivetrain.match.solve import (
    TARGET_BUCKETS,
    gpu_solver_available,
    gpu_solver_shapes,
    padded_target_count,
    solve,
    target_buckets,
    warm_gpu_solver,
    warm_pending,
)
from drivetrain.profile import Profiler
from drivetrain.profile.timer import active
from drivetrain.ragged import RaggedBatch
from helpers.gpu_solver import REQUIRE_ENV, needs_gpu_solver
from test_match_solve import assert_matches_scipy, padded_costs

solve_module = importlib.import_module("drivetrain.match.solve")  # the package's `solve` is the function


class RecordingKernel:
    """Stand-in for the Triton kernel: ``(P, Q, G)`` → ``(P, Q)`` column of each row or −1, by SciPy on each padded
    problem; records every shape it is called with."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []

    def __call__(self, cost: torch.Tensor) -> torch.Tensor:
        p, q, g = cost.shape
        self.shapes.append((q, g))
        out = np.full((p, q), -1, dtype=np.int64)
        for i in range(p):
            rows, cols = linear_sum_assignment(cost[i].double().numpy())
            out[i, rows] = cols
        return torch.from_numpy(out)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> RecordingKernel:
    """The gpu backend on the CPU with a recording kernel and an empty book of compiled shapes."""
    return install_recording_kernel(monkeypatch)


def install_recording_kernel(monkeypatch: pytest.MonkeyPatch) -> RecordingKernel:
    """:func:`kernel` for other test modules: the stand-in installed until ``monkeypatch`` undoes it."""
    fake = RecordingKernel()
    monkeypatch.setattr(solve_module, "gpu_solver_available", lambda device: True)
    monkeypatch.setattr(solve_module, "_triton_assignment", fake)
    monkeypatch.setattr(solve_module, "_SHAPES", solve_module._ShapeBook())
    return fake


def assert_original_pairs(costs: RaggedBatch, result: RaggedBatch) -> None:
    """Each problem's pairs are SciPy's on its real ``Q × M`` block: ``min(M, Q)`` of them (``M > Q``: the extra
    targets unassigned, as the original)."""
    q = costs.shape[-2]
    assert torch.equal(result.sizes, costs.sizes.clamp(max=q))
    flat_costs = costs.tensor.reshape(-1, *costs.shape[-2:])
    flat_pairs = result.tensor.reshape(-1, *result.shape[-2:])
    for b, m in enumerate(costs.sizes.reshape(-1).tolist()):
        if m == 0:
            continue
        rows, cols = linear_sum_assignment(flat_costs[b, :, :m].double().numpy())
        assert flat_pairs[b, : len(rows)].tolist() == np.stack([rows, cols], -1).tolist(), f"problem {b}"


def costs_with_max(batch: tuple[int, ...], q: int, g: int, gen: torch.Generator) -> RaggedBatch:
    """Tie-free float32 costs ``(*batch, Q, G)`` whose largest target count is exactly ``G``."""
    sizes = torch.randint(0, min(g, q) + 1, batch, generator=gen)
    sizes.view(-1)[0] = min(g, q)
    if g > q:
        sizes.view(-1)[-1] = g
    return padded_costs(batch, q, g, gen, dtype=torch.float32, sizes=sizes)


# ---------------------------------------------------------------------- the buckets
def test_every_target_count_up_to_64_reaches_at_most_4_kernel_shapes() -> None:
    assert len({padded_target_count(g) for g in range(1, 65)}) == 4
    for g in range(1, 300):
        bucket = padded_target_count(g)
        assert g <= bucket <= max(2 * g, TARGET_BUCKETS[0])  # every target fits, at most twice the columns (or 8)
    assert padded_target_count(0) == 0


def test_buckets_are_monotone_and_listed_by_target_buckets() -> None:
    counts = [padded_target_count(g) for g in range(1, 200)]
    assert counts == sorted(counts)
    assert target_buckets(199) == sorted(set(counts))
    assert target_buckets(64) == [8, 16, 32, 64]
    assert target_buckets(130) == [8, 16, 32, 64, 128, 192]


def test_kernel_sees_at_most_4_shapes_per_head_over_batches_with_1_to_64_targets(kernel, gen) -> None:
    """Three heads (Q 50 over 2 layers × 3 samples; Q 44 over 3 × 2 images; Q 12, where most counts exceed Q), 40
    batches each with the batch maximum G drawn from 1–64: each head's kernel sees ≤ 4 shapes, every pair SciPy's."""
    for q, batch in ((50, (2, 3)), (44, (3, 2)), (12, (4,))):
        for g in torch.randint(1, 65, (40,), generator=gen).tolist():
            costs = costs_with_max(batch, q, g, gen)
            assert_original_pairs(costs, solve(costs, backend="gpu"))
        shapes = {shape for shape in kernel.shapes if shape[0] == q}
        assert 1 <= len(shapes) <= 4, shapes


def test_more_targets_than_predictions_are_bucketed_and_stay_exact(kernel, gen) -> None:
    q = 6
    for g in (7, 9, 15, 20):
        assert_original_pairs(costs := costs_with_max((4,), q, g, gen), solve(costs, backend="gpu"))
    assert {shape[1] for shape in kernel.shapes} == {8, 16, 32}


# ---------------------------------------------------------------------- auto: no compile inside a step
def test_auto_solves_an_uncompiled_shape_with_scipy_and_notes_it(kernel, gen) -> None:
    costs = costs_with_max((3, 4), 30, 11, gen)
    with pytest.warns(UserWarning, match=r"Q 30 × G 16 is not compiled yet"):
        result = solve(costs, backend="auto")
    assert kernel.shapes == []  # nothing launched, so nothing compiled
    assert_matches_scipy(costs, result)
    book = gpu_solver_shapes()
    assert book["pending"] == [("cpu", 30, 16)] and book["fallbacks"] == 1 and book["compiled"] == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same shape again: counted, not warned twice
        solve(costs, backend="auto")
    assert gpu_solver_shapes()["fallbacks"] == 2


def test_warm_pending_compiles_every_bucket_of_the_noted_head_then_auto_uses_the_kernel(kernel, gen) -> None:
    with pytest.warns(UserWarning):
        solve(costs_with_max((2, 3), 100, 5, gen), backend="auto")
    warm = warm_pending()
    assert sorted(warm.shapes) == [(100, 8), (100, 16), (100, 32), (100, 64)]
    assert kernel.shapes == [(100, 8), (100, 16), (100, 32), (100, 64)]  # one launch per bucket, outside a step
    assert "compiled 4 GPU assignment kernels (Q 100: G 8, 16, 32, 64)" in warm.describe()
    assert gpu_solver_shapes()["pending"] == [] and warm_pending().shapes == ()
    kernel.shapes.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback any more
        for g in (1, 7, 9, 33, 64):
            costs = costs_with_max((2, 3), 100, g, gen)
            assert_matches_scipy(costs, solve(costs, backend="auto"))
    assert set(kernel.shapes) <= {(100, 8), (100, 16), (100, 32), (100, 64)}
    assert gpu_solver_shapes()["fallbacks"] == 1


def test_warm_pending_compiles_a_bucket_above_64_that_auto_met(kernel, gen) -> None:
    with pytest.warns(UserWarning, match=r"G 128"):
        solve(costs_with_max((2,), 200, 100, gen), backend="auto")
    assert sorted(warm_pending().shapes) == [(200, 8), (200, 16), (200, 32), (200, 64), (200, 128)]


def test_warm_gpu_solver_skips_compiled_shapes_and_does_nothing_without_the_backend(kernel, monkeypatch) -> None:
    first = warm_gpu_solver(40, 20, "cpu")
    assert first.shapes == ((40, 8), (40, 16), (40, 32)) and first.seconds >= 0
    assert warm_gpu_solver(40, 64, "cpu").shapes == ((40, 64),)  # the rest were compiled
    monkeypatch.setattr(solve_module, "gpu_solver_available", lambda device: False)
    assert warm_gpu_solver(40, 64, "cpu").shapes == ()


def test_the_warm_up_leaves_the_default_generators_as_they_were(kernel) -> None:
    """A resumed run warms the solver at other steps than the uninterrupted one, after its RNG state was restored:
    the warm-up's random costs must not move the default generators (dropout, denoising noise)."""
    before = torch.get_rng_state()
    warm = warm_gpu_solver(40, 64, "cpu")
    assert warm.shapes  # the warm-up did launch the kernel on random costs
    assert torch.equal(torch.get_rng_state(), before)


class _PackageWithout:
    """A ``torch_linear_assignment`` whose ``_triton`` entry point takes no ``validation`` (another version): the
    public ``batch_linear_assignment`` solves with the recording stand-in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import sys
        import types

        self.public = RecordingKernel()
        package, triton = (
            types.ModuleType("torch_linear_assignment"),
            types.ModuleType("torch_linear_assignment._triton"),
        )
        package.batch_linear_assignment = self.public
        triton.batch_linear_assignment = lambda cost: self.public(cost)  # no validation argument
        package._triton = self.triton = triton
        monkeypatch.setitem(sys.modules, "torch_linear_assignment", package)
        monkeypatch.setitem(sys.modules, "torch_linear_assignment._triton", triton)


@pytest.fixture
def entry_cache() -> Iterator[None]:
    solve_module._sync_free_entry.cache_clear()
    yield
    solve_module._sync_free_entry.cache_clear()


def test_a_package_without_the_sync_free_entry_point_warns_once_and_counts_its_calls(entry_cache, monkeypatch, gen):
    package = _PackageWithout(monkeypatch)
    monkeypatch.setattr(solve_module, "gpu_solver_available", lambda device: True)
    monkeypatch.setattr(solve_module, "_SHAPES", solve_module._ShapeBook())
    costs = costs_with_max((2, 3), 20, 5, gen)
    with pytest.warns(UserWarning, match="public wrapper is used, with two host syncs per call"):
        assert_original_pairs(costs, solve(costs, backend="gpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert_original_pairs(costs, solve(costs, backend="gpu"))
    assert gpu_solver_shapes()["wrapper_calls"] == 2 and len(package.public.shapes) == 2


def test_an_entry_point_without_a_readable_signature_is_tried_then_left_for_the_wrapper(entry_cache, monkeypatch, gen):
    """A compiled entry point has no signature to read: it is called with ``validation``; when it refuses the
    keyword, the public wrapper takes over (warned once, counted) and the entry point is not tried again."""
    package = _PackageWithout(monkeypatch)
    calls = []

    class Compiled:  # like a builtin: inspect.signature cannot read it
        __signature__ = property(lambda self: (_ for _ in ()).throw(ValueError("no signature")))

        def __call__(self, cost, **kwargs):
            calls.append(kwargs)
            raise TypeError("batch_linear_assignment() got an unexpected keyword argument 'validation'")

    monkeypatch.setattr(package.triton, "batch_linear_assignment", Compiled())
    monkeypatch.setattr(solve_module, "_ENTRY_REFUSED", [])
    monkeypatch.setattr(solve_module, "gpu_solver_available", lambda device: True)
    monkeypatch.setattr(solve_module, "_SHAPES", solve_module._ShapeBook())
    costs = costs_with_max((2,), 20, 5, gen)
    with pytest.warns(UserWarning, match="public wrapper is used"):
        assert_original_pairs(costs, solve(costs, backend="gpu"))
    assert_original_pairs(costs, solve(costs, backend="gpu"))
    assert calls == [{"validation": "off"}] and gpu_solver_shapes()["wrapper_calls"] == 2


def test_an_error_inside_the_kernel_is_not_taken_for_another_package_version(entry_cache, monkeypatch, gen) -> None:
    package = _PackageWithout(monkeypatch)

    def broken(cost: torch.Tensor, validation: str) -> torch.Tensor:
        raise TypeError("a bug inside the kernel")

    monkeypatch.setattr(package.triton, "batch_linear_assignment", broken)
    monkeypatch.setattr(solve_module, "_ENTRY_REFUSED", [])
    monkeypatch.setattr(solve_module, "gpu_solver_available", lambda device: True)
    monkeypatch.setattr(solve_module, "_SHAPES", solve_module._ShapeBook())
    with pytest.raises(TypeError, match="a bug inside the kernel"):
        solve(costs_with_max((2,), 20, 5, gen), backend="gpu")
    assert package.public.shapes == [] and gpu_solver_shapes()["wrapper_calls"] == 0


def test_a_batch_without_targets_needs_no_kernel(kernel) -> None:
    costs = RaggedBatch(torch.zeros(3, 10, 0), torch.zeros(3, dtype=torch.long), ragged_dim=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert solve(costs, backend="auto").tensor.shape == (3, 0, 2)
    assert gpu_solver_shapes()["fallbacks"] == 0


def test_gpu_path_times_its_solve_in_its_own_region(kernel, gen) -> None:
    profiler = Profiler("cpu", warmup=0, count=False)
    with active(profiler):
        with profiler.region("loss"):
            solve(costs_with_max((2, 2), 20, 5, gen), backend="gpu")
        profiler.step()
    assert "loss/solve" in profiler.summary()


def test_under_torch_compile_an_uncompiled_shape_falls_back_inside_the_operator(kernel, gen) -> None:
    """In a compiled graph the operator decides at run time: SciPy (and a note) before the warm-up, the kernel
    after it; the pairs are SciPy's both times."""
    torch._dynamo.reset()

    @torch.compile(backend="eager", fullgraph=True)
    def compiled(tensor: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        return solve(RaggedBatch.unchecked(tensor, sizes, 2), backend="auto").tensor

    costs = costs_with_max((4,), 24, 6, gen)
    with pytest.warns(UserWarning, match=r"Q 24 × G 8 is not compiled yet"):
        before = compiled(costs.tensor, costs.sizes)
    assert kernel.shapes == [] and gpu_solver_shapes()["pending"] == [("cpu", 24, 8)]
    assert_matches_scipy(costs, RaggedBatch.unchecked(before, costs.sizes, 1))  # pairs (B, G, 2): ragged dim 1
    warm_pending()
    kernel.shapes.clear()
    after = compiled(costs.tensor, costs.sizes)
    assert kernel.shapes == [(24, 8)]
    assert torch.equal(before, after)
    torch._dynamo.reset()


def test_under_torch_compile_with_a_profiler_active_the_gpu_backend_is_one_graph(kernel, gen) -> None:
    """``bench train`` times a compiled step (StreamPETR's calls the solver inside its graph) with a profiler active:
    the gpu backend's region is a no-op while dynamo traces, not the profiler's timer (whose host clock dynamo
    refuses: the ``fullgraph`` step would not compile; on CUDA the timer's events would be traced into the graph).
    Before the warm-up, as the step's first call: SciPy inside the operator."""
    torch._dynamo.reset()

    @torch.compile(backend="eager", fullgraph=True)
    def compiled(tensor: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        return solve(RaggedBatch.unchecked(tensor, sizes, 2), backend="auto").tensor

    costs = costs_with_max((4,), 24, 6, gen)
    profiler = Profiler("cpu", warmup=0, count=False)
    with active(profiler), profiler.region("step"), pytest.warns(UserWarning, match=r"Q 24 × G 8 is not compiled"):
        pairs = compiled(costs.tensor, costs.sizes)
    assert_matches_scipy(costs, RaggedBatch.unchecked(pairs, costs.sizes, 1))  # pairs (B, G, 2): ragged dim 1
    torch._dynamo.reset()


# ---------------------------------------------------------------------- CUDA: the real kernel
needs_kernel = needs_gpu_solver()  # skipped without the solver, failed instead when the run book requires it


@pytest.fixture
def fresh_book(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(solve_module, "_SHAPES", solve_module._ShapeBook())


@pytest.mark.cuda
@needs_kernel
def test_cuda_warmed_auto_compiles_nothing_over_64_target_counts(fresh_book, gen) -> None:
    warm = warm_gpu_solver(900, 64, "cuda")
    assert sorted(g for _, g in warm.shapes) == [8, 16, 32, 64] and warm.seconds > 0
    compiled = gpu_solver_shapes()["compiled"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn
        for g in range(1, 65, 7):
            costs = costs_with_max((6, 2), 900, g, gen)
            result = solve(costs.to("cuda"), backend="auto")
            assert_matches_scipy(costs, result.to("cpu"))
    assert gpu_solver_shapes()["compiled"] == compiled and gpu_solver_shapes()["fallbacks"] == 0


@pytest.mark.cuda
@needs_kernel
def test_cuda_warm_up_leaves_the_default_cuda_generator_as_it_was(fresh_book) -> None:
    before = torch.cuda.get_rng_state()
    assert warm_gpu_solver(300, 64, "cuda").shapes
    assert torch.equal(torch.cuda.get_rng_state(), before)
    assert gpu_solver_shapes()["wrapper_calls"] == 0  # the sync-free entry point of the installed package was used


@pytest.mark.cuda
@needs_kernel
def test_cuda_auto_falls_back_until_warm_pending_compiles(fresh_book, gen) -> None:
    costs = costs_with_max((4, 3), 704, 13, gen)
    with pytest.warns(UserWarning, match="not compiled yet"):
        first = solve(costs.to("cuda"), backend="auto")
    assert gpu_solver_shapes()["fallbacks"] == 1
    warm = warm_pending()
    assert sorted(g for _, g in warm.shapes) == [8, 16, 32, 64]
    second = solve(costs.to("cuda"), backend="auto")
    assert gpu_solver_shapes()["fallbacks"] == 1
    assert torch.equal(first.tensor.cpu(), second.tensor.cpu())
    assert_matches_scipy(costs, second.to("cpu"))


@pytest.mark.cuda
@needs_kernel
@pytest.mark.parametrize(("q", "g"), [(900, 1), (900, 64), (704, 20), (6, 20)])
def test_cuda_bucketed_kernel_matches_scipy(q: int, g: int, gen) -> None:
    costs = costs_with_max((5,), q, g, gen)
    assert_original_pairs(costs, solve(costs.to("cuda"), backend="gpu").to("cpu"))


def test_without_the_solver_its_tests_skip_unless_the_run_book_requires_it(monkeypatch) -> None:
    if gpu_solver_available("cuda"):
        pytest.skip("the solver is usable here: nothing would be skipped")
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    mark = needs_gpu_solver()
    assert mark.name == "skipif" and mark.args == (True,) and "not usable" in mark.kwargs["reason"]
    monkeypatch.setenv(REQUIRE_ENV, "1")
    mark = needs_gpu_solver()
    assert mark.name == "usefixtures" and mark.args == ("gpu_solver_required",)


@pytest.mark.slow
def test_the_run_books_requirement_turns_the_solver_tests_skip_into_a_failure(tmp_path) -> None:
    """Without the solver the CUDA solver tests skip, but under the run book's DRIVETRAIN_REQUIRE_GPU_SOLVER=1 they
    fail, naming why: a GPU machine without Triton or the package cannot pass the CUDA test step as "ok"."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if gpu_solver_available("cuda"):
        pytest.skip("the solver is usable here: nothing would be skipped")
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "-m", "cuda", "-k", "bucketed",
            str(Path(__file__))]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    env.pop(REQUIRE_ENV, None)
    skipped = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, check=False, timeout=300)
    assert skipped.returncode == 0 and "4 skipped" in skipped.stdout, skipped.stdout[-2000:]
    required = subprocess.run(argv, capture_output=True, text=True, env={**env, REQUIRE_ENV: "1"}, cwd=tmp_path,
                              check=False, timeout=300)  # fmt: skip
    assert required.returncode == 1 and "4 error" in required.stdout, required.stdout[-2000:]
    assert f"{REQUIRE_ENV}=1 requires the GPU solver, but it is not usable: " in required.stdout


@pytest.mark.cuda
@pytest.mark.heavy
@pytest.mark.compiles
@needs_kernel
def test_cuda_the_compiled_gpu_backend_traces_with_a_cuda_profiler_active(fresh_book, gen) -> None:
    """The test above with the real kernel and a CUDA profiler (CUDA events, as ``bench train`` on a GPU)."""
    warm_gpu_solver(24, 64, "cuda")
    torch._dynamo.reset()

    @torch.compile(backend="eager", fullgraph=True)
    def compiled(tensor: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        return solve(RaggedBatch.unchecked(tensor, sizes, 2), backend="auto").tensor

    costs = costs_with_max((4,), 24, 6, gen)
    profiler = Profiler("cuda", warmup=0, count=False)
    with active(profiler), profiler.region("step"):
        pairs = compiled(costs.tensor.to("cuda"), costs.sizes.to("cuda"))
    assert_matches_scipy(costs, RaggedBatch.unchecked(pairs.cpu(), costs.sizes, 1))
    assert gpu_solver_shapes()["fallbacks"] == 0
    torch._dynamo.reset()
