"""`drivetrain bench lidar-data` runs end to end and writes a result whose rows compare equal outputs."""

from __future__ import annotations

import json

import pytest

from drivetrain.cli.main import main

SMALL = ["--points", "3000", "--repeat", "1", "--warmup", "0"]


def _rows(path):
    result = json.loads(path.read_text())
    assert result["benchmark"] == "lidar-data" and result["device"] and result["date"]
    return {row["name"]: row for row in result["rows"]}, result


def test_voxelization_rows_are_written(tmp_path):
    out = tmp_path / "r.json"
    assert main(["bench", "lidar-data", *SMALL, "--skip-sweeps", "--json", str(out)]) == 0
    rows, _ = _rows(out)
    names = list(rows)
    assert any("tiny grid 64×64" in n and "reference loop" in n for n in names)
    assert any("full grid 400×400" in n for n in names)
    for row in rows.values():
        assert row["reference_ms"] > 0 and row["batched_ms"] > 0


@pytest.mark.slow
def test_sweep_rows_report_sizes_and_rates(tmp_path):
    out = tmp_path / "r.json"
    argv = ["bench", "lidar-data", *SMALL, "--data-dir", str(tmp_path / "data"), "--json", str(out)]
    assert main(argv) == 0
    rows, result = _rows(out)
    assert sum("sweeps" in n and "points of a frame" in n for n in rows) == 3
    ten = result["sweeps"]["N=10"]
    assert ten["points_per_frame"] > result["sweeps"]["N=0"]["points_per_frame"]
    # x, y, z stored, Δt per sweep: exactly 3/4 of the merged (x, y, z, Δt) float32 array, plus the small index
    assert 0.75 <= ten["float32_vs_merged"] < 0.76 and 0.375 <= ten["float16_vs_merged"] < 0.385
