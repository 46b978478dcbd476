"""The index describes the data it is used with: paths relative to the index, a fingerprint of the tables it
was built from, the devkit's scene splits; `data synth` never mixes two datasets in one folder; CLI misuse is
one line. (Issue 9: copied datasets, stale indexes, train/val splits.)"""

import json
import shutil

import pytest

from drivetrain.cli.main import main
from drivetrain.data import FrameDataset
from drivetrain.data.errors import DataError
from drivetrain.data.index import load_index
from drivetrain.data.synth.config import MINI_TRAIN, MINI_VAL

SMALL = ["--scenes", "4", "--frames-per-scene", "2", "--image-size", "96x54", "--quiet"]


@pytest.fixture()
def copied(synth_index, synth_root, tmp_path):
    """A copy of the indexed synthetic dataset (index inside), which the test may damage."""
    root = tmp_path / "copy"
    shutil.copytree(synth_root, root)
    return root


def test_a_copied_dataset_reads_its_own_files(copied):
    victim = load_index(copied / "drivetrain_index.npz").meta["image_files"][0][0]
    (copied / victim).unlink()
    dataset = FrameDataset(copied / "drivetrain_index.npz")
    assert dataset.root == copied.resolve()
    with pytest.raises(DataError, match="cannot read image") as err:
        dataset[0]
    assert str(copied / victim) in str(err.value)


def test_inspect_takes_the_root(copied, tmp_path, capsys):
    moved = tmp_path / "elsewhere.npz"
    shutil.move(copied / "drivetrain_index.npz", moved)  # the index outside its root: name the root
    assert main(["data", "inspect", "--index", str(moved), "--root", str(copied), "--split", "mini_val"]) == 0
    assert "images" in capsys.readouterr().out


def test_an_index_refuses_tables_that_changed_since_it_was_built(copied):
    table = copied / "v1.0-mini" / "sample_annotation.json"
    rows = json.loads(table.read_text())
    table.write_text(json.dumps(rows[:-1]))
    with pytest.raises(DataError, match=r"stale index: the tables \['sample_annotation'\]"):
        FrameDataset(copied / "drivetrain_index.npz")
    shutil.rmtree(copied / "v1.0-mini")  # data files only (no tables to compare with): loads
    assert len(FrameDataset(copied / "drivetrain_index.npz")) > 0


def test_splits_select_disjoint_scenes(synth_index):
    train, val = synth_index.split("mini_train"), synth_index.split("mini_val")
    assert set(train.meta["scenes"]) <= set(MINI_TRAIN) and set(val.meta["scenes"]) <= set(MINI_VAL)
    assert len(train) + len(val) == len(synth_index)
    assert not set(train.meta["sample_tokens"]) & set(val.meta["sample_tokens"])
    # The subset is a complete index: boxes and sweeps follow their frames.
    frame = synth_index.meta["sample_tokens"].index(val.meta["sample_tokens"][1])
    assert (val.arrays["boxes"][val.boxes_of(1)] == synth_index.arrays["boxes"][synth_index.boxes_of(frame)]).all()
    assert val.meta["sweep_files"][val.sweeps_of(1)] == synth_index.meta["sweep_files"][synth_index.sweeps_of(frame)]
    assert val.scene_lengths() == [3, 3] and sorted(val.arrays["scene_id"].tolist()) == [0, 0, 0, 1, 1, 1]
    with pytest.raises(DataError, match="unknown split 'nope'"):
        synth_index.split("nope")
    with pytest.raises(DataError, match="split 'test' holds none"):
        synth_index.split("test")


def test_synth_refuses_a_non_empty_folder_and_overwrite_replaces_the_dataset(tmp_path, capsys):
    root = tmp_path / "data"
    assert main(["data", "synth", "--out", str(root), *SMALL[:2], "--frames-per-scene", "3", *SMALL[4:]]) == 0
    with pytest.raises(SystemExit, match="is not empty; pass --overwrite"):
        main(["data", "synth", "--out", str(root), *SMALL])
    assert main(["data", "synth", "--out", str(root), *SMALL, "--overwrite"]) == 0
    jpegs = list((root / "samples").rglob("*.jpg"))
    assert len(jpegs) == 4 * 2 * 6  # none left over from the larger dataset
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="holds no synthetic dataset"):
        main(["data", "synth", "--out", str(tmp_path / "other"), *SMALL, "--overwrite"])
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["data", "synth", "--out", "X", "--scenes", "0"], "--scenes: must be ≥ 1, got 0"),
        (["data", "synth", "--out", "X", "--frames-per-scene", "0"], "--frames-per-scene: must be ≥ 1, got 0"),
        (["data", "synth", "--out", "X", "--image-size", "0x0"], "image_width: must be ≥ 1, got 0"),
        (["data", "index", "--root", "X", "--max-sweeps", "-1"], "--max-sweeps: must be ≥ 0, got -1"),
        (["data", "inspect", "--index", "X", "--batch-size", "0"], "--batch-size: must be ≥ 1, got 0"),
    ],
)
def test_bad_cli_numbers_are_one_line_errors(argv, message, tmp_path):
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_truncated_or_text_index_is_named(copied):
    index = copied / "drivetrain_index.npz"
    data = index.read_bytes()
    index.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"not a readable \.npz index"):
        load_index(index)
    index.write_text("not an index\n")
    with pytest.raises(DataError, match=r"not a readable .npz index") as err:
        load_index(index)
    assert "pickled" not in str(err.value)


def test_a_table_of_the_wrong_shape_is_named(copied):
    (copied / "v1.0-mini" / "sample.json").write_text(json.dumps({"token": "x"}))
    with pytest.raises(SystemExit, match=r"sample.json: a table must be a JSON list of records, got a dict"):
        main(["data", "index", "--root", str(copied), "--quiet"])
    (copied / "v1.0-mini" / "sample.json").write_text(json.dumps([{"no_token": 1}]))
    with pytest.raises(SystemExit, match=r"sample.json: record 0 is not an object with a string 'token'"):
        main(["data", "index", "--root", str(copied), "--quiet"])


def test_outputs_that_cannot_be_written_are_one_line(copied, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(SystemExit, match=r"data index: cannot write .*file/x\.npz"):
        main(["data", "index", "--root", str(copied), "--out", str(tmp_path / "file" / "x.npz"), "--quiet"])
    with pytest.raises(SystemExit, match=r"data synth: cannot write"):
        main(["data", "synth", "--out", str(tmp_path / "file" / "data"), *SMALL])
