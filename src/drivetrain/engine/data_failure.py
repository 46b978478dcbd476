"""Training data that cannot be read: the one-line error that stops a run and says how to go on.

An unreadable sample (:class:`~drivetrain.data.errors.DataError`, raised in the main process or a loader worker)
or a loader worker that died stops the run with a :class:`TrainingDataError` naming the file (or the worker) and
what to do: skip unreadable frames (``data.args.on_error=skip``; a DALI batch cannot drop a sample) or fix the
data and resume. The trainer saves the progress of the completed steps first, where it can.
"""

from __future__ import annotations

from pathlib import Path

from drivetrain.data.errors import DataError

__all__ = ["TrainingDataError", "data_error_line", "dead_worker"]


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
