"""Resume never loses good work: corrupt checkpoints are moved aside (not counted by pruning), a start from
step 0 says so, and checkpoints of an abandoned continuation are moved aside rather than resumed later. One
training process per run directory; a run directory that cannot be written is a one-line error."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drivetrain.cli.main import main
from drivetrain.engine import Checkpointer, CheckpointWarning, Trainer, load_config
from drivetrain.engine.trainer import STEP_DELAY_ENV
from helpers.engine import SMOKE, cli_env, losses, overrides, run_cli, train_cmd

RUN = ["checkpoint.every=2", "checkpoint.keep=2"]


def corrupt(path: Path) -> None:
    data = bytearray((path / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / "state.pt").write_bytes(bytes(data))


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_corrupt_newest_checkpoints_are_moved_aside_and_new_ones_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Trainer(load_config(SMOKE, overrides(tmp_path, *RUN, "train.steps=12"))).fit()
    ckpt = tmp_path / "checkpoints"
    assert names(ckpt) == ["step-00000010", "step-00000012"]
    for name in names(ckpt):  # both kept checkpoints go bad: nothing usable is left
        corrupt(ckpt / name)

    with pytest.warns(CheckpointWarning, match="moved corrupt checkpoint"):
        trainer = Trainer(load_config(SMOKE, overrides(tmp_path, *RUN, "train.steps=6")), resume="auto")
    assert trainer.state.iteration == 0
    trainer.fit()
    assert "no usable checkpoint" in capsys.readouterr().err
    assert "starting from step 0" in trainer._resume_note
    assert names(ckpt / "corrupt") == ["step-00000010", "step-00000012"]  # kept for the user, not deleted
    assert [s for s, _ in Checkpointer(ckpt).committed()] == [4, 6]  # new checkpoints survive pruning
    assert len(losses(tmp_path)) == 6  # metrics of the abandoned run dropped only down to the step resumed

    # A later resume continues from the new checkpoints, not from 0 again.
    trainer = Trainer(load_config(SMOKE, overrides(tmp_path, *RUN, "train.steps=8")), resume="auto")
    assert trainer.state.iteration == 6


def test_resume_from_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path: Path) -> None:
    Trainer(load_config(SMOKE, overrides(tmp_path, *RUN, "checkpoint.keep=3", "train.steps=6"))).fit()
    ckpt = tmp_path / "checkpoints"
    with pytest.warns(CheckpointWarning, match="newer than step 2"):
        trainer = Trainer(
            load_config(SMOKE, overrides(tmp_path, *RUN, "checkpoint.keep=3", "train.steps=6")),
            resume=str(ckpt / "step-00000002"),
        )
    assert names(ckpt / "superseded") == ["step-00000004", "step-00000006"]
    trainer.fit()
    resumed = Trainer(
        load_config(SMOKE, overrides(tmp_path, *RUN, "checkpoint.keep=3", "train.steps=6")), resume="auto"
    )
    assert resumed.resumed_from == ckpt / "step-00000006"  # this continuation's own checkpoint


# A process that builds a trainer (which takes the run directory's lock), says so, and holds it until killed: the
# lock is held for as long as the test needs, however slow the machine (no race against a number of steps).
HOLDER = """
import sys, time
from pathlib import Path
from drivetrain.engine import Trainer, load_config
config, ready, *keys = sys.argv[1:]
trainer = Trainer(load_config(config, keys))
Path(ready).touch()
time.sleep(600)
"""


def test_a_second_training_process_on_the_same_run_directory_is_refused(tmp_path: Path, capsys) -> None:
    """The holder is a process of its own; this test's process is the second trainer (``drivetrain train`` run
    in-process: the lock is per process, so it is refused as any other process would be)."""
    args = overrides(tmp_path / "run", "train.steps=3")
    ready = tmp_path / "holder-ready"
    cmd = [sys.executable, "-c", HOLDER, str(SMOKE), str(ready), *args]
    first = subprocess.Popen(cmd, env=cli_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first process did not build its trainer"
            time.sleep(0.05)
        capsys.readouterr()
        assert main(["train", "--config", str(SMOKE), *args, "--resume", "auto"]) == 2
        err = capsys.readouterr().err
        assert f"is in use by another training process (pid {first.pid} on " in err
        assert err.startswith("drivetrain train: config error: ") and len(err.strip().splitlines()) == 1
    finally:
        first.kill()  # SIGKILL: the holder gets no chance to release the lock itself
        first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL
    assert main(["train", "--config", str(SMOKE), *args, "--resume", "auto"]) == 0  # the lock died with its holder


def test_a_run_directory_that_cannot_be_created_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("not a folder")
    assert main(["train", "--config", str(SMOKE), *overrides(tmp_path / "file" / "run", "train.steps=1")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"drivetrain train: config error: run.out_dir: cannot create {tmp_path / 'file' / 'run'} (Not a directory)"
    ]


def test_the_same_process_may_build_a_second_trainer_for_its_run(tmp_path: Path) -> None:
    first = Trainer(load_config(SMOKE, overrides(tmp_path, "train.steps=2")))
    second = Trainer(load_config(SMOKE, overrides(tmp_path, "train.steps=2")))  # e.g. a notebook cell re-run
    second.fit()
    first.close()


@pytest.mark.slow  # ~6 s; the lock: the second process's test above
def test_deleting_the_lock_file_mid_run_does_not_let_a_second_trainer_write_along(tmp_path: Path) -> None:
    """Whichever process checks first holds the run directory; the other one stops with the holder named. Either
    way one trainer writes on, never both."""
    args = overrides(tmp_path, *RUN, "train.steps=60")
    # The first runs until the test stops it (far more steps than it gets to), so that it is still training when the
    # second comes however slow the machine; the second, if it wins the directory, trains to step 60.
    first = subprocess.Popen(
        train_cmd(*args, "train.steps=100000"),
        env=cli_env(**{STEP_DELAY_ENV: "0.1"}),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not Checkpointer(tmp_path / "checkpoints").committed():
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first run did not checkpoint"
            time.sleep(0.05)
        (tmp_path / ".drivetrain.lock").unlink()
        second = run_cli(*args, "--resume", "auto", timeout=300)
        second_status, second_err = second.returncode, second.stderr
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGTERM)
        _, first_err = first.communicate(timeout=120)
    outcomes = ((first.returncode, first_err), (second_status, second_err))
    refused = [(status, err) for status, err in outcomes if status in (1, 2)]  # 143: the test's own SIGTERM
    assert len(refused) == 1, (first.returncode, first_err[-2000:], second_status, second_err[-2000:])
    status, err = refused[0]
    assert "is in use by another training process" in err and "Traceback" not in err
    if status == 1:  # the first lost the directory to the second: it stopped before writing a checkpoint
        assert "not saving step" in err
    else:  # the first re-locked before the second came: the second was refused at start
        assert status == 2 and "was deleted or replaced while this run held it" in first_err
