"""`drivetrain eval` on bad or unusual submissions: every box is checked before the devkit runs (the error
names the entry and field), an empty submission scores 0 instead of crashing the devkit, token mismatches
name the tokens, unknown splits and configs name the option, and nothing is overwritten silently."""

import copy
import json

import pytest
from nuscenes.utils.splits import mini_val

from drivetrain.cli.main import main
from drivetrain.data import DataError
from drivetrain.data.formats.nuscenes.metric import evaluate
from drivetrain.data.formats.nuscenes.submission import ground_truth_submission
from drivetrain.data.formats.submission import write_submission


@pytest.fixture(scope="module")
def gt(synth_index):
    return ground_truth_submission(synth_index, list(mini_val))


def first_box(submission):
    token = next(t for t, boxes in submission["results"].items() if boxes)
    return token, submission["results"][token][0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda box: box["size"].__setitem__(0, float("inf")), r"\]\[0\]\.size: non-finite value"),
        (lambda box: box.pop("detection_score"), r"\]\[0\]\.detection_score: must be a finite number, got None"),
        (lambda box: box.__setitem__("sample_token", "other"), r"\.sample_token: 'other' differs from its key"),
        (lambda box: box.pop("velocity"), r"\]\[0\]\.velocity: must be a list of 2 numbers, got None"),
        (lambda box: box.__setitem__("detection_name", "dragon"), r"\.detection_name: 'dragon' is not one of"),
        (lambda box: box.__setitem__("size", [1.0, 0.0, 1.0]), r"\.size: must be positive"),
        (lambda box: box.pop("attribute_name"), r"\.attribute_name: None is not a nuScenes attribute"),
        (lambda box: box.__setitem__("num_pts", "x"), r"\.num_pts: must be an integer"),
    ],
    ids=[
        "inf-size",
        "no-score",
        "token-mismatch",
        "no-velocity",
        "unknown-class",
        "zero-size",
        "no-attribute",
        "bad-num-pts",
    ],
)
def test_every_box_is_checked_before_the_devkit(synth_root, gt, tmp_path, change, message):
    bad = copy.deepcopy(gt)
    token, box = first_box(bad)
    change(box)
    path = write_submission(bad, tmp_path / "bad.json")
    with pytest.raises(DataError, match=message) as err:
        evaluate(path, synth_root, out_dir=tmp_path / "eval")
    assert str(path) in str(err.value) and token in str(err.value)


def test_a_submission_without_detections_scores_zero(synth_root, gt, tmp_path):
    empty = {"meta": gt["meta"], "results": {key: [] for key in gt["results"]}}
    metrics = evaluate(write_submission(empty, tmp_path / "empty.json"), synth_root, out_dir=tmp_path / "eval")
    assert metrics["mean_ap"] == 0.0 and metrics["nd_score"] == 0.0
    assert json.loads((tmp_path / "eval" / "metrics_summary.json").read_text())["nd_score"] == 0.0


def test_token_mismatches_name_the_tokens(synth_root, gt, tmp_path):
    shifted = copy.deepcopy(gt)
    token = sorted(shifted["results"])[0]
    del shifted["results"][token]
    shifted["results"]["not-a-sample"] = []
    with pytest.raises(DataError) as err:
        evaluate(write_submission(shifted, tmp_path / "p.json"), synth_root, out_dir=tmp_path / "eval")
    assert token in str(err.value) and "not-a-sample" in str(err.value)


def test_unknown_split_and_config_name_the_option(synth_root, gt, tmp_path):
    path = write_submission(gt, tmp_path / "gt.json")
    with pytest.raises(DataError, match=r"^--split: unknown split 'nope'"):
        evaluate(path, synth_root, split="nope")
    with pytest.raises(DataError, match=r"^--config: unknown devkit detection config 'nope'"):
        evaluate(path, synth_root, config="nope")


def test_ground_truth_from_does_not_overwrite_predictions(synth_root, synth_index, tmp_path):
    preds = tmp_path / "mine.json"
    preds.write_text("my predictions")
    argv = ["eval", "--predictions", str(preds), "--root", str(synth_root),
            "--ground-truth-from", str(synth_root / "drivetrain_index.npz")]  # fmt: skip
    with pytest.raises(SystemExit, match="exists; --ground-truth-from would replace it"):
        main(argv)
    assert preds.read_text() == "my predictions"
    assert main([*argv, "--overwrite", "--out", str(tmp_path / "eval")]) == 0
