"""A detector added as a plugin, in one file (tests/plugins/slot_detector.py: spec, model, criterion), goes through
the whole loop on the command line — trains, checkpoints, resumes exactly, is scored by ``drivetrain eval`` — with
no file of drivetrain changed: the plugin is copied alone into an empty folder on ``PYTHONPATH`` and named with
``--plugin``; drivetrain's own sources are the same before and after."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml

import drivetrain
from helpers.engine import assert_same_weights, final_state, metrics

PLUGIN = Path(__file__).parent / "plugins" / "slot_detector.py"
SOURCE = Path(drivetrain.__file__).resolve().parent


def _sources() -> dict[str, str]:
    return {str(p.relative_to(SOURCE)): hashlib.sha256(p.read_bytes()).hexdigest() for p in SOURCE.rglob("*.py")}


def _config(path: Path, index: Path) -> Path:
    cfg = {
        "run": {"seed": 0, "threads": 1, "deterministic": True},
        "model": {"name": "slots", "args": {"num_slots": 8, "width": 16}},
        "data": {
            "name": "frames",
            "args": {"index": str(index), "split": "mini_train", "load_images": False, "load_points": True},
            "batch_size": 2,
            "num_workers": 0,
        },
        "train": {"steps": 4, "device": "cpu"},
        "optim": {"lr": 1.0e-3},
        "schedule": {"total_steps": 40},  # fixed, so a run stopped at step 2 has the same lr curve
        "checkpoint": {"every": 2, "keep": 4},
        "log": {"every": 1, "tensorboard": False, "progress": False},
        "eval": {"every": 0, "split": "mini_val"},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cli(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "drivetrain.cli.main", *argv], capture_output=True, text=True, env=env, timeout=600
    )


def test_a_one_file_detector_plugin_trains_resumes_exactly_and_is_evaluated(synth_index, synth_root, tmp_path):
    before = _sources()
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(PLUGIN, site / PLUGIN.name)  # the plugin alone: nothing else of it exists anywhere
    config = _config(tmp_path / "slots.yaml", synth_root / "drivetrain_index.npz")
    plugin = ["--plugin", PLUGIN.stem]

    whole, split = tmp_path / "whole", tmp_path / "split"
    done = _cli(site, "train", *plugin, "--config", str(config), f"run.out_dir={whole}")
    assert done.returncode == 0, done.stderr
    first = _cli(site, "train", *plugin, "--config", str(config), f"run.out_dir={split}", "train.steps=2")
    assert first.returncode == 0, first.stderr
    resumed = _cli(site, "train", *plugin, "--config", str(config), f"run.out_dir={split}", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr

    a, b = final_state(whole), final_state(split)
    assert_same_weights(a["model"], b["model"])  # bit for bit: the resumed run continued exactly
    losses = {m["step"]: m["loss"] for m in metrics(whole) if "loss" in m}
    resumed_losses = {m["step"]: m["loss"] for m in metrics(split) if "loss" in m}
    assert sorted(losses) == [1, 2, 3, 4] and losses == resumed_losses
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    saved = yaml.safe_load((whole / "config.yaml").read_text())
    assert saved["model"]["name"] == "slots" and saved["model"]["args"]["num_slots"] == 8

    scored = _cli(
        site, "eval", *plugin, "--checkpoint", str(whole), "--device", "cpu", "--json", str(tmp_path / "e.json")
    )
    assert scored.returncode == 0, scored.stderr
    summary = json.loads((tmp_path / "e.json").read_text())
    assert 0.0 <= summary["mAP"] <= 1.0 and "AP/car" in summary, summary
    refused = _cli(site, "eval", "--checkpoint", str(whole), "--device", "cpu")  # only the plugin knows the name
    assert refused.returncode != 0 and "unknown model 'slots'" in refused.stderr and "Traceback" not in refused.stderr

    assert _sources() == before  # no file of drivetrain was changed (or written) to add the detector
