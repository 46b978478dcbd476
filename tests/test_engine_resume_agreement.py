"""Ranks agree on their start, or none starts (drivetrain.engine.distributed).

Two torchrun "nodes" on this machine (``torchrun --nnodes 2 --node_rank k``, one rank each, gloo, static
rendezvous), each in its own working directory, so that the relative ``run.out_dir=run`` of the one command is a
node-local folder — the mistake of a user whose nodes had no shared run folder: rank 0 resumed step 10, rank 1 started
at step 0, and rank 0 committed checkpoints of the diverged state. Now every rank stops in one line, in bounded time,
and neither folder gains a file; with one shared folder the same command trains and resumes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from drivetrain.engine.checkpoint import Checkpointer, CheckpointError
from drivetrain.engine.config import ConfigError, load_config
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.resume import START_TOKEN, RanksDisagree, agree_on_start, check_run_dir, disagreement
from helpers.engine import FAST, ON_CPU, SMOKE, final_state, losses, torchrun_nodes

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

# Every node runs this same command; run.out_dir is relative, so it names each node's own folder.
TRAIN = ["-m", "drivetrain.cli.main", "train", "--config", str(SMOKE), *FAST, "run.out_dir=run",
         "distributed.strategy=ddp", *ON_CPU, "train.steps=4", "checkpoint.every=2"]  # fmt: skip
TIMEOUT = 120  # a rank left waiting in a collective would wait 30 minutes: a hang fails here instead


def listing(root: Path) -> dict[str, tuple[int, int] | None]:
    """Every folder (→ None) and file (→ size, mtime in ns) under ``root``, by relative path. A folder's own mtime
    is left out: rank 0's start token is made and removed in the run folder."""
    out: dict[str, tuple[int, int] | None] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            out[str((Path(folder) / name).relative_to(root))] = None
        for name in files:
            st = (Path(folder) / name).lstat()
            out[str((Path(folder) / name).relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def stderr_lines(proc, needle: str) -> list[str]:
    return [line for line in proc.stderr.splitlines() if needle in line]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both nodes in one folder (a shared run folder): 4 steps, checkpoints at steps 2 and 4."""
    node = tmp_path_factory.mktemp("shared")
    for proc in torchrun_nodes([node, node], *TRAIN, timeout=TIMEOUT):
        assert proc.returncode == 0, proc.stderr[-4000:]
    return node


def test_ranks_sharing_the_run_folder_train_and_leave_no_token(shared: Path) -> None:
    run = shared / "run"
    assert len(losses(run)) == 4
    assert final_state(run)["world_size"] == 2
    assert [step for step, _ in Checkpointer(run / "checkpoints").committed()] == [2, 4]
    assert not [p for p in run.iterdir() if p.name.startswith(START_TOKEN)]


def test_node_local_run_folders_stop_every_rank_in_one_line_and_write_nothing(shared: Path, tmp_path: Path) -> None:
    """Node 0 holds the run (steps 2 and 4), node 1 has no folder there: without the check, rank 0 resumed
    step 4 while rank 1 started at 0 (and the ranks then hung in mismatched collectives)."""
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shutil.copytree(shared, node0)
    node1.mkdir()
    before = listing(tmp_path)
    procs = torchrun_nodes([node0, node1], *TRAIN, "train.steps=6", "--resume", "auto", timeout=TIMEOUT)
    for proc in procs:
        assert proc.returncode != 0
        lines = stderr_lines(proc, "drivetrain train:")
        assert len(lines) == 1, proc.stderr[-4000:]
        assert "config error: run.out_dir: rank 1" in lines[0] and "does not see the run folder" in lines[0]
        assert f"{node0 / 'run'} on rank 0, {node1 / 'run'} on rank 1" in lines[0]
        assert "must be one folder shared by every node" in lines[0]
        assert "Traceback" not in proc.stderr.split("drivetrain train:")[0]  # no rank died in a collective first
    assert listing(tmp_path) == before  # no token, lock, marker, config.yaml, checkpoint or metrics line


@pytest.mark.slow  # ~10 s; the default set checks the comparison below, without processes
def test_ranks_resuming_different_copies_of_a_checkpoint_stop_in_one_line(shared: Path, tmp_path: Path) -> None:
    """One shared run folder, but ``--resume ckpt`` names a node-local copy: node 0's is step 4, node 1's a stale
    step 2. Both ranks stop, naming the two checkpoints; the run folder is not created."""
    node0, node1, out = tmp_path / "node0", tmp_path / "node1", tmp_path / "out"
    shutil.copytree(shared / "run" / "checkpoints" / "step-00000004", node0 / "ckpt")
    shutil.copytree(shared / "run" / "checkpoints" / "step-00000002", node1 / "ckpt")
    before = listing(tmp_path)
    args = [*TRAIN, f"run.out_dir={out}", "train.steps=6", "--resume", "ckpt"]
    for proc in torchrun_nodes([node0, node1], *args, timeout=TIMEOUT):
        assert proc.returncode != 0
        lines = stderr_lines(proc, "drivetrain train:")
        assert len(lines) == 1, proc.stderr[-4000:]
        assert "--resume: the ranks resumed different checkpoints" in lines[0]
        assert "rank 0 (host" in lines[0] and ": ckpt (COMMITTED digest" in lines[0] and "rank 1 (host" in lines[0]
        assert "a node has a stale or unshared copy" in lines[0]
    assert listing(tmp_path) == before


@pytest.mark.slow  # ~10 s
def test_a_start_error_on_one_rank_stops_every_rank_in_its_line(shared: Path, tmp_path: Path) -> None:
    """A fresh start (no --resume) where only node 0's folder holds checkpoints: rank 0 refuses, and rank 1, which
    would have started, stops with rank 0's line instead of waiting for it in the model's first broadcast."""
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shutil.copytree(shared, node0)
    node1.mkdir()
    before = listing(tmp_path)
    for proc in torchrun_nodes([node0, node1], *TRAIN, timeout=TIMEOUT):
        assert proc.returncode != 0
        lines = stderr_lines(proc, "drivetrain train:")
        assert len(lines) == 1, proc.stderr[-4000:]
        assert "config error: rank 0 (host" in lines[0] and "run.out_dir: run already holds checkpoints" in lines[0]
    assert listing(tmp_path) == before


# ---------------------------------------------------------------------- the comparison, without processes
def view(rank: int, **changes) -> dict:
    base = {"rank": rank, "host": f"h{rank}", "folder": "/r", "sees_folder": True, "error": None,
            "resumed": ("step-00000004", "ab" * 32), "config": "c"}  # fmt: skip
    return {**base, **changes}


def test_ranks_that_saw_the_same_start_agree() -> None:
    assert disagreement([view(0), view(1), view(2)], "runs/x") is None


def test_an_unseen_folder_is_named_before_everything_else() -> None:
    line = disagreement([view(0), view(1), view(2, sees_folder=False, folder="/s", resumed=None, config="d")], "r")
    assert line is not None and line.startswith("run.out_dir: rank 2 (host h2) does not see the run folder")
    assert "(/r on rank 0, /s on rank 2)" in line


def test_a_start_error_of_one_rank_is_every_rank_s_line() -> None:
    line = disagreement([view(0), view(1, error="--resume: checkpoint c was written by 4 ranks")], "r")
    assert line == "rank 1 (host h1): --resume: checkpoint c was written by 4 ranks"
    same = "run.out_dir: r already holds checkpoints"  # every rank met it: given as is
    assert disagreement([view(0, error=same), view(1, error=same)], "r") == same
    # rank 0 refused its folder and wrote no token: its error, not an unseen folder
    line = disagreement([view(0, error="run.out_dir: r is not a drivetrain run"), view(1, sees_folder=False)], "r")
    assert line == "rank 0 (host h0): run.out_dir: r is not a drivetrain run"


def test_different_checkpoints_are_listed_by_group() -> None:
    views = [view(0), view(1), view(2, resumed=None), view(3, resumed=None)]
    line = disagreement(views, "runs/x")
    assert line is not None and line.startswith("--resume: the ranks resumed different checkpoints (")
    assert "rank 0 (host h0) and 1 more rank: step-00000004 (COMMITTED digest abababababab)" in line
    assert "rank 2 (host h2) and 1 more rank: none (step 0)" in line
    assert "a node has a stale or unshared copy of them: run.out_dir (and a --resume DIR) must be one folder" in line


def test_different_configs_are_named() -> None:
    line = disagreement([view(0), view(1, config="other")], "r")
    assert line is not None and line.startswith("the ranks run different configs (rank 0 (host h0); rank 1 (host h1)")


def test_a_process_alone_raises_its_own_error_and_writes_nothing(tmp_path: Path) -> None:
    alone = DistContext(0, 1, 0, torch.device("cpu"), "none", False)
    cfg = load_config(SMOKE, [f"run.out_dir={tmp_path / 'run'}"])
    agree_on_start(alone, tmp_path / "run", cfg, None, None)
    error = ConfigError("run.out_dir: not a run")
    with pytest.raises(ConfigError, match="not a run") as raised:
        agree_on_start(alone, tmp_path / "run", cfg, None, error)
    assert raised.value is error and not isinstance(raised.value, RanksDisagree)
    assert list(tmp_path.iterdir()) == []


def test_a_token_left_by_a_killed_start_keeps_a_new_folder_new(tmp_path: Path) -> None:
    (tmp_path / f"{START_TOKEN}0123456789abcdef").write_text("pid 1 on h\n")
    check_run_dir(tmp_path)  # accepted as empty
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty and is not a drivetrain run"):
        check_run_dir(tmp_path)


# ---------------------------------------------------------------------- the checkpoint's identity
def test_checkpoint_identity_is_its_marker_digest(shared: Path, tmp_path: Path) -> None:
    ckpts = shared / "run" / "checkpoints"
    copy = tmp_path / "copy"
    shutil.copytree(ckpts / "step-00000004", copy)
    assert Checkpointer.identity(copy) == Checkpointer.identity(ckpts / "step-00000004")  # a copy is the same
    assert Checkpointer.identity(copy / "state.pt") == Checkpointer.identity(copy)  # its state file names it too
    assert Checkpointer.identity(ckpts / "step-00000002") != Checkpointer.identity(copy)
    (copy / "COMMITTED").write_text((copy / "COMMITTED").read_text().replace('"step": 4', '"step": 5'))
    assert Checkpointer.identity(copy) != Checkpointer.identity(ckpts / "step-00000004")


def test_checkpoint_identity_refuses_a_missing_or_special_marker(tmp_path: Path) -> None:
    (tmp_path / "gone").mkdir()
    with pytest.raises(CheckpointError, match=r"gone/COMMITTED: unreadable COMMITTED marker"):
        Checkpointer.identity(tmp_path / "gone")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "COMMITTED")
    with pytest.raises(CheckpointError, match="not a regular file"):
        Checkpointer.identity(tmp_path / "fifo")  # refused, not blocked on
