"""Asynchronous checkpoints and the checkpoint clock in a training run (issue 45): training goes on while the
previous checkpoint is written, the run continues bit-for-bit as with synchronous saves, a SIGKILL while a save is
in flight leaves the previous checkpoint the newest (and the run resumes exactly), each save's stall is a
``checkpoint/stall_s`` record in metrics.jsonl, and ``checkpoint.every_minutes`` saves between ``checkpoint.every``."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from drivetrain.engine import Checkpointer, ConfigError, Trainer, load_config
from drivetrain.engine.checkpoint import DELAY_ENV, MARKER
from drivetrain.engine.trainer import STEP_DELAY_ENV
from helpers.engine import (
    SMOKE,
    assert_same_weights,
    checkpoint_stalls,
    cli_env,
    final_state,
    losses,
    metrics,
    overrides,
    train_cmd,
)

RUN = ["train.steps=8", "checkpoint.every=2", "checkpoint.keep=10"]
ASYNC = "checkpoint.async_save=true"


def config(out: Path, *extra: str):
    return load_config(SMOKE, overrides(out, *RUN, *extra))


def committed(out: Path) -> list[int]:
    return [step for step, _ in Checkpointer(out / "checkpoints").committed()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 8-step run with synchronous saves."""
    out = tmp_path_factory.mktemp("reference")
    Trainer(config(out)).fit()
    return out


def test_async_saves_hold_the_same_state_as_synchronous_ones_and_record_their_stall(reference, tmp_path) -> None:
    Trainer(config(tmp_path, ASYNC)).fit()
    assert losses(tmp_path) == losses(reference)
    assert committed(tmp_path) == committed(reference) == [2, 4, 6, 8]
    for step in (4, 8):  # the staged copies hold the state at the save, not what training did after it
        a = Checkpointer(tmp_path / "checkpoints").load(tmp_path / "checkpoints" / Checkpointer.name(step))
        b = Checkpointer(reference / "checkpoints").load(reference / "checkpoints" / Checkpointer.name(step))
        assert_same_weights(a["model"], b["model"])
        assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
        for name, moments in a["optimizer"]["state"].items():
            assert_same_weights(moments, b["optimizer"]["state"][name])
        assert a["train"] == b["train"] and a["data"] == b["data"]
    for run in (tmp_path, reference):
        stalls = checkpoint_stalls(run)
        assert list(stalls) == [2, 4, 6, 8] and all(s > 0 for s in stalls.values())


def test_a_sigkill_during_an_async_save_leaves_the_previous_checkpoint_and_resumes_exactly(reference, tmp_path):
    Trainer(config(tmp_path, "train.steps=2")).fit()
    assert committed(tmp_path) == [2]
    # The background write sleeps 4 s twice (after state.pt, after the rename), each step 0.05 s.
    env = cli_env(**{DELAY_ENV: "4", STEP_DELAY_ENV: "0.05"})
    cmd = train_cmd(*overrides(tmp_path, *RUN, ASYNC), "--resume", "auto")
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not (tmp_path / "metrics.jsonl").exists() or max(m["step"] for m in metrics(tmp_path)) < 6:
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read()[-3000:] if proc.stderr else ""
            time.sleep(0.01)
        # Step 6 is done while step 4's save is still being written: training went on beside it.
        in_flight = [*(tmp_path / "checkpoints").glob(".step-00000004.tmp-*"), tmp_path / "checkpoints/step-00000004"]
        assert committed(tmp_path) == [2] and any(p.is_dir() for p in in_flight)  # written, not committed
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert committed(tmp_path) == [2]
    assert not (tmp_path / "checkpoints" / "step-00000004" / MARKER).exists()
    trainer = Trainer(config(tmp_path, ASYNC), resume="auto")
    assert trainer.state.iteration == 2
    trainer.fit()
    assert losses(tmp_path) == losses(reference)
    assert_same_weights(final_state(tmp_path)["model"], final_state(reference)["model"])
    assert committed(tmp_path) == [2, 4, 6, 8]


def test_every_minutes_saves_between_every_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each step sleeps 0.05 s after its decision, more than 0.0005 minutes (0.03 s): a step whose predecessor did
    # not save finds the clock due (one that follows a save has only its own compute since the save).
    monkeypatch.setenv(STEP_DELAY_ENV, "0.05")
    clock = ["train.steps=6", "checkpoint.every=100"]
    Trainer(config(tmp_path / "clock", *clock, "checkpoint.every_minutes=0.0005")).fit()
    saved = committed(tmp_path / "clock")
    assert saved[-1] == 6 and len(saved) >= 3 and all(b - a <= 2 for a, b in itertools.pairwise(saved))
    assert list(checkpoint_stalls(tmp_path / "clock")) == saved
    Trainer(config(tmp_path / "slow", *clock, "checkpoint.every_minutes=60")).fit()
    assert committed(tmp_path / "slow") == [6]  # only the final one


def test_every_minutes_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"checkpoint\.every_minutes: must be > 0 \(or null\), got 0"):
        config(tmp_path, "checkpoint.every_minutes=0")
