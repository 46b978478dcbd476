"""The GPU assignment solver's kernels, compiled between training steps rather than inside one.

A model that knows the number of queries its matchings solve (:class:`~drivetrain.engine.protocol.MatchedQueries`)
has the solver compiled for them before the first step (:func:`warm_known_shapes`); a matching it cannot size in
advance is solved by SciPy in the step that first meets it and compiled after that step
(:func:`warm_met_shapes`). Each compilation is one line in the run's log; without the GPU backend nothing happens.
"""

from __future__ import annotations

import torch

from drivetrain.engine.metrics import MetricsLogger
from drivetrain.engine.protocol import MatchedQueries
from drivetrain.match import warm_gpu_solver, warm_pending

__all__ = ["warm_known_shapes", "warm_met_shapes"]


def warm_known_shapes(model: torch.nn.Module, device: torch.device, log: MetricsLogger) -> None:
    """Compile the solver for every query count ``model`` declares, before the first step.

    Args:
        model: the run's model (nothing happens unless it declares ``matched_queries``).
        device: the training device.
        log: the run's log (one line per warm-up that compiled something).
    """
    if isinstance(model, MatchedQueries):
        for queries in model.matched_queries:
            warm = warm_gpu_solver(queries, device=device)
            if warm.shapes:
                log.message(f"solver: {warm.describe()} before the first step")


def warm_met_shapes(step: int, log: MetricsLogger) -> None:
    """Compile the solver shapes that step ``step`` met uncompiled (and solved on the host).

    Args:
        step: the optimizer iteration just done.
        log: the run's log (one line when something compiled).
    """
    warm = warm_pending()
    if warm.shapes:
        log.message(f"solver: {warm.describe()} after step {step}")
