"""``drivetrain doctor`` names the right cause on runs made deliberately data-bound (a dataset that sleeps per
sample), loss-bound (a model whose loss sleeps) and memory-heavy (a budget below the run's peak), each with the
switch that addresses it and the numbers behind it; a plain run gets neither of the first two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drivetrain import doctor
from drivetrain.cli.main import main
from drivetrain.engine import Trainer, load_config
from helpers import doctor_cases  # noqa: F401 - registers slow-data and slow-loss
from helpers.engine import FAST, SMOKE

SMALL = ["train.steps=6", "checkpoint.every=6", "data.batch_size=4", "data.args.num_samples=64"]


def _run(path: Path, *extra: str) -> Path:
    Trainer(load_config(SMOKE, [f"run.out_dir={path}", *FAST, *SMALL, *extra])).fit()
    return path


def _kinds(run: Path, *args: str) -> dict[str, dict]:
    assert main(["doctor", str(run), "--steps", "3", "--warmup", "1", *args]) == 0
    report = json.loads((run / "doctor.json").read_text())
    assert (run / "doctor.md").is_file()
    return {f["kind"]: f for f in report["findings"]}


def test_a_data_bound_run_is_named_with_the_loader_switches(tmp_path):
    run = _run(tmp_path / "data", "data.name=slow-data", "data.args.delay_s=0.02",
               "data.args.seed=0")  # fmt: skip
    kinds = _kinds(run)
    assert "data-bound" in kinds and "loss-bound" not in kinds
    switches = " ".join(kinds["data-bound"]["switches"])
    assert "data.num_workers" in switches and "drivetrain tune loader" in switches
    summary = doctor.run_summary(run)
    assert summary["data_share"] >= 0.2  # 4 samples × 20 ms of sleep per step, against a ~10 ms model step


def test_a_loss_bound_run_is_named_with_its_share(tmp_path):
    run = _run(tmp_path / "loss", "model.name=slow-loss", "model.args.delay_s=0.05")
    kinds = _kinds(run)
    assert "loss-bound" in kinds and "data-bound" not in kinds
    window = json.loads((run / "doctor.json").read_text())["window"]
    assert window["parts"]["loss"] >= 50 and window["parts"]["loss"] / window["step_ms"] >= 0.25


def test_a_memory_heavy_run_is_named_against_its_budget_and_a_plain_run_is_not_bound(tmp_path):
    run = _run(tmp_path / "plain", "model.args.width=64", "data.args.size=32")  # compute well above the loading
    peak = doctor.run_summary(run)["peak_memory_mb"]
    kinds = _kinds(run, "--memory-budget-mb", str(peak / 0.9))
    assert "memory-heavy" in kinds and "activation_checkpointing" in " ".join(kinds["memory-heavy"]["switches"])
    assert "precision.mode=bf16" in " ".join(kinds["memory-heavy"]["switches"])  # an fp32 run
    relaxed = _kinds(run, "--memory-budget-mb", str(peak * 100))
    assert "memory-heavy" not in relaxed and "data-bound" not in relaxed and "loss-bound" not in relaxed
    assert "network-bound" in relaxed


def test_doctor_names_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(SystemExit, match="metrics"):
        main(["doctor", str(tmp_path)])
