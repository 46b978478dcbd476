"""``drivetrain doctor`` names the right cause on runs made deliberately data-bound (a dataset that sleeps per
sample), loss-bound (a model whose loss sleeps) and memory-heavy (a budget below the run's peak), each with the
switch that addresses it and the numbers behind it; a plain run gets neither of the first two."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
import torch

from drivetrain.cli import doctor
from drivetrain.cli.main import main
from drivetrain.engine import Trainer, load_config
from drivetrain.engine.stepsplit import LABELS, PARTS
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
    loss = window["parts"]["loss"]["median_ms"]
    assert loss >= 50 and loss / window["step_ms"] >= 0.25


def test_the_profiled_window_is_the_split_bench_train_reports(tmp_path):
    """The doctor's window is :func:`drivetrain.engine.stepsplit.measure_steps`'s split: the same parts, overhead
    share and host syncs in doctor.json, and the same table in doctor.md."""
    run = _run(tmp_path / "plain")
    _kinds(run)
    window = json.loads((run / "doctor.json").read_text())["window"]
    assert tuple(window["parts"]) == doctor.PARTS == (*PARTS, "other")
    parts = {p: window["parts"][p]["median_ms"] for p in doctor.PARTS}
    assert window["overhead_share"] == round(1 - (parts["forward"] + parts["backward"]) / window["step_ms"], 4)
    # --warmup 1 runs 2: the counted step (the last warm-up step) is never the run's first (stepsplit.MIN_WARMUP)
    assert window["data_wait_ms"] == parts["data"] and window["steps"] == 3 and window["warmup"] == 2
    # The CPU counts host reads too: the smoke model's step has the trainer's one, the skip decision.
    assert window["syncs_per_step"] == 1 and window["region_syncs"] == {"step/optimizer": 1}
    report = (run / "doctor.md").read_text()
    for label in LABELS.values():
        assert f"| {label} |" in report
    assert "overhead share = 1 − (forward + backward) / step" in report and "host syncs per step: 1" in report


def test_a_memory_heavy_run_is_named_against_its_budget(tmp_path):
    """Memory only: the run's recorded peak against a budget just above and far above it (no timing involved)."""
    run = _run(tmp_path / "plain")
    peak = doctor.run_summary(run)["peak_memory_mb"]
    kinds = _kinds(run, "--memory-budget-mb", str(peak / 0.9))
    assert "memory-heavy" in kinds and "activation_checkpointing" in " ".join(kinds["memory-heavy"]["switches"])
    assert "precision.mode=bf16" in " ".join(kinds["memory-heavy"]["switches"])  # an fp32 run
    relaxed = _kinds(run, "--memory-budget-mb", str(peak * 100))
    assert "memory-heavy" not in relaxed


def _window(step_ms: float, syncs: int = 1, region_syncs: dict | None = None, **parts: float) -> dict:
    """A profiled window in measure_steps' JSON form with the given part medians (ms)."""
    forward_backward = parts.get("forward", 0.0) + parts.get("backward", 0.0)
    return {"step_ms": step_ms, "parts": {p: {"median_ms": parts.get(p, 0.0)} for p in doctor.PARTS}, "inner_ms": {},
            "overhead_share": 1 - forward_backward / step_ms, "syncs_per_step": syncs, "syncs_source": "counted",
            "region_syncs": region_syncs or {"step/optimizer": 1}, "device": "cpu"}  # fmt: skip


def test_a_run_whose_forward_and_backward_dominate_is_network_bound_and_nothing_else():
    """The plain run's verdict from its numbers (measured ones vary with the machine's load): a small data wait and
    loss share name neither, forward + backward do; at the thresholds the other causes are named instead."""
    summary = {"data_share": 0.05, "data_wait_ms": 1.0, "step_ms": 20.0, "peak_memory_mb": 100.0,
               "config": {"data": {"num_workers": 0}, "model": {}}}  # fmt: skip
    plain = doctor.diagnose(summary, _window(20.0, data=1.0, forward=8.0, loss=2.0, backward=8.0), memory_budget_mb=1e6)
    assert [f.kind for f in plain] == ["network-bound"] and "80%" in plain[0].statement
    loss = doctor.diagnose(summary, _window(20.0, data=1.0, forward=6.0, loss=5.0, backward=7.0), memory_budget_mb=1e6)
    assert [f.kind for f in loss] == ["loss-bound"]  # 25 % of the step
    data = doctor.diagnose(
        {**summary, "data_share": 0.2}, _window(20.0, forward=8.0, backward=8.0), memory_budget_mb=1e6
    )
    assert [f.kind for f in data] == ["data-bound"]


def test_the_batched_loss_advice_is_the_switch_the_models_spec_declares():
    """A loss-bound run on the per-sample path is told its model's switch (the built-in detectors: model.args.impl);
    a model whose spec declares none — a plugin with an ``impl`` argument of its own meaning — is told no switch."""
    window = _window(20.0, data=1.0, forward=6.0, loss=5.0, backward=7.0)
    summary = {"data_share": 0.05, "data_wait_ms": 1.0, "step_ms": 20.0, "peak_memory_mb": 100.0}

    def advice(model: dict) -> tuple[str, ...]:
        config = {"data": {"num_workers": 0}, "model": model}
        (finding,) = doctor.diagnose({**summary, "config": config}, window, memory_budget_mb=1e6)
        assert finding.kind == "loss-bound"
        return finding.switches

    for name in ("streampetr", "pointpillars", "ssn", "focal2d"):
        assert advice({"name": name, "args": {"impl": "reference"}}) == (
            "model.args.impl=batched (the batched loss path)",
        )
        assert "model.args.impl" not in " ".join(advice({"name": name, "args": {"impl": "batched"}}))
    assert "model.args.impl" not in " ".join(advice({"name": "slow-loss", "args": {"impl": "reference"}}))
    assert "model.args.impl" not in " ".join(advice({"name": "smoke", "args": {"impl": "reference"}}))


def test_doctor_names_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(SystemExit, match="metrics"):
        main(["doctor", str(tmp_path)])


@pytest.mark.parametrize(("option", "argv"), [("--warmup", ["--steps", "1", "--warmup", "0"]),
                                             ("--steps", ["--steps", "0", "--warmup", "1"])])  # fmt: skip
def test_a_window_option_out_of_range_is_one_line_naming_it(tmp_path, option, argv):
    run = _run(tmp_path / "run")
    with pytest.raises(SystemExit) as err:
        main(["doctor", str(run), *argv])
    message = str(err.value)
    assert message.startswith(f"doctor: {option} must be ≥ 1") and "\n" not in message
    assert not (run / "doctor.md").exists()


def test_host_syncs_beyond_the_trainers_one_are_named_with_their_regions():
    summary = {"data_share": 0.0, "data_wait_ms": 0.0, "step_ms": 20.0, "peak_memory_mb": 100.0,
               "config": {"data": {"num_workers": 0}, "model": {}}}  # fmt: skip
    parts = {"forward": 8.0, "backward": 8.0}
    reads = {"step/forward/input": 1, "step/loss/assignment": 1, "step/optimizer": 1}
    three = doctor.diagnose(summary, _window(20.0, 3, reads, **parts), memory_budget_mb=1e6)
    syncs = [f for f in three if f.kind == "host-syncs"]
    assert len(syncs) == 1 and "3 host syncs per step" in syncs[0].statement
    assert "step/forward/input 1" in syncs[0].statement and "step/loss/assignment 1" in syncs[0].statement
    one = doctor.diagnose(summary, _window(20.0, 1, **parts), memory_budget_mb=1e6)
    assert "host-syncs" not in [f.kind for f in one]


def test_the_counted_step_is_the_same_whatever_the_warm_up(tmp_path):
    """doctor and bench train count the last warm-up step; a run's first step does one-time work (more kernels, and
    for some models more host reads), so a warm-up of 1 would count that instead: at least 2 run, and the counts of a
    config do not depend on the warm-up asked for."""
    from drivetrain.engine.stepsplit import MIN_WARMUP, measure_steps

    keys = ["train.device=cpu", "run.threads=1"]
    splits = {w: measure_steps(SMOKE, keys, steps=1, warmup=w, scratch=tmp_path) for w in (1, MIN_WARMUP + 1)}
    assert splits[1].warmup == MIN_WARMUP and splits[MIN_WARMUP + 1].warmup == MIN_WARMUP + 1
    counted = {w: (s.kernels_per_step, s.counted_syncs_per_step, s.region_syncs) for w, s in splits.items()}
    assert counted[1] == counted[MIN_WARMUP + 1], counted


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_default_budget_of_a_cuda_run_is_the_gpus_memory_also_for_the_configs_auto():
    """A run read with --no-profile names its config's ``train.device``: ``auto`` (the default) trained on the GPU,
    so its peak (the CUDA allocator's) is held against the GPU's memory, not the machine's RAM."""
    gpu = torch.cuda.get_device_properties(torch.device("cuda")).total_memory / 2**20
    assert doctor.memory_budget_mb("cuda") == doctor.memory_budget_mb("cuda:0") == gpu
    assert doctor.memory_budget_mb("auto") == gpu
    assert doctor.memory_budget_mb("cpu") == psutil.virtual_memory().total / 2**20 != gpu


def test_the_default_budget_without_a_gpu_is_the_machines_ram():
    ram = psutil.virtual_memory().total / 2**20
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the cuda test covers it")
    assert doctor.memory_budget_mb("cpu") == doctor.memory_budget_mb("auto") == ram
