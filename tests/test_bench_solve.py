"""``drivetrain bench solve``: the heads' solves over batches of the data, and the kernel shapes they reach."""

from __future__ import annotations

import json
from pathlib import Path

from drivetrain.cli.main import main
from drivetrain.engine.config_files import read_config_file
from drivetrain.match.solve import TARGET_BUCKETS

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "streampetr_tiny.yaml"
# The first 4 scenes of the tiny preset (2 mini_train scenes, batch ≤ 2), generated into tmp_path.
TINY = ["--config", str(CONFIG), "--batch", "2", "--scenes", "4", "--repeat", "3", "--warmup", "1"]


def test_bench_solve_times_the_variants_per_batch_and_counts_kernel_shapes(tmp_path, capsys):
    argv = ["bench", "solve", *TINY, "--data-root", str(tmp_path / "synth"), "--json", str(tmp_path / "r.json")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["benchmark"] == "solve" and data["device"].startswith("CPU")
    shapes = data["config"]["shapes"]
    assert set(shapes) == {"3D head", "focal head"}
    for head, line in shapes.items():
        per_batch = line["padded_gt_per_batch"]
        assert len(per_batch) == 3  # the timed batches, each its own
        assert line["distinct_gt"] == len(set(per_batch))
        buckets = {next(b for b in TARGET_BUCKETS if g <= b) for g in per_batch if 0 < g <= TARGET_BUCKETS[-1]}
        assert line["kernel_shapes"] == len(buckets) <= 4
        assert f"{head}: kernel shapes over 3 batches: {line['kernel_shapes']}" in printed
    model = read_config_file(CONFIG).data["model"]["args"]
    queries = model.get("num_query", 644) + model.get("num_propagated", 256)
    assert shapes["3D head"]["queries"] == queries
    assert shapes["3D head"]["problems"] == model.get("num_layers", 6) * 2  # layers × samples
    rows = {row["name"].split(" solve")[0]: row for row in data["rows"]}
    assert set(rows) == {"3D head", "focal head"}
    for row in rows.values():
        assert row["baseline"] == "per problem" and set(row["variants"]) == {"per problem", "scipy"}  # no GPU here
        assert row["reference_ms"] > 0 and row["reference_max_ms"] >= row["reference_ms"]
        assert row["batched_max_ms"] >= row["batched_ms"] > 0
    assert any("every variant's pairs equaled the per-problem solve's" in note for note in data["notes"])
