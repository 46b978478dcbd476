"""How one optimizer iteration ends: its micro-batches' sums, the decision taken from them (keep or undo the update,
go on or stop), the record the metric log gets — and what stops a run.

- :class:`MicroBatches`: the weighted loss, the unweighted terms and the model's counters summed over the
  iteration's micro-batches, which of them had a non-finite loss, their dataset indices and the data wait (device
  tensors: nothing is read here).
- :func:`decide_on_device`: apply or skip the update (non-finite gradients or loss) and stop (a signal received here
  or on another rank), agreed across ranks on the device (the loss scaler moves by it there); the update is taken at
  once, undoably (:mod:`~drivetrain.engine.undoable_update`), and :meth:`PendingDecision.read`, after it, is the
  iteration's one host sync, which keeps or undoes it. With ``precision.nonfinite=stop`` a non-finite loss then
  raises :class:`NonFiniteLossError` naming the batch.
- :func:`step_record`: the device and host values of the iteration's ``metrics.jsonl`` entry
  (:mod:`drivetrain.engine.metrics`).

**What stops a run**: a signal (stopped cleanly, with a checkpoint) or training data that cannot be read.

**Signals.** SIGTERM and SIGINT set a flag that the loop reads once a step.

While :meth:`StopSignals.handling` is active (in the main thread; elsewhere signals cannot be handled and it does
nothing), either signal records its name in :attr:`StopSignals.received`; the trainer agrees on it across ranks in
the step's one host read, finishes the step, checkpoints and returns — during an evaluation, after the current frame
(:mod:`~drivetrain.engine.eval_shards`), abandoning the evaluation. The previous handlers come back afterwards.

**Unreadable data.** The one-line error that stops a run and says how to go on.

An unreadable sample (:class:`~drivetrain.data.errors.DataError`, raised in the main process or a loader worker)
or a loader worker that died stops the run with a :class:`TrainingDataError` naming the file (or the worker) and
what to do: skip unreadable frames (``data.args.on_error=skip``; a DALI batch cannot drop a sample) or fix the
data and resume. The trainer saves the progress of the completed steps first, where it can.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from drivetrain.data.errors import DataError
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.metrics import peak_memory_mb
from drivetrain.engine.state import TrainState

__all__ = [
    "MicroBatches",
    "NonFiniteLossError",
    "PendingDecision",
    "StepDecision",
    "StopSignals",
    "TrainingDataError",
    "data_error_line",
    "dead_worker",
    "decide_on_device",
    "step_record",
]


class NonFiniteLossError(RuntimeError):
    """The loss was NaN/inf and ``precision.nonfinite`` is ``stop``; the message names the batch."""


@dataclass
class MicroBatches:
    """What the micro-batches of one iteration leave for the update and the metrics (device tensors)."""

    loss_sum: torch.Tensor  # () weighted loss summed over the micro-batches
    term_sums: dict[str, torch.Tensor]  # unweighted terms summed over the micro-batches
    loss_bad: torch.Tensor  # (accumulation,) bool: the micro-batch's loss was not finite
    indices: list[torch.Tensor] = field(default_factory=list)  # dataset indices of each micro-batch
    count_sums: dict[str, torch.Tensor] = field(default_factory=dict)  # the model's loss_counts, summed
    data_wait: float = 0.0  # seconds spent waiting for batches

    @classmethod
    def empty(cls, accumulation: int, device: torch.device) -> MicroBatches:
        """Nothing summed yet, for ``accumulation`` micro-batches on ``device``."""
        loss_bad = torch.zeros(accumulation, dtype=torch.bool, device=device)
        return cls(loss_sum=torch.zeros((), device=device), term_sums={}, loss_bad=loss_bad)

    def fetched(self, indices: torch.Tensor, seconds: float) -> None:
        """Note a micro-batch's dataset ``indices`` and the ``seconds`` spent waiting for it."""
        self.indices.append(indices)
        self.data_wait += seconds

    def add(
        self, micro: int, loss: torch.Tensor, terms: dict[str, torch.Tensor], counts: dict[str, torch.Tensor]
    ) -> None:
        """Add micro-batch ``micro``'s weighted ``loss`` (), its unweighted ``terms`` and the model's ``counts``."""
        self.loss_sum += loss.detach()
        for name, term in terms.items():
            self.term_sums[name] = self.term_sums.get(name, 0) + term.detach().float()
        for name, count in counts.items():
            self.count_sums[name] = self.count_sums.get(name, 0) + count
        self.loss_bad[micro] = ~torch.isfinite(loss.detach())


@dataclass(frozen=True)
class StepDecision:
    """The step's host decisions, agreed across ranks."""

    apply: bool  # gradients and losses are finite: apply the update
    loss_bad: bool  # some rank had a non-finite loss
    stop: str | None  # the stop signal received (here or on another rank)
    save_due: bool = False  # some rank's clock says a checkpoint is due (checkpoint.every_minutes)


@dataclass(frozen=True)
class PendingDecision:
    """The step's decision on the device, before the host reads it (:func:`decide_on_device`)."""

    apply: torch.Tensor  # () bool: gradients and losses finite on every rank: the update is applied
    flags: torch.Tensor  # (5,) int64: gradients bad, a loss bad (any rank), stop (any rank), first bad micro, save due
    stop_signal: str | None  # the stop signal this process received, if any

    def read(
        self, micro: MicroBatches, ctx: DistContext, *, stop_on_nonfinite: bool, iteration: int, data: Any
    ) -> StepDecision:
        """The step's one host read, after the update: the decision on the host.

        Args:
            micro: the iteration's micro-batches.
            ctx: this process's place in the process group.
            stop_on_nonfinite: ``precision.nonfinite == "stop"``: a non-finite loss raises.
            iteration: optimizer iterations done before this one (for the message).
            data: the batch stream (its epoch, for the message).

        Raises:
            NonFiniteLossError: a non-finite loss with ``stop_on_nonfinite``; names the micro-batch, rank, epoch and
                dataset indices.
        """
        skip, loss_bad, stop, bad_micro, due = self.flags.tolist()  # sync: the host learns the step's outcome
        if loss_bad and stop_on_nonfinite:
            local_bad = bool(micro.loss_bad[bad_micro])  # sync: error path only, the run stops here
            where = (
                f"micro-batch {bad_micro} on rank {ctx.rank}, epoch {data.state_dict()['epoch']}, "
                f"dataset indices {micro.indices[bad_micro].tolist()}"
                if local_bad
                else f"a micro-batch on another rank than {ctx.rank}"
            )
            raise NonFiniteLossError(
                f"non-finite loss at step {iteration + 1}: {where} "
                "(precision.nonfinite=stop; set it to skip to skip and count such steps)"
            )
        stop_name = self.stop_signal or ("a stop signal (on another rank)" if stop else None)
        return StepDecision(apply=not (skip or loss_bad), loss_bad=bool(loss_bad), stop=stop_name, save_due=bool(due))


def decide_on_device(
    grads_bad: torch.Tensor, micro: MicroBatches, stop_signal: str | None, ctx: DistContext, *, save_due: bool = False
) -> PendingDecision:
    """Skip, non-finite loss and stop, agreed across ranks on the device (one small all-reduce): nothing is read.

    Args:
        grads_bad: () bool, the gradients after unscaling are not all finite.
        micro: the iteration's micro-batches.
        stop_signal: the name of a stop signal this process received, if any.
        ctx: this process's place in the process group.
        save_due: this rank's clock says a checkpoint is due; agreed like a stop signal (any rank's), so every
            rank saves after the same step.

    Returns:
        The decision on the device; :meth:`PendingDecision.read` brings it to the host after the update.
    """
    any_bad = micro.loss_bad.any().to(torch.int64)
    stop_flag = any_bad.new_full((), int(stop_signal is not None))  # a fill, not a host copy
    due_flag = any_bad.new_full((), int(save_due))
    if ctx.initialized:  # every rank takes the same decisions
        any_bad, stop_flag, due_flag = ctx.all_reduce_max(torch.stack([any_bad, stop_flag, due_flag]))
    first_bad = micro.loss_bad.to(torch.int64).argmax()
    flags = torch.stack([grads_bad.to(torch.int64), any_bad, stop_flag, first_bad, due_flag])
    apply = (flags[:2] == 0).all()
    return PendingDecision(apply=apply, flags=flags, stop_signal=stop_signal)


def step_record(
    micro: MicroBatches,
    grad_norm: torch.Tensor,
    scale: torch.Tensor,
    lr: float,
    elapsed: float,
    state: TrainState,
    samples: int,
    device: torch.device,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The iteration's metric record: ``(device values, host values)`` for :meth:`MetricsLogger.record`.

    Args:
        micro: the iteration's micro-batches (their sums are averaged over them; the counters stay sums).
        grad_norm: () the gradient norm the strategy reports.
        scale: () the loss scale of the iteration's backward passes.
        lr: the base learning rate of the update.
        elapsed: the iteration's host-clock seconds.
        state: the loop counters after the iteration.
        samples: samples the iteration trained on, over every rank and micro-batch.
        device: the training device (its peak memory).

    Returns:
        The device values (tensors, read at the log's flush) and the host values (numbers).
    """
    accum = micro.loss_bad.numel()
    device_values = {"loss": micro.loss_sum / accum, "grad_norm": grad_norm, "loss_scale": scale}
    device_values.update({f"loss/{k}": v / accum for k, v in micro.term_sums.items()})
    device_values.update({f"count/{k}": v for k, v in micro.count_sums.items()})  # summed over micro-batches
    host_values = {
        "step": state.iteration,
        "opt_step": state.step,
        "lr": lr,
        "skipped_steps": state.skipped,
        "nonfinite_losses": state.nonfinite_losses,
        "samples_per_s": samples / elapsed if elapsed > 0 else 0.0,
        "step_time_s": elapsed,
        "data_wait_s": micro.data_wait,
        "peak_memory_mb": peak_memory_mb(device),
    }
    return device_values, host_values


class StopSignals:
    """The stop signal received while :meth:`handling` is active (``received``: its name, e.g. ``"SIGTERM"``)."""

    def __init__(self) -> None:
        self.received: str | None = None

    @contextmanager
    def handling(self) -> Iterator[None]:
        """SIGTERM/SIGINT set :attr:`received` instead of their default action, within the block."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            self.received = signal.Signals(signum).name

        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


class TrainingDataError(RuntimeError):
    """Training stopped on unreadable data; ``checkpoint`` holds the progress made (None under torchrun)."""

    def __init__(self, message: str, checkpoint: Path | None, can_skip: bool = True) -> None:
        self.message, self.checkpoint = message, checkpoint
        kept = f"; saved checkpoint {checkpoint} (fix the data, then --resume auto)" if checkpoint else ""
        skip = "set data.args.on_error=skip to skip unreadable frames (warned and counted)"
        if not can_skip:  # a DALI batch cannot drop a sample
            skip = "data.loader=torch with data.args.on_error=skip would skip unreadable frames"
        super().__init__(f"{message}; {skip}{kept}")


def data_error_line(err: DataError) -> str:
    """The error's own line: from a loader worker the message carries the worker's traceback, whose last line it
    is."""
    return (str(err).strip().splitlines() or [type(err).__name__])[-1].split("DataError: ", 1)[-1]


def dead_worker(err: RuntimeError) -> DataError | None:
    """The DataError of a loader worker that died (torch reports it wherever the main process is), else None."""
    if "DataLoader worker" not in str(err):
        return None
    return DataError(
        f"a data loader worker process died ({str(err).splitlines()[0].rstrip('. ')}); killed or "
        "out of memory — fewer data.num_workers or more memory, then --resume auto"
    )
