"""``drivetrain tune loader``: the grid it measures, the rule it recommends by, and a real run on the smoke
config that prints the table, recommends a measured setting and writes a config that loads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from drivetrain.cli.main import main
from drivetrain.cli.tune import grid, recommend, worker_rule
from drivetrain.engine import load_config

ROOT = Path(__file__).resolve().parents[1]


def _args(**values):
    base = {"workers": "0,2", "prefetch": "2,4", "persistent": "true,false", "pin": "true,false", "loaders": "torch"}
    return argparse.Namespace(**{**base, **values})


def test_grid_pairs_prefetch_and_persistence_with_workers_only_and_pins_only_on_cuda():
    settings = grid(_args(), cuda=False, dali=False)
    assert {"loader": "torch", "num_workers": 0, "pin_memory": False, "prefetch_factor": None,
            "persistent_workers": False} in settings  # fmt: skip
    with_workers = [s for s in settings if s["num_workers"] == 2]
    assert len(with_workers) == 4 and {s["prefetch_factor"] for s in with_workers} == {2, 4}
    assert len(settings) == 5 and not any(s["pin_memory"] for s in settings)
    assert len(grid(_args(), cuda=True, dali=False)) == 10
    dali = grid(_args(loaders="torch,dali", workers="0"), cuda=False, dali=True)
    assert [s["loader"] for s in dali] == ["torch", "dali"] and dali[1]["num_workers"] == 1
    assert [s["loader"] for s in grid(_args(loaders="torch,dali", workers="0"), cuda=False, dali=False)] == ["torch"]
    with pytest.raises(SystemExit, match="--workers"):
        grid(_args(workers="two"), cuda=False, dali=False)


def test_recommendation_is_the_fastest_that_keeps_up_with_fewer_workers_on_a_tie():
    def row(workers, step, wait):
        return {"loader": "torch", "num_workers": workers}, {"step_ms": step, "wait_ms": wait}

    rows = [row(0, 90.0, 40.0), row(2, 100.0, 5.0), row(4, 98.0, 2.0), row(8, 120.0, 1.0)]
    best, keeps_up = recommend(rows, max_wait=0.1)
    assert keeps_up and best["num_workers"] == 2  # 0 workers is faster but waits 44 %; 4 is within 3 % of 2
    best, keeps_up = recommend([row(0, 90.0, 40.0), row(2, 80.0, 30.0)], max_wait=0.1)
    assert not keeps_up and best["num_workers"] == 2  # nothing keeps up: the fastest


def test_worker_rule_reads_the_loader_cost_off_the_setting_without_workers():
    rows = [({"loader": "torch", "num_workers": 0}, {"step_ms": 156.5, "wait_ms": 111.6}),  # PointPillars full, H200
            ({"loader": "torch", "num_workers": 4}, {"step_ms": 46.0, "wait_ms": 0.5})]  # fmt: skip
    rule = worker_rule(rows, cores=16)
    assert rule is not None and rule["workers"] == 4 and rule["wait_ms"] == 0.0
    assert rule["worker_ms_per_batch"] == 111.6 and rule["step_ms"] == pytest.approx(44.9)
    assert worker_rule(rows[1:], cores=16) is None  # no setting without workers: nothing to read the cost off


def test_tune_loader_on_the_smoke_config_prints_recommends_and_writes(tmp_path, capsys):
    out = tmp_path / "tuned.yaml"
    argv = ["tune", "loader", "--config", str(ROOT / "configs" / "smoke.yaml"), "--workers", "0,1", "--steps", "2",
            "--warmup", "1", "--write-config", str(out), "--json", str(tmp_path / "t.json"), "model.args.width=8",
            "data.args.num_samples=32", "data.batch_size=4"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| loader setting | step ms | data wait ms |" in printed and "← recommended" in printed
    measured = json.loads((tmp_path / "t.json").read_text())
    assert len(measured["rows"]) == 2 and all(r["step_ms"] > 0 and r["wait_ms"] >= 0 for r in measured["rows"])
    assert "worker rule (docs/data.md):" in printed and measured["worker_rule"]["workers"] >= 0
    tuned = load_config(out)
    assert tuned.data.num_workers == measured["recommended"]["num_workers"] and tuned.model.args["width"] == 8
