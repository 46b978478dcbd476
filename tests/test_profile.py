"""drivetrain.profile: timed regions, resource sampling, result format."""

from __future__ import annotations

import json
import subprocess
import sys
import time

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
    }
    assert data["rows"][2]["variants"] == {"scipy": 3.0, "gpu": 1.5} and data["rows"][2]["baseline"] == "scipy"
    md = md_path.read_text()
    assert "| loss | 10.000 | 2.500 | ×4.00 |" in md
    assert "↳ match" in md
    table = result.render_table()
    assert "×4.00" in table and "reference ms" in table


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
