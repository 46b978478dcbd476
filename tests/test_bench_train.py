"""``drivetrain bench train``: the trainer's own step split into its parts, from the JSON's own numbers; the scratch
run directory is gone afterwards; a missing config is one line."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import pytest
import torch

from drivetrain.cli.main import main
from drivetrain.engine.stepsplit import PARTS, measure_steps
from helpers.engine import FAST, SMOKE

solve_module = importlib.import_module("drivetrain.match.solve")  # the package's `solve` is the function

ROOT = Path(__file__).resolve().parents[1]
SMALL = [*FAST, "data.batch_size=4"]  # the smoke model on generated tensors: milliseconds a step
KEYS = {"step_ms", "step_max_ms", "parts", "data_wait_ms", "overhead_share", "skipped_steps", "syncs_per_step",
        "syncs_source",
        "counted_syncs_per_step", "kernels_per_step", "region_syncs", "logged", "inner_ms"}  # fmt: skip
ALL_PARTS = (*PARTS, "other")
MS_ROUNDING = 5e-7  # the JSON's ms have 6 decimals
SHARE_ROUNDING = 5e-5  # and its shares 4


def _bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[dict, Path]:
    scratch = tmp_path / "scratch"  # the system's temporary folder, for this run
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    # The solver's counts are this process's: a fresh book, as the command's own process starts with (a test before
    # this one in the same worker may have compiled a stand-in kernel).
    monkeypatch.setattr(solve_module, "_SHAPES", solve_module._ShapeBook())
    out = tmp_path / "r.json"
    argv = ["bench", "train", "--config", str(SMOKE), "--json", str(out), "--md", str(tmp_path / "r.md"), *args]
    assert main([*argv, *SMALL]) == 0
    return json.loads(out.read_text()), scratch


def _check_split(data: dict) -> None:
    """The invariants of a split, from the JSON's own numbers."""
    assert set(data) >= KEYS and set(data["parts"]) == set(ALL_PARTS)
    step, parts = data["step_ms"], {p: data["parts"][p]["median_ms"] for p in ALL_PARTS}
    assert step > 0 and data["step_max_ms"] >= step
    assert all(ms >= 0 and data["parts"][p]["max_ms"] >= ms for p, ms in parts.items())
    # Regions nest inside the step and do not overlap: the measured parts add up to at most the step.
    assert sum(parts[p] for p in PARTS) <= step + (len(PARTS) + 1) * MS_ROUNDING
    assert data["data_wait_ms"] == parts["data"]
    # overhead_share = 1 − (forward + backward) / step, from rounded ms: each off by ≤ MS_ROUNDING, the share rounded
    expected = 1 - (parts["forward"] + parts["backward"]) / step
    assert abs(data["overhead_share"] - expected) <= SHARE_ROUNDING + 3 * MS_ROUNDING / step
    assert 0 <= data["overhead_share"] <= 1


def test_bench_train_splits_the_trainers_step_and_leaves_no_run_behind(tmp_path, monkeypatch, capsys):
    data, scratch = _bench(tmp_path, monkeypatch, "--steps", "1", "--warmup", "2")
    _check_split(data)
    # One timed step: "other" is that step minus its parts, so all seven add up to the step exactly (but rounding).
    total = sum(data["parts"][p]["median_ms"] for p in ALL_PARTS)
    assert abs(total - data["step_ms"]) <= (len(ALL_PARTS) + 1) * MS_ROUNDING
    # The smoke model reads nothing: the step's one host read is the trainer's skip decision in the optimizer part.
    assert data["syncs_per_step"] == 1 and isinstance(data["syncs_per_step"], int)
    assert data["syncs_source"] == "counted" and data["region_syncs"] == {"step/optimizer": 1}
    assert isinstance(data["kernels_per_step"], int) and data["kernels_per_step"] > 0
    assert data["parts"]["optimizer"]["syncs"] == 1 and data["parts"]["data"]["kernels"] is None  # loader: host work
    assert sum(data["parts"][p]["kernels"] or 0 for p in ALL_PARTS) == data["kernels_per_step"]
    assert data["steps"] == 1 and data["warmup"] == 2 and data["config"]["model"] == "smoke"
    assert data["train_device"] == "cpu" and data["device"].startswith("CPU")
    assert data["logged"]["step_ms"] > 0  # the trainer's own log of the timed step was read
    assert data["skipped_steps"] == 0  # fp32: every timed step updated
    assert data["gpu_solver"] == {"fallbacks": 0, "wrapper_calls": 0, "compiled": 0}
    assert data["config"]["backends"]["tf32_cudnn"] is False  # the trainer's default, as every benchmark's
    rows = {row["name"]: row for row in data["rows"]}
    assert rows["step"]["parent"] is None and len(rows) == 1 + len(ALL_PARTS)
    assert all(row["reference_ms"] == row["batched_ms"] for row in data["rows"])  # one path, one measurement
    assert list(scratch.iterdir()) == []  # the scratch run directory is deleted
    printed = capsys.readouterr().out
    assert "| data wait (loader) |" in printed and "overhead share = 1 − (forward + backward) / step" in printed
    assert "timed steps that skipped the update (non-finite gradients, e.g. fp16 overflow): 0 of 1" in printed
    assert "| copy (host → device) |" in (tmp_path / "r.md").read_text()


def test_bench_train_profiles_more_steps_after_the_timed_ones(tmp_path, monkeypatch):
    """--profile N: N steps under torch.profiler after the timed ones, summarised beside the JSON; the timed split
    is the same as without (the traced steps are not timed)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "train-smoke-cpu.json"
    argv = ["bench", "train", "--config", str(SMOKE), "--steps", "1", "--warmup", "1", "--profile", "2"]
    assert main([*argv, "--json", str(out), *SMALL]) == 0
    data = json.loads(out.read_text())
    _check_split(data)
    assert data["steps"] == 1 and data["syncs_per_step"] == 1
    profile = data["profile"]
    assert profile["steps"] == 2 and profile["file"] == "profile-smoke-cpu.md" and profile["gpu_idle_share"] is None
    text = (tmp_path / "profile-smoke-cpu.md").read_text()
    assert "## Host syncs" in text and "## Top" in text and "No device kernels" in text
    # the smoke model's 2 steps make a trace of about 1.8 MB, kept under the 4 MB limit
    assert profile["chrome_trace"] == "profile-smoke-cpu.trace.json"
    assert json.loads((tmp_path / profile["chrome_trace"]).read_text())["traceEvents"]
    assert list(scratch.iterdir()) == []


def test_bench_train_reports_the_timed_steps_that_skipped_the_update(tmp_path, monkeypatch):
    """fp16 with a loss scale of 2**40 overflows (tests/test_engine_trainer.py): with hysteresis 2 and backoff 2**-8
    the first three iterations skip, so of the timed steps 2–4 some skip, and the result says how many."""
    scale = ["precision.mode=fp16", "precision.init_scale=1099511627776", "precision.backoff_factor=0.00390625"]
    data, _ = _bench(tmp_path, monkeypatch, "--steps", "3", "--warmup", "1", *scale)
    assert 1 <= data["skipped_steps"] <= 3
    assert any(
        f"{data['skipped_steps']} of the 3 timed steps skipped the optimizer's update" in n for n in data["notes"]
    )
    assert f"{data['skipped_steps']} of 3: the optimizer part of those is a skip" in (tmp_path / "r.md").read_text()


def test_bench_train_writes_the_timed_result_before_summarising_the_profile(tmp_path, monkeypatch):
    """A run cut while the traced steps are summarised (the summary fails here) keeps the timed steps' JSON."""
    from drivetrain.profile import trace

    def cut(*args, **kwargs):
        raise RuntimeError("cut while summarising")

    monkeypatch.setattr(trace, "summarize", cut)
    with pytest.raises(RuntimeError, match="cut while summarising"):
        _bench(tmp_path, monkeypatch, "--steps", "1", "--warmup", "1", "--profile", "1")
    data = json.loads((tmp_path / "r.json").read_text())
    _check_split(data)
    assert "profile" not in data and any("still being summarised" in note for note in data["notes"])
    assert "| copy (host → device) |" in (tmp_path / "r.md").read_text()


def test_bench_train_refuses_a_missing_config_in_one_line(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SystemExit) as err:
        main(["bench", "train", "--config", str(missing)])
    message = str(err.value)
    assert str(missing) in message and "not found" in message and "\n" not in message


def test_result_names_keep_the_published_and_tiny_configs_apart():
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "benchmarks" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    name = module.result_name
    assert name(Path("configs/streampetr_tiny.yaml"), "streampetr") == "train-streampetr-tiny"
    assert name(Path("configs/streampetr_full.yaml"), "streampetr") == "train-streampetr-full"
    assert name(Path("configs/pointpillars_nus.yaml"), "pointpillars") == "train-pointpillars-full"
    assert name(Path("configs/ssn_tiny.yaml"), "ssn") == "train-ssn-tiny"
    assert name(Path("configs/smoke.yaml"), "smoke") == "train-smoke"
    assert name(Path("my_run.yaml"), "ssn") == "train-my-run"


@pytest.mark.cuda
@pytest.mark.heavy
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_train_on_cuda_counts_the_syncs_of_the_timed_steps(tmp_path, monkeypatch):
    data, scratch = _bench(tmp_path, monkeypatch, "--steps", "2", "--warmup", "2", "--device", "cuda")
    _check_split(data)  # CUDA events on one stream: the parts' intervals still nest in the step's
    assert data["train_device"].startswith("cuda") and data["syncs_source"] == "cuda sync debug mode"
    # At least the skip decision's read each step (log.every=1 adds the metric log's read of the step's values).
    assert data["syncs_per_step"] >= 1
    assert data["counted_syncs_per_step"] >= 1 and data["region_syncs"].get("step/optimizer", 0) >= 1
    assert list(scratch.iterdir()) == []


@pytest.mark.cuda
@pytest.mark.heavy
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_runs_peak_memory_on_cuda_is_its_own_not_that_of_an_earlier_run(tmp_path):
    # The CUDA allocator's peak counts from the process's start: the eager run that bench train --compare measures
    # first (here 256 MiB allocated and freed) is not the compared run's peak, which the smoke model keeps far below.
    earlier = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del earlier
    split = measure_steps(SMOKE, SMALL, steps=1, warmup=2, device="cuda", scratch=tmp_path)
    assert 0 < split.logged["peak_memory_mb"] < 256
