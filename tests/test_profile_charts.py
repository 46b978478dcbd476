"""Benchmark charts: every row's two bars and its ratio, the published anchor drawn where a benchmark names one,
and ``emit`` writing the chart next to the JSON (or at ``--png``) unless the benchmark draws its own."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from drivetrain.profile import BenchResult, Row, emit
from drivetrain.profile.charts import ANCHOR, BATCHED, REFERENCE, bench_chart

mpimg = pytest.importorskip("matplotlib.image")


def _pixels(path, colour: str) -> int:
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    image = (mpimg.imread(path)[..., :3] * 255).round().astype(int)
    return int((np.abs(image - rgb).max(-1) <= 6).sum())


def _result(published: bool) -> BenchResult:
    result = BenchResult("demo", "CPU test", {})
    result.add(Row("total", 40.0, 10.0))
    result.add(Row("total/part", 30.0, 5.0, parent="total"))
    result.add(Row("slower", 1.0, 2.0))
    if published:
        result.extra["published"] = {"total": (8.0, "a paper")}
    return result


def test_chart_draws_both_paths_the_ratios_and_the_published_anchor(tmp_path):
    plain = bench_chart(_result(False), tmp_path / "plain.png")
    anchored = bench_chart(_result(True), tmp_path / "anchored.png")
    assert _pixels(plain, REFERENCE) > 500 and _pixels(plain, BATCHED) > 500
    assert _pixels(plain, ANCHOR) == 0 and _pixels(anchored, ANCHOR) > 20  # the diamond and its label


def test_emit_writes_the_chart_unless_the_benchmark_draws_its_own(tmp_path, capsys):
    args = argparse.Namespace(json=tmp_path / "r.json", md=None, save=False, png=tmp_path / "r.png", device="cpu")
    written = emit(_result(True), args)
    assert tmp_path / "r.png" in written and (tmp_path / "r.png").stat().st_size > 5_000
    args.png = tmp_path / "own.png"
    assert tmp_path / "own.png" not in emit(_result(True), args, chart=False)
    assert not (tmp_path / "own.png").exists()


def test_chart_draws_a_whisker_from_each_median_to_its_recorded_max(tmp_path):
    plain, whiskered = BenchResult("demo", "CPU test", {}), BenchResult("demo", "CPU test", {})
    for result in (plain, whiskered):
        result.add(Row("wide", 100.0, 0.1))  # sets the same log axis in both charts: 0.1 to 100 ms
    plain.add(Row("cold", 4.0, 2.0))
    whiskered.add(Row("cold", 4.0, 2.0, reference_max_ms=40.0, batched_max_ms=30.0))  # both flagged: ⚠ in the label
    before = bench_chart(plain, tmp_path / "plain.png")
    after = bench_chart(whiskered, tmp_path / "whiskered.png")
    for colour in (REFERENCE, BATCHED):  # a decade of log axis beyond each bar, in the path's colour
        assert _pixels(after, colour) > _pixels(before, colour) + 20
