"""torchrun around the trainer (2 gloo ranks on 127.0.0.1, processes signalled by PID): the scheduler contract of
``drivetrain launch`` (SIGTERM to the launcher: 143 with the stop's checkpoint committed, where torchrun returns 1;
its decision over the workers' records; torchrun's option errors), the attempt handshake of
:mod:`drivetrain.engine.distributed` on a real TCPStore, and, in the slow set, torchrun's own restarts with static
rendezvous, under ``drivetrain launch`` and with two agents (``--nnodes 1:2``) resuming bit-exactly, a node joining a
running launch, SIGTERM to one worker, a killed worker under the launcher, and the documented local command. The
default set's restart test with c10d is in test_engine_distributed.py (it compares with a run that file's fixture
makes anyway)."""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from drivetrain.cli.launch import RUNNING, clean_stop_status
from drivetrain.engine import Checkpointer, load_config
from drivetrain.engine.distributed import agree_on_attempt
from drivetrain.engine.trainer import STEP_DELAY_ENV
from helpers.engine import FLOAT64, ON_CPU, ROOT, assert_same_weights, cli_env, final_state, free_port, losses, metrics
from helpers.launch import finish, kill, rendezvous, start, train_args, wait_for_checkpoint, worker_pid

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

# DDP with dropout and the streaming memory on (per-rank RNG and buffers must come back), in float64.
RUN = ["train.steps=12", "checkpoint.every=3", "distributed.strategy=ddp", *FLOAT64, *ON_CPU]
TIMEOUT_S = 240  # one launch; past it the launcher's session (it and its workers) is killed
LAUNCH = ["-m", "drivetrain.cli.main", "launch", "--nproc_per_node", "2"]


def test_launch_returns_143_when_sigterm_stopped_every_worker_at_its_checkpoint(tmp_path: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    args = [*LAUNCH, "--max-restarts", "1", *rendezvous(), *train_args(tmp_path, *RUN, "train.steps=40")]
    proc = start(args, **{STEP_DELAY_ENV: "0.3"})  # a signal to the launcher stops torchrun: no restart
    try:
        first = wait_for_checkpoint(tmp_path, proc, deadline)
        os.kill(proc.pid, signal.SIGTERM)  # the launcher only, as Kubernetes signals a container's first process
    except BaseException:
        kill(proc)
        raise
    done = finish(proc, deadline)
    assert done.returncode == 143, done.stdout[-3000:] + done.stderr[-6000:]
    assert "every worker stopped after its checkpoint (SIGTERM); exit 143" in done.stderr
    stopped_at = len(metrics(tmp_path))  # one line per step, written by rank 0
    assert first <= stopped_at < 40
    assert Checkpointer(tmp_path / "checkpoints").committed()[-1][0] == stopped_at  # the stop's own checkpoint


@pytest.mark.slow
def test_launch_returns_143_when_one_worker_got_sigterm_and_every_worker_stopped(tmp_path: Path) -> None:
    """SIGTERM to rank 1 only (a scheduler that signals one process): the ranks agree on the stop, both checkpoint
    and exit 143; torchrun (no restarts) fails; the launcher returns 143."""
    deadline = time.monotonic() + TIMEOUT_S
    proc = start([*LAUNCH, *rendezvous(), *train_args(tmp_path, *RUN, "train.steps=40")], **{STEP_DELAY_ENV: "0.3"})
    try:
        wait_for_checkpoint(tmp_path, proc, deadline)
        os.kill(worker_pid(proc.pid, 1, deadline), signal.SIGTERM)
    except BaseException:
        kill(proc)
        raise
    done = finish(proc, deadline)
    assert done.returncode == 143, done.stderr[-6000:]
    assert Checkpointer(tmp_path / "checkpoints").committed()[-1][0] == len(metrics(tmp_path))


@pytest.mark.slow
def test_launch_reports_a_killed_worker_as_a_failure(tmp_path: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    proc = start([*LAUNCH, *rendezvous(), *train_args(tmp_path, *RUN)], **{STEP_DELAY_ENV: "0.3"})
    try:
        wait_for_checkpoint(tmp_path, proc, deadline)
        os.kill(worker_pid(proc.pid, 1, deadline), signal.SIGKILL)  # no restarts: torchrun stops the other
    except BaseException:
        kill(proc)
        raise
    done = finish(proc, deadline)
    assert done.returncode == 1, done.stderr[-6000:]


def _local_doc_commands() -> list[list[str]]:
    """The ``drivetrain launch --standalone`` commands of docs/engine.md's elastic section, as argv."""
    text = (ROOT / "docs" / "engine.md").read_text()
    section = text[text.index("## Elastic training") :]
    section = section[: section.index("\n## ", 1)]
    joined = re.sub(r"\\\n\s*", " ", section)  # continuation lines
    return [
        shlex.split(line, comments=True)
        for line in joined.splitlines()
        if line.startswith("drivetrain launch --standalone")
    ]


@pytest.mark.slow
def test_the_elastic_sections_local_command_runs(tmp_path: Path) -> None:
    """The documented one-machine command, as written but for the run folder and ``python -m`` for the console
    script (whose installed copy may be another checkout's): it trains under torchrun's c10d rendezvous and exits 0."""
    (command,) = _local_doc_commands()
    argv = [a if not a.startswith("run.out_dir=") else f"run.out_dir={tmp_path}" for a in command[2:]]
    script = argv.index("--no-python")
    argv = [*argv[:script], "-m", "drivetrain.cli.main", *argv[script + 2 :]]
    proc = subprocess.run(
        [sys.executable, "-m", "drivetrain.cli.main", "launch", *argv], cwd=ROOT, env=cli_env(), capture_output=True,
        text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    cfg = load_config(ROOT / "configs" / "smoke.yaml")
    assert len(metrics(tmp_path)) == cfg.train.steps
    assert final_state(tmp_path)["world_size"] == 2


def test_ranks_agree_on_their_attempt_although_the_previous_attempts_keys_remain() -> None:
    """The handshake of :func:`drivetrain.engine.distributed.attempt_store` on a real TCPStore: a second attempt
    whose rank 1 starts long before its rank 0 first reads the dead attempt's token, and still ends in the new one."""
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = datetime.timedelta(seconds=60)

    def attempt(delays: dict[int, float]) -> dict[int, str]:
        tokens: dict[int, str] = {}

        def rank(r: int) -> None:
            time.sleep(delays[r])
            client = torch.distributed.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout)
            tokens[r] = agree_on_attempt(client, "drivetrain/test", r, 3, timeout)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        return tokens

    first = attempt({0: 0.0, 1: 0.0, 2: 0.0})
    assert len(set(first.values())) == 1 and len(first) == 3
    second = attempt({0: 1.0, 1: 0.0, 2: 0.2})  # ranks 1 and 2 read the first attempt's token before rank 0 writes
    assert len(set(second.values())) == 1 and len(second) == 3
    assert second[0] != first[0]


def _records(folder: Path, *records: tuple[int, int, int, int]) -> Path:
    for attempt, local_rank, local_world_size, status in records:
        record = {"attempt": attempt, "local_rank": local_rank, "local_world_size": local_world_size, "status": status}
        (folder / f"attempt-{attempt}.local-{local_rank}.json").write_text(json.dumps(record))
    return folder


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([(0, 0, 2, 143), (0, 1, 2, 143)], 143),
        ([(0, 0, 2, 130), (0, 1, 2, 130)], 130),
        ([(0, 0, 2, 130), (0, 1, 2, 143)], 143),  # one rank's SIGINT, agreed as a stop by the other
        ([(0, 0, 2, 143)], None),  # a worker left no record
        ([(0, 0, 2, 143), (0, 1, 2, RUNNING)], None),  # killed while training
        ([(0, 0, 2, 143), (0, 1, 2, 1)], None),  # an error
        ([(0, 0, 2, 143), (0, 1, 2, 143), (1, 0, 2, RUNNING), (1, 1, 2, RUNNING)], None),  # a newer attempt died
        ([(0, 0, 2, 1), (0, 1, 2, 1), (1, 0, 2, 143), (1, 1, 2, 143)], 143),  # the newest attempt stopped cleanly
        ([(0, 0, 2, 0), (0, 1, 2, 0)], None),  # finished: torchrun itself returns 0 then
        ([], None),
    ],
)
def test_clean_stop_needs_every_worker_of_the_newest_attempt(tmp_path: Path, records, expected) -> None:
    assert clean_stop_status(_records(tmp_path, *records)) == expected


def test_launch_passes_torchrun_option_errors_on() -> None:
    done = finish(start([*LAUNCH, "--no-such-option", "train.py"]), time.monotonic() + 60)
    assert done.returncode == 2, done.stderr
    assert "drivetrain launch: error: unrecognized arguments: --no-such-option" in done.stderr


def _kill_rank1_after_a_checkpoint(out: Path, procs: list, deadline: float) -> None:
    try:
        assert wait_for_checkpoint(out, procs[0], deadline) < 12, "the run ended before the kill"
        for proc in procs:  # the agent whose child is rank 1
            try:
                pid = worker_pid(proc.pid, 1, min(deadline, time.monotonic() + 2))
            except AssertionError:
                continue
            os.kill(pid, signal.SIGKILL)
            return
        raise AssertionError("no rank 1 found")
    except BaseException:
        for proc in procs:
            kill(proc)
        raise


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node", "2", *rendezvous()]
    done = finish(start([*launcher, *train_args(out, *RUN)]), time.monotonic() + TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-6000:]
    return out


def assert_resumed_exactly(run: Path, reference: Path) -> None:
    assert losses(run) == losses(reference)
    state, expected = final_state(run), final_state(reference)
    assert state["train"] == expected["train"]
    assert_same_weights(state["model"], expected["model"])
    for a, b in zip(state["rng"], expected["rng"], strict=True):
        assert torch.equal(a["torch"], b["torch"])


@pytest.mark.slow
@pytest.mark.parametrize("how", ["torchrun-static", "launch-c10d"])
def test_torchrun_restart_with_static_rendezvous_and_under_launch(tmp_path: Path, uninterrupted: Path, how) -> None:
    """The static rendezvous keeps one agent store for every attempt as well; ``drivetrain launch`` (no shared
    store: rank 0's worker hosts a fresh one per attempt) restarts the same way."""
    deadline = time.monotonic() + TIMEOUT_S
    program = ["torch.distributed.run"] if how.startswith("torchrun") else ["drivetrain.cli.main", "launch"]
    where = rendezvous(how.split("-")[1])
    launcher = ["-m", *program, "--nproc_per_node", "2", "--max-restarts", "1", *where]
    proc = start([*launcher, *train_args(tmp_path, *RUN)], **{STEP_DELAY_ENV: "0.3"})
    _kill_rank1_after_a_checkpoint(tmp_path, [proc], deadline)
    done = finish(proc, deadline)
    assert done.returncode == 0, done.stderr[-6000:]
    assert (done.stdout + done.stderr).count("resumed from") == 1
    assert_resumed_exactly(tmp_path, uninterrupted)


@pytest.mark.slow
def test_torchrun_restart_with_two_agents(tmp_path: Path, uninterrupted: Path) -> None:
    """``--nnodes 1:2``, one worker per agent, c10d: each agent counts its own restarts (one that only follows the
    other's new rendezvous round counts none), so ``TORCHELASTIC_RESTART_COUNT`` cannot name the attempt; the
    group still meets and resumes exactly."""
    deadline = time.monotonic() + TIMEOUT_S
    where = [*rendezvous("c10d", f"127.0.0.1:{free_port()}"), "--rdzv-id", "two", "--rdzv-conf", "last_call_timeout=10"]
    agent = ["-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc_per_node", "1", "--max-restarts", "1", *where]
    procs = [start([*agent, *train_args(tmp_path, *RUN)], **{STEP_DELAY_ENV: "0.3"}) for _ in range(2)]
    _kill_rank1_after_a_checkpoint(tmp_path, procs, deadline)
    done = [finish(proc, deadline) for proc in procs]
    log = "".join(d.stdout + d.stderr for d in done)
    assert [d.returncode for d in done] == [0, 0], log[-6000:]
    assert log.count("resumed from") == 1, log[-6000:]
    assert_resumed_exactly(tmp_path, uninterrupted)


@pytest.mark.slow
def test_a_node_joining_a_running_launch_restarts_the_group_bigger(tmp_path: Path) -> None:
    """``drivetrain launch --nnodes 1:2``: one agent starts alone (world 1), a second joins; torchrun restarts the
    workers in a world of 2, whose process group starts (with torch's shared store the newcomer's agent waited for
    a store address that the first agent never published, and failed after 60 s)."""
    deadline = time.monotonic() + TIMEOUT_S
    where = [*rendezvous("c10d", f"127.0.0.1:{free_port()}"), "--rdzv-id", "join", "--rdzv-conf", "last_call_timeout=1"]
    agent = ["-m", "drivetrain.cli.main", "launch", "--nnodes", "1:2", "--nproc_per_node", "1", *where,
             str(ROOT / "tests" / "elastic_join_worker.py"), str(tmp_path)]  # fmt: skip
    first = start(agent)
    try:
        while not (tmp_path / "world1-rank0.txt").exists():  # the first agent's group (world 1) is running
            assert time.monotonic() < deadline and first.poll() is None, "the first agent's worker did not start"
            time.sleep(0.05)
        second = start(agent)
    except BaseException:
        kill(first)
        raise
    done = [finish(first, deadline), finish(second, deadline)]
    assert [d.returncode for d in done] == [0, 0], "".join(d.stdout + d.stderr for d in done)[-6000:]
    assert (tmp_path / "world1-rank0.txt").read_text() == "1"
    assert [(tmp_path / f"world2-rank{r}.txt").read_text() for r in (0, 1)] == ["3", "3"]
