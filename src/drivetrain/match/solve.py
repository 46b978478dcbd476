"""Linear assignment for a batch of rectangular problems of mixed sizes.

Problem ``p`` is the ``Q × M_p`` block of a padded cost tensor ``(*batch, Q, G)`` (``M_p`` ≤ ``G`` targets,
``Q`` predictions; ``M_p = 0`` is allowed). ``min(Q, M_p)`` (prediction, target) pairs of least total cost are
assigned, as ``scipy.optimize.linear_sum_assignment`` does on the rectangular block: with ``M_p ≤ Q`` every
target gets its own prediction; with more targets than predictions (``M_p > Q``, e.g. a frame holding more
ground truths than the detector has queries) every prediction gets one target and the other ``M_p − Q``
targets stay **unassigned** — what the original detectors do (their assigners call SciPy on the same
``(num_query, num_gt)`` matrix); the result's sizes are then ``Q``. Non-finite costs are mapped as the original
detectors do before solving: NaN → 100, +inf → 100, -inf → -100.

Backends:
    ``scipy``: the whole padded batch goes to the host in **one** transfer (one sync), the problems are
        solved in a thread pool (SciPy releases the GIL), and all index pairs come back in one transfer.
    ``gpu``: the exact Triton solver of the ``torch-linear-assignment`` package (``pip install
        drivetrain[gpu]``) on a CUDA device with compute capability ≥ 8.0: no host sync at all. Padding
        columns get one constant cost above every real cost of the batch, which leaves the optimum of the real
        columns unchanged: with ``G ≤ Q`` every column is matched anyway, and with ``G > Q`` a prediction
        matched to a padding column while a real column is free could swap to that column for less, so the
        optimum uses ``min(Q, M_p)`` real columns, as SciPy on the real block does.
    ``auto``: ``gpu`` when its requirements are met **and the kernel for this shape is compiled**, else
        ``scipy`` (see below).

**Shape buckets.** The Triton kernel takes its row and column counts as compile-time constants, so every new
padded target count ``G`` (a batch's largest ground-truth count) would compile a new kernel (0.3–0.75 s on an
H200: docs/benchmarks.md, "GPU results") — inside a training step. The ``gpu`` backend therefore pads ``G`` up to a
fixed bucket (:func:`padded_target_count`: 8, 16, 32, 64, then multiples of 64) with the same constant padding
cost, and slices the pairs back: ``G`` from 1 to 64 reaches at most 4 kernel shapes per ``Q``. The extra columns
cost the kernel at most twice the rows it would solve unpadded (at least 8 in all); the batch
size is a run-time argument of the kernel and needs no bucket. :func:`warm_gpu_solver` compiles the buckets of a
``Q`` before training or timing starts, and reports the seconds. ``auto`` never compiles: a shape not compiled
yet is solved by SciPy for that call (one host transfer) and noted; :func:`warm_pending` compiles every noted
shape (all buckets up to 64 of its ``Q``, and its own) outside the step — the trainer calls it between steps.
:func:`gpu_solver_shapes` says what was compiled, what waits, and how many calls fell back. ``backend="gpu"``
named explicitly compiles what it needs (the caller asked for that kernel).

Under ``torch.compile`` both solvers enter the graph as custom operators, ``drivetrain::solve_scipy`` and
``drivetrain::solve_gpu``, whose output shapes follow from the input shapes: dynamo traces through
:func:`solve` without a graph break. The SciPy operator still makes its one host transfer when the graph runs,
and is tagged ``cudagraph_unsafe``, so that ``mode="reduce-overhead"`` records CUDA graphs around it, not over
it. Eager calls skip the operator dispatch and run the same functions directly.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import math
import os
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from drivetrain.compiled import region  # a no-op while dynamo traces (_solve_gpu runs inside compiled steps)
from drivetrain.ragged import RaggedBatch

__all__ = [
    "BACKENDS",
    "TARGET_BUCKETS",
    "SolverWarmUp",
    "gpu_solver_available",
    "gpu_solver_shapes",
    "gpu_solver_status",
    "num_assigned",
    "num_unassigned",
    "padded_target_count",
    "pairs_from_assignment",
    "solve",
    "target_buckets",
    "warm_gpu_solver",
    "warm_pending",
]

BACKENDS = ("auto", "scipy", "gpu")
NAN_COST, POSINF_COST, NEGINF_COST = 100.0, 100.0, -100.0
# Σ Q·M² over the batch below which SciPy runs in the calling thread. Measured on a 2-core CPU: 48 problems
# of 704 × ≤20 (Σ ≈ 4.5e6) solve in 4 ms serially and 5.6 ms in the pool; 48 of 900 × 20–60 (Σ ≈ 7.7e7)
# in 30 ms serially and 17 ms in the pool.
PARALLEL_MIN_WORK = 20_000_000
# The GPU kernel's padded target counts up to 64: 4 shapes cover every G from 1 to 64 (a frame of nuScenes holds
# 0–60 boxes in most key frames); above 64 the bucket grows by BUCKET_STEP, so a rare crowded frame costs one more.
TARGET_BUCKETS = (8, 16, 32, 64)
BUCKET_STEP = 64


def solve(costs: RaggedBatch, *, backend: str = "auto", num_threads: int | None = None) -> RaggedBatch:
    """Solve every assignment problem of a padded batch.

    Args:
        costs: RaggedBatch ``(*batch, Q, G)`` with the ragged dim last (``G``), sizes ``M`` = number of
            targets per problem. Predictions are the rows, targets the columns.
        backend: ``auto``, ``scipy`` or ``gpu`` (see module docstring).
        num_threads: SciPy worker threads (default: the number of CPUs, at most the number of problems, and
            1 when the batch is too small to gain from threads; see ``PARALLEL_MIN_WORK``).

    Returns:
        int64 RaggedBatch ``(*batch, G, 2)`` of ``(prediction, target)`` pairs, ragged dim ``G``, sizes
        ``min(M, Q)`` (the targets beyond ``Q`` of a problem stay unassigned, see the module docstring); within
        a problem pairs are sorted by prediction index, as SciPy returns them.

    Raises:
        ValueError: the ragged dim is not last.
    """
    if not isinstance(costs, RaggedBatch):
        raise TypeError(f"costs: expected a RaggedBatch (*batch, Q, G) with sizes = targets, got {type(costs)}")
    if costs.tensor.dim() != costs.num_batch_dims + 2 or costs.ragged_dim != costs.tensor.dim() - 1:
        raise ValueError(
            f"costs: must have shape (*batch, Q, G) with the ragged dim last, got shape {tuple(costs.shape)} "
            f"ragged at dim {costs.ragged_dim}"
        )
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "auto" and gpu_solver_available(costs.device):
        if torch.compiler.is_compiling():  # the operator decides at run time (compiled kernel, or SciPy for now)
            return _solve_gpu(costs, compile_new=False)
        q, g = costs.shape[-2:]
        if _SHAPES.ready(costs.device, q, padded_target_count(g)):
            return _solve_gpu(costs, compile_new=False)
        _SHAPES.note(costs.device, q, padded_target_count(g))  # SciPy now; compiled between steps
    elif backend == "gpu":
        return _solve_gpu(costs, compile_new=True)
    tensor = costs.tensor.detach()
    if tensor.dtype not in (torch.float32, torch.float64):
        tensor = tensor.float()
    if torch.compiler.is_compiling():  # one opaque node in the graph instead of a graph break
        pairs = torch.ops.drivetrain.solve_scipy(tensor, costs.sizes, num_threads or 0)  # (*batch, G, 2)
    else:
        pairs = _scipy_pairs(tensor, costs.sizes, num_threads)  # (*batch, G, 2)
    return _pairs_batch(pairs, costs)


def num_assigned(num_targets: torch.Tensor, num_predictions: int, padded_targets: int) -> torch.Tensor:
    """Pairs each problem gets: ``min(M, Q)``, on the device, without a sync.

    Args:
        num_targets: int64 ``(*batch,)`` targets ``M`` per problem.
        num_predictions: ``Q``.
        padded_targets: the padded target length ``G`` (≥ every ``M``): when ``G ≤ Q`` (known on the host)
            ``num_targets`` itself is returned, no kernel runs.

    Returns:
        int64 ``(*batch,)``.
    """
    if padded_targets <= num_predictions:
        return num_targets
    return num_targets.clamp(max=num_predictions)  # (*batch,)


def num_unassigned(num_targets: torch.Tensor, num_predictions: int, padded_targets: int) -> torch.Tensor:
    """Targets left without a prediction in the whole batch, ``Σ max(M − Q, 0)``, on the device, without a sync.

    Args:
        num_targets: int64 ``(*batch,)`` targets ``M`` per problem.
        num_predictions: ``Q``.
        padded_targets: the padded target length ``G`` (≥ every ``M``): when ``G ≤ Q`` none can be left over
            and a zero is returned without reading the counts.

    Returns:
        int64 ``()``.
    """
    if padded_targets <= num_predictions:
        return num_targets.new_zeros(())
    return (num_targets - num_predictions).clamp(min=0).sum()  # ()


def _pairs_batch(pairs: torch.Tensor, costs: RaggedBatch) -> RaggedBatch:
    """The solvers' ``(*batch, G, 2)`` pairs as a RaggedBatch of sizes ``min(M, Q)`` (the costs' mask when equal)."""
    q, g = costs.shape[-2:]
    if g <= q:  # every target fits: the sizes (and their mask) are the costs'
        return RaggedBatch.unchecked(pairs, costs.sizes, costs.num_batch_dims, costs.cached_mask)
    return RaggedBatch.unchecked(pairs, num_assigned(costs.sizes, q, g), costs.num_batch_dims)


@lru_cache(maxsize=1)
def _has_triton_solver() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("torch_linear_assignment", "triton"))


@torch.compiler.assume_constant_result  # under torch.compile: evaluated once while tracing, a constant in the graph
def gpu_solver_available(device: torch.device | str) -> bool:
    """Whether the ``gpu`` backend can run on ``device`` (CUDA, CC ≥ 8.0, package and Triton installed)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0) and _has_triton_solver()


def gpu_solver_status(device: torch.device | str = "cuda") -> str:
    """One line saying whether the ``gpu`` backend can run on ``device`` and, if not, why; with the versions of
    the package and Triton, e.g. ``usable (torch-linear-assignment 0.1.0, triton 3.5.0)`` or ``not usable: no
    CUDA device``. For environment records; :func:`gpu_solver_available` is what the solver itself asks."""
    versions = []
    for name, module in (("torch-linear-assignment", "torch_linear_assignment"), ("triton", "triton")):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} {'installed' if importlib.util.find_spec(module) else 'missing'}")
    installed = ", ".join(versions)
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"not usable: no CUDA device ({installed})"
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 0):
        return f"not usable: compute capability {capability[0]}.{capability[1]} < 8.0 ({installed})"
    if not _has_triton_solver():
        return f"not usable: {installed}"
    if _sync_free_entry() is None or _ENTRY_REFUSED:
        return f"usable through the package's public wrapper, two host syncs per call ({installed})"
    return f"usable ({installed})"


# ---------------------------------------------------------------------- scipy
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="drivetrain-lsa")
    return _POOL


def _scipy_pairs(tensor: torch.Tensor, num_targets: torch.Tensor, num_threads: int | None) -> torch.Tensor:
    """The SciPy backend on plain tensors: float ``(*batch, Q, G)`` costs and int64 ``(*batch,)`` target counts
    → int64 ``(*batch, G, 2)`` pairs on the costs' device (rows past a problem's ``min(M, Q)`` pairs are zero)."""
    batch, (q, g) = tensor.shape[:-2], tensor.shape[-2:]
    device = tensor.device
    with region("transfer"):
        if device.type == "cuda":
            # sync: the one host transfer of the step; both copies are queued, then waited for once
            host_costs = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host_sizes = torch.empty(num_targets.shape, dtype=torch.int64, pin_memory=True)
            host_costs.copy_(tensor, non_blocking=True)
            host_sizes.copy_(num_targets, non_blocking=True)
            torch.cuda.current_stream(device).synchronize()
        else:
            host_costs, host_sizes = tensor, num_targets
    num_problems = math.prod(batch)
    flat_costs = host_costs.reshape(num_problems, q, g).numpy()  # (P, Q, G)
    sizes = host_sizes.reshape(-1).tolist()  # host memory by now (copied above on CUDA)
    pairs = np.zeros((len(sizes), g, 2), dtype=np.int64)  # (P, G, 2)

    def run(p: int) -> None:
        m = sizes[p]
        if m == 0 or q == 0:
            return
        block = np.nan_to_num(flat_costs[p, :, :m], nan=NAN_COST, posinf=POSINF_COST, neginf=NEGINF_COST)
        rows, cols = linear_sum_assignment(block)  # min(Q, M) pairs: with M > Q the extra targets stay unassigned
        pairs[p, : len(rows), 0] = rows
        pairs[p, : len(rows), 1] = cols

    work = [p for p, m in enumerate(sizes) if m > 0 and q > 0]
    threads = min(num_threads or os.cpu_count() or 1, len(work))
    if num_threads is None and sum(max(q, m) * min(q, m) ** 2 for m in sizes) < PARALLEL_MIN_WORK:
        threads = 1  # small problems: handing them to threads costs more than solving them
    with region("solve"):
        if threads > 1:
            list(_pool().map(run, work))
        else:
            for p in work:
                run(p)
    out = torch.from_numpy(pairs).view(*batch, g, 2)  # (*batch, G, 2)
    if device.type == "cuda":
        with region("transfer"):
            out = out.pin_memory().to(device, non_blocking=True)
    return out


@torch.library.custom_op(
    "drivetrain::solve_scipy",
    mutates_args=(),
    schema="(Tensor costs, Tensor num_targets, int num_threads) -> Tensor",
    tags=(torch.Tag.cudagraph_unsafe,),  # it waits for the stream: CUDA graphs (reduce-overhead) split around it
)
def _solve_scipy_op(costs: torch.Tensor, num_targets: torch.Tensor, num_threads: int) -> torch.Tensor:
    """:func:`_scipy_pairs` as an operator for compiled graphs (``num_threads`` 0: the default)."""
    return _scipy_pairs(costs, num_targets, num_threads or None)


@_solve_scipy_op.register_fake
def _(costs: torch.Tensor, num_targets: torch.Tensor, num_threads: int) -> torch.Tensor:
    return costs.new_empty((*costs.shape[:-2], costs.shape[-1], 2), dtype=torch.int64)  # (*batch, G, 2)


# ---------------------------------------------------------------------- gpu
def padded_target_count(num_targets: int) -> int:
    """The target count ``G`` a batch of ``num_targets`` padded targets is solved at by the ``gpu`` backend.

    The smallest of :data:`TARGET_BUCKETS` that holds ``G``, above them the next multiple of :data:`BUCKET_STEP`;
    0 stays 0 (no kernel runs). A bucket may exceed ``Q``: the padding argument of the module docstring holds for
    any number of padding columns, so the shapes do not depend on ``Q`` (4 for ``G`` from 1 to 64, whatever ``Q``).

    Example:
        >>> [padded_target_count(g) for g in (0, 1, 8, 9, 33, 64, 65, 130)]
        [0, 8, 8, 16, 64, 64, 128, 192]
    """
    if num_targets <= 0:
        return 0
    bucket = next((b for b in TARGET_BUCKETS if num_targets <= b), None)
    return bucket if bucket is not None else -(-num_targets // BUCKET_STEP) * BUCKET_STEP


def target_buckets(max_targets: int) -> list[int]:
    """Every padded target count that ``G`` from 1 to ``max_targets`` reaches, ascending (what
    :func:`warm_gpu_solver` compiles)."""
    return sorted({padded_target_count(g) for g in range(1, max_targets + 1)})


@dataclass(frozen=True)
class SolverWarmUp:
    """What one warm-up compiled: the ``(Q, G)`` kernel shapes and the seconds it took (0 when nothing was new)."""

    shapes: tuple[tuple[int, int], ...]
    seconds: float

    def describe(self) -> str:
        """One line for people, e.g. ``compiled 4 GPU assignment kernels (Q 900: G 8, 16, 32, 64) in 2.1 s``."""
        by_q: dict[int, list[int]] = {}
        for q, g in self.shapes:
            by_q.setdefault(q, []).append(g)
        parts = "; ".join(f"Q {q}: G {', '.join(map(str, sorted(gs)))}" for q, gs in sorted(by_q.items()))
        return f"compiled {len(self.shapes)} GPU assignment kernels ({parts}) in {self.seconds:.1f} s"


@dataclass
class _ShapeBook:
    """The ``gpu`` backend's kernel shapes in this process: compiled ones, ones ``auto`` met before they were
    compiled (solved by SciPy, to compile between steps), and the number of such fallbacks."""

    compiled: set[tuple[str, int, int]] = field(default_factory=set)  # (device, Q, G)
    pending: set[tuple[str, int, int]] = field(default_factory=set)
    fallbacks: int = 0
    wrapper_calls: int = 0  # kernel calls through the package's public wrapper (its two host syncs each)

    def ready(self, device: torch.device, q: int, g: int) -> bool:
        return g == 0 or (str(device), q, g) in self.compiled

    def note(self, device: torch.device, q: int, g: int) -> None:
        key = (str(device), q, g)
        if key not in self.pending:
            warnings.warn(
                f"solve: the GPU assignment kernel for Q {q} × G {g} is not compiled yet; SciPy solves this call "
                "(drivetrain.match.warm_pending compiles it outside the step; the trainer does so between steps)",
                stacklevel=3,
            )
        self.pending.add(key)
        self.fallbacks += 1


_SHAPES = _ShapeBook()


def gpu_solver_shapes() -> dict[str, object]:
    """The ``gpu`` backend's kernel shapes of this process: ``{"compiled": [(device, Q, G), ...], "pending":
    [...], "fallbacks": n, "wrapper_calls": k}`` (``fallbacks``: calls ``auto`` handed to SciPy because their shape
    was not compiled; ``wrapper_calls``: kernel calls that went through the package's public wrapper, with its two
    host syncs, because its sync-free entry point is not there — 0 with the version the module was written for)."""
    return {
        "compiled": sorted(_SHAPES.compiled),
        "pending": sorted(_SHAPES.pending),
        "fallbacks": _SHAPES.fallbacks,
        "wrapper_calls": _SHAPES.wrapper_calls,
    }


def warm_gpu_solver(
    num_predictions: int, max_targets: int = TARGET_BUCKETS[-1], device: torch.device | str = "cuda"
) -> SolverWarmUp:
    """Compile the ``gpu`` backend's kernel for every bucket ``G`` from 1 to ``max_targets`` reaches at
    ``Q = num_predictions`` (before training or timing starts: no step then compiles). Nothing happens where the
    backend is unavailable (a CPU, no Triton): an empty :class:`SolverWarmUp`. The warm-up's random costs come from a
    generator of its own: the default generators' states are left as they were.

    Args:
        num_predictions: ``Q``, the predictions of the head (e.g. 900 queries, or 704 tokens per image).
        max_targets: the largest padded target count to prepare for (default 64: 4 kernels).
        device: the CUDA device.

    Returns:
        The shapes compiled by this call (those compiled before are skipped) and the seconds it took.
    """
    device = torch.device(device)
    if not gpu_solver_available(device):
        return SolverWarmUp((), 0.0)
    if device.type == "cuda" and device.index is None:  # the key of a shape names the device as tensors do
        device = torch.device("cuda", torch.cuda.current_device())
    start = time.perf_counter()
    done = []
    # A private generator: the default ones (dropout, denoising noise, ...) must not move, or a resumed run — warmed at
    # other steps than the uninterrupted one, after its RNG state was restored — would draw other numbers.
    generator = torch.Generator(device=device).manual_seed(0)
    for g in target_buckets(max_targets):
        if _SHAPES.ready(device, num_predictions, g):
            continue
        cost = torch.rand((1, num_predictions, g), device=device, generator=generator)  # (1, Q, G)
        _triton_assignment(cost)
        _SHAPES.compiled.add((str(device), num_predictions, g))
        _SHAPES.pending.discard((str(device), num_predictions, g))
        done.append((num_predictions, g))
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync: the warm-up's end, outside any step
    return SolverWarmUp(tuple(done), time.perf_counter() - start if done else 0.0)


def warm_pending() -> SolverWarmUp:
    """Compile what ``auto`` met uncompiled (:func:`gpu_solver_shapes`' ``pending``): for each such ``Q`` every
    bucket up to 64 and the met ones. Call it outside a training step; cheap when nothing is pending."""
    pending, _SHAPES.pending = sorted(_SHAPES.pending), set()
    shapes: list[tuple[int, int]] = []
    seconds = 0.0
    for device, q, g in pending:
        warm = warm_gpu_solver(q, max(g, TARGET_BUCKETS[-1]), device)
        shapes += warm.shapes
        seconds += warm.seconds
    return SolverWarmUp(tuple(shapes), seconds)


def _solve_gpu(costs: RaggedBatch, *, compile_new: bool) -> RaggedBatch:
    if not gpu_solver_available(costs.device):
        raise RuntimeError(
            "backend='gpu' needs a CUDA device with compute capability ≥ 8.0 and the packages "
            "torch-linear-assignment and triton (pip install 'drivetrain[gpu]'); use backend='scipy' or 'auto'"
        )
    batch, (q, g) = costs.batch_shape, costs.shape[-2:]
    if g == 0:  # no problem has a target: no pairs, no kernel
        return _pairs_batch(costs.tensor.new_zeros((*batch, 0, 2), dtype=torch.int64), costs)
    bucket = padded_target_count(g)
    with region("solve"):
        clean = torch.nan_to_num(costs.tensor.detach().float(), nan=NAN_COST, posinf=POSINF_COST, neginf=NEGINF_COST)
        clean = torch.nn.functional.pad(clean, (0, bucket - g))  # (*batch, Q, G'): G' = the bucket
        valid = (torch.arange(bucket, device=costs.device) < costs.sizes.unsqueeze(-1)).unsqueeze(-2)  # (*b, 1, G')
        # One padding cost above every real cost (see the module docstring): no real column is ever left free for
        # a padding one. NEGINF_COST stands in for the padding while taking the maximum (any real cost may win).
        top = torch.where(valid, clean, NEGINF_COST).amax()  # ()
        padding = (top.abs() * 2 + 1).clamp(max=torch.finfo(torch.float32).max)  # (): finite, as the kernel needs
        clean = torch.where(valid, clean, padding)  # (*batch, Q, G')
        flat = clean.reshape(math.prod(batch), q, bucket)  # (P, Q, G')
        # Under torch.compile the kernel is one opaque node of the graph, which decides when it runs.
        kernel = torch.ops.drivetrain.solve_gpu if torch.compiler.is_compiling() else _assignment
        assignment = kernel(flat, compile_new)  # (P, Q): column of each row or -1
        pairs = pairs_from_assignment(assignment, costs.sizes.reshape(-1), bucket)[:, :g]  # (P, G, 2)
    return _pairs_batch(pairs.reshape(*batch, g, 2), costs)


def _assignment(cost: torch.Tensor, compile_new: bool) -> torch.Tensor:
    """``(P, Q, G)`` padded costs → ``(P, Q)`` assignment: the compiled kernel, or (``compile_new`` False and the
    shape not compiled: only reached under ``torch.compile``) SciPy on the host for now, the shape noted."""
    p, q, g = cost.shape
    if compile_new or _SHAPES.ready(cost.device, q, g):
        assignment = _triton_assignment(cost)
        _SHAPES.compiled.add((str(cost.device), q, g))
        return assignment
    _SHAPES.note(cost.device, q, g)
    with region("transfer"):
        host = cost.cpu().numpy()  # sync: the SciPy fallback's one host transfer (a shape not compiled yet)
    out = np.full((p, q), -1, dtype=np.int64)
    for i in range(p):
        if g:
            rows, cols = linear_sum_assignment(host[i])
            out[i, rows] = cols
    return torch.from_numpy(out).to(cost.device)


def _triton_assignment(cost: torch.Tensor) -> torch.Tensor:
    """``(P, Q, G)`` → ``(P, Q)`` assignment from the package's Triton kernel, without host syncs.

    The package's public wrapper checks for NaN/-inf and infeasibility with two host reads. Our costs are
    finite by construction (``nan_to_num`` and constant padding) and every problem is feasible (rectangular
    problems of finite costs always are; the package transposes ``G < Q`` itself),
    so we call its Triton entry point with validation off. Where that entry point is not there (a different package
    version: :func:`_sync_free_entry`), the public wrapper is used, with its two syncs: a warning says so once per
    process and :func:`gpu_solver_shapes` counts the calls (``wrapper_calls``). An error raised by the kernel itself
    is not caught.
    """
    entry = _sync_free_entry()
    if entry is not None and not _ENTRY_REFUSED:
        try:
            return entry(cost, validation="off")
        except TypeError as err:  # an entry point whose signature could not be read may not take the keyword
            if "validation" not in str(err):
                raise  # the kernel's own error
            _ENTRY_REFUSED.append(str(err))
    from torch_linear_assignment import batch_linear_assignment

    if _SHAPES.wrapper_calls == 0:
        warnings.warn(
            "solve: torch_linear_assignment has no _triton.batch_linear_assignment(cost, validation=...) entry point "
            "(a version drivetrain was not written for); its public wrapper is used, with two host syncs per call",
            stacklevel=2,
        )
    _SHAPES.wrapper_calls += 1
    return batch_linear_assignment(cost)  # sync: the public wrapper validates on the host


_ENTRY_REFUSED: list[str] = []  # the TypeError of an entry point that turned out not to take ``validation``


@lru_cache(maxsize=1)
def _sync_free_entry() -> Callable[..., torch.Tensor] | None:
    """The package's Triton entry point that takes ``validation`` (``torch_linear_assignment._triton.
    batch_linear_assignment``), or None where this version of the package has none."""
    try:
        from torch_linear_assignment import _triton
    except ImportError:
        return None
    entry = getattr(_triton, "batch_linear_assignment", None)
    if not callable(entry):
        return None
    try:
        parameters = inspect.signature(entry).parameters
    except (TypeError, ValueError):  # no signature to read (a compiled function): tried, see _triton_assignment
        return entry
    takes_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return entry if "validation" in parameters or takes_keywords else None


@torch.library.custom_op(
    "drivetrain::solve_gpu",
    mutates_args=(),
    schema="(Tensor cost, bool compile_new) -> Tensor",
    tags=(torch.Tag.cudagraph_unsafe,),  # its SciPy fallback waits for the stream
)
def _solve_gpu_op(cost: torch.Tensor, compile_new: bool) -> torch.Tensor:
    """:func:`_assignment` as an operator for compiled graphs."""
    return _assignment(cost, compile_new)


@_solve_gpu_op.register_fake
def _(cost: torch.Tensor, compile_new: bool) -> torch.Tensor:
    return cost.new_empty(cost.shape[:2], dtype=torch.int64)  # (P, Q)


def pairs_from_assignment(assignment: torch.Tensor, num_targets: torch.Tensor, num_columns: int) -> torch.Tensor:
    """Turn a per-prediction assignment into (prediction, target) pairs sorted by prediction, sync-free.

    Args:
        assignment: int64 ``(P, Q)``: the column assigned to each row, or -1.
        num_targets: int64 ``(P,)``: real columns per problem; pairs of columns ≥ this are dropped.
        num_columns: padded column count ``G``.

    Returns:
        int64 ``(P, G, 2)``: the first ``min(num_targets[p], Q)`` rows of problem ``p`` hold its pairs in row
        order (real columns no row took, ``num_targets[p] − Q`` of them when that is positive, hold no pair);
        the rest are zero.
    """
    p, q = assignment.shape
    rows = torch.arange(q, device=assignment.device).expand(p, q)  # (P, Q)
    row_of_col = torch.full((p, num_columns + 1), q, dtype=torch.long, device=assignment.device)  # (P, G+1)
    target = torch.where(assignment >= 0, assignment, num_columns)  # (P, Q): unassigned rows → dump column
    row_of_col.scatter_(1, target, rows)  # (P, G+1)
    row_of_col = row_of_col[:, :num_columns]  # (P, G): Q for a column no row took
    cols = torch.arange(num_columns, device=assignment.device).expand(p, num_columns)  # (P, G)
    real = cols < num_targets.unsqueeze(1)  # (P, G)
    key = torch.where(real, row_of_col, q + cols)  # (P, G): free real columns (Q) and padding sort after the pairs
    order = key.argsort(dim=1)  # (P, G)
    paired = cols < num_targets.clamp(max=q).unsqueeze(1)  # (P, G): positions that hold a pair after sorting
    return torch.stack([row_of_col.gather(1, order), cols.gather(1, order)], dim=-1) * paired.unsqueeze(-1)  # (P, G, 2)
