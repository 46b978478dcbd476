"""``drivetrain bench switches``: a small run measures the baseline and a switch in their own processes, writes the
guide's table and the files, and --write-config writes the fastest variant within the memory budget as a config
overlay that a config loads with."""

from __future__ import annotations

import json

import pytest
import yaml

from drivetrain.cli.main import main
from drivetrain.engine import load_config


@pytest.mark.slow
def test_bench_switches_measures_variants_and_writes_the_fastest_fitting_one(tmp_path, capsys):
    argv = ["bench", "switches", "--model", "pointpillars", "--variants", "channels_last,act_ckpt", "--steps", "2",
            "--warmup", "1", "--repeat", "1", "--no-ddp", "--no-schedule", "--no-channels-table",
            "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md"),
            "--write-config", str(tmp_path / "best.yaml")]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| switch | step ms (spread) |" in printed and "−30–40 % memory" in printed.replace("-", "−")
    data = json.loads((tmp_path / "r.json").read_text())
    measured = data["measured"]
    assert {"baseline", "channels_last", "act_ckpt"} <= set(measured)
    for m in measured.values():
        assert m["step_ms"] > 0 and m["memory_mb"] > 0 and m["spread_ms"][0] <= m["step_ms"] <= m["spread_ms"][1]
    overlay = yaml.safe_load((tmp_path / "best.yaml").read_text()) or {}
    fastest = min(measured, key=lambda n: measured[n]["step_ms"])
    expected = measured[fastest]["overrides"]
    assert _flatten(overlay) == {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in expected)}
    load_config("configs/pointpillars_tiny.yaml", expected)  # the overlay's keys are the model config's
    assert "## Switches (the performance guide's table, measured)" in (tmp_path / "r.md").read_text()


@pytest.mark.slow
def test_bench_switches_short_run_writes_the_table_the_files_and_the_fastest_fitting_config(tmp_path, capsys):
    """The short run (slow set, with the benchmarks: issue 30's 4-minute default set): the baseline and one switch,
    one process each, one timed step, nothing counted."""
    argv = ["bench", "switches", "--model", "pointpillars", "--variants", "act_ckpt", "--steps", "1",
            "--warmup", "1", "--repeat", "1", "--no-ddp", "--no-schedule", "--no-channels-table", "--no-count",
            "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md"),
            "--write-config", str(tmp_path / "best.yaml")]  # fmt: skip
    assert main(argv) == 0
    assert "| switch | step ms (spread) |" in capsys.readouterr().out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["benchmark"] == "switches-pointpillars" and data["config"]["variants"] == ["baseline", "act_ckpt"]
    measured = data["measured"]
    assert set(measured) == {"baseline", "act_ckpt"} and measured["baseline"]["overrides"] == []
    for m in measured.values():
        assert m["step_ms"] > 0 and m["memory_mb"] > 0 and m["spread_ms"] == [m["step_ms"], m["step_ms"]]
        assert m["cost"] is None  # --no-count
    assert [row["name"] for row in data["rows"]] == ["act_ckpt: step ms"]
    fastest = min(measured, key=lambda n: measured[n]["step_ms"])
    overlay = yaml.safe_load((tmp_path / "best.yaml").read_text()) or {}
    assert _flatten(overlay) == {
        k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in measured[fastest]["overrides"])
    }
    assert "## Switches (the performance guide's table, measured)" in (tmp_path / "r.md").read_text()


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_unknown_variants_are_named():
    with pytest.raises(SystemExit, match="channels_last_3d"):
        main(["bench", "switches", "--model", "pointpillars", "--variants", "channels_last_3d"])


@pytest.fixture
def backends_restored():
    """The process-wide TF32 and cuDNN flags put back after the test (the benchmark's in-process counts set them)."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


@pytest.mark.slow
def test_the_recorded_backends_are_the_baselines_not_the_last_counted_ones(tmp_path, monkeypatch, backends_restored):
    """Each variant is counted in this process after its timed runs (stepsplit.count_step builds a Trainer here, which
    sets the process-wide flags from its speed section and leaves them so); the tf32 variant (CUDA-only in the table,
    added here so a CPU shows it) is counted last. The result's config.backends must still say what the baseline,
    the reference column, ran under: the config's speed section (TF32 off), not the tf32 variant's flags."""
    from drivetrain.cli import bench

    module = bench.load(bench.available()["switches"])
    table = module.variants

    def with_tf32(model: str, cuda: bool) -> dict[str, list[str]]:
        return {**table(model, cuda), "tf32": ["speed.tf32=true"]}

    monkeypatch.setattr(module, "variants", with_tf32)
    argv = ["--model", "pointpillars", "--variants", "tf32", "--steps", "1", "--warmup", "1", "--repeat", "1",
            "--no-ddp", "--no-schedule", "--no-channels-table", "--json", str(tmp_path / "r.json")]  # fmt: skip
    assert module.main(argv) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["measured"]["tf32"]["cost"] is not None  # counted in this process, after the baseline
    assert data["config"]["backends"] == {"tf32_matmul": False, "tf32_cudnn": False, "cudnn_benchmark": False,
                                          "float32_matmul_precision": "highest"}  # fmt: skip
