"""``drivetrain bench precision --model ssn`` and ``drivetrain bench sweeps``: tiny runs write the result files
with the measured columns (memory, time, loss; points, data and step time, mAP) in the published layouts."""

from __future__ import annotations

import json

import pytest

from drivetrain.cli.main import main


@pytest.mark.slow
def test_bench_precision_on_ssn_short_run_writes_the_result_files(tmp_path, capsys):
    """The short run (slow set, with the benchmarks): one variant, one process, one timed step."""
    argv = ["bench", "precision", "--model", "ssn", "--variants", "fp32", "--repeat", "1", "--warmup", "1"]
    argv += ["--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md")]
    assert main(argv) == 0
    assert "| fp32 |" in capsys.readouterr().out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["benchmark"] == "precision-ssn-tiny" and data["config"]["config"] == "configs/ssn_tiny.yaml"
    measured = data["measured"]
    assert set(measured) == {"fp32"}
    assert measured["fp32"]["step_ms"] > 0 and measured["fp32"]["memory_mb"] > 0
    assert 0 < measured["fp32"]["final_loss"] < 10
    assert "## Memory and time per precision mode" in (tmp_path / "r.md").read_text()


@pytest.mark.slow
def test_bench_precision_on_ssn_reports_memory_time_and_loss(tmp_path, capsys):
    argv = ["bench", "precision", "--model", "ssn", "--variants", "fp32,fp32 + act. ckpt", "--repeat", "2"]
    argv += ["--warmup", "1", "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| fp32 + act. ckpt |" in printed and "loss, last 3 of 3 steps" in printed
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["benchmark"] == "precision-ssn-tiny" and data["config"]["config"] == "configs/ssn_tiny.yaml"
    measured = data["measured"]
    assert set(measured) == {"fp32", "fp32 + act. ckpt"}
    for m in measured.values():
        assert m["step_ms"] > 0 and m["memory_mb"] > 0 and 0 < m["final_loss"] < 10
    # Activation checkpointing recomputes the same forward: the same losses from the same seed and data.
    assert measured["fp32 + act. ckpt"]["final_loss"] == pytest.approx(measured["fp32"]["final_loss"], rel=1e-5)
    assert "## Memory and time per precision mode" in (tmp_path / "r.md").read_text()


@pytest.mark.slow
def test_bench_sweeps_trains_each_count_and_scores_it(tmp_path, capsys):
    argv = ["bench", "sweeps", "--model", "pointpillars", "--sweeps", "0,3", "--steps", "3", "--warmup", "1"]
    argv += ["--scenes", "4", "--data-root", str(tmp_path / "synth"), "--json", str(tmp_path / "r.json")]
    argv += ["--md", str(tmp_path / "r.md"), "--png", str(tmp_path / "r.png")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| sweeps | points / frame |" in printed
    measured = json.loads((tmp_path / "r.json").read_text())["measured"]
    assert set(measured) == {"0", "3"}
    # Three earlier sweeps roughly quadruple the points of a key frame (the same scan repeated as the ego moves).
    assert 3.0 < measured["3"]["points_per_frame"] / measured["0"]["points_per_frame"] < 4.5
    for m in measured.values():
        assert m["step_ms"] > 0 and m["data_ms"] > 0 and 0.0 <= m["mAP"] <= 1.0 and m["wall_s"] > 0
    assert "| published: score, training time |" in (tmp_path / "r.md").read_text()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
