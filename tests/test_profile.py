"""drivetrain.profile: timed regions, resource sampling, result format."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from drivetrain.profile import (
    BenchResult,
    Profiler,
    ResourceMonitor,
    Row,
    Stats,
    compare,
    device_name,
    device_slug,
    rows_from_profilers,
    time_call,
)
from drivetrain.profile.bench import count_variation
from drivetrain.profile.charts import load_result
from drivetrain.profile.results import FLAG, MAX_OVER_MEDIAN

ROOT = Path(__file__).resolve().parents[1]


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_nested_regions_are_named_by_path_and_parent_covers_children():
    prof = Profiler("cpu")
    for _ in range(3):
        with prof.region("step"):
            with prof.region("forward"):
                busy(0.002)
            with prof.region("backward"):
                busy(0.001)
        prof.step()
    assert prof.names == ["step", "step/forward", "step/backward"]
    for i in range(3):
        parent = prof.samples("step")[i]
        assert parent >= prof.samples("step/forward")[i] + prof.samples("step/backward")[i]


def test_warmup_steps_are_excluded_and_medians_use_the_rest():
    prof = Profiler("cpu", warmup=2)
    for i in range(6):
        with prof.region("r"):
            busy(0.0 if i < 2 else 0.005)  # the timed steps busy-wait ≥ 5 ms (a lower bound under any load)
        prof.step()
    samples = prof.samples("r")
    assert len(samples) == 4
    assert min(samples) >= 5.0  # no near-zero warm-up step among them
    assert prof.median("r") == Stats.of(samples).median


def test_region_entered_twice_in_one_step_adds_up():
    prof = Profiler("cpu")
    with prof.region("outer"):
        for _ in range(2):
            with prof.region("inner"):
                busy(0.002)
    prof.step()
    assert len(prof.samples("outer/inner")) == 1
    assert prof.samples("outer/inner")[0] >= 4.0 * 0.9


def test_profiler_rejects_bad_use():
    prof = Profiler("cpu")
    with pytest.raises(ValueError, match="name"):
        with prof.region("a/b"):
            pass
    with pytest.raises(RuntimeError, match="open region"):
        with prof.region("a"):
            prof.step()
    with pytest.raises(KeyError, match="no region"):
        prof.samples("missing")
    with pytest.raises(ValueError, match="warmup"):
        Profiler("cpu", warmup=-1)
    with pytest.raises(ValueError, match="no timed steps"):
        Stats.of([])


def test_time_call_and_compare_return_one_sample_per_repeat():
    calls = []
    assert len(time_call(lambda: calls.append(1), repeat=5, warmup=2)) == 5
    assert len(calls) == 7
    ref, bat = compare(lambda: busy(0.003), lambda: None, device="cpu", repeat=4, warmup=1)
    assert len(ref) == len(bat) == 4
    assert min(ref) >= 3.0 and min(bat) >= 0.0  # ms of the right call: the busy-wait's is a lower bound


def test_rows_from_profilers_pairs_regions_and_builds_parents():
    ref, bat = Profiler("cpu"), Profiler("cpu")
    for prof, work in ((ref, 0.004), (bat, 0.001)):
        with prof.region("loss"):
            with prof.region("match"):
                busy(work)
        prof.step()
    rows = rows_from_profilers(ref, bat)
    assert [(r.name, r.parent) for r in rows] == [("loss", None), ("loss/match", "loss")]
    assert rows[1].reference_ms >= 4.0 and rows[1].batched_ms >= 1.0  # each path's own busy-wait (lower bounds)
    assert rows[1].speedup == pytest.approx(rows[1].reference_ms / rows[1].batched_ms)


def test_resource_monitor_counts_cpu_of_child_processes():
    child = "import time\nwhile time.process_time() < 0.4:\n    pass\n"
    with ResourceMonitor("cpu", interval=0.02) as mon:
        subprocess.run([sys.executable, "-c", child], check=True)
    usage = mon.result
    assert usage is not None
    assert usage.cpu_s >= 0.3  # the child's CPU time is part of the process tree's
    assert usage.peak_rss_mb > 10
    assert usage.peak_device_mb is None
    assert usage.cpu_cores == pytest.approx(usage.cpu_s / usage.wall_s)


def test_bench_result_json_follows_the_design_format(tmp_path):
    result = BenchResult("demo", device_name("cpu"), {"batch": 8})
    result.add(Row("loss", reference_ms=10.0, batched_ms=2.5))
    result.add(Row("match", reference_ms=4.0, batched_ms=1.0, parent="loss"))
    result.add(Row("solve", 3.0, 1.5, parent="loss", variants={"scipy": 3.0, "gpu": 1.5}, baseline="scipy"))
    with pytest.raises(ValueError, match="parent"):
        result.add(Row("orphan", 1.0, 1.0, parent="nope"))
    json_path, md_path = tmp_path / "out" / "r.json", tmp_path / "out" / "r.md"
    assert result.write(json_path, md_path) == [json_path, md_path]
    data = json.loads(json_path.read_text())
    assert {"benchmark", "device", "torch", "date", "config", "rows"} <= set(data)
    assert data["torch"] == torch.__version__ and data["config"] == {"batch": 8}
    assert data["rows"][0] == {
        "name": "loss",
        "parent": None,
        "reference_ms": 10.0,
        "batched_ms": 2.5,
        "speedup": 4.0,
        "reference_max_ms": None,  # built by hand without a max: none recorded, nothing flagged
        "batched_max_ms": None,
        "max_over_median": False,
        "max_over_median_paths": [],
    }
    assert data["rows"][2]["variants"] == {"scipy": 3.0, "gpu": 1.5} and data["rows"][2]["baseline"] == "scipy"
    md = md_path.read_text()
    assert "| loss | 10.000 | 2.500 | ×4.00 |" in md  # a median alone: no max recorded
    assert "↳ match" in md
    table = result.render_table()
    assert "×4.00" in table and "reference ms" in table


def _flag_result() -> BenchResult:
    """A result with one row per case: a cold first repeat of the batched path (flagged), a steady row exactly at
    the bound (not flagged: the bound is strict), a row without a max, and a variant row whose compiled variant
    has the cold repeat."""
    result = BenchResult("demo", "CPU test", {})
    result.add(Row.from_samples("cold", [4.0, 4.2, 3.9, 4.1, 4.0], [90.0, 1.0, 1.1, 0.9, 1.0]))
    result.add(Row.from_samples("steady", [2.0, 2.0, 2.0 * MAX_OVER_MEDIAN], [1.0, 1.0, 1.0], parent="cold"))
    result.add(Row("by hand", 3.0, 1.5))
    result.add(
        Row("compiled", 3.0, 1.5, variants={"reference": 3.0, "batched": 1.5, "compiled": 1.0}, baseline="reference",
            reference_max_ms=3.3, batched_max_ms=1.6, variants_max={"reference": 3.3, "batched": 1.6, "compiled": 40.0})
    )  # fmt: skip
    return result


def test_from_samples_takes_each_paths_median_and_max():
    row = Row.from_samples("r", [3.0, 1.0, 2.0, 9.0], [0.5, 0.25, 0.75], parent=None)
    assert (row.reference_ms, row.reference_max_ms) == (2.5, 9.0)
    assert (row.batched_ms, row.batched_max_ms) == (0.5, 0.75)
    with pytest.raises(ValueError, match="no timed steps"):
        Row.from_samples("empty", [], [1.0])


def test_a_max_over_five_medians_is_flagged_per_path_and_at_the_bound_is_not():
    cold, steady, by_hand, compiled = _flag_result().rows
    assert cold.max_over_median_paths == ["batched"]  # 90 > 5 × 1.0; the reference's 4.2 < 5 × 4.0
    assert steady.max_over_median_paths == []  # max == MAX_OVER_MEDIAN × median exactly: not over it
    assert by_hand.max_over_median_paths == [] and by_hand.reference_max_ms is None
    assert compiled.max_over_median_paths == ["compiled"]  # a variant's max counts too, named by its variant
    assert Row("zero", 0.0, 1.0, reference_max_ms=0.0).max_over_median_paths == []  # 0 is not over 5 × 0


def test_flagged_rows_are_marked_in_json_table_and_markdown(tmp_path):
    result = _flag_result()
    result.write(tmp_path / "r.json", tmp_path / "r.md")
    rows = {row["name"]: row for row in json.loads((tmp_path / "r.json").read_text())["rows"]}
    assert rows["cold"]["max_over_median"] is True and rows["cold"]["max_over_median_paths"] == ["batched"]
    assert (rows["cold"]["reference_max_ms"], rows["cold"]["batched_max_ms"]) == (4.2, 90.0)
    assert rows["steady"]["max_over_median"] is False and rows["steady"]["max_over_median_paths"] == []
    assert rows["by hand"]["reference_max_ms"] is None and rows["by hand"]["max_over_median"] is False
    assert rows["compiled"]["variants_max"] == {"reference": 3.3, "batched": 1.6, "compiled": 40.0}
    assert rows["compiled"]["max_over_median_paths"] == ["compiled"]

    md = (tmp_path / "r.md").read_text()
    assert "| region | reference ms (max) | batched ms (max) | speedup |" in md
    assert f"| cold {FLAG} | 4.000 (4.200) | 1.000 (90.000 {FLAG}) | ×4.00 |" in md  # the row and the path
    assert "| &nbsp;&nbsp;↳ steady | 2.000 (10.000) | 1.000 (1.000) | ×2.00 |" in md
    assert "| by hand | 3.000 | 1.500 | ×2.00 |" in md
    assert f"| compiled | reference | 3.000 (3.300) | 1.500 (1.600) | 1.000 (40.000 {FLAG}) |" in md
    assert f"{FLAG} max > 5× median in 2 row(s): cold (batched); compiled (compiled)" in md

    table = result.render_table()
    lines = {line.split()[0]: line for line in table.splitlines()[3:7]}  # region → its line, after the header
    assert FLAG in lines["cold"] and f"1.000 (90.000 {FLAG})" in lines["cold"] and "4.000 (4.200)" in lines["cold"]
    assert FLAG not in table.splitlines()[4]  # the steady child row
    assert f"{FLAG} max > 5× median in 2 row(s)" in table


def test_maxima_survive_a_json_round_trip_and_old_files_read_without_them(tmp_path):
    result = _flag_result()
    result.write(tmp_path / "r.json")
    loaded = load_result(tmp_path / "r.json")
    for before, after in zip(result.rows, loaded.rows, strict=True):
        assert (after.reference_max_ms, after.batched_max_ms) == (before.reference_max_ms, before.batched_max_ms)
        assert after.variants_max == before.variants_max and after.max_over_median_paths == before.max_over_median_paths
    old = json.loads((tmp_path / "r.json").read_text())
    for row in old["rows"]:  # a file from before the maxima
        for key in ("reference_max_ms", "batched_max_ms", "variants_max", "max_over_median", "max_over_median_paths"):
            row.pop(key, None)
    (tmp_path / "old.json").write_text(json.dumps(old))
    rows = load_result(tmp_path / "old.json").rows
    assert all(r.reference_max_ms is None and r.variants_max is None and r.max_over_median_paths == [] for r in rows)
    committed = load_result(ROOT / "benchmarks" / "results" / "ragged-cpu.json")  # committed results load too
    assert committed.rows and all(r.reference_ms > 0 for r in committed.rows)


def cold_once(calls: list[int], cold_call: int, seconds: float = 0.05):
    """A callable that sleeps only on its ``cold_call``-th call (1-based), counted in ``calls``."""

    def fn() -> None:
        calls.append(1)
        if len(calls) == cold_call:
            time.sleep(seconds)

    return fn


def test_compare_fills_max_and_a_cold_first_timed_repeat_is_flagged():
    calls: list[int] = []
    warmup, repeat = 2, 5
    # sleeps ≥ 50 ms on its first timed call only; every other call of both paths does nothing (microseconds)
    ref, bat = compare(cold_once(calls, warmup + 1), lambda: None, device="cpu", repeat=repeat, warmup=warmup,
                       count=False)  # fmt: skip
    assert len(calls) == warmup + repeat
    row = Row.from_samples("cold start", ref, bat)
    assert row.reference_max_ms == max(ref) and row.batched_max_ms == max(bat)
    assert (
        "reference" in row.max_over_median_paths
    )  # the median is a no-op's time: the ≥ 50 ms repeat is far over 5× it


def test_rows_from_profilers_fill_max_from_the_timed_steps():
    ref, bat = Profiler("cpu", warmup=1), Profiler("cpu", warmup=1)
    calls: list[int] = []
    cold = cold_once(calls, 2)  # the first timed step (the warm-up step is call 1)
    for _ in range(5):
        for prof, work in ((ref, cold), (bat, lambda: None)):
            with prof.region("loss"):
                work()
            prof.step()
    (row,) = rows_from_profilers(ref, bat)
    assert row.reference_max_ms == max(ref.samples("loss"))
    assert row.batched_max_ms == max(bat.samples("loss")) and row.reference_ms == ref.median("loss")
    assert "reference" in row.max_over_median_paths


def test_count_variation_counts_distinct_timed_values_and_those_new_after_warmup():
    per_batch = [{"g": 3, "h": 1}, {"g": 5, "h": 1}, {"g": 5, "h": 1}, {"g": 7, "h": 1}, {"g": 3, "h": 1}]
    assert count_variation(per_batch, warmup=2) == {
        "batches": 3,
        "g": {"per_batch": [5, 7, 3], "distinct": 3, "not_in_warmup": 1},  # 7: no warm-up batch had it
        "h": {"per_batch": [1, 1, 1], "distinct": 1, "not_in_warmup": 0},
    }
    assert count_variation(per_batch, warmup=0)["g"]["not_in_warmup"] == 3  # no warm-up: every value is new


def test_device_helpers_name_the_cpu():
    assert device_slug("cpu") == "cpu"
    assert device_name("cpu").startswith("CPU ")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profiler_times_cuda_work_with_events():
    prof = Profiler("cuda", nvtx=True)
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(3):
        with prof.region("matmul"):
            x @ x
        prof.step()
    assert len(prof.samples("matmul")) == 3 and min(prof.samples("matmul")) > 0
    with ResourceMonitor("cuda") as mon:
        torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    assert mon.result.peak_device_mb >= 64


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_resource_monitor_on_cuda_reports_the_peak_of_its_own_block():
    """The allocator's peak is reset on entry: a larger tensor freed before the block is not its peak. Sizes are
    whole MiB, far above the allocator's rounding (2 MiB blocks for large tensors)."""
    held = torch.cuda.memory_allocated() / 2**20  # what earlier tests in this process still hold
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del big  # the process's peak is now ≥ held + 256 MiB, the block's must not be
    with ResourceMonitor("cuda") as mon:
        small = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    assert held + 64 <= mon.result.peak_device_mb < held + 256
    del small
    with ResourceMonitor("cpu") as host:
        pass
    assert host.result.peak_device_mb is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_name_and_slug_of_a_gpu_are_its_name():
    name = torch.cuda.get_device_name(0)
    assert device_name("cuda") == device_name("cuda:0") == name
    slug = device_slug("cuda")
    assert slug == device_slug(torch.device("cuda", 0)) and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug)
    assert slug.replace("-", "") == re.sub(r"[^a-z0-9]", "", name.lower())
