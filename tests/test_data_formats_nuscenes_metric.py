"""Official nuScenes metrics through the devkit: GT as predictions scores mAP ≈ 1; wrong boxes do not."""

import json

import numpy as np
import pytest
from nuscenes.utils.splits import mini_val

from drivetrain.data import DataError
from drivetrain.data.formats.nuscenes.metric import evaluate
from drivetrain.data.formats.nuscenes.submission import boxes_to_submission, ground_truth_submission
from drivetrain.data.formats.submission import write_submission


def test_ground_truth_as_predictions_scores_full_map_on_mini_val(synth_root, synth_index, tmp_path):
    path = write_submission(ground_truth_submission(synth_index, list(mini_val)), tmp_path / "gt.json")
    metrics = evaluate(path, synth_root, split="mini_val", out_dir=tmp_path / "eval")
    assert metrics["mean_ap"] >= 0.99
    assert all(ap >= 0.99 for ap in metrics["mean_dist_aps"].values())
    assert metrics["tp_errors"]["trans_err"] < 1e-3 and metrics["tp_errors"]["orient_err"] < 1e-3
    assert metrics["tp_errors"]["vel_err"] < 1e-3 and metrics["tp_errors"]["attr_err"] < 1e-9


def test_predictions_shifted_by_three_metres_lose_most_of_the_map(synth_root, synth_index, tmp_path):
    arr, meta = synth_index.arrays, synth_index.meta
    results = {}
    for f in range(len(synth_index)):
        if meta["scenes"][arr["scene_id"][f]] not in mini_val:
            continue
        sl = synth_index.boxes_of(f)
        boxes = arr["boxes"][sl].astype(np.float64)
        boxes[:, 0] += 3.0
        token = meta["sample_tokens"][f]
        results[token] = boxes_to_submission(token, boxes, arr["labels"][sl], np.ones(len(boxes)), arr["ego_pose"][f])
    path = write_submission({"meta": {"use_camera": True}, "results": results}, tmp_path / "shifted.json")
    metrics = evaluate(path, synth_root, split="mini_val", out_dir=tmp_path / "eval")
    assert metrics["mean_ap"] < 0.6


def test_bad_predictions_files_are_named(synth_root, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        evaluate(tmp_path / "none.json", synth_root)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": {}}))
    with pytest.raises(DataError, match="submission"):
        evaluate(bad, synth_root)
    for meta in (None, [], "camera"):  # the devkit copies meta as a dict (the slow fuzz found "meta": null)
        bad.write_text(json.dumps({"meta": meta, "results": {}}))
        with pytest.raises(DataError, match=r"^.*bad\.json: predictions must be a nuScenes submission: "):
            evaluate(bad, synth_root)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"meta": {}, "results": {}}))
    with pytest.raises(DataError, match=r"sample\(s\) of split 'mini_val' have no entry \(e.g. \['"):
        evaluate(partial, synth_root, out_dir=tmp_path / "eval")
