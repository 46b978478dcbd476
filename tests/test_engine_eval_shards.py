"""Evaluation during training over every rank: the shares of the frames (whole scenes for a streaming model) give
each frame the detections of one pass; two torchrun ranks (gloo) each predict their share and rank 0's scores and
submission equal the one-process ``drivetrain eval`` of the step's checkpoint (StreamPETR with its memory,
PointPillars with its batch norms); a SIGTERM during the evaluation abandons it, checkpoints the step and exits 143 —
in one process and when only one rank is signalled — and ``--resume auto`` evaluates that step first;
``distributed.timeout_s`` is the process group's timeout."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from drivetrain.data.sources import frames
from drivetrain.engine import Checkpointer, ConfigError, load_config
from drivetrain.engine.eval_run import detect_frames
from drivetrain.engine.eval_shards import EVAL_DELAY_ENV, frame_shares
from drivetrain.models.streampetr import StreamPETR
from helpers.engine import ROOT, SMOKE, cli_env, free_port, metrics, torchrun, wait_for
from helpers.streampetr import SMALL

WORKER = ROOT / "tests" / "engine_eval_worker.py"
CAMERA = ROOT / "configs" / "streampetr_tiny.yaml"


class _Frames:
    def __init__(self, lengths: list[int]) -> None:
        self.index = SimpleNamespace(arrays={"frame_in_scene": np.concatenate([np.arange(n) for n in lengths])})

    def __len__(self) -> int:
        return len(self.index.arrays["frame_in_scene"])


@pytest.mark.parametrize("lengths", [[3, 3], [5, 1, 1, 1], [1, 7, 2], [4], [2, 2, 2, 2, 2]])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize(("whole_scenes", "batch_size"), [(True, 1), (False, 1), (False, 3)])
def test_shares_cover_every_frame_once_in_order_and_keep_scenes_whole(lengths, world_size, whole_scenes, batch_size):
    dataset = _Frames(lengths)
    shares = frame_shares(dataset, world_size, whole_scenes=whole_scenes, batch_size=batch_size)
    assert len(shares) == world_size
    assert [f for share in shares for f in share] == list(range(len(dataset)))  # contiguous, in order, once each
    assert len(shares[0]) > 0  # rank 0 has the first frame (the TensorBoard picture)
    starts = set(np.cumsum([0, *lengths]).tolist())
    if whole_scenes:
        assert all(share.start in starts for share in shares if share)
    else:  # the one-process pass's batches, as equal in number as integers allow
        assert all(share.start % batch_size == 0 for share in shares)
        batches = [-(-len(share) // batch_size) for share in shares]
        assert max(batches) - min(batches) <= 1


def test_two_equal_scenes_go_one_to_each_of_two_ranks():
    assert frame_shares(_Frames([3, 3]), 2, whole_scenes=True) == [range(0, 3), range(3, 6)]


def test_each_share_of_whole_scenes_gets_the_detections_of_one_pass(synth_index, synth_root):
    """The streaming memory is cleared where a scene starts, so a rank that starts there detects what one pass over
    every frame detects; a share cut inside a scene does not (what sharding by scene is for)."""
    torch.set_num_threads(1)  # 2 threads on a loaded 2-core machine take 10× longer
    torch.manual_seed(0)
    model = StreamPETR(**SMALL)
    val = frames(str(synth_root / "drivetrain_index.npz"), split="mini_val")
    whole = detect_frames(model, val, "cpu", progress=False)
    shares = frame_shares(val, 2, whole_scenes=True)
    sharded = [d for share in shares for d in detect_frames(model, val, "cpu", frames=share, progress=False)]
    assert [d.token for d in sharded] == [d.token for d in whole] and len(whole) == 6
    for a, b in zip(sharded, whole, strict=True):
        for name in ("boxes", "scores", "labels", "pose"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (a.frame, name)
    cut = [range(0, 2), range(2, 6)]  # frame 2 ends the first scene: detected without its memory
    mid_scene = [d for share in cut for d in detect_frames(model, val, "cpu", frames=share, progress=False)]
    assert not np.array_equal(mid_scene[2].scores, whole[2].scores)


def test_timeout_is_a_positive_finite_number_of_seconds():
    assert load_config(SMOKE, []).distributed.timeout_s == 1800  # torch's 30 minutes, as before
    assert load_config(SMOKE, ["distributed.timeout_s=120"]).distributed.timeout_s == 120.0
    for bad in ("0", "-5", ".inf", "soon"):
        with pytest.raises(ConfigError, match=r"distributed\.timeout_s"):
            load_config(SMOKE, [f"distributed.timeout_s={bad}"])


# ---------------------------------------------------------------------------------------------------- two ranks
@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory, synth_index, synth_root) -> Path:
    """StreamPETR and PointPillars trained 2 steps under DDP on two ranks, evaluated at step 2 over both."""
    root = tmp_path_factory.mktemp("sharded-eval")
    broken = root / "broken-set"  # the test set with a camera image of the second evaluation scene missing
    shutil.copytree(synth_root, broken)
    (broken / _second_scene_image(broken)).unlink()
    index = str(synth_root / "drivetrain_index.npz")
    proc = torchrun(str(WORKER), str(root), index, "camera,lidar,broken", str(broken / "drivetrain_index.npz"),
                    timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (root / "torchrun.err").write_text(proc.stderr)
    return root


def _second_scene_image(root: Path) -> str:
    """A camera image (relative to ``root``) of the last mini_val frame: rank 1's share of the evaluation."""
    from drivetrain.data.index import load_index

    index = load_index(root / "drivetrain_index.npz", root).split("mini_val")
    return str(index.meta["image_files"][len(index) - 1][0])


@pytest.mark.parametrize("run", ["camera", "lidar"])
def test_two_ranks_each_predict_their_share_and_score_as_one_process(two_rank_runs, synth_root, run, capsys):
    from drivetrain.cli.main import main
    from drivetrain.data.index import load_index

    out = two_rank_runs / run
    records = [json.loads((out / f"detected-rank{r}.json").read_text()) for r in (0, 1)]
    detected = [record["tokens"] for record in records]
    index = load_index(synth_root / "drivetrain_index.npz", synth_root).split("mini_val")
    tokens, in_scene = index.meta["sample_tokens"], index.arrays["frame_in_scene"]
    assert detected[0] and detected[1], detected  # both ranks predicted, neither waited alone
    assert detected[0] + detected[1] == list(tokens)  # disjoint shares, every frame once, in frame order
    if run == "camera":  # the streaming model's shares are whole scenes
        assert in_scene[len(detected[0])] == 0
    else:  # each rank's batch norms ran on its own batches; both predicted with rank 0's, then got their own back
        assert records[0]["buffers_after"] != records[1]["buffers_after"]
        assert records[0]["buffers_at_detect"] == records[1]["buffers_at_detect"] == [records[0]["buffers_after"]]

    evals = [m for m in metrics(out) if "eval/mAP" in m]
    assert [m["step"] for m in evals] == [2]
    torch.set_num_threads(1)  # as the run (run.threads=1, run.deterministic=true)
    torch.use_deterministic_algorithms(True)
    assert main(["eval", "--checkpoint", str(out), "--device", "cpu"]) == 0  # one process, the step's checkpoint
    capsys.readouterr()
    sharded, single = out / "eval" / "step-00000002", out / "eval" / "step-00000002-mini_val"
    assert json.loads((sharded / "results.json").read_text()) == json.loads((single / "results.json").read_text())
    a, b = (json.loads((d / "metrics_summary.json").read_text()) for d in (sharded, single))
    a.pop("eval_time", None), b.pop("eval_time", None)  # the devkit's own timing
    assert a == b
    assert evals[0]["eval/mAP"] == a["mean_ap"] and evals[0]["eval/NDS"] == a["nd_score"]


@pytest.mark.slow
def test_eval_cli_under_torchrun_shares_the_frames_and_scores_as_one_process(two_rank_runs, tmp_path, capsys):
    from drivetrain.cli.main import main

    run = two_rank_runs / "camera"
    torch.set_num_threads(1)  # as the ranks (OMP_NUM_THREADS=1)
    assert main(["eval", "--checkpoint", str(run), "--device", "cpu", "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    args = ["--checkpoint", str(run), "--device", "cpu", "--out", str(tmp_path / "two")]
    proc = torchrun("-m", "drivetrain.cli.main", "eval", *args, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    headers = [line for line in proc.stdout.splitlines() if line.startswith("eval: ")]
    assert len(headers) == 1 and "6 frames, cpu, 2 ranks" in headers[0], proc.stdout  # rank 0 speaks, once
    one, two = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two"))
    assert one == two


def test_an_unreadable_frame_on_one_rank_fails_the_evaluation_on_both_and_training_goes_on(two_rank_runs):
    out = two_rank_runs / "broken"
    missing = _second_scene_image(two_rank_runs / "broken-set")
    assert json.loads((out / "detected-rank0.json").read_text())["tokens"]  # rank 0's scene read and predicted
    assert not [m for m in metrics(out) if "eval/mAP" in m]  # nothing logged as the evaluation's result
    assert [m["step"] for m in metrics(out)] == [1, 2]  # the run went on and finished
    assert Checkpointer(out / "checkpoints").committed()[-1][0] == 2
    err = (two_rank_runs / "torchrun.err").read_text()
    assert f"evaluation at step 2 failed, training goes on: {two_rank_runs / 'broken-set' / missing}" in err


@pytest.mark.slow
def test_timeout_s_is_the_process_groups_timeout(tmp_path):
    """A rank whose peer arrives 8 s late at a barrier gives up after distributed.timeout_s=2 (it would wait with
    the 30 minutes of before)."""
    proc = torchrun(str(WORKER), str(tmp_path), "timeout", timeout=120)
    outcome = json.loads((tmp_path / "timeout-rank1.json").read_text())
    assert outcome.startswith("raised"), (outcome, proc.stderr[-3000:])


# ---------------------------------------------------------------------------------------------------- SIGTERM
def _camera_args(out: Path, index: Path, *extra: str) -> list[str]:
    args = ", ".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items())
    return [
        "--config", str(CAMERA), f"run.out_dir={out}", "run.threads=1", "run.deterministic=true",
        "log.progress=false", "log.tensorboard=false", "log.every=1", f"model.args={{{args}}}",
        "data.name=drivetrain.data.sources:frames", f"data.args={{index: {index}, split: mini_train}}",
        "train.device=cpu", "train.steps=4", "eval.every=2", "checkpoint.every=100", *extra,
    ]  # fmt: skip


def _logged_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r["step"] for r in records if "checkpoint/stall_s" not in r]  # a step's and an evaluation's records


def _assert_stopped_in_evaluation(out: Path) -> None:
    """The step-2 evaluation was abandoned (no result logged or written) and step 2 checkpointed."""
    assert Checkpointer(out / "checkpoints").committed()[-1][0] == 2
    assert not [m for m in metrics(out) if "eval/mAP" in m]
    assert not (out / "eval" / "step-00000002" / "results.json").exists()


def test_sigterm_during_evaluation_checkpoints_exits_143_and_resume_evaluates_that_step(
    synth_index, synth_root, tmp_path
):
    index, out = synth_root / "drivetrain_index.npz", tmp_path / "run"
    cmd = [*_train_cmd(), *_camera_args(out, index)]
    env = cli_env(**{EVAL_DELAY_ENV: "10"})  # 6 frames × 10 s: far past the 30 s a scheduler waits before SIGKILL
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: 2 in _logged_steps(out), proc, timeout=120)  # step 2 is logged, then its evaluation starts
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "evaluation at step 2 abandoned: SIGTERM received" in err
    assert "received SIGTERM; stopped after step 2 with checkpoint" in err
    _assert_stopped_in_evaluation(out)

    done = subprocess.run([*cmd, "--resume", "auto"], env=cli_env(), capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [m["step"] for m in metrics(out) if "eval/mAP" in m] == [2, 4]  # step 2 evaluated first, then 4
    assert _logged_steps(out) == [1, 2, 2, 3, 4, 4]
    assert (out / "eval" / "step-00000002" / "results.json").is_file()


def _train_cmd() -> list[str]:
    return [sys.executable, "-m", "drivetrain.cli.main", "train"]


@pytest.mark.slow
def test_sigterm_to_one_rank_during_evaluation_stops_both_after_a_checkpoint(synth_index, synth_root, tmp_path):
    """Two ranks (started as torchrun starts them: RANK, WORLD_SIZE, MASTER_ADDR/PORT), DDP on gloo: only rank 1
    gets SIGTERM while both predict; both abandon the evaluation at the same frame, rank 0 writes the step's
    checkpoint and both exit 143 within the 30 s a scheduler waits before its SIGKILL."""
    index, out = synth_root / "drivetrain_index.npz", tmp_path / "run"
    cmd = [*_train_cmd(), *_camera_args(out, index, "distributed.strategy=ddp", "data.batch_size=1")]
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", EVAL_DELAY_ENV: "10"}
    ranks = [
        subprocess.Popen(
            cmd,
            env=cli_env(**rendezvous, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        wait_for(lambda: 2 in _logged_steps(out), ranks[0], timeout=240)
        ranks[1].send_signal(signal.SIGTERM)
        errs = [rank.communicate(timeout=30)[1] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    assert [rank.returncode for rank in ranks] == [143, 143], errs[0][-3000:] + errs[1][-3000:]
    assert "evaluation at step 2 abandoned: a stop signal (on another rank) received" in errs[0], errs[0][-3000:]
    assert "stopped after step 2 with checkpoint" in errs[0]
    _assert_stopped_in_evaluation(out)


def test_sigterm_during_the_first_evaluation_checkpoints_step_0_and_resume_evaluates_it(
    synth_index, synth_root, tmp_path
):
    """``eval.at_start``: a SIGTERM while the initial weights are scored stops before the first step with a step-0
    checkpoint; the resumed run scores them, then trains."""
    from drivetrain.engine import Trainer

    out = tmp_path / "run"
    args = _camera_args(out, synth_root / "drivetrain_index.npz", "train.steps=2", "eval.at_start=true")[2:]
    trainer = Trainer(load_config(CAMERA, args))
    detect = trainer.model.detect

    def signalled(batch):  # a real SIGTERM to this process, handled by the run while it scores its first frame
        signal.raise_signal(signal.SIGTERM)
        return detect(batch)

    trainer.model.detect = signalled
    state = trainer.fit()
    assert trainer.stopped_by == "SIGTERM" and state.iteration == 0
    assert Checkpointer(out / "checkpoints").committed()[-1][0] == 0
    assert not (out / "metrics.jsonl").exists() or not metrics(out)

    resumed = Trainer(load_config(CAMERA, args), resume="auto")
    resumed.fit()
    assert resumed.stopped_by is None
    assert [m["step"] for m in metrics(out) if "eval/mAP" in m] == [0, 2]
