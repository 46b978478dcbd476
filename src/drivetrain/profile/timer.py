"""Named, nestable timed regions with warm-up exclusion and medians over repeats.

On a CUDA device a region records a pair of CUDA events on the current stream (no sync while timing;
the events are resolved with one synchronisation when results are read). On the CPU it reads
``time.perf_counter``. Optionally each region is also an NVTX range so it shows up in Nsight Systems.
The last warm-up step is also counted: the ATen kernels and host syncs of each region
(:mod:`drivetrain.profile.costmodel`), in a step whose time is discarded anyway.

Example:
    >>> prof = Profiler("cpu", warmup=2)
    >>> for _ in range(10):
    ...     with prof.region("step"):
    ...         with prof.region("forward"):
    ...             model(x)
    ...     prof.step()
    >>> prof.median("step/forward")
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from drivetrain.profile import costmodel
from drivetrain.profile.costmodel import Cost, CostCounter

__all__ = ["Profiler", "Stats", "active", "region", "synchronize", "time_call"]


@dataclass(frozen=True)
class Stats:
    """Summary of one region's per-step times in milliseconds (warm-up steps excluded)."""

    median: float
    mean: float
    min: float
    max: float
    count: int

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        """Stats of ``samples`` (milliseconds).

        Raises:
            ValueError: if ``samples`` is empty.
        """
        if not samples:
            raise ValueError("samples: no timed steps after warm-up; raise repeat or lower warmup")
        return cls(statistics.median(samples), statistics.fmean(samples), min(samples), max(samples), len(samples))


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Profiler:
    """Collects per-step times of named, nestable regions.

    Args:
        device: where the timed work runs; ``cuda`` uses CUDA events, anything else ``perf_counter``.
        warmup: number of leading steps (see :meth:`step`) whose times are discarded.
        nvtx: also emit an NVTX range per region (only on CUDA).
        count: count the kernels and host syncs of every region in the last warm-up step (see :meth:`cost`;
            nothing is counted with ``warmup=0``, or while another counter counts).
        host_regions: region paths whose work is host work, not counted (e.g. the trainer's ``step/data``:
            :func:`~drivetrain.profile.costmodel.host_work`).

    Region names nest with ``/``: ``region("loss")`` inside ``region("forward")`` is ``forward/loss``.
    A region entered several times in one step adds up, in time and in counts.
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        warmup: int = 0,
        nvtx: bool = False,
        count: bool = True,
        host_regions: Collection[str] = (),
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup: must be ≥ 0, got {warmup}")
        self.device = torch.device(device)
        self.warmup = warmup
        self._cuda = self.device.type == "cuda"
        self._nvtx = nvtx and self._cuda
        self._count = count and warmup > 0
        self._counter: CostCounter | None = None
        self._costs: dict[str, Cost | None] = {}
        self._host_regions = frozenset(host_regions)
        self._stack: list[str] = []
        self._step = 0
        self._pending: list[tuple[int, str, Any, Any]] = []
        self._times: dict[str, dict[int, float]] = {}

    @property
    def names(self) -> list[str]:
        """Region paths in the order they were first entered."""
        self._resolve()
        return list(self._times)

    @property
    def num_steps(self) -> int:
        """Steps closed so far with :meth:`step`, warm-up steps included."""
        return self._step

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Time the enclosed block as ``name`` (nested under any open region)."""
        if not name or "/" in name:
            raise ValueError(f"name: region names must be non-empty and contain no '/', got {name!r}")
        path = "/".join([*self._stack, name])
        self._times.setdefault(path, {})
        counter = self._counting_now()
        if counter is not None:
            counter.push(name)
        if self._nvtx:
            torch.cuda.nvtx.range_push(path)
        if self._cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        self._stack.append(name)
        host = costmodel.host_work() if counter is not None and path in self._host_regions else nullcontext()
        try:
            with host:
                yield
        except BaseException:
            self._stop_counting()  # an error leaves no dispatch mode or patches behind
            raise
        finally:
            self._stack.pop()
            if counter is not None:
                counter.pop()
            if self._cuda:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self._pending.append((self._step, path, start, end))
            else:
                self._add(self._step, path, (time.perf_counter() - t0) * 1e3)
            if self._nvtx:
                torch.cuda.nvtx.range_pop()

    def step(self) -> None:
        """Close one repeat (e.g. one training iteration)."""
        if self._stack:
            raise RuntimeError(f"step() called inside open region {'/'.join(self._stack)!r}")
        self._stop_counting()
        self._step += 1

    def cost(self, name: str) -> Cost | None:
        """Kernels and host syncs of region ``name`` in the counted step (the last warm-up step); None if nothing
        was counted there (``warmup=0``, ``count=False``, a region first entered after that step, or one that
        only did :func:`~drivetrain.profile.costmodel.host_work`)."""
        return self._costs.get(name)

    def _counting_now(self) -> CostCounter | None:
        """The counter of the counted step, started at its first region; None in every other step."""
        if not self._count or self._step != self.warmup - 1:
            return None
        if self._counter is None and costmodel.current() is None:
            self._counter = CostCounter()
            self._counter.start()
        return self._counter

    def _stop_counting(self) -> None:
        if self._counter is not None:
            self._counter.stop()
            self._costs = {path: cost for path, cost in self._counter.costs().items() if path}
            self._counter = None

    def samples(self, name: str) -> list[float]:
        """Per-step milliseconds of region ``name`` for the steps after warm-up."""
        self._resolve()
        if name not in self._times:
            raise KeyError(f"name: no region {name!r}; known: {sorted(self._times)}")
        return [ms for step, ms in sorted(self._times[name].items()) if step >= self.warmup]

    def median(self, name: str) -> float:
        """Median per-step milliseconds of region ``name`` over the steps after warm-up."""
        return Stats.of(self.samples(name)).median

    def summary(self) -> dict[str, Stats]:
        """Stats of every region that has timed steps after warm-up."""
        self._resolve()
        return {name: Stats.of(s) for name in self._times if (s := self.samples(name))}

    def _add(self, step: int, path: str, ms: float) -> None:
        per_step = self._times.setdefault(path, {})
        per_step[step] = per_step.get(step, 0.0) + ms

    def _resolve(self) -> None:
        if not self._pending:
            return
        torch.cuda.synchronize(self.device)  # sync: read back event times, once, when results are asked for
        for step, path, start, end in self._pending:
            self._add(step, path, start.elapsed_time(end))
        self._pending.clear()


def time_call(
    fn: Callable[[], Any],
    *,
    device: torch.device | str = "cpu",
    repeat: int = 10,
    warmup: int = 2,
) -> list[float]:
    """Run ``fn`` ``warmup + repeat`` times; return the ``repeat`` timed durations in milliseconds.

    The device is synchronised before and after each call so queued work is neither missed nor
    charged to the next call.
    """
    if repeat < 1:
        raise ValueError(f"repeat: must be ≥ 1, got {repeat}")
    prof = Profiler(device, warmup=warmup, count=False)
    for _ in range(warmup + repeat):
        synchronize(prof.device)
        with prof.region("call"):
            fn()
        synchronize(prof.device)
        prof.step()
    return prof.samples("call")


_ACTIVE: list[Profiler] = []


@contextmanager
def active(profiler: Profiler) -> Iterator[Profiler]:
    """Make ``profiler`` receive the :func:`region` calls of library code while the block runs.

    Example:
        >>> with active(prof), prof.region("loss"):
        ...     loss(outputs, batch)   # its internal regions land under "loss/..."
    """
    _ACTIVE.append(profiler)
    try:
        yield profiler
    finally:
        _ACTIVE.remove(profiler)


def region(name: str) -> AbstractContextManager[None]:
    """A timed region of the active profiler, or a no-op (``nullcontext``) when none is active.

    Library code marks its phases with this (e.g. ``cost``, ``solve``, ``targets``); it costs one list
    lookup when nobody is profiling.
    """
    return _ACTIVE[-1].region(name) if _ACTIVE else nullcontext()


def step_active() -> None:
    """Close one step of the active profiler (the trainer calls it after every iteration); a no-op without one."""
    if _ACTIVE:
        _ACTIVE[-1].step()
