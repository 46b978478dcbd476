"""Exact resume: a run stopped by SIGTERM, or (slow set) killed with SIGKILL at random points (also mid-checkpoint),
and resumed with ``--resume auto`` gives the same per-step losses and the same final weights, bit for bit,
as an uninterrupted run. The runs keep dropout and the streaming memory on, so RNG and non-parameter
state must round-trip."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from drivetrain.engine import Checkpointer, CheckpointWarning, Trainer, load_config
from drivetrain.engine.checkpoint import DELAY_ENV, MARKER
from drivetrain.engine.trainer import STEP_DELAY_ENV
from helpers.engine import (
    SMOKE,
    assert_same_weights,
    cli_env,
    final_state,
    losses,
    metrics,
    overrides,
    run_cli,
    train_cmd,
    wait_for,
)

STEPS = 30
RUN = ["train.steps=30", "checkpoint.every=4", "checkpoint.keep=2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run, in this process (same thread count and deterministic mode as the CLI runs)."""
    out = tmp_path_factory.mktemp("reference")
    Trainer(load_config(SMOKE, overrides(out, *RUN))).fit()
    return out


def start(out: Path, *extra: str, **env: str) -> subprocess.Popen:
    args = [*overrides(out, *RUN), *extra]
    return subprocess.Popen(train_cmd(*args), env=cli_env(**env), stderr=subprocess.PIPE, text=True)


def metric_lines(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def assert_same_run(run: Path, reference: Path) -> None:
    assert losses(run) == losses(reference)
    assert len(losses(run)) == STEPS
    a, b = final_state(run), final_state(reference)
    assert a["train"] == b["train"]
    assert_same_weights(a["model"], b["model"])
    assert a["model"]["_extra_state"] == b["model"]["_extra_state"]  # the streaming memory's frame counter


def test_sigterm_checkpoints_exits_143_and_resumes_exactly(tmp_path: Path, reference: Path) -> None:
    proc = start(tmp_path, **{STEP_DELAY_ENV: "0.05"})
    wait_for(lambda: metric_lines(tmp_path) >= 6, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err  # checkpointed, then the conventional status
    assert "received SIGTERM" in err
    stopped_at = len(losses(tmp_path))
    assert 6 <= stopped_at < STEPS
    assert Checkpointer(tmp_path / "checkpoints").committed()[-1][0] == stopped_at  # checkpoint of the stop step

    done = run_cli(*overrides(tmp_path, *RUN), "--resume", "auto")
    assert done.returncode == 0, done.stderr
    assert f"resumed from {tmp_path / 'checkpoints' / Checkpointer.name(stopped_at)}" in done.stderr
    assert_same_run(tmp_path, reference)


@pytest.mark.slow  # ~3 s; a signal's checkpoint and exit status: the SIGTERM test above
def test_sigint_checkpoints_and_exits_130(tmp_path: Path) -> None:
    """Ctrl-C: the step finishes, a checkpoint is written, and the status says the run was interrupted, so
    `drivetrain train ... && drivetrain eval ...` stops there."""
    proc = start(tmp_path, **{STEP_DELAY_ENV: "0.05"})
    wait_for(lambda: metric_lines(tmp_path) >= 3, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "received SIGINT" in err and "Traceback" not in err
    stopped_at = len(losses(tmp_path))
    assert Checkpointer(tmp_path / "checkpoints").committed()[-1][0] == stopped_at


@pytest.mark.slow  # ~7 s; a SIGKILL inside a checkpoint write: tests/test_engine_kill_anywhere.py
def test_sigkill_at_random_points_and_mid_checkpoint_resumes_exactly(tmp_path: Path, reference: Path) -> None:
    seed = 7  # fixed: the random moment is the same on every run (test_engine_kill_anywhere.py's slow sweeps vary it)
    rng = random.Random(seed)
    ckpt = tmp_path / "checkpoints"
    delays = {STEP_DELAY_ENV: "0.02", DELAY_ENV: "0.15"}

    def temp_dir_exists() -> bool:  # inside a save, before the rename
        return ckpt.is_dir() and any(p.name.startswith(".step-") for p in ckpt.iterdir())

    def uncommitted_exists() -> bool:  # renamed, marker not yet written
        return ckpt.is_dir() and any(p.name.startswith("step-") and not (p / MARKER).exists() for p in ckpt.iterdir())

    kills = [temp_dir_exists, uncommitted_exists, None]
    skipped_warning = False
    for i, when in enumerate(kills):
        proc = start(tmp_path, *(["--resume", "auto"] if i else []), **delays)
        if when is None:  # a random moment
            wait_for(lambda: metric_lines(tmp_path) >= 1, proc)
            time.sleep(rng.uniform(0.0, 0.6))
        else:
            wait_for(when, proc)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"seed {seed}: {err}"
        skipped_warning |= "skipping checkpoint" in err

    done = run_cli(*overrides(tmp_path, *RUN), "--resume", "auto")
    assert done.returncode == 0, f"seed {seed}: {done.stderr}"
    skipped_warning |= "skipping checkpoint" in done.stderr
    assert skipped_warning, "the half-written checkpoint was not reported as skipped"
    assert_same_run(tmp_path, reference)


def test_corrupt_newest_checkpoint_is_skipped_and_resume_stays_exact(tmp_path: Path, reference: Path) -> None:
    Trainer(load_config(SMOKE, overrides(tmp_path, *RUN[:1], "checkpoint.every=4", "checkpoint.keep=3",
                                         "train.steps=16"))).fit()  # fmt: skip
    newest = Checkpointer(tmp_path / "checkpoints").committed()[-1][1]
    data = bytearray((newest / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest / "state.pt").write_bytes(bytes(data))
    with pytest.warns(CheckpointWarning, match="SHA-256 differs"):
        trainer = Trainer(load_config(SMOKE, overrides(tmp_path, *RUN)), resume="auto")
    assert trainer.state.iteration == 12
    trainer.fit()
    assert_same_run(tmp_path, reference)


def test_metrics_deleted_mid_run_are_written_again_and_said(tmp_path: Path) -> None:
    proc = start(tmp_path, "log.every=1", **{STEP_DELAY_ENV: "0.05"})
    wait_for(lambda: metric_lines(tmp_path) >= 4, proc)
    (tmp_path / "metrics.jsonl").unlink()  # a user cleaning up, a sync tool, ...
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "metrics.jsonl was deleted or replaced while the run wrote it" in err
    steps = [record["step"] for record in metrics(tmp_path)]
    assert steps and steps[-1] == STEPS  # the records after the deletion went to the new file, up to the end
    assert steps == list(range(steps[0], STEPS + 1))


def test_a_killed_loader_worker_is_one_line_with_a_checkpoint_and_the_run_resumes(tmp_path: Path) -> None:
    import psutil

    proc = start(tmp_path, "data.num_workers=2", **{STEP_DELAY_ENV: "0.05"})
    wait_for(lambda: metric_lines(tmp_path) >= 5, proc)
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert workers
    workers[0].send_signal(signal.SIGKILL)  # the OOM killer's way
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    lines = [line for line in err.splitlines() if line.startswith("drivetrain train:")]
    assert lines and "a data loader worker process died" in lines[-1] and "Traceback" not in err, err[-3000:]
    stopped_at = len(losses(tmp_path))
    assert Checkpointer(tmp_path / "checkpoints").committed()[-1][0] == stopped_at  # the last completed step
    done = run_cli(*overrides(tmp_path, *RUN, "data.num_workers=2"), "--resume", "auto")
    assert done.returncode == 0, done.stderr
    assert len(losses(tmp_path)) == STEPS
