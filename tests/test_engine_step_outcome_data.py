"""A frame that cannot be read stops training with one line naming the file and the skip option, after a
checkpoint of the completed steps from which a resume (once the file is back) continues exactly — with the
PyTorch loader and with ``data.loader=dali`` alike; a full disk during a checkpoint write is named and keeps the
older checkpoints. (Issue 9 item 9, issue 31; tests/test_engine_disk_full.py has the other full-disk writes.)"""

from __future__ import annotations

import shutil

import pytest
import torch

from drivetrain.cli.main import main
from drivetrain.data.index import load_index
from drivetrain.engine import Checkpointer, CheckpointError
from helpers.engine import SMOKE, losses, overrides
from test_engine_streaming import CONFIG, run


def test_an_unreadable_image_stops_with_one_line_and_a_checkpoint_to_resume_from(
    synth_root, synth_index, tmp_path, capsys
):
    data = tmp_path / "data"
    shutil.copytree(synth_root, data)
    index = load_index(data / "drivetrain_index.npz")
    late = int((index.arrays["frame_in_scene"] == 2).nonzero()[0][0])  # read at the third step of its slot or later
    image = data / index.meta["image_files"][late][3]
    run(tmp_path / "reference", data / "drivetrain_index.npz", "train.steps=6", "checkpoint.every=100")

    saved = image.read_bytes()
    image.write_bytes(saved[: len(saved) // 3])  # truncated JPEG
    argv = ["train", "--config", str(CONFIG), f"run.out_dir={tmp_path / 'run'}", "run.threads=1",
            "run.deterministic=true", "log.progress=false", "log.tensorboard=false", "log.every=1",
            "model.args.width=8", "data.name=drivetrain.data.sources:frames",
            f"data.args={{index: {data / 'drivetrain_index.npz'}}}", "schedule.total_steps=8", "train.steps=6",
            "checkpoint.every=100"]  # fmt: skip
    assert main(argv) == 1
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("drivetrain train:")]
    assert line.startswith(f"drivetrain train: data error: {image}: corrupt or non-JPEG image")
    assert "data.args.on_error=skip" in line and "saved checkpoint" in line
    done = len(losses(tmp_path / "run"))
    assert 2 <= done < 6
    assert Checkpointer(tmp_path / "run" / "checkpoints").committed()[-1][0] == done

    image.write_bytes(saved)
    assert main([*argv, "--resume", "auto"]) == 0
    assert losses(tmp_path / "run") == losses(tmp_path / "reference")


def test_a_full_disk_during_a_checkpoint_is_named_and_keeps_the_older_ones(tmp_path, monkeypatch, capsys):
    assert main(["train", "--config", str(SMOKE), *overrides(tmp_path, "train.steps=4", "checkpoint.every=2")]) == 0
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        real_save({"partial": torch.zeros(10)}, f)
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 474624 vs 474512")

    monkeypatch.setattr(torch, "save", full_disk)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20))
    argv = ["train", "--config", str(SMOKE), *overrides(tmp_path, "train.steps=6", "checkpoint.every=2")]
    assert main([*argv, "--resume", "auto"]) == 1
    err = capsys.readouterr().err
    assert "checkpoint error: cannot write a checkpoint in" in err and "the disk is full; 1 MiB free" in err
    ckpt = tmp_path / "checkpoints"
    assert [s for s, _ in Checkpointer(ckpt).committed()] == [2, 4]  # the older checkpoints are kept
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".step-")]  # no partial files left behind
    with pytest.raises(CheckpointError, match="disk is full"):
        Checkpointer(ckpt).save(6, {"x": torch.zeros(1)})


@pytest.mark.parametrize("fault", ["missing", pytest.param("wrong size", marks=pytest.mark.slow)])  # ~6 s each
def test_dali_loader_stops_on_a_bad_image_like_the_pytorch_loader(fault, synth_root, synth_index, tmp_path, capsys):
    """``data.loader=dali``: a removed image, or one of another size than the index records (found before DALI
    decodes it), stops the run at the step the PyTorch loader stops at, with its one line naming the file and its
    checkpoint; once the file is back the run resumes there and finishes."""
    pytest.importorskip("nvidia.dali")
    import numpy as np
    import simplejpeg

    data = tmp_path / "data"
    shutil.copytree(synth_root, data)
    index = load_index(data / "drivetrain_index.npz")
    late = int((index.arrays["frame_in_scene"] == 2).nonzero()[0][0])  # DALI reads it ahead, at an earlier step
    image = data / index.meta["image_files"][late][3]
    saved = image.read_bytes()
    if fault == "missing":
        image.unlink()
        expected = f"drivetrain train: data error: {image}: cannot read image (No such file or directory); "
    else:
        image.write_bytes(simplejpeg.encode_jpeg(np.zeros((40, 64, 3), np.uint8)))
        expected = f"drivetrain train: data error: {image}: image is 64×40, the index says 160×90; "

    def train(loader: str, *extra: str) -> tuple[int, str, int]:
        out = tmp_path / loader
        argv = ["train", "--config", str(CONFIG), f"run.out_dir={out}", "run.threads=1", "run.deterministic=true",
                "log.progress=false", "log.tensorboard=false", "log.every=1", "model.args.width=8",
                "data.name=drivetrain.data.sources:frames", f"data.loader={loader}",
                f"data.args={{index: {data / 'drivetrain_index.npz'}}}", "schedule.total_steps=8", "train.steps=6",
                "checkpoint.every=100", *extra]  # fmt: skip
        code = main(argv)
        err = capsys.readouterr().err
        assert "Traceback" not in err and "DALI" not in err, err
        lines = [ln for ln in err.splitlines() if ln.startswith("drivetrain train:")]
        return code, lines[0] if code else "", len(losses(out))

    code, torch_line, torch_done = train("torch")
    assert code == 1 and torch_line.startswith(expected)
    code, line, done = train("dali")
    assert code == 1 and line.startswith(expected), line
    assert "data.loader=torch with data.args.on_error=skip" in line and "saved checkpoint" in line
    assert done == torch_done < 6
    assert Checkpointer(tmp_path / "dali" / "checkpoints").committed()[-1][0] == done

    image.write_bytes(saved)  # fixed: the run resumes at the step it stopped and finishes
    assert train("dali", "--resume", "auto")[0] == 0
    assert len(losses(tmp_path / "dali")) == 6
