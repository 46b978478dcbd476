"""``drivetrain bench solve``: the heads' solves over batches of the data, and the kernel shapes they reach."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from drivetrain.cli.main import main
from drivetrain.engine.config_files import read_config_file
from drivetrain.match.solve import TARGET_BUCKETS
from drivetrain.ragged import RaggedBatch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "streampetr_tiny.yaml"
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
    assert any("whose total cost is the per-problem optimum's within float32 rounding" in n for n in data["notes"])
    checked = data["config"]["checked"]["scipy"]  # SciPy on the same values: the same pairs
    assert checked["problems"] > 0 and checked["other_pairs"] == 0 and checked["max_excess"] == 0
    assert data["config"]["gpu_solver"] == {"fallbacks": 0, "wrapper_calls": 0, "fallbacks_timed": 0}


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_solve", ROOT / "benchmarks" / "solve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one(costs: list[list[float]]) -> RaggedBatch:
    tensor = torch.tensor([costs], dtype=torch.float32)  # (1, Q, G)
    return RaggedBatch(tensor, torch.tensor([tensor.shape[-1]]), ragged_dim=2)


def _pairs(pairs: list[tuple[int, int]]) -> RaggedBatch:
    return RaggedBatch(torch.tensor([pairs]), torch.tensor([len(pairs)]), ragged_dim=1)


def test_an_assignment_of_equal_cost_passes_and_a_costlier_or_broken_one_stops_the_benchmark():
    """float32 ties: where two assignments cost the same, the GPU kernel may return the other one; that passes the
    check (counted), a costlier one or pairs that are no assignment do not."""
    bench = _bench_module()
    tie = _one([[0.5, 0.5], [0.5, 0.5]])
    counts = bench.check_assignments(tie, _pairs([(0, 1), (1, 0)]), bench.per_problem(tie))
    assert counts == {"problems": 1, "other_pairs": 1, "max_excess": 0.0}
    cross = _one([[0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="exceeds the optimum"):
        bench.check_assignments(cross, _pairs([(0, 1), (1, 0)]), bench.per_problem(cross))
    with pytest.raises(ValueError, match="not an assignment"):
        bench.check_assignments(cross, _pairs([(0, 0), (1, 0)]), bench.per_problem(cross))
    # the bound: 64 pairs of costs below 1 (padding 3): a few hundredths; float32 ties of 1-ulp costs are far below
    assert 1e-3 < bench.cost_tolerance(64, 3.0) < 0.05 and bench.cost_tolerance(1, 1.0) < 1e-5
