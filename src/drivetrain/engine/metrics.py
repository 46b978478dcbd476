"""Training metrics: a JSON-lines file, TensorBoard scalars and a console progress bar with ETA.

The trainer records one entry per optimizer iteration. Values that live on the device (losses, gradient
norm, loss scale) are kept as tensors and read in one transfer per flush (every ``log.every`` iterations
and before a checkpoint); host values (lr, counters, timings) are plain numbers. Across ranks the device
values are averaged with one all-reduce per flush; only rank 0 writes.

``metrics.jsonl`` gets one object per iteration:
``{"step", "opt_step", "loss", "loss/<term>", "lr", "grad_norm", "loss_scale", "skipped_steps",
"nonfinite_losses", "samples_per_s", "step_time_s", "data_wait_s", "peak_memory_mb"}``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from drivetrain.safe_files import replace_text

__all__ = ["MetricsLogger", "peak_memory_mb", "truncate_metrics"]


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: the CUDA allocator's peak on a GPU, the process's peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records after ``last_step`` (written by a run that was killed after its last checkpoint)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by the kill
            continue
        if record.get("step", 0) <= last_step:
            kept.append(line)
    replace_text(path, "".join(f"{line}\n" for line in kept))


class MetricsLogger:
    """Buffers per-iteration metrics and writes them at flush time.

    Args:
        out_dir: the run directory.
        enabled: True on rank 0 (writes files and the progress bar).
        total: total iterations (progress bar).
        start: the iteration the run starts or resumes at.
        tensorboard, progress: the log switches.
        reduce_mean: averages a 1-D device tensor across ranks (identity in one process).
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        enabled: bool,
        total: int,
        start: int,
        tensorboard: bool,
        progress: bool,
        reduce_mean: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        self.enabled = enabled
        self.reduce_mean = reduce_mean
        self._pending: list[tuple[dict[str, torch.Tensor], dict[str, float]]] = []
        self._file = None
        self._tb = None
        self._bar = None
        self.last: dict[str, float] = {}
        if not enabled:
            return
        path = out_dir / "metrics.jsonl"
        if start == 0 and path.exists():
            path.unlink()
        truncate_metrics(path, start)
        if path.is_symlink():  # appending would write into the link's target: keep our records in our own file
            path.unlink()
        self._path = path
        self._file = open(path, "a")  # noqa: SIM115 - kept open for the whole run
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(out_dir / "tensorboard"), purge_step=start + 1 if start else None)
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, file=sys.stderr)
        self._t_last = time.perf_counter()

    def record(self, device_values: dict[str, torch.Tensor], host_values: dict[str, float]) -> None:
        """Keep one iteration's metrics; device values are 0-dim float tensors, read at flush.

        The progress bar advances here, every step (no device read); its loss and lr show the last flush.
        """
        self._pending.append((device_values, host_values))
        if self._bar is not None:
            self._bar.update(1)

    def flush(self) -> None:
        """Read the buffered device values (one transfer), average across ranks, write records."""
        if not self._pending:
            return
        keys = list(self._pending[0][0])
        stacked = torch.stack([torch.stack([d[k].float() for k in keys]) for d, _ in self._pending])  # (T, K)
        stacked = self.reduce_mean(stacked.flatten()).view(len(self._pending), len(keys))
        values = stacked.tolist()  # sync: the one read of losses, norms and scales per flush
        if self.enabled:
            self._ensure_file()
            for row, (_, host) in zip(values, self._pending, strict=True):
                record = {"step": int(host["step"]), **dict(zip(keys, row, strict=True))}
                record.update({k: v for k, v in host.items() if k != "step"})
                self._write(record)
            self._file.flush()
            if self._bar is not None:  # the values just read, shown now (not at the next update)
                self._bar.set_postfix(loss=f"{self.last['loss']:.4f}", lr=f"{self.last['lr']:.2e}", refresh=True)
        self._pending.clear()

    def _ensure_file(self) -> None:
        """Re-open ``metrics.jsonl`` by its path if it was deleted or replaced while the run writes it: appending
        to the old, unlinked file would lose every later record without a word. Warned once per re-open."""
        try:
            same = os.path.samestat(os.fstat(self._file.fileno()), os.stat(self._path, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            return
        self._file.close()
        if self._path.is_symlink():  # never append through a link planted at the name
            self._path.unlink()
        self._file = open(self._path, "a")  # noqa: SIM115 - kept open for the whole run
        warnings.warn(
            f"{self._path} was deleted or replaced while the run wrote it; writing the next records to a new "
            "file there (earlier records are in the run's TensorBoard log, if enabled)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _write(self, record: dict[str, Any]) -> None:
        self.last = record
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            step = record["step"]
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self._tb.add_scalar(f"train/{key}", value, step)

    def evaluation(self, step: int, values: dict[str, float]) -> None:
        """Write one evaluation's numbers as a metrics.jsonl record ``{"step", "eval/<name>": ...}`` and as
        TensorBoard scalars ``eval/<name>`` (rank 0)."""
        if not self.enabled:
            return
        record = {"step": int(step), **{f"eval/{k}": float(v) for k, v in values.items()}}
        self._ensure_file()
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step":
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def image(self, tag: str, picture: Any, step: int) -> None:
        """A uint8 ``(H, W, 3)`` picture in TensorBoard under ``tag`` (rank 0; nothing without TensorBoard)."""
        if self.enabled and self._tb is not None:
            self._tb.add_image(tag, picture, step, dataformats="HWC")
            self._tb.flush()

    def message(self, text: str) -> None:
        """Print a line on rank 0 without breaking the progress bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        """Flush pending records, then close the progress bar, the TensorBoard writer and the metrics file."""
        self.flush()
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._file is not None:
            self._file.close()
