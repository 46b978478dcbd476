"""Running a command on hostile input and reading its refusal: bounded in time and memory, one line, no traceback."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from helpers.engine import cli_env


def one_line(text: str) -> str:
    """``text`` stripped, asserted to be one line without a traceback."""
    text = text.strip()
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def memory_limit(limit: int) -> Callable[[], None]:
    """A ``preexec_fn`` capping the child's address space at ``limit`` bytes (an expansion fails there, not here)."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def drivetrain_process(
    *args: str, timeout: float, memory: int | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """``drivetrain ARGS`` in its own interpreter (the repository's sources), killed after ``timeout`` seconds — a
    ``TimeoutExpired`` fails the test instead of hanging the suite — under ``memory`` bytes of address space."""
    return subprocess.run(
        [sys.executable, "-m", "drivetrain.cli.main", *args],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        preexec_fn=memory_limit(memory) if memory else None,
    )
