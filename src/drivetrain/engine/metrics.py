"""Training metrics: a JSON-lines file, TensorBoard scalars and a console progress bar with ETA.

The trainer records one entry per optimizer iteration. Values that live on the device (losses, gradient
norm, loss scale) are kept as tensors and read in one transfer per flush (every ``log.every`` iterations
and before a checkpoint); host values (lr, counters, timings) are plain numbers. Across ranks the device
values are averaged with one all-reduce per flush; only rank 0 writes.

``metrics.jsonl`` gets one object per iteration:
``{"step", "opt_step", "loss", "loss/<term>", "count/<name>", "lr", "grad_norm", "loss_scale", "skipped_steps",
"nonfinite_losses", "samples_per_s", "step_time_s", "data_wait_s", "peak_memory_mb"}`` (``count/<name>``: the
model's ``loss_counts`` summed over the iteration's micro-batches — and, like every device value, averaged over
ranks — e.g. ``count/unassigned_gt``, ground truths left unassigned because a frame holds more than the model has
queries).

A file of the log that cannot be written — a full disk, an exceeded quota, a read-only file system, at start-up
(``metrics.jsonl``, the TensorBoard event file) or later — raises one :class:`RunWriteError` line naming the file
and why; the logger writes nothing more after it. TensorBoard writes from a thread of its own, which hands its
error to the next call of the writer: the thread's own traceback print is kept quiet (:func:`_quiet_tensorboard`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from drivetrain.engine.checkpoint import write_reason
from drivetrain.safeio import json_files
from drivetrain.safeio.files import no_follow, replace_text

__all__ = ["MetricsLogger", "RunWriteError", "peak_memory_mb", "truncate_metrics"]


class RunWriteError(RuntimeError):
    """A file of the run could not be written; the message is one line naming it and why (e.g. the disk is full)."""


def write_failure(path: Path, err: BaseException) -> str:
    """The one line of a failed write of ``path``: why, and that the committed checkpoints are kept."""
    reason, fix = write_reason(err)
    return f"cannot write {path} ({reason}); the committed checkpoints are kept — {fix}, then --resume auto"


def _quiet_tensorboard() -> None:
    """Keep ``threading`` from printing the traceback of TensorBoard's writer thread when it dies on an OSError:
    the writer raises that error again in the next call made to it, which :class:`MetricsLogger` reports in one
    line. Installed once per process; every other thread's exception goes to the previous hook."""
    previous = threading.excepthook
    if getattr(previous, "drivetrain_quiet_tensorboard", False):
        return

    def hook(args: Any) -> None:
        if type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, OSError):
            return
        previous(args)

    hook.drivetrain_quiet_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: the CUDA allocator's peak on a GPU, the process's peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records after ``last_step`` (written by a run that was killed after its last checkpoint). A link at
    the name holds no records of this run: it is left for the logger to replace."""
    if path.is_symlink() or not path.is_file():
        return
    kept = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            record = json_files.loads(line, source=path, line=number)
        except json_files.JSONLimitError as err:  # no run of ours writes that: not a record, dropped and said so
            warnings.warn(f"{err}; dropping that line", RuntimeWarning, stacklevel=2)
            continue
        except ValueError:  # a line cut short by the kill
            continue
        step = record.get("step", 0) if isinstance(record, dict) else None
        if isinstance(step, int | float) and step <= last_step:
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
        self._failed = False  # a write failed: nothing more is written
        self.last: dict[str, float] = {}
        if not enabled:
            return
        path = out_dir / "metrics.jsonl"
        self._path, self._tb_dir = path, out_dir / "tensorboard"
        with self._writing(path):
            if start == 0 and path.exists():
                path.unlink()
            truncate_metrics(path, start)
            # kept open for the whole run; a link at the name is replaced, never appended through
            self._file = open(path, "a", opener=no_follow)  # noqa: SIM115
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_tensorboard()
            with self._writing(self._tb_dir):  # the writer creates its event file and writes to it at once
                self._tb = SummaryWriter(str(self._tb_dir), purge_step=start + 1 if start else None)
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
        """Read the buffered device values (one transfer), average across ranks, write records.

        Raises:
            RunWriteError: ``metrics.jsonl`` or the TensorBoard log could not be written (one line naming it).
        """
        if not self._pending:
            return
        keys = list(self._pending[0][0])
        stacked = torch.stack([torch.stack([d[k].float() for k in keys]) for d, _ in self._pending])  # (T, K)
        stacked = self.reduce_mean(stacked.flatten()).view(len(self._pending), len(keys))
        values = stacked.tolist()  # sync: the one read of losses, norms and scales per flush
        pending, self._pending = self._pending, []
        if self.enabled and not self._failed:
            with self._writing(self._path):
                self._ensure_file()
            for row, (_, host) in zip(values, pending, strict=True):
                record = {"step": int(host["step"]), **dict(zip(keys, row, strict=True))}
                record.update({k: v for k, v in host.items() if k != "step"})
                self._write(record)
            with self._writing(self._path):
                self._file.flush()
            if self._bar is not None:  # the values just read, shown now (not at the next update)
                self._bar.set_postfix(loss=f"{self.last['loss']:.4f}", lr=f"{self.last['lr']:.2e}", refresh=True)

    @contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        """Turn an error writing ``path`` into one :class:`RunWriteError` line; the logger writes nothing after it."""
        try:
            yield
        except OSError as err:
            self._fail()
            raise RunWriteError(write_failure(path, err)) from None

    def _fail(self) -> None:
        """Stop writing: close the files without flushing what could not be written (their errors are moot)."""
        self._failed = True
        for close in (getattr(self._tb, "close", None), getattr(self._file, "close", None)):
            try:
                if close is not None:
                    close()
            except OSError:
                pass
        self._tb = self._file = None

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
        self._file = open(self._path, "a", opener=no_follow)  # noqa: SIM115 - never through a link at the name
        warnings.warn(
            f"{self._path} was deleted or replaced while the run wrote it; writing the next records to a new "
            "file there (earlier records are in the run's TensorBoard log, if enabled)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _write(self, record: dict[str, Any]) -> None:
        self.last = record
        with self._writing(self._path):
            self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            step = record["step"]
            with self._writing(self._tb_dir):
                for key, value in record.items():
                    if key != "step" and isinstance(value, int | float):
                        self._tb.add_scalar(f"train/{key}", value, step)

    def evaluation(self, step: int, values: dict[str, float]) -> None:
        """Write one evaluation's numbers as a metrics.jsonl record ``{"step", "eval/<name>": ...}`` and as
        TensorBoard scalars ``eval/<name>`` (rank 0)."""
        if not self.enabled or self._failed:
            return
        self._write_record({"step": int(step), **{f"eval/{k}": float(v) for k, v in values.items()}})

    def checkpoint(self, step: int, stall_s: float) -> None:
        """Write how long the save of ``step`` blocked training as a metrics.jsonl record ``{"step",
        "checkpoint/stall_s"}`` (rank 0; ``step_time_s`` leaves it out) and the TensorBoard scalar of that name."""
        if not self.enabled or self._failed:
            return
        self._write_record({"step": int(step), "checkpoint/stall_s": float(stall_s)})

    def _write_record(self, record: dict[str, Any]) -> None:
        """Append ``record`` (``{"step": N, name: value, ...}``) to metrics.jsonl now, and each value as the
        TensorBoard scalar of its name."""
        with self._writing(self._path):
            self._ensure_file()
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._tb is not None:
            with self._writing(self._tb_dir):
                for key, value in record.items():
                    if key != "step":
                        self._tb.add_scalar(key, value, record["step"])
                self._tb.flush()

    def image(self, tag: str, picture: Any, step: int) -> None:
        """A uint8 ``(H, W, 3)`` picture in TensorBoard under ``tag`` (rank 0; nothing without TensorBoard)."""
        if self.enabled and self._tb is not None:
            with self._writing(self._tb_dir):
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

    def close(self, *, reduce: bool = True) -> None:
        """Flush pending records, then close the progress bar, the TensorBoard writer and the metrics file.

        Args:
            reduce: average the pending records over the ranks and write them (a collective); False drops them
                (said in one line): a rank that failed, perhaps alone, leaves without a collective.

        Raises:
            RunWriteError: as :meth:`flush`, for the records still pending or the last TensorBoard write (once:
                after a failed write, close only releases the files).
        """
        try:
            if reduce:
                self.flush()
            elif self._pending:
                dropped, self._pending = len(self._pending), []
                self.message(f"drivetrain train: the metrics of the last {dropped} step(s) are not written (the run "
                             "failed; their mean over the ranks would wait for every rank)")  # fmt: skip
            if self._tb is not None:
                with self._writing(self._tb_dir):
                    self._tb.flush()  # raises what the writer thread met; its close() would not
                    self._tb.close()
                self._tb = None
            if self._file is not None:
                with self._writing(self._path):
                    self._file.close()
                self._file = None
        finally:
            if self._bar is not None:
                self._bar.close()
            if self._failed:
                self._fail()
