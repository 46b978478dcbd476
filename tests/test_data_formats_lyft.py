"""Lyft Level 5 format: the synthetic Lyft set, its index (read with the nuScenes devkit), the loader on it, the
Lyft metric through `drivetrain eval` (ground truth as predictions scores 1), and bad input named."""

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from drivetrain.cli.main import main
from drivetrain.data import DataError, DatasetConfig, FrameDataset
from drivetrain.data.formats.lyft.metric import evaluate_lyft
from drivetrain.data.formats.lyft.splits import LYFT_SPLITS
from drivetrain.data.formats.lyft.submission import lyft_ground_truth_submission
from drivetrain.data.formats.lyft.synth import LYFT_SYNTH, LYFT_SYNTH_SCENES
from drivetrain.data.formats.lyft.tables import LYFT_CLASSES, LYFT_VERSION
from drivetrain.data.formats.registry import detect_format, format_of
from drivetrain.data.formats.schema import LIDAR
from drivetrain.data.formats.submission import write_submission
from drivetrain.data.index import build_index, save_index
from drivetrain.data.synth import SynthConfig, generate
from helpers.synth import SYNTH_TEST_CONFIG

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lyft_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lyft")
    generate(
        root,
        SynthConfig(**dict(SYNTH_TEST_CONFIG, scenes=LYFT_SYNTH_SCENES[:4])),
        progress=False,
        synth_format=LYFT_SYNTH,
    )
    return root


@pytest.fixture(scope="module")
def lyft_index(lyft_root):
    index = build_index(lyft_root, LYFT_VERSION, progress=False)
    save_index(index, lyft_root / "drivetrain_index.npz")
    return index


def table(root, name):
    return json.loads((root / LYFT_VERSION / f"{name}.json").read_text())


def test_synthetic_lyft_set_has_lyft_tables_and_folder_layout(lyft_root):
    assert sorted(c["name"] for c in table(lyft_root, "category")) == sorted(LYFT_CLASSES)
    assert all("index" not in c for c in table(lyft_root, "category"))
    anns = table(lyft_root, "sample_annotation")
    assert {a["num_lidar_pts"] for a in anns} == {-1} and {a["visibility_token"] for a in anns} == {""}
    files = {r["filename"].split("/")[0]: r for r in table(lyft_root, "sample_data")}
    assert set(files) == {"images", "lidar"}
    assert files["images"]["filename"].endswith(".jpeg") and files["lidar"]["filename"].endswith(".bin")
    assert "width" not in files["lidar"]
    assert {s["name"] for s in table(lyft_root, "scene")} <= set(LYFT_SPLITS["train"]) | set(LYFT_SPLITS["val"])
    assert detect_format(lyft_root, LYFT_VERSION).name == "lyft"


def test_lyft_index_records_format_and_classes_without_velocity_or_attributes(lyft_index):
    meta, arr = lyft_index.meta, lyft_index.arrays
    assert format_of(meta).name == "lyft" and meta["classes"] == list(LYFT_CLASSES) and meta["attributes"] == []
    assert set(arr["labels"].tolist()) == set(range(len(LYFT_CLASSES)))  # all nine classes are placed
    assert (arr["boxes"][:, 7:9] == 0).all() and (arr["attribute"] == -1).all() and (arr["visibility"] == 0).all()
    assert sorted(meta["splits"]) == ["train", "val"] and len(meta["splits"]["val"]) == 2
    assert (arr["num_lidar_pts"] >= 0).all() and (arr["num_lidar_pts"] > 0).mean() > 0.3


def test_num_lidar_pts_is_counted_as_the_devkit_points_in_box(lyft_root, lyft_index):
    from nuscenes import NuScenes
    from nuscenes.utils.geometry_utils import points_in_box

    nusc = NuScenes(version=LYFT_VERSION, dataroot=str(lyft_root), verbose=False)
    for f in (0, 7):
        sd_token = nusc.get("sample", lyft_index.meta["sample_tokens"][f])["data"][LIDAR]
        points = np.fromfile(lyft_root / nusc.get("sample_data", sd_token)["filename"], np.float32).reshape(-1, 5)
        _, dev_boxes, _ = nusc.get_sample_data(sd_token)
        counts = [int(points_in_box(b, points[:, :3].T).sum()) for b in dev_boxes]
        np.testing.assert_array_equal(lyft_index.arrays["num_lidar_pts"][lyft_index.boxes_of(f)], counts)


def test_frame_dataset_loads_a_lyft_frame_with_lyft_labels(lyft_root, lyft_index):
    dataset = FrameDataset(lyft_root / "drivetrain_index.npz", DatasetConfig(load_points=True), split="val")
    sample = dataset[1]
    assert sample.images.shape == (6, 90, 160, 3) and sample.points.shape[1] == 5
    assert 0 < len(sample.gt_labels) <= lyft_index.boxes_of(sample.index).stop - lyft_index.boxes_of(sample.index).start
    assert sample.gt_labels.max() < len(LYFT_CLASSES)


def test_ground_truth_scores_map_one_with_the_lyft_metric(lyft_root, lyft_index, tmp_path, capsys):
    preds = tmp_path / "gt.json"
    index = lyft_root / "drivetrain_index.npz"
    argv = ["eval", "--predictions", str(preds), "--root", str(lyft_root), "--ground-truth-from", str(index),
            "--out", str(tmp_path / "eval")]  # fmt: skip
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["mAP"] == 1.0 and set(printed["AP"]) == set(LYFT_CLASSES)
    assert printed["num_gt"] == printed["num_predictions"] > 0
    assert json.loads((tmp_path / "eval" / "lyft_metrics.json").read_text())["mAP"] == 1.0
    # the same file with the PyPI SDK's footprint: the boxes share their centres, so the score stays 1
    assert evaluate_lyft(preds, lyft_root, out_dir=tmp_path / "eval08", footprint="pypi-0.0.8")["mAP"] == 1.0


def test_shifted_predictions_lose_the_high_thresholds_first(lyft_root, lyft_index, tmp_path):
    submission = lyft_ground_truth_submission(lyft_index, list(LYFT_SPLITS["val"]))
    for boxes in submission["results"].values():
        for box in boxes:
            box["translation"][2] += 0.1 * box["size"][2]  # vertical overlap 0.9: IoU 0.9 / 1.1 ≈ 0.82
    metrics = evaluate_lyft(write_submission(submission, tmp_path / "up.json"), lyft_root, out_dir=tmp_path / "e")
    assert metrics["mAP_per_iou"]["0.8"] == 1.0 and metrics["mAP_per_iou"]["0.85"] == 0.0
    assert metrics["mAP"] == pytest.approx(0.7)


def test_synth_and_index_from_the_command_line_detect_the_lyft_layout(tmp_path, capsys):
    root = tmp_path / "lyft"
    assert main(["data", "synth", "--out", str(root), "--format", "lyft", "--scenes", "1", "--frames-per-scene",
                 "1", "--image-size", "64x36", "--quiet"]) == 0  # fmt: skip
    assert main(["data", "index", "--root", str(root), "--quiet"]) == 0  # no --version, no --format
    index = FrameDataset(root / "drivetrain_index.npz").index
    assert format_of(index.meta).name == "lyft" and index.meta["version"] == LYFT_VERSION
    assert main(["data", "synth", "--out", str(root), "--format", "lyft", "--scenes", "1", "--frames-per-scene",
                 "1", "--image-size", "64x36", "--quiet", "--overwrite"]) == 0  # fmt: skip
    assert not (root / "drivetrain_index.npz").exists()


@pytest.fixture(scope="module")
def gt(lyft_index):
    return lyft_ground_truth_submission(lyft_index, list(LYFT_SPLITS["val"]))


def first_box(submission):
    token = next(t for t, boxes in submission["results"].items() if boxes)
    return token, submission["results"][token][0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda box: box.__setitem__("name", "dragon"), r"\]\[0\]\.name: 'dragon' is not one of the Lyft classes"),
        (lambda box: box.__setitem__("detection_name", box.pop("name")), r"\.name: None .*name the class in 'name'"),
        (lambda box: box.pop("score"), r"\]\[0\]\.score: must be a finite number, got None"),
        (lambda box: box.__setitem__("rotation", [0, 0, 0, 0]), r"\.rotation: the zero quaternion"),
        (lambda box: box.__setitem__("size", [1.0, -1.0, 1.0]), r"\.size: must be positive"),
    ],
    ids=["unknown-class", "nuscenes-record", "no-score", "zero-quaternion", "negative-size"],
)
def test_bad_predictions_name_the_file_and_field(lyft_root, gt, tmp_path, change, message):
    bad = copy.deepcopy(gt)
    token, box = first_box(bad)
    change(box)
    path = write_submission(bad, tmp_path / "bad.json")
    with pytest.raises(DataError, match=message) as err:
        evaluate_lyft(path, lyft_root, out_dir=tmp_path / "eval")
    assert str(path) in str(err.value) and token in str(err.value)


def test_wrong_split_and_unknown_split_are_named(lyft_root, gt, tmp_path):
    path = write_submission(gt, tmp_path / "gt.json")
    with pytest.raises(DataError, match=r"sample\(s\) of split 'train' have no entry"):
        evaluate_lyft(path, lyft_root, split="train", out_dir=tmp_path / "eval")
    with pytest.raises(DataError, match=r"^--split: unknown Lyft split 'mini_val'"):
        evaluate_lyft(path, lyft_root, split="mini_val")


def test_missing_table_and_wrong_format_are_named(lyft_root, synth_root, tmp_path, gt):
    root = tmp_path / "root"
    shutil.copytree(lyft_root / LYFT_VERSION, root / LYFT_VERSION)
    (root / LYFT_VERSION / "sample_annotation.json").unlink()
    with pytest.raises(DataError, match=r"sample_annotation\.json.*missing nuScenes table"):
        evaluate_lyft(write_submission(gt, tmp_path / "gt.json"), root)
    # a root without annotations (a test split) is indexed without boxes; any other table is required
    shutil.copytree(lyft_root / "maps", root / "maps")  # the devkit opens the map masks
    assert len(build_index(root, LYFT_VERSION, progress=False, check_files=False).arrays["boxes"]) == 0
    (root / LYFT_VERSION / "ego_pose.json").unlink()
    with pytest.raises(DataError, match=r"ego_pose\.json.*missing nuScenes table"):
        build_index(root, LYFT_VERSION, progress=False)
    with pytest.raises(DataError, match=r"category\.json: category '[a-z.]+' is not a Lyft class .*nuScenes root\?"):
        build_index(synth_root, progress=False, dataset="lyft")


def test_nuscenes_index_is_unchanged(synth_index):
    assert "dataset" not in synth_index.meta and format_of(synth_index.meta).name == "nuscenes"


class LidarGroundTruth(torch.nn.Module):
    """Detects each frame's ground truth with score 1, in the batch's label order (a perfect lidar model)."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def detect(self, batch):
        scores = batch.gt_labels.apply(lambda t: torch.ones(t.shape))
        return batch.gt_boxes, scores, batch.gt_labels


def test_a_model_on_lyft_frames_is_scored_with_the_lyft_metric(lyft_root, lyft_index, tmp_path):
    from drivetrain.data.sources import StreamingFrames
    from drivetrain.engine.eval_run import evaluate_model

    # Every annotated box, also those without lidar points (training drops them; the metric counts them).
    config = DatasetConfig(load_images=False, load_points=True, filter_empty=False)
    dataset = StreamingFrames(FrameDataset(lyft_index, config, lyft_root, split="val"))
    result = evaluate_model(LidarGroundTruth(), dataset, "cpu", tmp_path / "eval", split="val", progress=False)
    assert result.metrics["mAP"] == pytest.approx(1.0) and result.frames == len(dataset) > 0
    records = json.loads(result.predictions.read_text())["results"]
    assert {r["name"] for frame in records.values() for r in frame} <= set(LYFT_CLASSES)
    summary = result.summary()
    assert summary["mAP"] == pytest.approx(1.0) and "AP/car" in summary and "NDS" not in summary


def test_lyft_pointpillars_is_scored_in_training_and_by_eval_checkpoint(lyft_root, lyft_index, tmp_path, capsys):
    from drivetrain.engine import Trainer, load_config

    index = lyft_root / "drivetrain_index.npz"
    data = {"index": str(index), "root": str(lyft_root), "split": "train", "load_images": False, "load_points": True}
    cfg = load_config(
        ROOT / "configs" / "pointpillars_tiny.yaml",
        [
            f"run.out_dir={tmp_path / 'run'}",
            "run.threads=1",
            "log.progress=false",
            "log.tensorboard=false",
            "data.name=drivetrain.data.sources:frames",
            f"data.args={json.dumps(data)}",
            "model.args.num_classes=9",
            "model.args.code_size=7",
            "model.args.dataset_classes=lyft",
            "model.args.point_dims=5",
            "train.steps=1",
            "checkpoint.every=1",
            "eval.split=val",  # the config evaluates at the start and at the end: the Lyft metric in training
        ],
    )
    Trainer(cfg).fit()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/mAP" in r]
    assert [r["step"] for r in evals] == [0, 1] and all("eval/AP/car" in r and "eval/NDS" not in r for r in evals)
    assert main(["eval", "--checkpoint", str(tmp_path / "run"), "--split", "val", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("{\n") :])
    assert set(summary) >= {"mAP", "AP", "mAP_per_iou", "num_gt"} and 0.0 <= summary["mAP"] <= 1.0
    assert summary["num_gt"] > 0
    assert (tmp_path / "run" / "eval" / "step-00000001-val" / "lyft_metrics.json").is_file()


def test_the_lyft_index_records_its_format_and_its_writers_refuse_the_other(lyft_root, lyft_index, synth_index):
    from drivetrain.data.formats.lyft.format import LYFT
    from drivetrain.data.formats.nuscenes.format import NUSCENES
    from drivetrain.data.formats.nuscenes.submission import ground_truth_submission
    from drivetrain.data.index import load_index

    assert lyft_index.format is LYFT and detect_format(lyft_root, LYFT_VERSION) is LYFT
    assert load_index(lyft_root / "drivetrain_index.npz").format is LYFT
    scenes = list(LYFT_SPLITS["val"])
    assert lyft_index.format.ground_truth(lyft_index, scenes) == lyft_ground_truth_submission(lyft_index, scenes)
    with pytest.raises(DataError, match="built from a Lyft Level 5 root, not a nuScenes one"):
        ground_truth_submission(lyft_index)
    with pytest.raises(DataError, match="built from a nuScenes root, not a Lyft one"):
        LYFT.ground_truth(synth_index, None)
    assert NUSCENES.ground_truth(synth_index, None)["results"]  # the same call on its own format's index


def test_eval_checks_a_lyft_split_against_the_lyft_splits(lyft_root, lyft_index, tmp_path):
    preds = tmp_path / "p.json"
    preds.write_text("{}")
    with pytest.raises(SystemExit, match=r"^eval: --split: unknown Lyft Level 5 split 'mini_val'; there are \['train'"):
        main(["eval", "--predictions", str(preds), "--root", str(lyft_root), "--split", "mini_val"])
