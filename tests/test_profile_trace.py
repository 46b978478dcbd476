"""drivetrain.profile.trace: a torch.profiler trace summarised (top ops, GPU idle, host syncs with call sites)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from drivetrain.profile.trace import _idle, render, summarize


def read_twice(x: torch.Tensor) -> float:
    """Two host reads of device values: the call site the summary must name."""
    return (x * 2).sum().item() + x.max().item()


def profiled(steps: int, activities: list[ProfilerActivity], device: str = "cpu") -> profile:
    x = torch.randn(1000, device=device)
    with profile(activities=activities, with_stack=True) as prof:
        for _ in range(steps):
            y = torch.relu(x @ torch.ones(1000, device=device) + x)  # a few ops that are no sync
            read_twice(y)
    return prof


def test_host_reads_are_counted_per_step_at_their_python_call_site() -> None:
    summary = summarize(profiled(3, [ProfilerActivity.CPU]), steps=3)
    assert summary["syncs_per_step"] == 2
    (sync,) = summary["syncs"]
    assert sync["count"] == 6 and sync["per_step"] == 2 and sync["kind"] == "aten::_local_scalar_dense"
    assert sync["site"].startswith("test_profile_trace.py(") and sync["site"].endswith("read_twice")
    names = {row["name"] for row in summary["cpu_ops"]}
    assert {"aten::mul", "aten::relu"} <= names and all(n.startswith(("aten::", "cu")) for n in names)
    assert summary["device_ops"] == [] and summary["gpu"] is None


def test_render_says_what_a_cpu_trace_cannot_show() -> None:
    summary = summarize(profiled(2, [ProfilerActivity.CPU]), steps=2)
    text = render(summary, "profile of a toy step", notes=["device: CPU"])
    assert text.startswith("# profile of a toy step") and "- device: CPU" in text
    assert "No device kernels in the trace" in text and "## Host syncs (2 per step)" in text
    assert "read_twice" in text and "## Top" in text and "`aten::relu`" in text


def test_idle_time_is_the_span_less_the_union_of_the_kernels() -> None:
    gpu = _idle([(20.0, 30.0), (0.0, 10.0), (5.0, 15.0), (12.0, 14.0)], steps=2)  # µs; overlaps merge
    assert gpu["kernels"] == 4
    assert gpu["busy_ms"] == pytest.approx(0.025) and gpu["span_ms"] == pytest.approx(0.030)
    assert gpu["idle_ms"] == pytest.approx(0.005) and gpu["idle_ms_per_step"] == pytest.approx(0.0025)
    assert gpu["idle_share"] == round(5 / 30, 6)  # rounded to 6 places, as every figure of the summary


def test_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="steps"):
        summarize(profiled(1, [ProfilerActivity.CPU]), steps=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_trace_has_kernels_idle_time_and_the_syncs_of_item() -> None:
    prof = profiled(3, [ProfilerActivity.CPU, ProfilerActivity.CUDA], device="cuda")
    summary = summarize(prof, steps=3)
    assert summary["gpu"] is not None and summary["gpu"]["kernels"] >= 3 * 4
    assert 0 <= summary["gpu"]["idle_share"] < 1 and summary["device_ops"]
    sites = {s["site"] for s in summary["syncs"]}
    assert any(site.endswith("read_twice") for site in sites)
    assert summary["syncs_per_step"] >= 2  # each .item() waits for the stream
