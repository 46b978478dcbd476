"""No write and no delete reaches through a symbolic link (issue 39, class 2; docs/safety.md).

Two rules, one helper each (``drivetrain.safeio.files``), used by every writer:

- a link (or a FIFO) at the name of a file drivetrain writes is *replaced* by the new file — the link itself, never
  its target — whether the user named the file (``--png``, ``--ply``, ``--json``, ``--write-config``, ``--md``,
  ``--out``) or drivetrain picked it (``frame-K.png``, ``RUN/eval/.../metrics_summary.json``, a synthetic
  dataset's JPEG);
- a folder drivetrain writes into or deletes from below a folder the user named (``RUN/checkpoints`` and its
  ``corrupt``/``superseded``, ``RUN/eval`` and ``RUN/eval/step-N-SPLIT``, ``RUN/tensorboard``, a report's
  ``report-vs-...``, a metrics folder named after a predictions file) is *refused* when it is a link: one line
  naming it, an exit status, and nothing written, moved or deleted anywhere.

Every test plants the link at the name pointing at a file or folder elsewhere, and checks the outcome, that the
target is byte for byte what it was, and that nothing outside the named outputs was created, changed or deleted
(:func:`tree` snapshots: kinds, sizes, content digests, link targets and mtimes, folders' included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain.cli.main import main
from drivetrain.engine import Checkpointer
from drivetrain.engine.checkpoint import CheckpointError
from drivetrain.engine.resume import RUN_FOLDERS
from drivetrain.safeio.files import (
    LINKED,
    LinkedFolderError,
    open_output,
    real_dir,
    save_figure,
    staged_outputs,
    write_inside,
)
from helpers.engine import SMOKE, overrides
from helpers.refusals import one_line
from helpers.trees import tree

ROOT = Path(__file__).resolve().parents[1]
VICTIM = b"someone else's file\n"
QUIET = ["run.threads=1", "log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.at_start=false"]


def victim_file(folder: Path, name: str = "victim") -> Path:
    """A file of someone else's, outside every output, that a link will point at."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(VICTIM)
    return path


def other_folder(folder: Path) -> Path:
    """A folder of someone else's with files in it (another run's results, a user's folder)."""
    (folder / "sub").mkdir(parents=True)
    (folder / "results.json").write_bytes(VICTIM)
    (folder / "sub" / "notes.txt").write_bytes(VICTIM)
    return folder


def replaced(path: Path) -> bool:
    """``path`` is now a regular file of ours (not the link that was planted there)."""
    return path.is_file() and not path.is_symlink()


# ---------------------------------------------------------------- the helpers


def test_open_output_replaces_a_link_at_the_name_and_leaves_its_target(tmp_path):
    victim = victim_file(tmp_path / "elsewhere")
    outside = tree(tmp_path / "elsewhere")
    (tmp_path / "out").mkdir()
    for mode, name in (("w", "log.txt"), ("a", "metrics.jsonl"), ("ab", "x.bin"), ("a+", "lock")):
        (tmp_path / "out" / name).symlink_to(victim)
        with open_output(tmp_path / "out" / name, mode) as f:
            f.write(b"ours" if "b" in mode else "ours")
        assert replaced(tmp_path / "out" / name) and (tmp_path / "out" / name).read_text() == "ours", mode
    (tmp_path / "out" / "dangling").symlink_to(tmp_path / "elsewhere" / "missing")  # would be created
    with open_output(tmp_path / "out" / "dangling") as f:
        f.write("ours")
    assert replaced(tmp_path / "out" / "dangling")
    assert tree(tmp_path / "elsewhere") == outside and victim.read_bytes() == VICTIM


def test_open_output_replaces_a_fifo_at_the_name_without_blocking(tmp_path):
    """A FIFO nobody reads would block a plain open for writing forever: in a subprocess with a hard timeout."""
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    code = "import sys; from drivetrain.safeio.files import open_output; open_output(sys.argv[1], 'a').write('ours')"
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert replaced(fifo) and fifo.read_text() == "ours"


def test_real_dir_refuses_a_linked_folder_below_the_named_one_and_makes_nothing_beneath_it(tmp_path):
    other = other_folder(tmp_path / "other")
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval").symlink_to(other, target_is_directory=True)
    before = tree(tmp_path)
    with pytest.raises(LinkedFolderError) as err:
        real_dir(run / "eval" / "step-2-mini_val", base=run, create=True)
    assert one_line(str(err.value)) == f"{run / 'eval'}: {LINKED}"
    assert err.value.filename == str(run / "eval")
    assert tree(tmp_path) == before  # no step-2-mini_val in the other folder
    # the folder the user named may itself be a link (to a larger disk): only what lies below it is checked
    (tmp_path / "named").symlink_to(other, target_is_directory=True)
    assert real_dir(tmp_path / "named" / "made", base=tmp_path / "named", create=True).is_dir()
    assert (other / "made").is_dir() and not (other / "made").is_symlink()
    with pytest.raises(NotADirectoryError):
        real_dir(other / "results.json" / "x", base=other, create=True)


def test_write_inside_replaces_a_linked_file_and_refuses_a_linked_folder(tmp_path):
    victim, other = victim_file(tmp_path / "elsewhere"), other_folder(tmp_path / "other")
    root = tmp_path / "data"
    (root / "samples").mkdir(parents=True)
    (root / "samples" / "a.jpg").symlink_to(victim)
    (root / "sweeps").symlink_to(other, target_is_directory=True)
    outside = tree(tmp_path / "elsewhere"), tree(other)
    assert write_inside(root, "samples/a.jpg", b"ours").read_bytes() == b"ours"
    assert replaced(root / "samples" / "a.jpg")
    assert write_inside(root, "maps/new/m.png", b"png").read_bytes() == b"png"  # folders made as it goes
    with pytest.raises(LinkedFolderError, match=f"^{root / 'sweeps'}: a symbolic link"):
        write_inside(root, "sweeps/LIDAR_TOP/x.bin", b"ours")
    assert (tree(tmp_path / "elsewhere"), tree(other)) == outside


def test_staged_outputs_rename_a_writers_own_files_over_links_at_their_names(tmp_path):
    """What the nuScenes devkit does (plain ``open`` of its metric files in the folder it is given), planted."""
    victim = victim_file(tmp_path / "elsewhere")
    out = tmp_path / "eval"
    out.mkdir()
    for name in ("metrics_summary.json", "metrics_details.json"):
        (out / name).symlink_to(victim)
    (out / "notes.txt").write_bytes(VICTIM)  # someone's file beside the outputs: kept as it is
    outside = tree(tmp_path / "elsewhere")
    with staged_outputs(out) as stage:
        assert list(stage.iterdir()) == [] and stage.parent == out
        for name in ("metrics_summary.json", "metrics_details.json"):
            with open(stage / name, "w") as f:  # plain open, as the devkit writes
                json.dump({"name": name}, f)
        (stage / "plots").mkdir()  # the devkit's empty plots/: not moved
    for name in ("metrics_summary.json", "metrics_details.json"):
        assert replaced(out / name) and json.loads((out / name).read_text()) == {"name": name}
    assert sorted(p.name for p in out.iterdir()) == ["metrics_details.json", "metrics_summary.json", "notes.txt"]
    assert tree(tmp_path / "elsewhere") == outside
    before = tree(out)
    with pytest.raises(RuntimeError), staged_outputs(out) as stage:  # a failing writer: out stays as it was
        (stage / "metrics_summary.json").write_text("half")
        raise RuntimeError("the devkit failed")
    del before["."]  # (the folder's own mtime records the staging folder made and removed in it)
    assert {k: v for k, v in tree(out).items() if k != "."} == before


def test_save_figure_replaces_a_link_and_adds_no_suffix(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    victim = victim_file(tmp_path / "elsewhere")
    (tmp_path / "chart.png").symlink_to(victim)
    fig = plt.figure(figsize=(1, 1))
    save_figure(fig, tmp_path / "chart.png")
    save_figure(fig, tmp_path / "chart")  # savefig(path) would have written chart.png
    plt.close(fig)
    assert replaced(tmp_path / "chart.png") and (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "chart").read_bytes().startswith(b"\x89PNG") and victim.read_bytes() == VICTIM


# ---------------------------------------------------------------- run directories: checkpoints, resume, pruning


def _train(out: Path, *extra: str, resume: str | None = None) -> int:
    argv = ["train", "--config", str(SMOKE), *overrides(out, "train.steps=2", "checkpoint.every=1", *extra)]
    return main([*argv, *(["--resume", resume] if resume else [])])


@pytest.fixture
def two_runs(tmp_path) -> tuple[Path, Path]:
    """Run ``a`` (someone else's, committed checkpoints and a file of the user's among them) and run ``b``."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert _train(a, "checkpoint.keep=5") == 0
    assert _train(b, "checkpoint.keep=1") == 0
    (a / "checkpoints" / "notes.txt").write_bytes(VICTIM)
    (a / "checkpoints" / "step-00000007").mkdir()  # uncommitted: a prune in this folder would delete it
    return a, b


@pytest.mark.parametrize("folder", RUN_FOLDERS)
def test_resume_refuses_a_linked_folder_of_the_run_and_touches_nothing(two_runs, tmp_path, capsys, folder):
    a, b = two_runs
    target = a / "checkpoints" if folder == "checkpoints" else other_folder(tmp_path / "other")
    link = b / folder
    remove = shutil.rmtree if link.is_dir() else (lambda p: None)
    remove(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)
    capsys.readouterr()
    before = tree(tmp_path)
    assert _train(b, "train.steps=4", "checkpoint.keep=1", resume="auto") == 2
    line = one_line(capsys.readouterr().err)
    assert line == f"drivetrain train: config error: run.out_dir: {link} is {LINKED}"
    assert tree(tmp_path) == before  # no lock, no metrics, no checkpoint written; nothing pruned or moved


def test_a_fresh_train_into_a_run_with_a_linked_checkpoints_folder_is_refused(two_runs, tmp_path, capsys):
    a, b = two_runs
    shutil.rmtree(b / "checkpoints")
    (b / "checkpoints").symlink_to(a / "checkpoints", target_is_directory=True)
    before = tree(tmp_path)
    assert _train(b, "checkpoint.keep=1") == 2
    assert f"run.out_dir: {b / 'checkpoints'} is a symbolic link" in one_line(capsys.readouterr().err)
    assert tree(tmp_path) == before


def test_the_checkpointer_refuses_to_save_prune_or_move_aside_in_a_linked_folder(two_runs, tmp_path):
    a, b = two_runs
    outside = tree(a)
    linked = Checkpointer(tmp_path / "c" / "checkpoints", keep=1)
    linked.root.parent.mkdir()
    linked.root.symlink_to(a / "checkpoints", target_is_directory=True)
    for call in (lambda: linked.save(9, {"w": 9}), linked.prune):
        with pytest.raises(CheckpointError) as err:
            call()
        assert one_line(str(err.value)) == (
            f"not writing or deleting checkpoints in {linked.root}: {LINKED}; nothing was saved, deleted or moved"
        )
    own = Checkpointer(b / "checkpoints", keep=1)
    (b / "checkpoints" / "corrupt").symlink_to(tmp_path / "other", target_is_directory=True)
    other_folder(tmp_path / "other")
    before = tree(tmp_path)
    with pytest.raises(CheckpointError, match=f"in {b / 'checkpoints' / 'corrupt'}: a symbolic link"):
        own.set_aside(own.committed()[-1][1], "corrupt")
    assert tree(tmp_path) == before and tree(a) == outside


# ---------------------------------------------------------------- eval outputs


@pytest.fixture(scope="module")
def lidar_run(synth_root, synth_index, tmp_path_factory) -> Path:
    """PointPillars (tiny) after 2 steps, score threshold 0 (detections on every frame)."""
    out = tmp_path_factory.mktemp("pointpillars")
    data = {"index": str(synth_root / "drivetrain_index.npz"), "split": "mini_train", "load_images": False,
            "load_points": True, "num_sweeps": 1, "use_dim": [0, 1, 2, 4]}  # fmt: skip
    argv = ["train", "--config", str(ROOT / "configs" / "pointpillars_tiny.yaml"), f"run.out_dir={out}", *QUIET,
            "data.name=frames", f"data.args={json.dumps(data)}", "data.batch_size=2", "train.steps=2",
            "checkpoint.every=2", "train.device=cpu",
            'model.args.decode={"score_threshold": 0.0, "max_num": 20}']  # fmt: skip
    assert main(argv) == 0
    return out


@pytest.fixture
def run_copy(lidar_run, tmp_path) -> Path:
    """A private copy of the trained run, to plant links in."""
    return Path(shutil.copytree(lidar_run, tmp_path / "run", symlinks=True))


@pytest.mark.parametrize("linked", ["eval", "eval/step-00000002-mini_val"])
def test_eval_checkpoint_refuses_a_linked_eval_folder_and_keeps_the_other_runs_results(
    run_copy, tmp_path, capsys, linked
):
    other = other_folder(tmp_path / "other-run-eval")
    (run_copy / linked).parent.mkdir(parents=True, exist_ok=True)
    (run_copy / linked).symlink_to(other, target_is_directory=True)
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["eval", "--checkpoint", str(run_copy), "--device", "cpu"])
    assert one_line(str(err.value)) == f"eval: not writing into {run_copy / linked}: {LINKED}"
    assert tree(tmp_path) == before  # refused before predicting: nothing written in the run or the other folder


def test_eval_checkpoint_replaces_links_planted_at_its_result_names(run_copy, tmp_path, capsys):
    victim = victim_file(tmp_path / "elsewhere")
    out = run_copy / "eval" / "step-00000002-mini_val"
    out.mkdir(parents=True)
    names = ("results.json", "metrics_summary.json", "metrics_details.json")
    for name in names:
        (out / name).symlink_to(victim)
    outside = tree(tmp_path / "elsewhere")
    assert main(["eval", "--checkpoint", str(run_copy), "--device", "cpu"]) == 0
    for name in names:
        assert replaced(out / name), name
        json.loads((out / name).read_text())  # the devkit's own file, renamed over the link
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no staging folder left
    assert tree(tmp_path / "elsewhere") == outside


def test_eval_predictions_refuses_a_linked_default_metrics_folder(synth_root, synth_index, tmp_path, capsys):
    predictions = tmp_path / "gt.json"
    argv = ["eval", "--predictions", str(predictions), "--root", str(synth_root)]
    assert main([*argv, "--ground-truth-from", str(synth_root / "drivetrain_index.npz")]) == 0
    shutil.rmtree(tmp_path / "gt_eval")
    other = other_folder(tmp_path / "other")
    (tmp_path / "gt_eval").symlink_to(other, target_is_directory=True)
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert one_line(str(err.value)) == f"eval: not writing the metrics into {tmp_path / 'gt_eval'}: {LINKED}"
    assert tree(tmp_path) == before


def test_evaluation_during_training_writes_its_log_and_metrics_over_links(lidar_run, synth_root, tmp_path):
    """The trainer's periodic evaluation (evaluate_model, quiet): devkit.log and the devkit's metric files."""
    from drivetrain.data.sources import frames
    from drivetrain.engine.eval_run import evaluate_model, model_from_checkpoint

    model, _, _ = model_from_checkpoint(lidar_run)
    dataset = frames(str(synth_root / "drivetrain_index.npz"), str(synth_root), "mini_val", load_points=True,
                     load_images=False, num_sweeps=1, use_dim=[0, 1, 2, 4])  # fmt: skip
    victim = victim_file(tmp_path / "elsewhere")
    out = tmp_path / "run" / "eval" / "step-00000002"
    out.mkdir(parents=True)
    for name in ("devkit.log", "metrics_summary.json", "results.json"):
        (out / name).symlink_to(victim)
    outside = tree(tmp_path / "elsewhere")
    result = evaluate_model(model, dataset, "cpu", out, split="mini_val", progress=False, quiet=True)
    assert "mAP" in result.summary()
    for name in ("devkit.log", "metrics_summary.json", "results.json"):
        assert replaced(out / name), name
    assert "mAP" in (out / "devkit.log").read_text()
    assert tree(tmp_path / "elsewhere") == outside


def test_predict_replaces_a_link_at_out(lidar_run, synth_root, synth_index, tmp_path):
    victim = victim_file(tmp_path / "elsewhere")
    (tmp_path / "p.json").symlink_to(victim)
    argv = ["predict", "--checkpoint", str(lidar_run), "--root", str(synth_root), "--out", str(tmp_path / "p.json")]
    assert main([*argv, "--device", "cpu", "--split", "mini_val", "--quiet"]) == 0
    assert replaced(tmp_path / "p.json") and "results" in json.loads((tmp_path / "p.json").read_text())
    assert victim.read_bytes() == VICTIM


# ---------------------------------------------------------------- viz, report, tune, bench


def test_viz_frame_replaces_links_at_its_default_png_and_at_png_and_ply(synth_root, synth_index, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    victim = victim_file(tmp_path / "elsewhere")
    work = tmp_path / "work"
    work.mkdir()
    for name in ("frame-0.png", "named.png", "named.ply"):
        (work / name).symlink_to(victim)
    outside = tree(tmp_path / "elsewhere")
    monkeypatch.chdir(work)
    argv = ["viz", "frame", "--root", str(synth_root), "--frame", "0", "--no-cameras"]
    assert main(argv) == 0  # the default frame-0.png, in the current folder
    assert main([*argv, "--png", str(work / "named.png"), "--ply", str(work / "named.ply")]) == 0
    for name in ("frame-0.png", "named.png"):
        assert replaced(work / name) and (work / name).read_bytes().startswith(b"\x89PNG"), name
    assert replaced(work / "named.ply") and (work / "named.ply").read_bytes().startswith(b"ply\n")
    assert sorted(p.name for p in work.iterdir()) == ["frame-0.png", "named.ply", "named.png"]
    assert tree(tmp_path / "elsewhere") == outside


def _run_with_metrics(folder: Path) -> Path:
    folder.mkdir(parents=True)
    lines = [{"step": s, "loss": 1.0 / s, "lr": 1e-3, "samples_per_s": 8.0, "step_time_s": 0.2, "data_wait_s": 0.01,
              "peak_memory_mb": 100.0, "loss_scale": 1.0, "skipped_steps": 0} for s in range(1, 6)]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / "config.yaml").write_text("model:\n  name: smoke\ntrain:\n  device: cpu\n")
    return folder


def test_report_of_several_runs_refuses_a_linked_comparison_folder(tmp_path):
    pytest.importorskip("matplotlib")
    a, b = _run_with_metrics(tmp_path / "a"), _run_with_metrics(tmp_path / "b")
    other = other_folder(tmp_path / "other")
    (a / "report-vs-b").symlink_to(other, target_is_directory=True)
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["report", str(a), str(b)])
    line = one_line(str(err.value))
    assert line.startswith(f"report: cannot write {a / 'report-vs-b'} (a symbolic link, not a folder")
    assert tree(tmp_path) == before


def test_tune_loader_replaces_links_at_write_config_and_json(tmp_path, capsys):
    victim = victim_file(tmp_path / "elsewhere")
    for name in ("tuned.yaml", "t.json"):
        (tmp_path / name).symlink_to(victim)
    outside = tree(tmp_path / "elsewhere")
    argv = ["tune", "loader", "--config", str(SMOKE), "--workers", "0", "--steps", "1", "--warmup", "0",
            "--write-config", str(tmp_path / "tuned.yaml"), "--json", str(tmp_path / "t.json"), "model.args.width=8",
            "data.args.num_samples=16", "data.batch_size=4"]  # fmt: skip
    assert main(argv) == 0
    assert replaced(tmp_path / "tuned.yaml") and "num_workers: 0" in (tmp_path / "tuned.yaml").read_text()
    assert replaced(tmp_path / "t.json") and json.loads((tmp_path / "t.json").read_text())["recommended"]
    assert tree(tmp_path / "elsewhere") == outside


def test_bench_results_replace_links_at_json_md_and_png(tmp_path, capsys):
    """The emit path every ``drivetrain bench`` shares: --json, --md and the --png chart."""
    pytest.importorskip("matplotlib")
    from drivetrain.profile import BenchResult, Row, emit

    victim = victim_file(tmp_path / "elsewhere")
    names = ("r.json", "r.md", "r.png")
    for name in names:
        (tmp_path / name).symlink_to(victim)
    outside = tree(tmp_path / "elsewhere")
    result = BenchResult("links", "cpu", {"what": "a test"})
    result.add(Row.from_samples("op", [2.0, 2.5], [1.0, 1.2]))
    args = argparse.Namespace(json=tmp_path / "r.json", md=tmp_path / "r.md", png=tmp_path / "r.png", save=False,
                              device="cpu")  # fmt: skip
    assert emit(result, args) == [tmp_path / name for name in names]
    assert json.loads((tmp_path / "r.json").read_text())["benchmark"] == "links"
    assert (tmp_path / "r.md").read_text().startswith("#") and (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert all(replaced(tmp_path / name) for name in names)
    assert tree(tmp_path / "elsewhere") == outside


# ---------------------------------------------------------------- data synth --overwrite

SMALL = ["--scenes", "1", "--image-size", "64x36", "--quiet"]


def _listed(root: Path) -> set[str]:
    return {r["filename"] for r in json.loads((root / "v1.0-mini" / "sample_data.json").read_text())}


def test_synth_overwrite_replaces_a_link_planted_at_a_name_the_old_tables_omit(tmp_path):
    reference, root = tmp_path / "reference", tmp_path / "data"
    assert main(["data", "synth", "--out", str(reference), *SMALL, "--frames-per-scene", "2"]) == 0
    assert main(["data", "synth", "--out", str(root), *SMALL, "--frames-per-scene", "1"]) == 0
    new = sorted(f for f in _listed(reference) - _listed(root) if f.endswith(".jpg"))  # the second frame's
    victim = victim_file(tmp_path / "elsewhere", "photo.jpg")
    (root / new[0]).symlink_to(victim)  # a name the old set's tables do not list
    outside = tree(tmp_path / "elsewhere")
    assert main(["data", "synth", "--out", str(root), *SMALL, "--frames-per-scene", "2", "--overwrite"]) == 0
    assert replaced(root / new[0]) and (root / new[0]).read_bytes() == (reference / new[0]).read_bytes()
    assert tree(tmp_path / "elsewhere") == outside
