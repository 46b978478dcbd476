"""Nothing a dataset, a sweep cache or a run directory holds makes drivetrain read outside the dataset root or
delete or overwrite a file it did not make (issue 27, docs/safety.md).

Every refusal is checked three ways: the exit code (or exception), the one line that names the file, row and
value, and the absence of side effects — a snapshot of the whole tree (kinds, contents, link targets, mtimes,
folders' mtimes included, so a file created and removed again shows too) is the same before and after, and the
file a bad name points at is intact. Beside each refusal, the legitimate use of the same door still works.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from drivetrain.cli.main import main
from drivetrain.data import DatasetConfig, FrameDataset
from drivetrain.data.errors import DataError
from drivetrain.data.index import load_index
from drivetrain.data.sweep_cache import SweepCache
from drivetrain.data.sweeps import SweepConfig
from drivetrain.data.table_paths import path_problem
from drivetrain.engine import Checkpointer
from drivetrain.engine.resume import RUN_FORMAT, RUN_MARKER
from drivetrain.safeio.files import remove_path, replace_text
from helpers.engine import SMOKE, cli_env, metrics, overrides
from helpers.refusals import one_line
from helpers.trees import tree

VICTIM = b"someone else's file\n"


@pytest.fixture
def root(synth_root, synth_index, tmp_path) -> Path:
    """A private copy of the session's synthetic dataset (with its index), to tamper with."""
    return Path(shutil.copytree(synth_root, tmp_path / "data", symlinks=True))


def _edit_table(root: Path, table: str, row: int, field: str, value: object) -> str:
    path = root / "v1.0-mini" / f"{table}.json"
    rows = json.loads(path.read_text())
    rows[row][field] = value
    path.write_text(json.dumps(rows))
    return rows[row]["token"]


# ---------------------------------------------------------------- dataset paths stay in the dataset


@pytest.mark.parametrize("value", ["VICTIM", "../victim.jpg", "samples/../../victim.jpg", "samples/../x.jpg"])
def test_index_refuses_a_sample_data_file_name_outside_the_root(root, tmp_path, capsys, value):
    (tmp_path / "victim.jpg").write_bytes(VICTIM)
    value = str(tmp_path / "victim.jpg") if value == "VICTIM" else value
    token = _edit_table(root, "sample_data", 3, "filename", value)
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["data", "index", "--root", str(root), "--quiet"])
    line = one_line(str(err.value))
    assert line.startswith(f"data index: {root / 'v1.0-mini' / 'sample_data.json'}: row 3 (token {token!r}): ")
    assert f"filename {value!r}" in line
    assert tree(tmp_path) == before  # no index written, nothing read into one
    assert (tmp_path / "victim.jpg").read_bytes() == VICTIM


def test_index_refuses_a_map_file_name_outside_the_root_before_the_devkit_looks_for_it(root, tmp_path):
    token = _edit_table(root, "map", 0, "filename", "../../etc/hostname")
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["data", "index", "--root", str(root), "--quiet"])
    line = one_line(str(err.value))
    assert f"map.json: row 0 (token {token!r}): filename '../../etc/hostname' has a '..' part" in line
    assert tree(tmp_path) == before


def test_index_refusal_from_the_command_line_is_one_line_with_the_data_error_exit_code(root, tmp_path):
    _edit_table(root, "sample_data", 0, "filename", "/etc/hostname")
    cmd = [sys.executable, "-m", "drivetrain.cli.main", "data", "index", "--root", str(root), "--quiet"]
    proc = subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1  # what every `drivetrain data` error exits with (SystemExit with the message)
    line = one_line(proc.stderr)
    assert "sample_data.json: row 0" in line and "'/etc/hostname' is an absolute path" in line
    assert proc.stdout == ""


def _tampered_index(src: Path, dst: Path, key: str, row: int, value: str) -> None:
    with np.load(src, allow_pickle=False) as npz:
        data = {k: npz[k] for k in npz.files}
    meta = json.loads(data.pop("meta_json").tobytes().decode())
    if key == "image_files":
        meta[key][row][2] = value
    else:
        meta[key][row] = value
    np.savez(dst, meta_json=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **data)


@pytest.mark.parametrize(
    ("key", "value"), [("image_files", "../../victim.jpg"), ("lidar_files", "/tmp/x.bin"), ("sweep_files", "a/../..")]
)
def test_a_stored_index_cannot_name_files_outside_its_root(root, tmp_path, key, value):
    index = root / "drivetrain_index.npz"
    _tampered_index(index, index, key, 1, value)
    with pytest.raises(DataError) as err:
        load_index(index)
    assert one_line(str(err.value)).startswith(f"{index}: index metadata {key}[1] {value!r} ")
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["data", "inspect", "--index", str(index), "--points"])
    assert f"{key}[1] {value!r}" in one_line(str(err.value))
    assert tree(tmp_path) == before


def test_a_linked_samples_folder_inside_the_root_is_followed(root, tmp_path):
    disk = tmp_path / "big-disk"
    disk.mkdir()
    shutil.move(root / "samples", disk / "samples")
    (root / "samples").symlink_to(disk / "samples", target_is_directory=True)
    (tmp_path / "victim").write_bytes(VICTIM)
    (root / "drivetrain_index.npz").unlink()
    (root / "drivetrain_index.npz").symlink_to(tmp_path / "victim")  # replaced by the index, not written through
    assert main(["data", "index", "--root", str(root), "--quiet"]) == 0
    assert (tmp_path / "victim").read_bytes() == VICTIM and not (root / "drivetrain_index.npz").is_symlink()
    frames = FrameDataset(root / "drivetrain_index.npz", DatasetConfig(load_points=True))
    sample = frames[0]
    assert sample.images.shape == (6, 90, 160, 3) and sample.images.max() > 0
    assert len(sample.points) > 0
    assert path_problem("samples/CAM_FRONT/x.jpg") is None and path_problem("./samples//x.jpg") is None


# ---------------------------------------------------------------- the sweep cache deletes only its own files


def _cache(synth_root: Path, out: Path, *extra: str) -> int:
    index = synth_root / "drivetrain_index.npz"
    return main(["data", "cache", "--index", str(index), "--sweeps", "1", "--out", str(out), "--quiet", *extra])


@pytest.mark.parametrize("manifest", ['{"name": "my project", "files": ["notes.txt"]}', "not json {", "[1, 2]"])
def test_cache_rebuild_refuses_a_manifest_that_is_not_ours(synth_root, synth_index, tmp_path, manifest):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "manifest.json").write_text(manifest)
    (out / "notes.txt").write_bytes(VICTIM)
    (out / "shard-00000.points").write_bytes(VICTIM)  # our naming pattern, not our file
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        _cache(synth_root, out, "--rebuild")
    line = one_line(str(err.value))
    assert line.startswith(f"data cache: {out / 'manifest.json'}: is not a drivetrain sweep-cache file")
    assert line.endswith("not touching its folder")
    assert tree(tmp_path) == before


def test_cache_rebuild_refuses_a_non_empty_folder_without_a_cache(synth_root, synth_index, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_bytes(VICTIM)
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        _cache(synth_root, out, "--rebuild")
    assert f"{out}: is not empty and holds no sweep cache" in one_line(str(err.value))
    assert tree(tmp_path) == before


def test_cache_rebuild_replaces_our_cache_and_deletes_nothing_else(synth_root, synth_index, tmp_path):
    out, victim = tmp_path / "cache", tmp_path / "victim.bin"
    victim.write_bytes(VICTIM)
    assert _cache(synth_root, out, "--frames-per-shard", "5") == 0
    ours = {p.name for p in out.iterdir()}
    assert {"manifest.json", "build.json", "shard-00002.points", "shard-00002.json"} <= ours
    (out / "notes.txt").write_bytes(VICTIM)
    (out / "shard-00007.points").write_bytes(VICTIM)  # our pattern, but no manifest lists it
    (out / "shard-00001.points.tmp").symlink_to(victim)  # our temporary name: the link goes, not its target
    with pytest.raises(SystemExit, match="other settings"):
        _cache(synth_root, out, "--frames-per-shard", "5", "--choice", "nearest")
    assert _cache(synth_root, out, "--frames-per-shard", "5", "--choice", "nearest", "--rebuild") == 0
    assert (out / "notes.txt").read_bytes() == VICTIM and (out / "shard-00007.points").read_bytes() == VICTIM
    assert not (out / "shard-00001.points.tmp").is_symlink() and victim.read_bytes() == VICTIM
    assert {p.name for p in out.iterdir()} == ours | {"notes.txt", "shard-00007.points"}
    SweepCache(out, synth_index, SweepConfig(num_sweeps=1, choice="nearest"))  # the rebuilt cache, new settings
    with pytest.raises(DataError, match="other settings"):
        SweepCache(out, synth_index, SweepConfig(num_sweeps=1))


# ---------------------------------------------------------------- training writes only into its own run directory


def _train(out: Path, *extra: str, resume: str | None = None) -> int:
    argv = ["train", "--config", str(SMOKE), *overrides(out, "train.steps=2", "checkpoint.every=2", *extra)]
    return main([*argv, *(["--resume", resume] if resume else [])])


def test_train_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    out = tmp_path / "home"
    (out / "projects").mkdir(parents=True)
    (out / "notes.txt").write_bytes(VICTIM)
    (out / "config.yaml").write_bytes(VICTIM)  # a name the trainer writes
    before = tree(tmp_path)
    assert _train(out) == 2
    line = one_line(capsys.readouterr().err)
    assert line == (
        f"drivetrain train: config error: run.out_dir: {out} is not empty and is not a drivetrain run (no "
        f"{RUN_MARKER}); choose a new or empty folder"
    )
    assert tree(tmp_path) == before  # no lock file, no marker, no config.yaml written


@pytest.mark.parametrize("marker", ['{"format": "something-else"}', "hello", "[]"])
def test_train_refuses_a_marker_that_is_not_ours(tmp_path, capsys, marker):
    out = tmp_path / "run"
    out.mkdir()
    (out / RUN_MARKER).write_text(marker)
    (out / "metrics.jsonl").write_bytes(VICTIM)
    before = tree(tmp_path)
    assert _train(out) == 2
    line = one_line(capsys.readouterr().err)
    assert f"run.out_dir: {out / RUN_MARKER} is not a drivetrain run marker" in line
    assert tree(tmp_path) == before


def test_train_into_an_empty_folder_marks_it_and_resumes_there(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    assert _train(out) == 0
    marker = json.loads((out / RUN_MARKER).read_text())
    assert marker["format"] == RUN_FORMAT and marker["version"] == 1 and "created" in marker
    assert _train(out, "train.steps=4", resume="auto") == 0
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]
    assert json.loads((out / RUN_MARKER).read_text()) == marker  # kept, not rewritten


def test_a_run_of_an_older_drivetrain_is_refused_until_adopted(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out) == 0
    (out / RUN_MARKER).unlink()  # as an older drivetrain left it: config.yaml and committed checkpoints
    capsys.readouterr()
    before = tree(tmp_path)
    assert _train(out, "train.steps=3", resume="auto") == 2
    line = one_line(capsys.readouterr().err)
    assert f"run.out_dir: {out} holds a run of an older drivetrain" in line
    assert f"adopt it with `touch {out / RUN_MARKER}`" in line
    assert tree(tmp_path) == before
    (out / RUN_MARKER).touch()
    assert _train(out, "train.steps=3", resume="auto") == 0
    assert metrics(out)[-1]["step"] == 3
    assert json.loads((out / RUN_MARKER).read_text())["format"] == RUN_FORMAT  # the full marker replaces the empty one


def test_a_resumed_run_replaces_links_in_its_folder_instead_of_writing_through_them(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out) == 0
    victims = {name: tmp_path / f"victim-{name}" for name in ("config.yaml", ".drivetrain.lock", "metrics.jsonl")}
    for name, victim in victims.items():
        victim.write_bytes(VICTIM)
        (out / name).unlink()
        (out / name).symlink_to(victim)
    assert _train(out, "train.steps=3", resume="auto") == 0
    for name, victim in victims.items():
        assert victim.read_bytes() == VICTIM, name
        assert not (out / name).is_symlink(), name
    assert metrics(out)[-1]["step"] == 3 and "model:" in (out / "config.yaml").read_text()


# ---------------------------------------------------------------- data synth --overwrite deletes only its own set

SMALL = ["--scenes", "1", "--frames-per-scene", "1", "--image-size", "64x36", "--quiet"]


def _listed(root: Path) -> set[str]:
    return {
        r["filename"]
        for table in ("sample_data", "map")
        for r in json.loads((root / f"v1.0-mini/{table}.json").read_text())
    }


def test_synth_overwrite_deletes_only_what_the_generator_made(tmp_path):
    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    assert main(["data", "synth", "--out", str(root), *SMALL]) == 0
    assert main(["data", "index", "--root", str(root), "--quiet"]) == 0
    old_files = _listed(root)
    (root / "notes.txt").write_bytes(VICTIM)
    (root / "samples" / "mine.txt").write_bytes(VICTIM)
    (root / "samples" / "CAM_FRONT" / "mine.jpg").write_bytes(VICTIM)
    elsewhere.mkdir()
    shutil.move(root / "maps", elsewhere / "maps")  # maps/ linked to another disk
    (root / "maps").symlink_to(elsewhere / "maps", target_is_directory=True)
    (elsewhere / "maps" / "victim.txt").write_bytes(VICTIM)
    shutil.move(root / "samples" / "CAM_BACK", elsewhere / "CAM_BACK")  # a linked folder deeper down
    (root / "samples" / "CAM_BACK").symlink_to(elsewhere / "CAM_BACK", target_is_directory=True)
    linked = tree(elsewhere)
    assert main(["data", "synth", "--out", str(root), *SMALL, "--seed", "1", "--overwrite"]) == 0
    for mine in ("notes.txt", "samples/mine.txt", "samples/CAM_FRONT/mine.jpg"):
        assert (root / mine).read_bytes() == VICTIM, mine
    assert tree(elsewhere) == linked  # the link was removed, never followed
    for folder in ("maps", "samples/CAM_BACK"):
        assert (root / folder).is_dir() and not (root / folder).is_symlink(), folder
    assert not (root / "drivetrain_index.npz").exists()  # the old set's index went with it
    new_files = _listed(root)
    assert new_files != old_files
    data = {p.relative_to(root).as_posix() for d in ("samples", "sweeps", "maps") for p in (root / d).rglob("*")}
    data = {f for f in data if not (root / f).is_dir()} - {"samples/mine.txt", "samples/CAM_FRONT/mine.jpg"}
    assert data == new_files  # no file of the old set stayed behind
    assert json.loads((root / "drivetrain_synth.json").read_text())["seed"] == 1
    assert main(["data", "index", "--root", str(root), "--quiet"]) == 0


@pytest.mark.parametrize("settings", ["[1, 2]", "{}", "not json", '{"version": "v9", "seed": 0, "scenes": []}'])
def test_synth_overwrite_refuses_settings_that_are_not_the_generators(tmp_path, settings):
    root = tmp_path / "data"
    (root / "samples").mkdir(parents=True)
    (root / "samples" / "x.jpg").write_bytes(VICTIM)
    (root / "drivetrain_synth.json").write_text(settings)
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["data", "synth", "--out", str(root), *SMALL, "--overwrite"])
    line = one_line(str(err.value))
    assert line.startswith(f"data synth: {root / 'drivetrain_synth.json'}: is not a drivetrain synthetic dataset's")
    assert tree(tmp_path) == before


def test_synth_overwrite_refuses_tables_that_name_files_outside_the_set(tmp_path):
    root = tmp_path / "data"
    assert main(["data", "synth", "--out", str(root), *SMALL]) == 0
    (tmp_path / "victim.txt").write_bytes(VICTIM)
    token = _edit_table(root, "sample_data", 0, "filename", "../victim.txt")
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["data", "synth", "--out", str(root), *SMALL, "--overwrite"])
    line = one_line(str(err.value))
    assert f"sample_data.json: row 0 (token {token!r}): filename '../victim.txt' has a '..' part" in line
    assert tree(tmp_path) == before


# ---------------------------------------------------------------- links are unlinked or replaced, never followed


def test_checkpoint_pruning_and_saving_unlink_links_and_keep_their_targets(tmp_path):
    other = Checkpointer(tmp_path / "other" / "checkpoints", keep=5)
    linked = other.save(1, {"w": 1})
    uncommitted = tmp_path / "other" / "half"
    uncommitted.mkdir()
    (uncommitted / "state.pt").write_bytes(VICTIM)
    outside = tree(tmp_path / "other")
    run = Checkpointer(tmp_path / "run" / "checkpoints", keep=1)
    run.root.mkdir(parents=True)
    (run.root / "step-00000001").symlink_to(linked, target_is_directory=True)  # linked from another run
    (run.root / "step-00000002").symlink_to(uncommitted, target_is_directory=True)  # a save to redo there
    run.save(2, {"w": 2})
    run.save(3, {"w": 3})
    assert [step for step, _ in run.committed()] == [3]
    assert sorted(p.name for p in run.root.iterdir()) == ["step-00000003"]
    assert tree(tmp_path / "other") == outside


def test_remove_path_and_replace_text_never_reach_through_a_link(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "file").write_bytes(VICTIM)
    (tmp_path / "victim").write_bytes(VICTIM)
    (tmp_path / "dir-link").symlink_to(target, target_is_directory=True)
    (tmp_path / "file-link").symlink_to(tmp_path / "victim")
    remove_path(tmp_path / "dir-link")
    replace_text(tmp_path / "file-link", "ours")
    assert not (tmp_path / "dir-link").exists() and (target / "file").read_bytes() == VICTIM
    assert not (tmp_path / "file-link").is_symlink() and (tmp_path / "file-link").read_text() == "ours"
    assert (tmp_path / "victim").read_bytes() == VICTIM
    remove_path(tmp_path / "missing")  # nothing to do


def _run_with_metrics(folder: Path) -> None:
    folder.mkdir()
    lines = [{"step": s, "loss": 1.0 / s, "lr": 1e-3, "samples_per_s": 8.0, "step_time_s": 0.2, "data_wait_s": 0.01,
              "peak_memory_mb": 100.0, "loss_scale": 1.0, "skipped_steps": 0} for s in range(1, 6)]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / "config.yaml").write_text("model:\n  name: smoke\ntrain:\n  device: cpu\n")


def test_report_and_doctor_replace_their_own_outputs_instead_of_writing_through_links(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run, victim = tmp_path / "run", tmp_path / "victim"
    victim.write_bytes(VICTIM)
    _run_with_metrics(run)
    for name in ("loss.png", "report.md", "doctor.md", "doctor.json"):
        (run / name).symlink_to(victim)
    (run / "notes.txt").write_bytes(VICTIM)
    assert main(["report", str(run)]) == 0
    assert main(["doctor", str(run), "--no-profile"]) == 0
    assert victim.read_bytes() == VICTIM and (run / "notes.txt").read_bytes() == VICTIM
    for name in ("loss.png", "report.md", "doctor.md", "doctor.json"):
        assert (run / name).is_file() and not (run / name).is_symlink(), name
    assert (run / "loss.png").read_bytes().startswith(b"\x89PNG")
