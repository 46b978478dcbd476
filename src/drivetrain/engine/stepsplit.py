"""The trainer's own step, split into its parts: what ``drivetrain bench train`` and ``drivetrain doctor`` measure.

:func:`measure_steps` trains a config with the real :class:`~drivetrain.engine.Trainer` — its loader and workers,
prefetcher, precision, strategy — in a scratch run directory it deletes afterwards (evaluation off; the one
checkpoint the trainer always writes at the end comes after the last timed step), ``warmup`` steps then ``steps``
timed ones, under a :class:`~drivetrain.profile.Profiler` that receives the trainer's regions:

- ``data``: blocked on the loader (``next(batch)``; with the prefetcher this includes waiting for its side stream),
- ``copy``: the host → device copy (``to_device``; a pass-through for a batch the prefetcher already copied),
- ``forward`` (the network, under autocast), ``loss``, ``backward``,
- ``optimizer`` (unscale, clip, the skip decision on the device, schedule, the update taken undoably, then the
  iteration's one documented host read, of its outcome),
- ``other``: the rest of the ``step`` region (per step: the step minus its parts; gradient bookkeeping).

Times are medians over the timed steps (and their maxima); on CUDA they are CUDA-event times on the training
stream, so a part is the stream time between its marks — ``data`` is what the GPU waits while the host blocks on
the loader, not the host's wait when the GPU is still busy. The trainer's own host-clock log (``metrics.jsonl``:
``step_time_s``, ``data_wait_s``, which includes the copy) is reported beside them.

Host syncs per step: the last warm-up step is counted by :mod:`drivetrain.profile.costmodel` (the ATen kernels and
host reads of the ``step`` region, the loader's host work in ``data`` excepted), on any device — never a run's first
step, which does one-time work (lazy buffers, first solves, often with more host reads than any later step), so at
least :data:`MIN_WARMUP` warm-up steps run whatever is asked, and ``doctor`` and ``bench train`` count the same step
of a config alike; on CUDA the timed
steps also run under ``torch.cuda.set_sync_debug_mode("warn")`` and every synchronising call it reports is counted
(a stream's sync, a blocking copy, a read of a value: not a device-wide ``torch.cuda.synchronize()``, which the mode
does not report; the metric log's flush every ``log.every`` steps included), which is then the reported number.

``overhead_share = 1 − (forward + backward) / step``: the share of the step that is not the network's own work.
``skipped_steps``: the timed steps whose update was skipped (non-finite gradients: an fp16 loss scale still too high
for the model) — such a step's optimizer part is an update taken and undone (a copy back), so a split with many of
them overstates the optimizer a little.

Compilations: ``graph_breaks`` and ``compiles_in_steps`` come from ``torch._dynamo``'s counters (process-wide,
taken as differences over this run): the graph breaks over the whole run, and the graphs dynamo compiled (first
compilations and recompilations) during the timed steps — after warm-up a compiled step should compile nothing.
``cudagraph_skips`` (inductor's counter of that name, over the whole run): the graphs inductor ran without CUDA
graphs although asked to replay them (``speed.compile_step_mode=reduce-overhead``; the reason goes to torch's
``cudagraphs`` log, off by default): anything but 0 means the compiled step was not (wholly) replayed as CUDA graphs.
``batch_indices``: the dataset indices each timed step trained on (its micro-batches' in order), so two
measurements can show that they saw the same batches.

With ``trace_steps``, that many more steps follow the timed ones under ``torch.profiler`` (``with_stack``; no region
is timed there): :func:`drivetrain.profile.trace.summarize` gives their top ops, GPU idle time between kernels and
host syncs by call site, and the trace can be kept as a Chrome trace file. The split of the timed steps is handed
to ``on_timed`` before that summary is made, so a caller can write it first (a run cut during the summary keeps it).

**Step cost.** Kernels and host syncs of one step of the real trainer, for benchmarks whose variants are training
runs.

A step is the trainer's ``step`` region (forward, loss, backward, clipping, optimizer) without ``step/data``:
fetching and collating the batch is host work, kept out of the count (a :class:`~drivetrain.profile.Profiler`'s
``host_regions``; ``data=True`` counts it, for batches finished on the device). It is counted in the run's last
warm-up step, as every profiled benchmark does (:mod:`drivetrain.profile.costmodel`), so a benchmark that trains
in-process passes :func:`step_profiler` to ``active`` around ``Trainer.fit`` and reads :func:`step_cost`; one that
trains in a ``drivetrain train`` process calls :func:`count_step` (or ``python -m drivetrain.engine.stepsplit``): a
separate run of the same config that counts its third step (the first builds the optimizer's state, DDP's static
graph settles in the second), with ``torch.compile`` off, as compiled code runs eagerly while counted anyway.

Run: ``python -m drivetrain.engine.stepsplit CONFIG [KEY=VALUE ...] [--device cpu|cuda]``: prints
``{"kernels": ..., "syncs": ...}`` (under ``torch.distributed.run``, rank 0 prints).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import signal
import statistics
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from drivetrain.engine.config import load_config
from drivetrain.engine.trainer import Trainer
from drivetrain.profile import trace
from drivetrain.profile.costmodel import Cost
from drivetrain.profile.timer import Profiler, Stats, active
from drivetrain.safeio.json_files import jsonl_records

__all__ = [
    "DATA",
    "LABELS",
    "PARTS",
    "STEP",
    "StepSplit",
    "count_step",
    "measure_interleaved",
    "measure_steps",
    "step_cost",
    "step_profiler",
    "table_lines",
]

PARTS = ("data", "copy", "forward", "loss", "backward", "optimizer")  # the trainer's regions inside ``step``
STEP = "step"
HOST_REGIONS = ("step/data",)  # the loader's host work (decoding, collating) is no GPU cost: not counted
LABELS = {
    "data": "data wait (loader)", "copy": "copy (host → device)", "forward": "forward (network)", "loss": "loss",
    "backward": "backward", "optimizer": "optimizer", "other": "other",
}  # fmt: skip
SYNC_WARNING = "synchroniz"  # in the message of every warning torch.cuda.set_sync_debug_mode("warn") gives


@dataclasses.dataclass(frozen=True)
class StepSplit:
    """One measurement of the trainer's step (see the module docstring). Times in milliseconds.

    Attributes:
        device: the trainer's device, e.g. ``"cpu"``, ``"cuda:0"``.
        steps: timed steps; ``warmup``: untimed steps before them (the last one counted).
        step: the ``step`` region's stats over the timed steps.
        parts: ``PARTS`` and ``"other"`` → their stats over the timed steps.
        inner: every region path (``step/...``, the models' and losses' regions included) → its median.
        kernels_per_step, counted_syncs_per_step: the counted step's ATen kernels and host reads (None if it was
            not counted, e.g. while another counter counted).
        syncs_per_step: host syncs per step: on CUDA the synchronising calls seen per timed step, else the counted.
        syncs_source: ``"cuda sync debug mode"`` or ``"counted"``.
        region_syncs: region path → host reads of the counted step made in that region itself (not in a region
            inside it), for the regions that make any.
        part_costs: part → its kernels and host reads in the counted step (None: not counted, e.g. ``data``, the
            loader's host work); ``other``'s are the step's minus the parts'.
        logged: medians of the trainer's log over the timed steps: ``step_ms``, ``data_wait_ms`` (host clock; the
            wait includes the copy), and the run's ``peak_memory_mb``: on CUDA the allocator's peak since the run's
            trainer was built (interleaved: both runs' together); on the CPU the process's peak RSS, which a run
            measured after another in one process does not go below.
        trace: :func:`drivetrain.profile.trace.summarize` of the traced steps after the timed ones (None without).
        skipped_steps: timed steps that skipped the optimizer's update (None: the trainer's log had no record).
        graph_breaks: dynamo's graph breaks over the run (warm-up included).
        compiles_in_steps: graphs dynamo compiled during the timed steps.
        cudagraph_skips: graphs inductor ran without CUDA graphs although asked to replay them, over the run.
        batch_indices: per timed step, the dataset indices it trained on.
        step_graph: with ``speed.compile_step``, ``{"buckets", "compile_s"}``: the compiled step's buckets and the
            seconds compiling all of them before step 1 took; None without.
    """

    device: str
    steps: int
    warmup: int
    step: Stats
    parts: dict[str, Stats]
    inner: dict[str, float]
    kernels_per_step: int | None
    counted_syncs_per_step: int | None
    syncs_per_step: float | None
    syncs_source: str
    region_syncs: dict[str, int]
    part_costs: dict[str, Cost | None]
    logged: dict[str, float]
    trace: dict[str, Any] | None = None
    skipped_steps: int | None = None
    graph_breaks: int = 0
    compiles_in_steps: int = 0
    cudagraph_skips: int = 0
    batch_indices: list[list[int]] = dataclasses.field(default_factory=list)
    step_graph: dict[str, float] | None = None

    @property
    def data_wait_ms(self) -> float:
        """Median time blocked on the loader (the ``data`` part)."""
        return self.parts["data"].median

    @property
    def overhead_share(self) -> float:
        """``1 − (forward + backward) / step`` from the medians; NaN for a step of no time."""
        step = self.step.median
        if step <= 0:
            return float("nan")
        return 1.0 - (self.parts["forward"].median + self.parts["backward"].median) / step

    def as_dict(self) -> dict[str, Any]:
        """The JSON of ``drivetrain bench train`` (and the doctor's window): ms to 6 decimals, shares to 4."""

        def stats(part: str, s: Stats) -> dict[str, Any]:
            share = s.median / self.step.median if self.step.median > 0 else float("nan")
            cost = self.part_costs.get(part)
            return {"median_ms": round(s.median, 6), "max_ms": round(s.max, 6), "share": round(share, 4),
                    "kernels": None if cost is None else int(cost.kernels),
                    "syncs": None if cost is None else int(cost.syncs)}  # fmt: skip

        return {
            "device": self.device,
            "steps": self.steps,
            "warmup": self.warmup,
            "step_ms": round(self.step.median, 6),
            "step_max_ms": round(self.step.max, 6),
            "parts": {name: stats(name, s) for name, s in self.parts.items()},
            "data_wait_ms": round(self.data_wait_ms, 6),
            "overhead_share": round(self.overhead_share, 4),
            "skipped_steps": self.skipped_steps,
            "syncs_per_step": self.syncs_per_step,
            "syncs_source": self.syncs_source,
            "counted_syncs_per_step": self.counted_syncs_per_step,
            "kernels_per_step": self.kernels_per_step,
            "region_syncs": self.region_syncs,
            "graph_breaks": self.graph_breaks,
            "compiles_in_steps": self.compiles_in_steps,
            "cudagraph_skips": self.cudagraph_skips,
            "batch_indices": self.batch_indices,
            "step_graph": self.step_graph,
            "logged": {k: round(v, 6) for k, v in self.logged.items()},
            "inner_ms": {k: round(v, 6) for k, v in self.inner.items()},
        }


class _StepMarks(Profiler):
    """A profiler of the first ``limit`` steps that notes, as each step closes, how many warnings have been caught so
    far, and then runs ``torch.profiler`` over the next ``trace_steps`` steps (``trace``, once they are done)."""

    def __init__(
        self, device: torch.device, warmup: int, limit: int, ledger: _Ledger, *, nvtx: bool = False,
        trace_steps: int = 0,
    ) -> None:  # fmt: skip
        super().__init__(device, warmup=warmup, nvtx=nvtx, host_regions=HOST_REGIONS)
        self.limit, self.ledger, self.trace_steps = limit, ledger, trace_steps
        self.marks: list[int] = []  # the run's own warnings caught (ledger.own) as each step closed
        self.compiled = [ledger.counts()]  # (graphs compiled, breaks, cudagraph skips): at the start, then per step
        self.trace: Any = None
        self._traced = 0  # steps closed under the trace
        self._tracing = False

    def region(self, name: str) -> AbstractContextManager[None]:
        """Time ``name`` within the first ``limit`` steps; nothing after them (the traced steps)."""
        return super().region(name) if self.num_steps < self.limit else nullcontext()

    def step(self) -> None:
        if self.num_steps < self.limit:
            super().step()
            self.marks.append(self.ledger.warnings())
            self.compiled.append(self.ledger.counts())
        else:
            self._traced += 1
        if self.trace_steps and self.num_steps == self.limit and self.trace is None:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            self.trace = profile(activities=activities, with_stack=True)
            self.trace.start()
            self._tracing = True
        elif self._tracing and self._traced == self.trace_steps:
            self.end_trace()

    def end_trace(self) -> None:
        """Stop the trace if it runs (also when training stopped early: no profiler is left running)."""
        if self._tracing:
            self._tracing = False
            self.trace.stop()


def _dynamo_counts() -> tuple[int, int, int]:
    """``(graphs compiled, graph breaks, cudagraph skips)`` in this process so far, from ``torch._dynamo``'s counters
    (inductor's ``cudagraph_skips``: graphs it ran without CUDA graphs although asked to replay them)."""
    from torch._dynamo.utils import counters

    return (
        int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values())),
        int(counters["inductor"]["cudagraph_skips"]),
    )  # fmt: skip


MIN_WARMUP = 2  # warm-up steps run at least: the last is counted, and it must not be the run's first (see the module)


def measure_steps(
    config: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    steps: int = 5,
    warmup: int = 2,
    device: str | None = None,
    scratch: str | Path | None = None,
    nvtx: bool = False,
    trace_steps: int = 0,
    trace_file: str | Path | None = None,
    generate_data: bool = True,
    on_timed: Callable[[StepSplit], None] | None = None,
) -> StepSplit:
    """Train ``config`` (its ``base:`` chain and ``overrides`` applied) ``warmup + steps`` steps and split its step.

    Args:
        config: a run config (YAML), read as ``drivetrain train`` reads it.
        overrides: ``key=value`` overrides (before the scratch run's own: out_dir, steps, no evaluation).
        steps: timed steps (≥ 1).
        warmup: untimed steps before them (≥ 1; at least :data:`MIN_WARMUP` run: the last one is counted, and a
            run's first step does one-time work); the split reports the number run.
        device: ``train.device`` if given, else the config's.
        scratch: the folder the scratch run directory is made in (default: the system's temporary folder).
        nvtx: also emit an NVTX range per region (CUDA only), for Nsight Systems.
        trace_steps: steps after the timed ones run under ``torch.profiler`` (0: none).
        trace_file: where to export those steps' Chrome trace (JSON; with ``trace_steps``).
        generate_data: the config's data may be generated if missing (the :class:`Trainer`'s switch); ``doctor``
            profiling a run passes False, so a run's config never makes it write into the folder it names.
        on_timed: called with the split of the timed steps (``trace`` None) before the traced steps are summarised.

    Returns:
        The :class:`StepSplit`.

    Raises:
        ValueError: ``steps`` < 1, ``warmup`` < 1 or ``trace_steps`` < 0.
        ConfigError: the config or an override is invalid.
    """
    _check_counts(steps, warmup, trace_steps)
    (split,), profiler = _measure(
        config, [list(overrides)], steps=steps, warmup=warmup, device=device, scratch=scratch, nvtx=nvtx,
        trace_steps=trace_steps, generate_data=generate_data,
    )  # fmt: skip
    if profiler.trace is None:
        return split
    if on_timed is not None:
        on_timed(split)  # before the summary of the trace, which takes a while
    traced = trace.summarize(profiler.trace, trace_steps)
    if trace_file is not None:  # torch opens the file itself: exported into a folder made just now, then
        with tempfile.TemporaryDirectory(dir=Path(trace_file).parent) as fresh:  # renamed over the name
            profiler.trace.export_chrome_trace(str(Path(fresh) / Path(trace_file).name))
            os.replace(Path(fresh) / Path(trace_file).name, trace_file)  # (a link there replaced, not followed)
    return dataclasses.replace(split, trace=traced)


def measure_interleaved(
    config: str | Path,
    overrides: list[str] | tuple[str, ...],
    compare: list[str] | tuple[str, ...],
    *,
    steps: int = 5,
    warmup: int = 2,
    device: str | None = None,
    scratch: str | Path | None = None,
    nvtx: bool = False,
    generate_data: bool = True,
) -> tuple[StepSplit, StepSplit]:
    """:func:`measure_steps` of ``config`` with ``overrides`` and with ``compare`` on top, their steps alternated.

    Both trainers are built first (the configured one, then the compared one), then each runs one optimizer
    iteration in turn — warm-up (the compiled step's buckets are compiled in its first), timed steps — through
    :meth:`~drivetrain.engine.Trainer.iterations`, so a change of the machine's load during the measurement falls on
    both alike. Before its iteration each trainer gets back the process-wide state it set or draws from: torch's
    threads, deterministic mode, cuDNN benchmark and TF32 flags, torch's CPU generator and Python's and NumPy's
    global generators (:class:`_Settings`), so on the CPU each run trains exactly as it would alone (its losses,
    batches and weights). On CUDA the two share the device's generator (a CUDA generator's state is not swapped
    between graph replays): their random draws are not those of a run alone. Each split counts only its own
    steps' CUDA sync warnings and dynamo compilations. Both models, optimizers and loaders are held at once (each
    split's ``peak_memory_mb`` is the two runs' together).

    Returns:
        ``(configured, compared)`` splits.

    Raises:
        ValueError: ``steps`` < 1 or ``warmup`` < 1.
        ConfigError: the config or an override is invalid.
    """
    _check_counts(steps, warmup, 0)
    splits, _ = _measure(
        config, [list(overrides), [*overrides, *compare]], steps=steps, warmup=warmup, device=device,
        scratch=scratch, nvtx=nvtx, trace_steps=0, generate_data=generate_data,
    )  # fmt: skip
    return splits[0], splits[1]


def _check_counts(steps: int, warmup: int, trace_steps: int) -> None:
    if steps < 1 or warmup < 1 or trace_steps < 0:
        raise ValueError(f"steps ≥ 1, warmup ≥ 1, trace_steps ≥ 0: got {steps}, {warmup}, {trace_steps}")


def _measure(
    config: str | Path,
    runs: list[list[str]],
    *,
    steps: int,
    warmup: int,
    device: str | None,
    scratch: str | Path | None,
    nvtx: bool,
    trace_steps: int,
    generate_data: bool,
) -> tuple[list[StepSplit], _StepMarks]:
    """Build a trainer per override list in ``runs``, train them one iteration each in turn, and split each one's
    steps; returns the splits and the last run's profiler (its trace, with ``trace_steps``)."""
    warmup = max(warmup, MIN_WARMUP)  # the counted step is never the run's first (one-time work is no step's cost)
    total = warmup + steps
    with ExitStack() as stack:
        if threading.current_thread() is threading.main_thread():  # each trainer's fit sets the stop signals' handlers
            handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # and puts back what it met:
            stack.callback(lambda: [signal.signal(s, h) for s, h in handlers.items()])  # alternated, not nested
        measured: list[_Run] = []
        for overrides in runs:
            run = _Run(config, overrides, total + trace_steps, device, scratch, generate_data)
            stack.callback(run.close)  # the last built closes first
            measured.append(run)
        swapped = len(measured) > 1  # alone, a run's process state is its own throughout
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        for run in measured:
            run.start(caught, warmup, total, nvtx=nvtx, trace_steps=trace_steps)
        cuda = any(run.trainer.device.type == "cuda" for run in measured)
        if cuda:
            # The trainers log the CUDA allocator's peak, which counts from the process's start or its last reset: a
            # run measured after another in this process (bench train --compare) would log the other's peak. Once
            # the other's tensors are freed (cycles included), the peak counts from what these runs hold now.
            gc.collect()
            for device in {run.trainer.device for run in measured if run.trainer.device.type == "cuda"}:
                torch.cuda.reset_peak_memory_stats(device)
            torch.cuda.set_sync_debug_mode("warn")
        try:
            going = list(measured)
            while going:
                going = [run for run in going if run.advance(swapped)]
        finally:
            for run in measured:
                run.profiler.end_trace()
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
        splits = [run.split(steps, warmup, total) for run in measured]  # before the scratch folders go
    for w in caught:  # the runs' other warnings reach the caller as they would have (once per place)
        if SYNC_WARNING not in str(w.message).lower():
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return splits, measured[-1].profiler


@dataclasses.dataclass
class _Settings:
    """The process-wide state a trainer sets (:class:`~drivetrain.engine.Trainer`, ``apply_speed``) or draws from,
    swapped between the trainers :func:`measure_interleaved` alternates (CUDA's generators excepted, see there)."""

    threads: int
    deterministic: bool
    deterministic_warn_only: bool
    cudnn_benchmark: bool
    matmul_tf32: bool
    cudnn_tf32: bool
    cpu_rng: torch.Tensor
    python_rng: Any
    numpy_rng: Any

    @classmethod
    def capture(cls) -> _Settings:
        return cls(
            torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark,
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_rng_state(),
            random.getstate(), np.random.get_state(),
        )  # fmt: skip

    def apply(self) -> None:
        torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(self.deterministic, warn_only=self.deterministic_warn_only)
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        torch.backends.cuda.matmul.allow_tf32 = self.matmul_tf32
        torch.backends.cudnn.allow_tf32 = self.cudnn_tf32
        torch.set_rng_state(self.cpu_rng)
        random.setstate(self.python_rng)
        np.random.set_state(self.numpy_rng)


class _Ledger:
    """What one of several alternating runs caused itself: the warnings caught and dynamo's counts while it ran.

    Between :meth:`resume` and :meth:`pause` the run is the one running; the other runs' warnings stay out of
    :attr:`own`, and dynamo's counts made while it was paused are subtracted from :meth:`counts`.
    """

    def __init__(self, caught: list[warnings.WarningMessage]) -> None:
        self.caught = caught
        self.own: list[warnings.WarningMessage] = []
        self._base: int | None = None  # len(caught) at resume
        self._foreign: tuple[int, ...] = (0, 0, 0)  # dynamo's counts made while paused
        self._paused_at = _dynamo_counts()

    def resume(self) -> None:
        now = _dynamo_counts()
        self._foreign = tuple(f + n - p for f, n, p in zip(self._foreign, now, self._paused_at, strict=True))
        self._base = len(self.caught)

    def pause(self) -> None:
        if self._base is not None:
            self.own.extend(self.caught[self._base :])
        self._base = None
        self._paused_at = _dynamo_counts()

    def warnings(self) -> int:
        """Warnings caught while this run ran, so far."""
        return len(self.own) + (len(self.caught) - self._base if self._base is not None else 0)

    def counts(self) -> tuple[int, ...]:
        """``(graphs compiled, graph breaks, cudagraph skips)`` by this run so far (and by whatever ran before it
        started)."""
        return tuple(n - f for n, f in zip(_dynamo_counts(), self._foreign, strict=True))


class _Run:
    """One trainer of :func:`_measure` in its scratch run directory: built, started, advanced, split, closed."""

    def __init__(
        self, config: str | Path, overrides: list[str], total: int, device: str | None, scratch: str | Path | None,
        generate_data: bool,
    ) -> None:  # fmt: skip
        self._tmp = tempfile.TemporaryDirectory(prefix="drivetrain-steps-", dir=scratch)
        self.out = Path(self._tmp.name) / "run"
        keys = [
            f"run.out_dir={self.out}", "log.progress=false", "log.tensorboard=false", "eval.every=0",
            "eval.at_start=false", f"train.steps={total}", f"checkpoint.every={total}", "checkpoint.keep=1",
            *([f"train.device={device}"] if device is not None else []),
        ]  # fmt: skip
        try:
            self.trainer = Trainer(load_config(config, [*overrides, *keys]), generate_data=generate_data)
        except BaseException:
            self._tmp.cleanup()
            raise
        self.settings = _Settings.capture()  # what the trainer set up, before the next one is built
        self._iterations: Iterator[int] | None = None

    def start(
        self, caught: list[warnings.WarningMessage], warmup: int, total: int, *, nvtx: bool, trace_steps: int
    ) -> None:
        self.ledger = _Ledger(caught)
        self.profiler = _StepMarks(
            self.trainer.device, warmup, total, self.ledger, nvtx=nvtx, trace_steps=trace_steps
        )  # fmt: skip
        self.fetched = _noting_indices(self.trainer, self.profiler)
        self._iterations = self.trainer.iterations()

    def advance(self, swapped: bool) -> bool:
        """One iteration of the trainer (the first also compiles what the run compiles before step 1); False once
        it has finished (its last checkpoint committed)."""
        if swapped:
            self.settings.apply()
        self.ledger.resume()
        try:
            with active(self.profiler):
                next(self._iterations)
            return True
        except StopIteration:
            return False
        finally:
            self.ledger.pause()
            if swapped:
                self.settings = _Settings.capture()

    def split(self, steps: int, warmup: int, total: int) -> StepSplit:
        """The split of this run's timed steps (read before :meth:`close` deletes its run directory)."""
        trainer, profiler = self.trainer, self.profiler
        cuda = trainer.device.type == "cuda"
        step_times = profiler.samples(STEP)
        per_part = {part: _samples(profiler, f"{STEP}/{part}", len(step_times)) for part in PARTS}
        other = [s - sum(parts) for s, *parts in zip(step_times, *per_part.values(), strict=True)]
        summary = profiler.summary()
        counted = profiler.cost(STEP)
        syncs: float | None = None if counted is None else int(counted.syncs)
        source = "counted"
        if cuda and len(profiler.marks) >= total:  # the warnings between the end of warm-up and the last timed step
            window = self.ledger.own[profiler.marks[warmup - 1] : profiler.marks[total - 1]]
            seen = sum(SYNC_WARNING in str(w.message).lower() for w in window)
            syncs, source = (seen // steps if seen % steps == 0 else seen / steps), "cuda sync debug mode"
        region_syncs = _own_syncs(profiler)
        part_costs = {part: profiler.cost(f"{STEP}/{part}") for part in PARTS}
        if counted is not None:
            kernels = counted.kernels - sum(c.kernels for c in part_costs.values() if c is not None)
            part_costs["other"] = Cost(
                kernels, counted.syncs - sum(c.syncs for c in part_costs.values() if c is not None)
            )  # fmt: skip
        compiled = profiler.compiled
        end = compiled[min(total, len(compiled) - 1)]
        timed_indices = [[int(i) for t in self.fetched if t[0] == step for i in t[1].flatten().tolist()]
                         for step in range(warmup, total)]  # fmt: skip
        return StepSplit(
            device=str(trainer.device),
            steps=steps,
            warmup=warmup,
            step=Stats.of(step_times),
            parts={**{part: Stats.of(s) for part, s in per_part.items()}, "other": Stats.of(other)},
            inner={name: s.median for name, s in summary.items() if name.startswith(f"{STEP}/")},
            kernels_per_step=None if counted is None else int(counted.kernels),
            counted_syncs_per_step=None if counted is None else int(counted.syncs),
            syncs_per_step=syncs,
            syncs_source=source,
            region_syncs=region_syncs,
            part_costs=part_costs,
            logged=_logged(self.out / "metrics.jsonl", warmup, total),
            skipped_steps=_skipped(self.out / "metrics.jsonl", warmup, total),
            graph_breaks=end[1] - compiled[0][1],
            compiles_in_steps=end[0] - compiled[min(warmup, len(compiled) - 1)][0],
            cudagraph_skips=end[2] - compiled[0][2],
            batch_indices=timed_indices,
            step_graph=_step_graph(trainer),
        )

    def close(self) -> None:
        try:
            if self._iterations is not None:
                self._iterations.close()  # a run stopped part-way: its files closed, its directory unlocked
        finally:
            try:
                self.trainer.close()
            finally:
                self._tmp.cleanup()


def _step_graph(trainer: Trainer) -> dict[str, float] | None:
    """The compiled step's bucket count and the seconds compiling them took (``speed.compile_step``), or None."""
    graph = trainer.step_graph
    if graph is None:
        return None
    return {"buckets": len(graph.buckets), "compile_s": round(graph.compile_seconds, 3)}


def _noting_indices(trainer: Trainer, profiler: Profiler) -> list[tuple[int, torch.Tensor]]:
    """Make ``trainer`` note each batch's ``(step number, dataset indices)`` as it fetches it (read afterwards: no
    host read in the step); returns the list it fills."""
    fetched: list[tuple[int, torch.Tensor]] = []
    fetch = trainer.data.next

    def next_batch() -> Any:
        batch, indices = fetch()
        fetched.append((profiler.num_steps, indices))
        return batch, indices

    trainer.data.next = next_batch
    return fetched


def _own_syncs(profiler: Profiler) -> dict[str, int]:
    """Region path → the host reads of the counted step made in that region itself, not in a region inside it."""
    syncs = {name: int(cost.syncs) for name in profiler.names if (cost := profiler.cost(name)) is not None}
    own = {}
    for name, n in syncs.items():
        inside = sum(m for child, m in syncs.items() if child.rpartition("/")[0] == name)
        if name.startswith(f"{STEP}/") and n > inside:
            own[name] = n - inside
    return own


def _samples(profiler: Profiler, name: str, count: int) -> list[float]:
    """Per-step ms of region ``name`` over the timed steps; zeros for a region the trainer never entered."""
    if name not in profiler.names:
        return [0.0] * count
    samples = profiler.samples(name)
    if len(samples) != count:  # a part entered in some steps only: the step-by-step remainder would misalign
        raise RuntimeError(f"{name}: timed in {len(samples)} of {count} steps")
    return samples


def _logged(path: Path, warmup: int, total: int) -> dict[str, float]:
    """Medians of the trainer's own log over the timed steps (``step`` numbers ``warmup + 1 … total``)."""
    records = [r for _, _, r in jsonl_records(path.read_text(), source=path)] if path.is_file() else []
    timed = [r for r in records if "step_time_s" in r and warmup < int(r.get("step", 0)) <= total]
    out: dict[str, float] = {}
    if timed:
        out["step_ms"] = statistics.median(r["step_time_s"] for r in timed) * 1e3
        out["data_wait_ms"] = statistics.median(r["data_wait_s"] for r in timed) * 1e3
    memory = [float(r["peak_memory_mb"]) for r in records if isinstance(r.get("peak_memory_mb"), (int, float))]
    if memory:
        out["peak_memory_mb"] = max(memory)
    return out


def _skipped(path: Path, warmup: int, total: int) -> int | None:
    """Timed steps (``warmup + 1 … total``) that skipped the update: the log's cumulative ``skipped_steps`` at the
    last timed step minus at the last warm-up step; None without those records."""
    records = [r for _, _, r in jsonl_records(path.read_text(), source=path)] if path.is_file() else []
    at = {int(r["step"]): int(r["skipped_steps"]) for r in records if "step" in r and "skipped_steps" in r}
    if total not in at or warmup not in at:
        return None
    return at[total] - at[warmup]


def table_lines(split: dict[str, Any]) -> list[str]:
    """Markdown lines of a split in :meth:`StepSplit.as_dict` form: each part's median, max, share of the step and
    counted kernels and host reads, the step, then overhead share, host syncs, kernels and the trainer's own log
    (``bench train``, ``doctor``)."""
    lines = ["| part | median ms | max ms | share of the step | kernels | host reads |"]
    lines.append("|---|---:|---:|---:|---:|---:|")
    for part, label in LABELS.items():
        p = split["parts"][part]
        counts = " | ".join("–" if p.get(key) is None else f"{p[key]:,}" for key in ("kernels", "syncs"))
        lines.append(f"| {label} | {p['median_ms']:.2f} | {p['max_ms']:.2f} | {p['share']:.1%} | {counts} |")
    totals = ("kernels_per_step", "counted_syncs_per_step")
    counts = " | ".join("–" if split[key] is None else f"{split[key]:,}" for key in totals)
    lines += [f"| **step** | **{split['step_ms']:.2f}** | {split['step_max_ms']:.2f} | 100% | {counts} |", ""]
    lines.append(f"- overhead share = 1 − (forward + backward) / step = {split['overhead_share']:.3f}")
    syncs = "n/a" if split["syncs_per_step"] is None else f"{split['syncs_per_step']:g}"
    where = ", ".join(f"{name} {n}" for name, n in split["region_syncs"].items()) or "none"
    lines.append(f"- host syncs per step: {syncs} ({split['syncs_source']}; host reads counted by region: {where})")
    skipped = split.get("skipped_steps")
    if skipped is not None:
        note = ": the optimizer part of those is a skip, not an update" if skipped else ""
        lines.append(f"- timed steps that skipped the update (non-finite gradients, e.g. fp16 overflow): "
                     f"{skipped} of {split['steps']}{note}")  # fmt: skip
    if split["kernels_per_step"] is not None:
        lines.append(f"- ATen kernels per step (counted, the loader's work excepted): {split['kernels_per_step']:,}")
    logged = split["logged"]
    if "step_ms" in logged:
        lines.append(
            f"- the trainer's log (host clock): step {logged['step_ms']:.2f} ms, data wait {logged['data_wait_ms']:.2f}"
            " ms (the copy included)"
            + (f", peak memory {logged['peak_memory_mb']:.0f} MB" if "peak_memory_mb" in logged else "")
        )
    return lines


STEP, DATA = "step", "step/data"  # the trainer's regions


def step_profiler(device: torch.device | str, warmup: int, *, data: bool = False) -> Profiler:
    """A profiler for ``active(...)`` around ``Trainer.fit``: counts step ``warmup - 1``.

    Args:
        device: the trainer's device.
        warmup: the run's warm-up steps (≥ 1 to count).
        data: count the data region too, for runs whose batches are finished on the device (an augmentation
            after the copy); the loader's workers are not seen either way.
    """
    return Profiler(device, warmup=warmup, host_regions=() if data else (DATA,))


def step_cost(profiler: Profiler) -> Cost | None:
    """Kernels and host syncs of the counted training step (data excluded); None if none was counted."""
    return profiler.cost(STEP)


def count_step(config: str | Path, overrides: list[str], device: str = "cpu", steps: int = 3) -> Cost | None:
    """Train ``steps`` steps of ``config`` with ``overrides`` in a scratch folder; the last one's cost.

    Args:
        config: a run config (YAML).
        overrides: ``key=value`` overrides, as ``drivetrain train`` takes them.
        device: ``train.device``.
        steps: steps to run; the last is counted.
    """
    with tempfile.TemporaryDirectory(prefix="drivetrain-stepcost-") as tmp:
        keys = [
            f"run.out_dir={Path(tmp) / 'run'}", "log.progress=false", "log.tensorboard=false", "eval.every=0",
            "eval.at_start=false", f"train.steps={steps}", f"checkpoint.every={steps}", "checkpoint.keep=1",
            f"train.device={device}", "speed.compile=[]",
        ]  # fmt: skip
        trainer = Trainer(load_config(Path(config), [*overrides, *keys]))
        profiler = step_profiler(trainer.device, steps)
        try:
            with active(profiler):
                trainer.fit()
        finally:
            trainer.close()
    return step_cost(profiler)


def main(argv: list[str] | None = None) -> int:
    """``python -m drivetrain.engine.stepsplit``: print the counted step's kernels and syncs as JSON."""
    parser = argparse.ArgumentParser(prog="python -m drivetrain.engine.stepsplit", description=__doc__.split("\n")[0])
    parser.add_argument("config", type=Path, help="run config (YAML)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--device", default="cpu", help="train.device (default: cpu)")
    parser.add_argument("--steps", type=int, default=3, help="steps to run; the last is counted (default: 3)")
    args = parser.parse_args(argv)
    cost = count_step(args.config, args.overrides, args.device, args.steps)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(None if cost is None else {"kernels": cost.kernels, "syncs": cost.syncs}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
