"""A point reader that kills the worker process it runs in (as the OOM killer or a stray ``kill -9`` would), for
the tests of pools that must report a dead worker instead of waiting for it."""

from __future__ import annotations

import multiprocessing
import os
import signal

from drivetrain.data.io import read_points


def read_points_then_die(path, dims: int = 5):
    """``read_points`` in the main process; SIGKILL of the calling process in a worker."""
    if multiprocessing.parent_process() is not None:
        os.kill(os.getpid(), signal.SIGKILL)
    return read_points(path, dims)
