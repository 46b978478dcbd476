"""Process CPU usage and peak memory while a block runs.

CPU usage is measured as CPU time over wall time of this process *and its children* (data-loader
workers are child processes), in cores: 1.0 = one core busy. A background thread samples the process
tree with psutil every ``interval`` seconds, which also tracks the peak resident set size (RSS) of the
tree. On CUDA the peak of PyTorch's caching allocator is reported as well.

Example:
    >>> with ResourceMonitor("cpu") as mon:
    ...     run_epoch()
    >>> mon.result.cpu_cores, mon.result.peak_rss_mb
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import asdict, dataclass
from types import TracebackType

import psutil
import torch

__all__ = ["ResourceMonitor", "ResourceUsage"]


@dataclass(frozen=True)
class ResourceUsage:
    """What a :class:`ResourceMonitor` saw."""

    wall_s: float
    cpu_s: float
    cpu_cores: float  # cpu_s / wall_s: average busy cores of the process tree
    cpu_percent_of_machine: float  # cpu_cores / logical CPUs * 100
    peak_rss_mb: float
    peak_device_mb: float | None  # CUDA allocator peak; None on the CPU

    def as_dict(self) -> dict[str, float | None]:
        """The fields as a dict."""
        return asdict(self)


class ResourceMonitor:
    """Context manager sampling CPU time and memory of this process tree.

    Args:
        device: the compute device; on CUDA its allocator's peak memory is reset and reported.
        interval: seconds between samples of the process tree.
    """

    def __init__(self, device: torch.device | str = "cpu", interval: float = 0.05) -> None:
        if interval <= 0:
            raise ValueError(f"interval: must be > 0, got {interval}")
        self.device = torch.device(device)
        self.interval = interval
        self._proc = psutil.Process(os.getpid())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_by_pid: dict[int, float] = {}
        self._peak_rss = 0
        self._t0 = 0.0
        self.result: ResourceUsage | None = None

    def __enter__(self) -> ResourceMonitor:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._cpu_start = self._tree_cpu()
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="drivetrain-resource-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - self._t0
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self._tree_cpu()  # final reading, after the sampler thread has stopped
        cpu = max(0.0, sum(self._cpu_by_pid.values()) - self._cpu_start)
        peak_dev = None
        if self.device.type == "cuda":
            peak_dev = torch.cuda.max_memory_allocated(self.device) / 2**20
        cores = cpu / wall if wall > 0 else 0.0
        self.result = ResourceUsage(
            wall_s=wall,
            cpu_s=cpu,
            cpu_cores=cores,
            cpu_percent_of_machine=100.0 * cores / (psutil.cpu_count() or 1),
            peak_rss_mb=self._peak_rss / 2**20,
            peak_device_mb=peak_dev,
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._tree_cpu()

    def _tree_cpu(self) -> float:
        """Total CPU seconds of the process tree (exited children keep their last reading); tracks peak RSS."""
        procs = [self._proc]
        with contextlib.suppress(psutil.Error):
            procs += self._proc.children(recursive=True)
        rss = 0
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    self._cpu_by_pid[p.pid] = t.user + t.system
                    rss += p.memory_info().rss
            except psutil.Error:
                continue
        self._peak_rss = max(self._peak_rss, rss)
        return sum(self._cpu_by_pid.values())
