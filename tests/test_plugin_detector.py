"""The detector of docs/design.md ("A new detector"), taken from the page as written — its file ``slots.py``, its
config ``slots.yaml`` (built on a shipped config with ``unset``) and its commands — goes through the whole loop on
the command line with no file of drivetrain changed: it trains, resumes exactly, is scored by ``eval``, predicted,
drawn by ``viz frame`` (its ``detect`` returns plain tensors) and measured by ``bench train`` (predict and bench
train in the slow set). The two files are
written alone into an empty project folder, named with ``--plugin`` and found through ``PYTHONPATH``, as the page
says; the commands get fewer steps and a smaller synthetic set (overrides), nothing else. Beside them, the mistake a
plugin author makes first: a misspelt batch field (a plugin folder left off the import path:
tests/test_engine_registry.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import drivetrain
from helpers.engine import assert_same_weights, final_state, metrics

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
SOURCE = Path(drivetrain.__file__).resolve().parent
# A smaller synthetic set (2 train + 2 val scenes of 3 frames, small images, 1 sweep) and a few steps on one CPU
# thread; the schedule's length is fixed so that a run stopped at step 2 follows the same lr curve as one of 4 steps.
FAST = [
    "data.args.scenes=4", "data.args.frames_per_scene=3", "data.args.image_size=[160,90]",
    "data.args.sweeps_per_sample=1", "train.steps=4", "schedule.total_steps=40", "checkpoint.every=2",
    "checkpoint.keep=4", "eval.every=0", "log.every=1", "log.progress=false", "log.tensorboard=false",
    "run.threads=1", "train.device=cpu",
]  # fmt: skip


def _section() -> str:
    text = DESIGN.read_text()
    start = text.index("## A new detector")
    return text[start : text.index("\n## ", start + 1)]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", _section(), flags=re.S | re.M)


def _file(name: str, language: str) -> str:
    """The fenced block of the section whose first line is ``# NAME ...``."""
    found = [b for b in _blocks(language) if b.startswith(f"# {name} ")]
    assert len(found) == 1, f"docs/design.md, A new detector: one {language} block starting '# {name}', found {found}"
    return found[0]


def _commands() -> dict[str, list[str]]:
    """The section's drivetrain command lines (continuations joined) by their first words (``train``, ``resume``,
    ``eval``, ``predict``, ``viz``, ``bench``), without the leading ``drivetrain``."""
    (block,) = _blocks("bash")
    out: dict[str, list[str]] = {}
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["drivetrain"]:
            name = "resume" if "--resume" in words else words[1]
            out[name] = words[1:]
    assert set(out) == {"train", "resume", "eval", "predict", "viz", "bench"}, out
    return out


def _sources() -> dict[str, str]:
    return {str(p.relative_to(SOURCE)): hashlib.sha256(p.read_bytes()).hexdigest() for p in SOURCE.rglob("*.py")}


def _cli(project: Path, *argv: str, path: bool = True) -> subprocess.CompletedProcess[str]:
    """``drivetrain ARGV`` run in ``project`` as the console script runs it (the current folder off the import path:
    ``python -P``), with ``PYTHONPATH=$PWD`` exported as the page says (unless ``path`` is False)."""
    src = str(REPO / "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(project), src] if path else [src])}
    return subprocess.run(
        [sys.executable, "-P", "-m", "drivetrain.cli.main", *argv],
        capture_output=True, text=True, env=env, cwd=project, timeout=600, check=False,
    )  # fmt: skip


def _write_project(folder: Path, plugin: str) -> Path:
    folder.mkdir()
    (folder / "slots.py").write_text(plugin)
    (folder / "slots.yaml").write_text(_file("slots.yaml", "yaml"))
    shutil.copytree(REPO / "configs", folder / "configs")  # a checkout's configs/, which the config's base names
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The page's project trained by its own commands — runs/slots 4 steps at once, runs/split 2 steps then resumed by
    the page's resume command to 4 — and runs/slots scored by its eval command (into eval/, with e.json)."""
    before = _sources()
    folder = _write_project(tmp_path_factory.mktemp("plugin") / "myproject", _file("slots.py", "python"))
    commands = _commands()
    for argv in (
        [*commands["train"], *FAST],
        [*commands["train"], *FAST, "run.out_dir=runs/split", "train.steps=2"],
        [*commands["resume"], *FAST, "run.out_dir=runs/split"],
        [*commands["eval"], "--out", "eval", "--json", "e.json"],
    ):
        done = _cli(folder, *argv)
        assert done.returncode == 0, f"drivetrain {shlex.join(argv)}:\n{done.stderr}"
    assert _sources() == before  # no file of drivetrain was changed (or written) to add the detector
    return folder


def test_the_pages_detector_trains_with_its_config_and_resumes_exactly(project):
    whole, split = project / "runs" / "slots", project / "runs" / "split"
    assert_same_weights(final_state(whole)["model"], final_state(split)["model"])  # bit for bit
    losses = {m["step"]: m["loss"] for m in metrics(whole) if "loss" in m}
    assert sorted(losses) == [1, 2, 3, 4] and losses == {m["step"]: m["loss"] for m in metrics(split) if "loss" in m}
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    saved = yaml.safe_load((whole / "config.yaml").read_text())
    assert saved["model"] == {**saved["model"], "name": "slots", "args": {"num_classes": 10, "num_slots": 8,
                                                                         "width": 16, "extent": 32.0}}  # fmt: skip
    assert saved["data"]["name"] == "synthetic" and saved["data"]["augment"]["lidar"] is not None  # the base's


def test_eval_scores_it_and_only_with_the_plugin(project):
    summary = json.loads((project / "e.json").read_text())  # the page's eval command, run by the fixture
    assert 0.0 <= summary["mAP"] <= 1.0 and "AP/car" in summary, summary
    argv = _commands()["eval"]
    without = [w for i, w in enumerate(argv) if w != "--plugin" and argv[i - 1] != "--plugin"]
    refused = _cli(project, *without, "--out", "refused")  # only the plugin knows the name
    assert refused.returncode != 0 and "unknown model 'slots'" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.slow  # ~4 s; the plugin's detect: the viz test; predict itself: tests/test_cli_predict.py
def test_predict_writes_a_few_frames_above_a_score_threshold(project):
    argv = _commands()["predict"]
    assert argv[argv.index("--frames") + 1] == "3" and argv[argv.index("--score-threshold") + 1] == "0.3"
    done = _cli(project, *argv)
    assert done.returncode == 0, done.stderr
    look = json.loads((project / argv[argv.index("--out") + 1]).read_text())["results"]
    full = json.loads((project / "eval" / "results.json").read_text())["results"]  # eval's: every frame, every box
    assert list(look) == list(full)[:3]  # the split's first three frames, in scene order
    assert all(len(full[token]) == 8 for token in look)  # num_slots boxes each, below the threshold too
    for token, boxes in look.items():
        assert boxes == [b for b in full[token] if b["detection_score"] >= 0.3]


def test_viz_frame_draws_its_plain_tensor_detections(project):
    argv = _commands()["viz"]
    assert argv[:2] == ["viz", "frame"] and argv[2] == "--plugin"  # --plugin after the sub-action
    drawn = _cli(project, *argv)
    assert drawn.returncode == 0, drawn.stderr
    png = project / argv[argv.index("--png") + 1]
    assert drawn.stdout.strip().endswith(f"wrote {png}") or drawn.stdout.strip().endswith(f"wrote {png.name}")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # ~4 s; the plugin through the commands: train, eval and viz; bench train: tests/test_bench_train.py
def test_bench_train_measures_its_step(project):
    argv = [*_commands()["bench"], *FAST, "--json", "bench.json"]
    assert argv[:3] == ["bench", "train", "--plugin"]  # among the benchmark's own options
    measured = _cli(project, *argv)
    assert measured.returncode == 0, measured.stderr
    data = json.loads((project / "bench.json").read_text())
    assert data["config"]["model"] == "slots" and data["steps"] == 5 and data["warmup"] == 2
    assert data["step_ms"] > 0 and data["kernels_per_step"] > 0


def test_a_misspelt_batch_field_is_one_line_naming_the_plugins_line(project, tmp_path):
    plugin = _file("slots.py", "python")
    assert plugin.count("batch.gt_boxes, batch.gt_labels") == 1
    folder = _write_project(
        tmp_path / "typo", plugin.replace("batch.gt_boxes, batch.gt_labels", "batch.gt_box, batch.gt_labels")
    )
    shutil.copytree(project / "data", folder / "data")  # the generated set, reused (same settings)
    done = _cli(folder, *_commands()["train"], *FAST)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    number = (
        plugin.splitlines().index(next(x for x in plugin.splitlines() if "batch.gt_boxes, batch.gt_labels" in x)) + 1
    )
    head = f"drivetrain train: {folder / 'slots.py'}:{number} in loss: Batch has no field 'gt_box' (did you mean "
    assert line.startswith(f"{head}gt_boxes or gt_boxes_2d?); its fields (drivetrain.batch.Batch): images, "), line
