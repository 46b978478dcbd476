"""``drivetrain predict``: a checkpoint's submission for any indexed root (with or without annotations, indexed in
memory when it has no index, nothing written but --out); ``eval --checkpoint`` is predict + ``eval --predictions``;
``--blank-inputs`` is the control (grey images, empty point clouds); each misuse is one line naming the option."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from drivetrain.cli.main import main
from drivetrain.data.formats.nuscenes.submission import check_submission
from drivetrain.engine.eval_run import BLANK_GREY, blank_inputs
from helpers.streampetr import SMALL

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["run.threads=1", "log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.at_start=false"]


@pytest.fixture(scope="module")
def lidar_run(synth_root, synth_index, tmp_path_factory) -> Path:
    """PointPillars (tiny) after 2 steps; score threshold 0, so that every frame has detections to compare."""
    out = tmp_path_factory.mktemp("pointpillars")
    data = {"index": str(synth_root / "drivetrain_index.npz"), "split": "mini_train", "load_images": False,
            "load_points": True, "num_sweeps": 1, "use_dim": [0, 1, 2, 4]}  # fmt: skip
    argv = ["train", "--config", str(ROOT / "configs" / "pointpillars_tiny.yaml"), f"run.out_dir={out}", *QUIET,
            "data.name=frames", f"data.args={json.dumps(data)}", "data.batch_size=2", "train.steps=2",
            "checkpoint.every=2", "train.device=cpu",
            'model.args.decode={"score_threshold": 0.0, "max_num": 20}']  # fmt: skip
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def camera_run(synth_root, synth_index, tmp_path_factory) -> Path:
    """StreamPETR (the tests' small one) after 2 steps."""
    out = tmp_path_factory.mktemp("streampetr")
    args = ", ".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items())
    argv = ["train", "--config", str(ROOT / "configs" / "streampetr_tiny.yaml"), f"run.out_dir={out}", *QUIET,
            f"model.args={{{args}}}", "data.name=frames",
            f"data.args={{index: {synth_root / 'drivetrain_index.npz'}, split: mini_train}}", "train.steps=2",
            "checkpoint.every=2", "train.device=cpu"]  # fmt: skip
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def test_split_root(synth_root, synth_index, tmp_path_factory) -> Path:
    """The synthetic root as a test split ships: the same tables and files, no sample_annotation table, no index."""
    root = tmp_path_factory.mktemp("no-annotations")
    for name in ("v1.0-mini", "samples", "sweeps", "maps"):
        shutil.copytree(synth_root / name, root / name)
    (root / "v1.0-mini" / "sample_annotation.json").unlink()
    return root


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def _predict(run: Path, root: Path, out: Path, *extra: str) -> dict:
    argv = ["predict", "--checkpoint", str(run), "--root", str(root), "--out", str(out), "--device", "cpu", *extra]
    assert main([*argv, "--quiet"]) == 0
    return json.loads(out.read_text())


def _devkit_loads(path: Path) -> int:
    """Boxes of the submission as the nuScenes devkit's loader reads it (it checks every field of every box)."""
    from nuscenes.eval.common.loaders import load_prediction
    from nuscenes.eval.detection.data_classes import DetectionBox

    boxes, meta = load_prediction(str(path), 500, DetectionBox)
    assert meta["use_lidar"] is True and meta["use_camera"] is False
    return sum(len(boxes[token]) for token in boxes.sample_tokens)


def test_predict_writes_the_same_valid_submission_for_a_root_with_and_without_annotations(
    lidar_run, synth_root, synth_index, test_split_root, tmp_path
):
    with_gt = _predict(lidar_run, synth_root, tmp_path / "with.json", "--split", "mini_val")
    before = _files(test_split_root)
    without = _predict(lidar_run, test_split_root, tmp_path / "without.json", "--split", "mini_val")
    assert _files(test_split_root) == before  # indexed in memory: nothing written into the root
    mini_val = [t for t, s in zip(synth_index.meta["sample_tokens"], synth_index.arrays["scene_id"], strict=True)
                if synth_index.meta["scenes"][s] in ("scene-0103", "scene-0916")]  # fmt: skip
    assert list(with_gt["results"]) == mini_val  # every frame of the split, in scene order
    assert with_gt == without  # the ground truth plays no part
    count = check_submission(with_gt, tmp_path / "with.json")
    assert count > 0 and count == _devkit_loads(tmp_path / "with.json")
    everything = _predict(lidar_run, test_split_root, tmp_path / "all.json")  # no --split: every scene
    assert len(everything["results"]) == len(synth_index)


def test_predict_says_it_indexes_in_memory_and_what_it_wrote(lidar_run, test_split_root, tmp_path, capsys):
    _predict(lidar_run, test_split_root, tmp_path / "p.json", "--split", "mini_val")
    out = capsys.readouterr().out
    assert f"predict: indexing {test_split_root / 'v1.0-mini'} in memory" in out
    assert f"`drivetrain data index --root {test_split_root}` saves an index" in out
    assert "on " + str(test_split_root) + " mini_val (6 frames, cpu) → " in out
    assert out.strip().splitlines()[-1].startswith("predict: ") and "in 6 frames (nuScenes format)" in out


def test_eval_checkpoint_scores_what_predict_then_eval_predictions_scores(
    lidar_run, synth_root, synth_index, tmp_path, capsys
):
    argv = ["eval", "--checkpoint", str(lidar_run), "--device", "cpu", "--out", str(tmp_path / "e")]
    assert main([*argv, "--json", str(tmp_path / "checkpoint.json")]) == 0
    printed = capsys.readouterr().out
    _predict(lidar_run, synth_root, tmp_path / "p.json", "--split", "mini_val")
    argv = ["eval", "--predictions", str(tmp_path / "p.json"), "--root", str(synth_root), "--out", str(tmp_path / "f")]
    assert main([*argv, "--json", str(tmp_path / "predictions.json")]) == 0
    assert (tmp_path / "e" / "results.json").read_text() == (tmp_path / "p.json").read_text()
    by_checkpoint = json.loads((tmp_path / "checkpoint.json").read_text())
    by_predictions = json.loads((tmp_path / "predictions.json").read_text())
    metrics = {k: v for k, v in by_checkpoint.items() if isinstance(v, float)}
    assert {"mAP", "NDS", "trans_err", "AP/car"} <= set(metrics)
    assert metrics == {k: v for k, v in by_predictions.items() if isinstance(v, float)}
    assert by_checkpoint["blank_inputs"] is False and by_checkpoint["split"] == "mini_val"
    assert json.loads(printed[printed.index("{\n") :])["mAP"] == metrics["mAP"]  # the report as before


def test_blank_inputs_gives_a_lidar_model_no_points_and_detections_that_do_not_depend_on_them(
    lidar_run, synth_root, synth_index, tmp_path, monkeypatch, capsys
):
    from drivetrain.models.pointpillars import PointPillars

    seen, detections = [], []
    forward, detect = PointPillars.forward, PointPillars.detect

    def forward_spy(self, batch):
        seen.append((tuple(batch.points.tensor.shape), batch.points.sizes.tolist()))
        return forward(self, batch)

    def detect_spy(self, batch, tta=None):
        out = detect(self, batch, tta)
        detections.append([t.to_list()[0] for t in out])
        return out

    monkeypatch.setattr(PointPillars, "forward", forward_spy)
    monkeypatch.setattr(PointPillars, "detect", detect_spy)
    argv = ["eval", "--checkpoint", str(lidar_run), "--device", "cpu", "--blank-inputs"]
    assert main([*argv, "--json", str(tmp_path / "control.json")]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("eval: "))
    assert "on mini_val (6 frames, cpu) with inputs blanked (lidar point clouds empty) → " in header
    assert header.endswith("step-00000002-mini_val-blank")  # beside the real evaluation, not over it
    assert seen == [((1, 0, 4), [0])] * 6  # the model's forward got no point in any frame
    first = detections[0]
    assert len(first[0]) > 0
    for frame in detections[1:]:  # lidar-frame detections: the same whatever the frame's points were
        for got, want in zip(frame, first, strict=True):
            assert torch.equal(got, want)
    control = json.loads((tmp_path / "control.json").read_text())
    assert control["blank_inputs"] is True and 0.0 <= control["mAP"] <= 1.0


def test_blank_inputs_shows_a_camera_model_grey_images_only(camera_run, synth_root, tmp_path, monkeypatch, capsys):
    from drivetrain.models.streampetr import StreamPETR

    seen = []
    detect = StreamPETR.detect

    def spy(self, batch):
        seen.append(batch.images.clone())
        return detect(self, batch)

    monkeypatch.setattr(StreamPETR, "detect", spy)
    _predict(camera_run, synth_root, tmp_path / "real.json", "--split", "mini_val")
    assert all(len(torch.unique(images)) > 3 for images in seen)  # the real images
    seen.clear()
    _predict(camera_run, synth_root, tmp_path / "blank.json", "--split", "mini_val", "--blank-inputs")
    assert "with inputs blanked (camera images grey RGB (124, 116, 104))" in capsys.readouterr().out
    grey = torch.tensor(BLANK_GREY, dtype=torch.uint8).view(1, 1, 3, 1, 1)
    assert len(seen) == 6 and all(images.dtype == torch.uint8 and (images == grey).all() for images in seen)
    blank = json.loads((tmp_path / "blank.json").read_text())
    assert blank["meta"]["use_camera"] is True and len(blank["results"]) == 6


def test_a_camera_runs_test_time_transform_normalises_blanked_images_to_about_zero(synth_root, synth_index):
    from drivetrain.cli.predict import blank_grey, frame_transform
    from drivetrain.data.sources import frames
    from drivetrain.engine import load_config
    from drivetrain.pipeline.augment.photometric import IMAGENET_MEAN, IMAGENET_STD

    sizes = ["data.augment.camera.image.source_size=[160,90]", "data.augment.camera.image.final_size=[128,48]"]
    cfg = load_config(ROOT / "configs" / "streampetr_tiny_aug.yaml", sizes)  # the test images' size
    data = frames(str(synth_root / "drivetrain_index.npz"), split="mini_val")
    batch = data.collate([data[0], data[1]])
    assert blank_grey(cfg) == BLANK_GREY == tuple(round(m) for m in IMAGENET_MEAN)
    images = frame_transform(cfg, blank=True)(batch).images  # (B, N, 3, H, W) normalised
    # Each channel is (grey − mean) / std, up to float32 rounding of the resize and of the normalisation
    # (a few ulps of values ≤ 256: 2⁻¹⁶ bounds it); the grey's own rounding keeps it under 0.5 / 57.1 < 0.01.
    want = torch.tensor([(g - m) / s for g, m, s in zip(BLANK_GREY, IMAGENET_MEAN, IMAGENET_STD, strict=True)])
    assert want.abs().max() < 0.5 / min(IMAGENET_STD)
    torch.testing.assert_close(images, want.view(1, 1, 3, 1, 1).expand_as(images), atol=2**-16, rtol=0)


def test_blank_inputs_keeps_everything_but_the_sensor_data(synth_root, synth_index):
    from drivetrain.data.sources import frames

    data = frames(str(synth_root / "drivetrain_index.npz"), split="mini_val", load_points=True, num_sweeps=1)
    batch = data.collate([data[0], data[1]])
    blanked = blank_inputs(batch)
    assert blanked.images.shape == batch.images.shape and blanked.images.dtype == torch.uint8
    assert (blanked.images == torch.tensor(BLANK_GREY, dtype=torch.uint8).view(1, 1, 3, 1, 1)).all()
    assert blanked.points.tensor.shape == (2, 0, batch.points.tensor.shape[-1])
    assert blanked.points.sizes.tolist() == [0, 0] and batch.points.sizes.min() > 0
    assert torch.equal(blanked.lidar2img, batch.lidar2img) and torch.equal(
        blanked.gt_boxes.tensor, batch.gt_boxes.tensor
    )
    assert blanked.sample_tokens == batch.sample_tokens


def test_a_lidar_model_predicts_the_same_in_batches(lidar_run, synth_root, synth_index, tmp_path):
    one = _predict(lidar_run, synth_root, tmp_path / "one.json", "--split", "mini_val")
    four = _predict(lidar_run, synth_root, tmp_path / "four.json", "--split", "mini_val", "--batch-size", "4")
    assert list(one["results"]) == list(four["results"])
    for token, boxes in one["results"].items():
        assert len(boxes) == len(four["results"][token]) > 0
        for a, b in zip(boxes, four["results"][token], strict=True):
            assert a["detection_name"] == b["detection_name"]
            # The batch changes the convolutions' reduction order only: float32 rounding of scores in [0, 1] and
            # of metres up to ~45 in the global frame (2⁻¹⁸ relative leaves a few ulps of a deep network's sums).
            np.testing.assert_allclose(a["detection_score"], b["detection_score"], rtol=0, atol=2**-18)
            np.testing.assert_allclose(a["translation"], b["translation"], rtol=2**-18, atol=2**-18)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--root", "/nonexistent/nuscenes"], r"^predict: --root: /nonexistent/nuscenes is not a folder"),
        (["--split", "no_such_split"], r"^predict: --split: unknown nuScenes split 'no_such_split'; there are \["),
        (["--split", "test"], r"^predict: --split: no frames of split 'test' under .* in \['mini_train', 'mini_val'"),
        (["--out", "/nonexistent/folder/results.json"], r"^predict: --out: the folder /nonexistent/folder does not"),
        (["--checkpoint", "/nonexistent/run"], r"^predict: --checkpoint: /nonexistent/run does not exist"),
        (["--batch-size", "0"], r"^predict: --batch-size: must be ≥ 1, got 0$"),
    ],
)
def test_predict_misuse_is_one_line_naming_the_option(lidar_run, synth_root, synth_index, tmp_path, extra, message):
    argv = {"--checkpoint": str(lidar_run), "--root": str(synth_root), "--out": str(tmp_path / "p.json")}
    for i in range(0, len(extra) - 1, 2):
        argv[extra[i]] = extra[i + 1]
    with pytest.raises(SystemExit, match=message) as err:
        main(["predict", *[x for kv in argv.items() for x in kv], "--quiet"])
    assert "\n" not in str(err.value) and not (tmp_path / "p.json").exists()


def test_other_misuse_of_predict_and_eval_is_named(camera_run, lidar_run, synth_root, tmp_path):
    with pytest.raises(SystemExit, match=r"^predict: --out: .* is a folder; name the submission file to write$"):
        main(["predict", "--checkpoint", str(lidar_run), "--root", str(synth_root), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"^predict: --batch-size: StreamPETR keeps a temporal memory"):
        main(["predict", "--checkpoint", str(camera_run), "--root", str(synth_root), "--out", str(tmp_path / "p"),
              "--batch-size", "2"])  # fmt: skip
    with pytest.raises(SystemExit, match=r"^eval: --blank-inputs blanks a model's inputs; use it with --checkpoint$"):
        main(["eval", "--predictions", str(tmp_path / "p.json"), "--root", str(synth_root), "--blank-inputs"])
    with pytest.raises(SystemExit, match=r"^eval: --json: .* its folder does not exist; name a file to write$"):
        main(["eval", "--checkpoint", str(lidar_run), "--json", str(tmp_path / "no" / "m.json")])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: --device cuda is fine here")
@pytest.mark.parametrize("command", ["predict", "eval", "viz frame"])
def test_device_cuda_without_a_gpu_is_one_line_naming_the_option(lidar_run, synth_root, tmp_path, command):
    argv = {
        "predict": ["predict", "--root", str(synth_root), "--out", str(tmp_path / "p.json")],
        "eval": ["eval", "--out", str(tmp_path / "e")],
        "viz frame": ["viz", "frame", "--frame", "0", "--png", str(tmp_path / "f.png")],
    }[command]
    with pytest.raises(SystemExit, match=rf"^{command}: --device cuda, but no CUDA device is available$"):
        main([*argv, "--checkpoint", str(lidar_run), "--device", "cuda"])
    assert not any(tmp_path.iterdir())  # nothing written
