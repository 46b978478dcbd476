"""The skip of the GPU solver's tests: a test that needs the solver is skipped where it is not usable, unless the run
book asks for it (``DRIVETRAIN_REQUIRE_GPU_SOLVER=1``, set by ``scripts/gpu_check.sh`` on a GPU machine): there such
a test fails, naming why, so a machine without Triton or the package cannot pass the step as "ok"."""

from __future__ import annotations

import os

import pytest

from drivetrain.match import gpu_solver_available, gpu_solver_status

REQUIRE_ENV = "DRIVETRAIN_REQUIRE_GPU_SOLVER"


def needs_gpu_solver() -> pytest.MarkDecorator:
    """The mark of a test that runs the real GPU solver: nothing where it is usable; where it is not, a skip, or the
    ``gpu_solver_required`` fixture (tests/conftest.py: a failure naming why) under ``REQUIRE_ENV=1``."""
    if gpu_solver_available("cuda"):
        return pytest.mark.skipif(False, reason="")
    if os.environ.get(REQUIRE_ENV) == "1":
        return pytest.mark.usefixtures("gpu_solver_required")
    return pytest.mark.skipif(True, reason=f"gpu solver {gpu_solver_status('cuda')}")
