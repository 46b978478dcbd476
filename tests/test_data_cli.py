"""``drivetrain data synth|index|inspect`` and ``drivetrain eval`` end to end."""

import json

import pytest

from drivetrain.cli.main import build_parser, main
from drivetrain.data.formats.nuscenes.tables import CLASSES


def test_data_and_eval_help_name_their_options(capsys):
    for argv in (["data", "synth", "--help"], ["data", "index", "--help"], ["eval", "--help"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        out = capsys.readouterr().out
        assert "--out" in out and "example" in out


def test_synth_index_inspect_eval_end_to_end(tmp_path, capsys):
    root = tmp_path / "data"
    assert (
        main(
            [
                "data",
                "synth",
                "--out",
                str(root),
                "--scenes",
                "4",
                "--frames-per-scene",
                "2",
                "--image-size",
                "96x54",
                "--quiet",
            ]
        )
        == 0
    )
    assert main(["data", "index", "--root", str(root), "--quiet"]) == 0
    index = root / "drivetrain_index.npz"
    assert index.is_file()
    assert main(["data", "inspect", "--index", str(index)]) == 0
    assert "images         (2, 6, 3, 54, 96)" in capsys.readouterr().out
    preds = tmp_path / "gt.json"
    assert main(["eval", "--predictions", str(preds), "--root", str(root), "--ground-truth-from", str(index)]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.rindex("\n{\n") + 1 :])  # the summary is the last top-level object
    assert summary["mAP"] >= 0.99
    assert set(summary["AP"]) == set(CLASSES)


def test_index_of_a_non_nuscenes_folder_exits_with_the_reason(tmp_path):
    with pytest.raises(SystemExit, match="no nuScenes tables found"):
        main(["data", "index", "--root", str(tmp_path)])
