"""Stopping a run cleanly: SIGTERM and SIGINT set a flag that the loop reads once a step.

While :meth:`StopSignals.handling` is active (in the main thread; elsewhere signals cannot be handled and it does
nothing), either signal records its name in :attr:`StopSignals.received`; the trainer agrees on it across ranks in
the step's one host read, finishes the step, checkpoints and returns — during an evaluation, after the current frame
(:mod:`~drivetrain.engine.sharded_evaluation`), abandoning the evaluation. The previous handlers come back afterwards.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["StopSignals"]


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
