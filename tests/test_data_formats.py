"""The dataset format record: chosen at indexing, kept by the index, and the one thing eval asks (the Lyft side of
each check is in test_data_formats_lyft.py, beside its synthetic root)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from drivetrain.cli.main import main
from drivetrain.data import DataError
from drivetrain.data.formats.lyft.format import LYFT
from drivetrain.data.formats.lyft.splits import LYFT_SPLITS
from drivetrain.data.formats.nuscenes.format import NUSCENES
from drivetrain.data.formats.nuscenes.submission import boxes_to_submission
from drivetrain.data.formats.nuscenes.tables import CLASSES
from drivetrain.data.formats.registry import FORMATS, default_version, detect_format, format_of
from drivetrain.data.index import build_index, load_index

ROOT = Path(__file__).resolve().parents[1]


def test_the_index_knows_its_format_and_a_nuscenes_index_stays_as_it_was(synth_root, synth_index):
    assert synth_index.format is NUSCENES and detect_format(synth_root, "v1.0-mini") is NUSCENES
    assert "dataset" not in synth_index.meta  # read as the default format
    assert load_index(synth_root / "drivetrain_index.npz").format is NUSCENES
    assert synth_index.meta["classes"] == list(NUSCENES.classes) == list(CLASSES)
    assert synth_index.meta["attributes"] == list(NUSCENES.attributes)


def test_an_index_of_a_format_drivetrain_does_not_know_is_named():
    with pytest.raises(DataError, match=r"^/data/waymo: index of unknown dataset format 'waymo'; known: \['lyft'"):
        format_of({"dataset": "waymo", "root": "/data/waymo"})


def test_each_format_holds_its_splits():
    from nuscenes.utils.splits import create_splits_scenes

    assert NUSCENES.splits() == {k: list(v) for k, v in create_splits_scenes(verbose=False).items()}
    assert LYFT.splits() == {k: list(v) for k, v in LYFT_SPLITS.items()}
    for fmt in FORMATS.values():
        assert fmt.default_split in fmt.splits() and set(fmt.category_to_class.values()) <= set(fmt.classes)
        assert set(fmt.category_to_class) <= set(fmt.categories)


def test_the_default_table_folder_is_the_formats_or_the_only_one_there(tmp_path):
    assert default_version(tmp_path) == "v1.0-mini"  # nothing there: the root check names what is missing
    (tmp_path / "v1.01-train").mkdir()
    assert default_version(tmp_path) == "v1.01-train"
    (tmp_path / "v1.0-mini").mkdir()
    assert default_version(tmp_path) == "v1.0-mini"
    assert default_version(tmp_path, "lyft") == LYFT.version == "v1.01-train"


def test_a_format_named_at_indexing_must_fit_the_root(synth_root):
    with pytest.raises(DataError, match=r"category\.json: category '[a-z.]+' is not a Lyft class"):
        build_index(synth_root, progress=False, dataset=LYFT)
    with pytest.raises(ValueError, match="dataset: expected one of"):
        build_index(synth_root, progress=False, dataset="waymo")


def test_the_formats_writers_write_their_own_records():
    pose, box = np.eye(4), np.array([[1.0, 2.0, 0.5, 4.0, 2.0, 1.5, 0.3, 1.0, 0.0]])
    args = ("token", box, np.array([0]), np.array([0.9]), pose)
    assert NUSCENES.write_boxes(*args) == boxes_to_submission(*args)
    (lyft,) = LYFT.write_boxes(*args)
    assert lyft["name"] == "car" and lyft["score"] == 0.9 and "detection_name" not in lyft and "velocity" not in lyft


def test_eval_checks_the_split_against_the_formats_splits(synth_root, synth_index, tmp_path):
    preds = tmp_path / "p.json"
    preds.write_text("{}")
    with pytest.raises(SystemExit, match=r"^eval: --split: unknown nuScenes split 'val_typo'; there are \["):
        main(["eval", "--predictions", str(preds), "--root", str(synth_root), "--split", "val_typo"])


def _pointpillars_run(out: Path, index: Path) -> None:
    data = {"index": str(index), "split": "mini_train", "load_images": False, "load_points": True, "num_sweeps": 1,
            "use_dim": [0, 1, 2, 4]}  # fmt: skip
    argv = ["train", "--config", str(ROOT / "configs" / "pointpillars_tiny.yaml"), f"run.out_dir={out}",
            "run.threads=1", "log.progress=false", "log.tensorboard=false", "data.name=frames",
            f"data.args={json.dumps(data)}", "data.batch_size=2", "train.steps=1", "checkpoint.every=1",
            "eval.every=0", "eval.at_start=false"]  # fmt: skip
    assert main(argv) == 0


def test_eval_scores_a_lidar_run_with_tta_on_its_data_and_on_a_named_root(synth_root, synth_index, tmp_path, capsys):
    run = tmp_path / "run"
    _pointpillars_run(run, synth_root / "drivetrain_index.npz")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--device", "cpu", "--tta", "--out", str(tmp_path / "tta")]) == 0
    out = capsys.readouterr().out
    printed = json.loads(out[out.index("{\n") :])
    assert set(printed) >= {"mAP", "NDS", "trans_err", "AP"}
    assert json.loads((tmp_path / "tta" / "results.json").read_text())["meta"]["use_lidar"] is True
    root = [
        "eval",
        "--checkpoint",
        str(run),
        "--device",
        "cpu",
        "--root",
        str(synth_root),
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(root) == 0
    assert "on mini_val (6 frames" in capsys.readouterr().out  # the format's default split of --root's index
    assert (tmp_path / "r" / "metrics_summary.json").is_file()
