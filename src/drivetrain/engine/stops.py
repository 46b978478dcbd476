"""What stops a run: a signal (stopped cleanly, with a checkpoint) or training data that cannot be read.

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
from pathlib import Path
from typing import Any

from drivetrain.data.errors import DataError

__all__ = ["StopSignals", "TrainingDataError", "data_error_line", "dead_worker"]


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
