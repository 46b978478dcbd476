"""A config's dataset root is only written to where drivetrain may: generating happens only into a new or empty
folder or over a synthetic dataset whose manifest says drivetrain made it, and a command that reads a run never
generates at all (issue 39 class 1, docs/safety.md).

Each refusal is checked for its exit status, its one line naming the folder (no traceback) and the absence of side
effects: the trees around it (kinds, contents, link targets, mtimes) are the same before and after. Beside each
refusal, the legitimate use of the same door still works: a killed generation is recovered by the rerun and by
``--overwrite``, and the ``data synth`` command a refusal names makes the data the run reads. The default set checks
the refusals and recoveries in-process (``main``) and one hostile manifest in a process of its own; the refusal and a
real kill of a generation in processes of their own, and the other hostile manifests, are in the slow set.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drivetrain.cli.main import main
from drivetrain.data.synth import SynthConfig, generate
from drivetrain.data.synth.manifest import MANIFEST, folder_state, write_manifest
from drivetrain.data.synth.names import GeneratedNames
from helpers.engine import cli_env
from helpers.refusals import one_line
from helpers.trees import tree

ROOT = Path(__file__).resolve().parents[1]
MINE = b"someone else's file\n"
# A small synthetic set the run below trains on: 4 scenes (2 mini_train, the 2 mini_val) x 2 key frames, 1 sweep.
DATA = {"scenes": 4, "frames_per_scene": 2, "image_size": [160, 90], "sweeps_per_sample": 1}
QUIET = ["run.threads=1", "log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.at_start=false"]
TINY = SynthConfig(scenes=("scene-0061", "scene-0103"), samples_per_scene=2, sweeps_per_sample=1, image_width=32,
                   image_height=18, focal=25.32, lidar_rings=4, lidar_azimuths=30)  # fmt: skip
SMALL = ["--scenes", "1", "--frames-per-scene", "1", "--image-size", "64x36", "--quiet"]


def plant_nuscenes(root: Path) -> None:
    """A never-indexed nuScenes-format root someone else owns: tables, an image, notes."""
    (root / "v1.0-mini").mkdir(parents=True)
    (root / "v1.0-mini" / "scene.json").write_text('[{"token": "s1", "name": "scene-0061"}]')
    (root / "v1.0-mini" / "log.json").write_text('[{"token": "l1"}]')
    (root / "samples" / "CAM_FRONT").mkdir(parents=True)
    (root / "samples" / "CAM_FRONT" / "n015.jpg").write_bytes(MINE)
    (root / "notes.txt").write_bytes(MINE)


def plant_unfinished(root: Path, config: SynthConfig = TINY) -> None:
    """What a generation killed before its tables leaves: the manifest (complete: false) and some data files."""
    generate(root, config, progress=False)
    write_manifest(root, config, "nuscenes", complete=False)
    for table in (root / "v1.0-mini").iterdir():
        table.unlink()
    for sweep in (root / "sweeps").rglob("*.bin"):
        sweep.unlink()
    assert folder_state(root)[0] == "unfinished"


def data_files(root: Path) -> set[str]:
    """The files under the generator's data folders."""
    found = {p.relative_to(root).as_posix() for d in ("samples", "sweeps", "maps") for p in (root / d).rglob("*")}
    return {f for f in found if not (root / f).is_dir()}


def listed(root: Path, version: str = "v1.0-mini") -> set[str]:
    """The data files the tables list."""
    tables = [json.loads((root / version / f"{t}.json").read_text()) for t in ("sample_data", "map")]
    return {row["filename"] for rows in tables for row in rows}


# ---------------------------------------------------------------- train never generates into a folder not ours


def _train_argv(data_root: Path, out: Path) -> list[str]:
    args = json.dumps({"root": str(data_root), "size": "tiny", **DATA, "split": "mini_train"})
    return ["train", "--config", str(ROOT / "configs" / "synth_tiny.yaml"), f"run.out_dir={out}", *QUIET,
            f"data.args={args}", "model.args.width=8", "train.steps=1", "train.device=cpu"]  # fmt: skip


@pytest.mark.slow  # ~3.5 s; the same refusal in-process: the manifests' and the foreign folders' tests
def test_train_refuses_to_generate_into_a_nuscenes_root_it_did_not_make(tmp_path):
    """The process as a user runs it: exit status 2, one line on stderr naming the folder, the folder untouched."""
    data = tmp_path / "nuscenes"
    plant_nuscenes(data)
    before = tree(data)
    done = subprocess.run([sys.executable, "-m", "drivetrain.cli.main", *_train_argv(data, tmp_path / "run")],
                          env=cli_env(), capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert line.startswith("drivetrain train: config error: data.args: synthetic: ") and line.count(str(data)) == 1
    assert f"{data}: is not empty and holds no synthetic dataset of drivetrain (no drivetrain_synth.json)" in line
    assert tree(data) == before
    assert [p.name for p in tmp_path.iterdir()] == ["nuscenes"]  # nothing made beside it, not even the run


@pytest.mark.parametrize(
    "manifest", ['{"version": "v1.0-mini"}', "[1, 2]", '{"version": "v1.0-mini", "seed": 0, "scenes": "x"}']
)
def test_train_refuses_a_manifest_that_is_not_the_generators(tmp_path, capsys, manifest):
    data = tmp_path / "data"
    plant_nuscenes(data)
    (data / MANIFEST).write_text(manifest)
    before = tree(data)
    assert main(_train_argv(data, tmp_path / "run")) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{data / MANIFEST}: is not a drivetrain synthetic dataset's settings" in line
    assert tree(data) == before


def test_train_generates_into_a_new_or_empty_folder_and_over_its_own_unfinished_set(tmp_path, capsys):
    empty, unfinished = tmp_path / "empty", tmp_path / "unfinished"
    empty.mkdir()
    plant_unfinished(unfinished)
    (unfinished / "notes.txt").write_bytes(MINE)  # a file of the user's beside the killed generation
    for data in (empty, unfinished, tmp_path / "new" / "data"):
        assert main(_train_argv(data, tmp_path / f"run-{data.name}")) == 0, capsys.readouterr().err
        assert folder_state(data)[0] == "complete" and (data / "drivetrain_index.npz").is_file()
    assert (unfinished / "notes.txt").read_bytes() == MINE
    assert data_files(unfinished) == listed(unfinished)  # no file of the killed set stayed behind
    # A finished set with the same settings is reused (nothing written), one with others is refused by name.
    before = tree(empty)
    assert main(_train_argv(empty, tmp_path / "run-again")) == 0
    assert tree(empty) == before
    other = [*_train_argv(empty, tmp_path / "run-seed"), "data.args.seed=7"]
    capsys.readouterr()  # the generations' progress bars
    assert main(other) == 2
    assert "seed: the data has 0, asked for 7" in one_line(capsys.readouterr().err)
    assert tree(empty) == before


def test_a_config_cannot_ask_for_generation(tmp_path, capsys):
    assert main([*_train_argv(tmp_path / "data", tmp_path / "run"), "data.args.generate=true"]) == 2
    assert "data.args.generate" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------- reading a run never generates


@pytest.fixture(scope="module")
def lidar_run(tmp_path_factory) -> tuple[Path, Path]:
    """A finished PointPillars (tiny) run of 2 steps on a synthetic set train generated; (run, its data root)."""
    tmp = tmp_path_factory.mktemp("run-of-someone")
    run, data = tmp / "run", tmp / "data"
    args = json.dumps({"root": str(data), "size": "tiny", **DATA, "split": "mini_train", "load_images": False,
                       "load_points": True, "num_sweeps": 1, "use_dim": [0, 1, 2, 4]})  # fmt: skip
    argv = ["train", "--config", str(ROOT / "configs" / "pointpillars_tiny.yaml"), f"run.out_dir={run}", *QUIET,
            f"data.args={args}", "train.steps=2", "checkpoint.every=2", "train.device=cpu"]  # fmt: skip
    assert main(argv) == 0
    return run, data


READERS = {
    "eval": ["eval", "--checkpoint", "RUN", "--device", "cpu"],
    "viz": ["viz", "frame", "--checkpoint", "RUN", "--frame", "0"],
    "doctor": ["doctor", "RUN", "--steps", "1", "--warmup", "1"],
}


def _swap_data(data: Path, kind: str) -> None:
    """Replace the run's data root with what a colleague's machine may hold at that path."""
    import shutil

    shutil.rmtree(data, ignore_errors=True)
    if kind == "nuscenes":
        plant_nuscenes(data)
    elif kind == "unfinished":
        plant_unfinished(data)
    else:
        assert kind == "missing"


@pytest.mark.parametrize("kind", ["nuscenes", "missing", "unfinished"])
@pytest.mark.parametrize("command", list(READERS))
def test_reading_a_run_never_generates_its_data(lidar_run, command, kind, capsys, tmp_path, monkeypatch):
    run, data = lidar_run
    monkeypatch.chdir(tmp_path)  # where viz frame would write its default frame-0.png
    _swap_data(data, kind)
    before_data, before_run = tree(data), tree(run)
    argv = [str(run) if word == "RUN" else word for word in READERS[command]]
    with pytest.raises(SystemExit) as err:
        main(argv)
    line = one_line(str(err.value))
    if kind == "unfinished":
        assert f"{data}: holds an unfinished synthetic dataset" in line
    else:
        assert f"{data}: holds no synthetic dataset (no drivetrain_synth.json)" in line
    assert "this command reads data without generating it; make it with `drivetrain data synth --out" in line
    assert tree(data) == before_data and tree(run) == before_run
    if kind == "missing":
        assert not data.exists()
    assert not any(tmp_path.iterdir())
    capsys.readouterr()


def test_the_data_synth_command_a_refusal_names_makes_the_data_the_run_reads(lidar_run, tmp_path, capsys):
    run, data = lidar_run
    _swap_data(data, "missing")
    with pytest.raises(SystemExit) as err:
        main(["eval", "--checkpoint", str(run), "--device", "cpu"])
    command = re.search(r"`drivetrain (data synth [^`]*)`", str(err.value))[1]
    assert main([*shlex.split(command), "--quiet"]) == 0
    before = tree(data)  # a finished set without an index, as data synth leaves it
    assert main(["eval", "--checkpoint", str(run), "--device", "cpu", "--out", str(tmp_path / "e")]) == 0
    assert (tmp_path / "e" / "results.json").is_file()
    assert tree(data) == before  # indexed in memory: nothing written into the data root
    capsys.readouterr()


# ---------------------------------------------------------------- a killed data synth is recovered, not refused


@pytest.mark.parametrize("overwrite", [False, True])
def test_after_a_killed_data_synth_the_rerun_and_overwrite_recover(tmp_path, capsys, overwrite):
    root = tmp_path / "data"
    plant_unfinished(root, TINY.with_overrides(samples_per_scene=3))  # a larger set, killed before its tables
    (root / "notes.txt").write_bytes(MINE)
    (root / "samples" / "CAM_FRONT" / "mine.jpg").write_bytes(MINE)
    argv = ["data", "synth", "--out", str(root), *SMALL, *(["--overwrite"] if overwrite else [])]
    assert main(argv) == 0
    assert "holds an unfinished synthetic dataset (its generation was stopped); replacing it" in capsys.readouterr().out
    assert folder_state(root)[0] == "complete"
    assert data_files(root) == listed(root) | {"samples/CAM_FRONT/mine.jpg"}  # no file of the killed set stayed
    assert (root / "notes.txt").read_bytes() == MINE and (root / "samples/CAM_FRONT/mine.jpg").read_bytes() == MINE
    assert main(["data", "index", "--root", str(root), "--quiet"]) == 0


@pytest.mark.slow  # ~3.5 s; the killed set's recovery in-process: the test above
def test_a_data_synth_killed_while_writing_is_recovered_by_the_rerun(tmp_path):
    """A real kill: SIGKILL a `data synth` once it has written images; the folder is ours, unfinished, and the rerun
    finishes it (the same files as an uninterrupted run)."""
    root, whole = tmp_path / "data", tmp_path / "whole"
    argv = [sys.executable, "-m", "drivetrain.cli.main", "data", "synth", "--out", str(root), "--scenes", "4",
            "--frames-per-scene", "3", "--image-size", "96x54", "--quiet"]  # fmt: skip
    child = subprocess.Popen(argv, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any((root / "samples").rglob("*.jpg")) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=20)
    assert child.returncode == -signal.SIGKILL, "data synth finished before it could be killed"
    assert folder_state(root)[0] == "unfinished"
    rerun = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert main(["data", "synth", "--out", str(whole), *argv[7:]]) == 0
    digest = {k: v[:2] for k, v in tree(root).items() if k not in (".", ".generate.lock")}
    assert digest == {k: v[:2] for k, v in tree(whole).items() if k not in (".", ".generate.lock")}


def test_a_foreign_manifest_or_a_foreign_folder_still_refuses(tmp_path):
    for overwrite in ([], ["--overwrite"]):
        folder = tmp_path / f"nuscenes{len(overwrite)}"
        plant_nuscenes(folder)
        before = tree(folder)
        with pytest.raises(SystemExit) as err:
            main(["data", "synth", "--out", str(folder), *SMALL, *overwrite])
        assert f"{folder} is not empty and holds no synthetic dataset (no drivetrain_synth.json)" in one_line(
            str(err.value)
        )
        assert tree(folder) == before
        (folder / MANIFEST).write_text('{"version": "v1.0-mini", "seed": 0, "scenes": ["x"], "complete": false}')
        before = tree(folder)
        with pytest.raises(SystemExit) as err:
            main(["data", "synth", "--out", str(folder), *SMALL, *overwrite])
        assert f"{folder / MANIFEST}: is not a drivetrain synthetic dataset's settings" in one_line(str(err.value))
        assert tree(folder) == before


def test_a_finished_set_still_needs_overwrite(tmp_path):
    root = tmp_path / "data"
    assert main(["data", "synth", "--out", str(root), *SMALL]) == 0
    before = tree(root)
    with pytest.raises(SystemExit, match="is not empty; pass --overwrite"):
        main(["data", "synth", "--out", str(root), *SMALL])
    assert tree(root) == before


def test_data_synth_refuses_a_folder_another_process_is_generating_into(tmp_path):
    from drivetrain.data.synth.manifest import generation_lock

    root = tmp_path / "data"
    plant_unfinished(root)
    code = (
        "import sys\nfrom pathlib import Path\nfrom drivetrain.data.synth.manifest import generation_lock\n"
        f"with generation_lock(Path({str(root)!r})):\n    print('held', flush=True)\n    sys.stdin.read()\n"
    )
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    holder = subprocess.Popen([sys.executable, "-c", code], env=cli_env(), **pipes)
    try:
        assert holder.stdout.readline() == "held\n"
        before = tree(root)
        with pytest.raises(SystemExit) as err:
            main(["data", "synth", "--out", str(root), *SMALL])
        assert f"{root}: another process is generating the synthetic dataset here now" in one_line(str(err.value))
        assert tree(root) == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=20)
    with generation_lock(root, wait=False):  # released with its holder
        pass


# ---------------------------------------------------------------- what the removal finds from the settings


def test_the_names_the_generator_writes_are_recognised_from_its_settings(tmp_path):
    """Every data file the tables list, and nothing else, is a generated name for the settings (both flavours);
    other settings claim fewer of them."""
    from drivetrain.data.formats.lyft.synth import LYFT_SYNTH_SCENES
    from drivetrain.data.formats.registry import FORMATS

    for dataset, config in (("nuscenes", TINY), ("lyft", TINY.with_overrides(scenes=LYFT_SYNTH_SCENES[:3]))):
        root = tmp_path / dataset
        generate(root, config, progress=False, synth_format=FORMATS[dataset].synth)
        made = listed(root, json.loads((root / MANIFEST).read_text())["version"])
        files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
        assert {f for f in files if f in GeneratedNames(config, FORMATS[dataset].synth)} == made
        fewer = GeneratedNames(config.with_overrides(samples_per_scene=1), FORMATS[dataset].synth)
        assert len({f for f in made if f in fewer}) == 1 + len(config.scenes) * (6 + 1 + config.sweeps_per_sample)
        # Without the first scene the others start an hour earlier: none of their files is named the same.
        shifted = GeneratedNames(config.with_overrides(scenes=config.scenes[1:]), FORMATS[dataset].synth)
        assert {f for f in made if f in shifted} == {f for f in made if f.startswith("maps/")}


# ---------------------------------------------------------------- data inspect


def test_inspect_with_more_slots_than_scenes_is_one_line(synth_root, synth_index, tmp_path):
    before = tree(synth_root)
    with pytest.raises(SystemExit) as err:
        main(["data", "inspect", "--index", str(synth_root / "drivetrain_index.npz"), "--split", "mini_val",
              "--batch-size", "5"])  # fmt: skip
    line = one_line(str(err.value))
    assert line == (
        "data inspect: --batch-size: 5 slots need as many scenes (one each), but split 'mini_val' has 2; "
        "pass --batch-size 2 or less"
    )
    assert tree(synth_root) == before


# ---------------------------------------------------------------- a hostile manifest: one line, bounded


def _limited() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("fifo", "not a regular file"),  # the default set's; the others ~1.5 s each
        pytest.param("deep", "nested too deeply", marks=pytest.mark.slow),
        pytest.param("huge", f"{(2 << 20) + 2} bytes, more than 1048576", marks=pytest.mark.slow),
        pytest.param("dangling", "a link to nothing", marks=pytest.mark.slow),
    ],
)
def test_a_hostile_manifest_is_one_line_in_bounded_time_and_memory(tmp_path, capsys, kind, why):
    """``data synth --overwrite`` and ``train`` read the manifest of the folder they are given: a FIFO does not
    block them, deep nesting or a large file does not exhaust the stack or memory (3 GiB address space)."""
    root = tmp_path / "data"
    plant_nuscenes(root)
    manifest = root / MANIFEST
    if kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "deep":
        manifest.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "huge":
        manifest.write_text('"' + "x" * (2 << 20) + '"')
    else:
        manifest.symlink_to(tmp_path / "nothing")
    before = tree(root)
    message = f"{manifest}: is not a drivetrain synthetic dataset's settings ({why})"
    done = subprocess.run([sys.executable, "-m", "drivetrain.cli.main", "data", "synth", "--out", str(root), *SMALL,
                           "--overwrite"], env=cli_env(), capture_output=True, text=True, timeout=20, check=False,
                          preexec_fn=_limited)  # fmt: skip
    assert done.returncode == 1 and message in one_line(done.stderr), done.stderr
    assert tree(root) == before
    if kind != "fifo":  # the same reader under train, in this process (a FIFO is not opened: see above)
        capsys.readouterr()
        assert main(_train_argv(root, tmp_path / "run")) == 2
        assert message in one_line(capsys.readouterr().err)
        assert tree(root) == before and not (tmp_path / "run").exists()
