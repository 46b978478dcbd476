"""``drivetrain bench augment``: a tiny run times worker and device augmentation (and, with --train, the four
training variants) and writes the result files with every variant and the CPU figures."""

from __future__ import annotations

import json

import pytest

from drivetrain.cli.main import main
from drivetrain.pipeline.dali import dali_available

DALI = {"dali"} if dali_available() else set()


# All in the slow set, with the benchmarks: a short run times each variant once without warm-up; the others twice
# after one, and train.
@pytest.mark.parametrize(
    ("train", "repeat", "warmup"),
    [
        pytest.param(False, 1, 0, marks=pytest.mark.slow),
        pytest.param(False, 2, 1, marks=pytest.mark.slow),
        pytest.param(True, 2, 1, marks=pytest.mark.slow),
    ],
)
def test_bench_augment_times_every_variant_and_writes_json_md_png(tmp_path, capsys, train, repeat, warmup):
    argv = ["bench", "augment", "--sizes", "tiny", "--batch", "2", "--workers", "0", "--repeat", str(repeat)]
    argv += ["--warmup", str(warmup), "--data-dir", str(tmp_path / "data"), "--json", str(tmp_path / "r.json")]
    argv += ["--md", str(tmp_path / "r.md"), "--png", str(tmp_path / "r.png"), "--train" if train else "--no-train"]
    assert main(argv) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["benchmark"] == "augment" and data["config"]["train"] is train
    rows = {row["name"]: row for row in data["rows"]}
    pipeline = rows["tiny 320×180, B=2: pipeline ms/frame"]
    assert set(pipeline["variants"]) == {"worker", "device"} | DALI and min(pipeline["variants"].values()) > 0
    cpu = data["cpu"]["tiny 320×180, B=2: pipeline ms/frame"]
    assert cpu["worker cpu_s_per_frame"] > 0 and cpu["device cpu_s_per_frame"] > 0
    if train:
        training = rows["tiny 320×180, B=2: training ms/frame (tiny encoder, frozen)"]
        assert set(training["variants"]) == {"worker", "device", "device+stream", "device+stream+encoder"} | DALI
    else:
        assert len(rows) == 1
    assert "pipeline ms/frame" in (tmp_path / "r.md").read_text()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "r.png").stat().st_size > 10_000
