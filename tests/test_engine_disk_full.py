"""A write the disk has no room for (issue 31): a full disk (ENOSPC), an exceeded quota (EDQUOT) or a read-only
file system (EROFS) — at start-up (the config copy, the TensorBoard writer), at a checkpoint's COMMITTED marker or
at a metrics.jsonl write — stops ``drivetrain train`` with one line on stderr naming the file and why, status 1,
and every checkpoint committed before stays committed and loads. The errors are injected where the real write
fails (the system call, the TensorBoard writer thread's write); no small file system (which needs root to mount)
is required."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

import drivetrain.engine.metrics as metrics_module
from drivetrain.cli.main import main
from drivetrain.engine import Checkpointer, CheckpointError
from drivetrain.engine.checkpoint import MARKER, NO_ROOM, no_room
from drivetrain.engine.metrics import write_failure
from drivetrain.engine.resume import RUN_MARKER
from helpers.engine import SMOKE, checkpoint_stalls, losses, metrics, overrides

ERRNOS = [errno.ENOSPC, errno.EDQUOT, errno.EROFS]


def no_room_error(code: int) -> OSError:
    """What the kernel reports: an OSError with the errno and its text, and no file name (a write to an open file)."""
    return OSError(code, os.strerror(code))


def train(tmp_path, *extra: str, resume: bool = False) -> int:
    argv = ["train", "--config", str(SMOKE), *overrides(tmp_path, *extra)]
    return main([*argv, "--resume", "auto"] if resume else argv)


def one_line(capsys) -> str:
    """The whole of stderr but a resume's progress note, which must be one line (no traceback, not a thread's)."""
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and not ln.startswith("resumed from ")]
    assert len(lines) == 1, "\n".join(lines)
    return lines[0]


def assert_committed_and_loadable(ckpt, steps: list[int]) -> None:
    checkpointer = Checkpointer(ckpt)
    assert [s for s, _ in checkpointer.committed()] == steps
    for _, path in checkpointer.committed():
        checkpointer.load(path)  # marker, checksum and weights_only load
    assert not [p.name for p in ckpt.iterdir() if p.name.startswith(".step-")]  # nothing of a failed save left


def fail_fsync_of(name: str, code: int, monkeypatch) -> None:
    """``os.fsync`` of a file named ``name`` fails with ``code`` (as a full disk reports a delayed allocation)."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == name:
            raise no_room_error(code)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("code", ERRNOS, ids=["ENOSPC", "EDQUOT", "EROFS"])
def test_no_room_for_the_commit_marker_keeps_the_committed_checkpoints(code, tmp_path, monkeypatch, capsys):
    assert train(tmp_path, "train.steps=4", "checkpoint.every=2") == 0
    capsys.readouterr()
    fail_fsync_of(f"{MARKER}.tmp", code, monkeypatch)
    assert train(tmp_path, "train.steps=6", "checkpoint.every=2", resume=True) == 1
    line = one_line(capsys)
    ckpt = tmp_path / "checkpoints"
    assert line.startswith(f"drivetrain train: checkpoint error: cannot write a checkpoint in {ckpt} ")
    assert f"({NO_ROOM[code]}; " in line and "the older checkpoints are kept" in line
    assert_committed_and_loadable(ckpt, [2, 4])  # step 6 was written but never committed: removed

    monkeypatch.undo()  # room again: the run resumes from step 4 and finishes
    assert train(tmp_path, "train.steps=6", "checkpoint.every=2", resume=True) == 0
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]


def test_a_failed_save_over_a_committed_checkpoint_of_the_same_step_puts_it_back(tmp_path, monkeypatch):
    checkpointer = Checkpointer(tmp_path, keep=3)
    checkpointer.save(1, {"w": torch.zeros(3)})
    checkpointer.save(2, {"w": torch.ones(3)})
    fail_fsync_of(f"{MARKER}.tmp", errno.ENOSPC, monkeypatch)
    with pytest.raises(CheckpointError, match=r"\(the disk is full; \d+ MiB free\)"):
        checkpointer.save(2, {"w": torch.full((3,), 7.0)})
    assert torch.equal(checkpointer.load(tmp_path / "step-00000002")["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001", "step-00000002"]
    monkeypatch.undo()
    checkpointer.save(2, {"w": torch.full((3,), 7.0)})  # with room the same step is replaced
    assert torch.equal(checkpointer.load(tmp_path / "step-00000002")["w"], torch.full((3,), 7.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001", "step-00000002"]


# ---------------------------------------------------------------------------------------------- metrics
class FullAfter:
    """A ``metrics.jsonl`` file object whose writes fail with ``code`` once ``lines`` records are in."""

    def __init__(self, file, lines: int, code: int) -> None:
        self._file, self._left, self._code = file, lines, code

    def write(self, text: str) -> int:
        if self._left <= 0:
            raise no_room_error(self._code)
        self._left -= 1
        return self._file.write(text)

    def __getattr__(self, name: str):
        return getattr(self._file, name)


@pytest.mark.parametrize("code", ERRNOS, ids=["ENOSPC", "EDQUOT", "EROFS"])
def test_no_room_for_metrics_stops_with_one_line_and_the_run_resumes(code, tmp_path, monkeypatch, capsys):
    def full_open(path, mode="r", *args, **kwargs):
        file = open(path, mode, *args, **kwargs)  # noqa: SIM115 - handed to the logger, which closes it
        return FullAfter(file, 5, code) if str(path).endswith("metrics.jsonl") else file

    monkeypatch.setattr(metrics_module, "open", full_open, raising=False)
    assert train(tmp_path, "train.steps=8", "checkpoint.every=2") == 1
    line = one_line(capsys)
    assert line.startswith(f"drivetrain train: cannot write {tmp_path / 'metrics.jsonl'} ({NO_ROOM[code]}); ")
    assert "the committed checkpoints are kept" in line
    assert len(losses(tmp_path)) == 4 and list(checkpoint_stalls(tmp_path)) == [2]  # 5 records: the 6th, step 4's
    assert_committed_and_loadable(tmp_path / "checkpoints", [2, 4])  # stall, failed after its save committed

    monkeypatch.undo()
    assert train(tmp_path, "train.steps=8", "checkpoint.every=2", resume=True) == 0
    assert [m["step"] for m in metrics(tmp_path)] == list(range(1, 9))  # steps 5 and 6 again, once each


# ---------------------------------------------------------------------------------------------- start-up
def test_no_room_for_the_tensorboard_writer_at_start_up_is_one_line(tmp_path, monkeypatch, capsys):
    """The writer's thread meets the full disk; its traceback is not printed, its error comes back as one line."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    def full(self, data):
        raise no_room_error(errno.ENOSPC)

    monkeypatch.setattr(RecordWriter, "write", full)
    assert train(tmp_path, "train.steps=2", "log.tensorboard=true") == 1
    line = one_line(capsys)
    assert line.startswith(f"drivetrain train: cannot write {tmp_path / 'tensorboard'} (the disk is full); ")
    assert not (tmp_path / "checkpoints").exists() and metrics(tmp_path) == []


def test_no_room_for_the_config_copy_at_start_up_names_it(tmp_path, monkeypatch, capsys):
    """A write the CLI has no special handling for (here the run's config.yaml) still ends in one line naming it."""
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith("config.yaml"):
            raise no_room_error(errno.ENOSPC)  # names no file, as a failed write does
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    assert train(tmp_path, "train.steps=2") == 1
    line = one_line(capsys)
    assert line.startswith(f"drivetrain train: cannot write {tmp_path / 'config.yaml'} (the disk is full); ")


@pytest.mark.parametrize("code", ERRNOS, ids=["ENOSPC", "EDQUOT", "EROFS"])
def test_no_room_for_the_run_marker_is_a_write_failure_not_a_config_error(tmp_path, monkeypatch, capsys, code):
    """The run directory's marker is the first file a run writes; a full disk there is status 1 and the
    write-failure line naming the marker, not status 2 and "config error" (nothing in the config is wrong)."""
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith(RUN_MARKER):
            raise no_room_error(code)
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    assert train(tmp_path, "train.steps=2") == 1
    line = one_line(capsys)
    assert line.startswith(f"drivetrain train: cannot write {tmp_path / RUN_MARKER} ({NO_ROOM[code]}); "), line
    assert "config error" not in line


def test_a_marker_write_failing_for_another_reason_stays_a_config_error(tmp_path, monkeypatch, capsys):
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith(RUN_MARKER):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    assert train(tmp_path, "train.steps=2") == 2
    line = one_line(capsys)
    assert (
        line == f"drivetrain train: config error: run.out_dir: cannot write {tmp_path / RUN_MARKER} (Permission denied)"
    )


def test_no_room_is_found_behind_a_wrapping_error_and_named() -> None:
    cause = no_room_error(errno.EROFS)
    try:
        try:
            raise cause
        except OSError as err:
            raise RuntimeError("unexpected pos 10 vs 20") from err
    except RuntimeError as wrapped:
        assert no_room(wrapped) is cause
    assert no_room(RuntimeError("something else")) is None
    assert no_room(no_room_error(errno.EIO)) is None
    path = Path("/run/metrics.jsonl")
    assert write_failure(path, cause) == (
        f"cannot write {path} (the file system is read-only); the committed checkpoints are kept — make it writable, "
        "then --resume auto"
    )
