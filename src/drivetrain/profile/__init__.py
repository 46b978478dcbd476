"""Timing, resource sampling and result reporting for every drivetrain benchmark.

- :class:`Profiler`: named, nestable regions (CUDA events on GPU, ``perf_counter`` on CPU, optional
  NVTX), warm-up exclusion, medians over repeats.
- :class:`ResourceMonitor`: CPU cores used by the process tree, peak RSS, peak CUDA memory.
- :class:`BenchResult` / :class:`Row`: the breakdown table and its JSON / Markdown files.
- :func:`compare`, :func:`add_bench_arguments`, :func:`emit`: the plumbing shared by ``drivetrain bench``.
- :mod:`~drivetrain.profile.costmodel`: the ATen kernels and host syncs of each path, counted on any device, and
  the launch-bound GPU estimate every row reports beside its times.
- :mod:`~drivetrain.profile.runbook`: the GPU check's steps within a borrowed machine's minutes (the versions and
  settings its numbers depend on: :mod:`drivetrain.cli.gpu_environment`, which asks the solver whether it is usable).
"""

from drivetrain.profile.bench import (
    add_bench_arguments,
    compare,
    emit,
    resolve_device,
    rows_from_profilers,
    setup_bench,
)
from drivetrain.profile.resources import ResourceMonitor, ResourceUsage
from drivetrain.profile.results import BenchResult, Row, device_name, device_slug, environment
from drivetrain.profile.timer import Profiler, Stats, active, region, synchronize, time_call

__all__ = [
    "BenchResult",
    "Profiler",
    "ResourceMonitor",
    "ResourceUsage",
    "Row",
    "Stats",
    "active",
    "add_bench_arguments",
    "compare",
    "device_name",
    "device_slug",
    "emit",
    "environment",
    "region",
    "resolve_device",
    "rows_from_profilers",
    "setup_bench",
    "synchronize",
    "time_call",
]
