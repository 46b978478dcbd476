"""Helpers of the elastic tests: launch torchrun (or ``drivetrain launch``) over the CLI in its own session, find a
worker's PID by its rank, wait for a committed checkpoint, and bound every wait (the session is killed on a timeout)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from drivetrain.engine import Checkpointer
from helpers.engine import SMOKE, cli_env, free_port, overrides


def rendezvous(rdzv: str = "c10d", endpoint: str | None = None) -> list[str]:
    """torchrun's rendezvous options on 127.0.0.1: c10d at ``endpoint`` (a free port by default), or static."""
    if rdzv == "c10d":
        return ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint or f"127.0.0.1:{free_port()}"]
    return ["--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(free_port())]


def train_args(out: Path, *extra: str) -> list[str]:
    """``-m drivetrain.cli.main train`` on the smoke config with the fast overrides and ``--resume auto``."""
    return ["-m", "drivetrain.cli.main", "train", "--config", str(SMOKE), *overrides(out, *extra), "--resume", "auto"]


def start(args: list[str], **env: str) -> subprocess.Popen:
    """``python ARGS`` in a new session (so that a timeout can kill it with every worker); ``env`` extends cli_env."""
    return subprocess.Popen(
        [sys.executable, *args], env=cli_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's whole session and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def finish(proc: subprocess.Popen, deadline: float) -> subprocess.CompletedProcess:
    """Wait for the launcher until ``deadline`` (``time.monotonic``); past it, kill its session and fail."""
    try:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the launch did not finish in time: {proc.args}\n{out[-3000:]}\n{err[-6000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def worker_pid(launcher: int, rank: int, deadline: float) -> int:
    """The PID of the worker of global ``rank`` among the launcher's child processes (read from their ``RANK``)."""
    while time.monotonic() < deadline:
        for pid in _children(launcher):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:  # gone meanwhile
                continue
            if f"RANK={rank}".encode() in environ:
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no worker of rank {rank} under the launcher {launcher}")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def wait_for_checkpoint(run: Path, proc: subprocess.Popen, deadline: float) -> int:
    """The step of the newest committed checkpoint of ``run`` (waits for a first one while the launcher runs)."""
    while time.monotonic() < deadline and proc.poll() is None:
        committed = Checkpointer(run / "checkpoints").committed()
        if committed:
            return committed[-1][0]
        time.sleep(0.05)
    raise AssertionError("no checkpoint was committed before the launcher ended")
