"""A ``torch.profiler`` trace of a few training steps, summarised for someone who cannot open it.

:func:`summarize` reads a finished :class:`torch.profiler.profile` (recorded with ``with_stack=True``) over
``steps`` steps and returns plain numbers; :func:`render` turns them into Markdown:

- **top ops by device time**: the ATen ops and kernels that hold the GPU longest (self device time, summed over
  the window, and per step);
- **top ops by CPU time**: the ATen ops and CUDA runtime calls that hold the host longest (self CPU time);
- **GPU idle between kernels**: the kernels' busy time is the union of their intervals; the idle time is the span
  from the first kernel's start to the last one's end less that union, per step. A launch-bound step shows a large
  idle share: the GPU waits for the host to launch the next kernel;
- **host syncs with their call site**: every place the host waited for the device — on CUDA the runtime's
  ``cuda*Synchronize`` calls (``.item()``, ``.cpu()``, ``.tolist()`` and blocking copies go through one), on a CPU
  the reads of a value (``aten::_local_scalar_dense``) and the data-dependent shapes (``aten::nonzero``), which are
  syncs on a GPU — grouped by the innermost Python frame outside torch that led to it (``with_stack``).

Only torch is needed; nothing here depends on drivetrain's models. On a CPU the device tables are empty and say so.

Example:
    >>> import torch
    >>> from torch.profiler import ProfilerActivity, profile
    >>> with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
    ...     _ = [(torch.ones(3) * 2).sum().item() for _ in range(2)]
    >>> summary = summarize(prof, steps=2)
    >>> summary["syncs_per_step"]
    1.0
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from torch.autograd import DeviceType

__all__ = ["SYNC_OPS_CPU", "render", "summarize"]

SYNC_OPS_CPU = ("aten::_local_scalar_dense", "aten::nonzero")  # host waits on a GPU, visible as ops on a CPU
_PY_FRAME = re.compile(r"^(?P<file>[^()]+\.py)\((?P<line>\d+)\): (?P<func>.+)$")
_INTERNAL = ("torch/", "<built-in", "threading.py", "contextlib.py", "functools.py", "runpy.py", "<frozen")


def summarize(prof: Any, steps: int, *, top: int = 30) -> dict[str, Any]:
    """The numbers of the module docstring from a finished profile of ``steps`` steps.

    Args:
        prof: a finished ``torch.profiler.profile`` (``with_stack=True`` for the call sites).
        steps: how many steps the profile covers (the per-step figures divide by it).
        top: rows in each op table.

    Returns:
        ``{"steps", "device_ops": [{"name", "count", "self_ms", "ms_per_step"}], "cpu_ops": [same], "gpu": {"busy_ms",
        "span_ms", "idle_ms", "idle_ms_per_step", "idle_share", "kernels"} or None without device kernels,
        "syncs": [{"site", "kind", "count", "per_step"}], "syncs_per_step"}``.
    """
    if steps < 1:
        raise ValueError(f"steps: must be ≥ 1, got {steps}")
    events = list(prof.events())
    averages = prof.key_averages()
    device_ops, cpu_ops = [], []
    for avg in averages:
        name, count = avg.key, avg.count
        device_us = float(getattr(avg, "self_device_time_total", 0.0) or 0.0)
        if device_us > 0:
            device_ops.append(_op_row(name, count, device_us, steps))
        if name.startswith(("aten::", "cuda", "cu")) and avg.self_cpu_time_total > 0:
            cpu_ops.append(_op_row(name, count, float(avg.self_cpu_time_total), steps))
    device_ops.sort(key=lambda r: -r["self_ms"])
    cpu_ops.sort(key=lambda r: -r["self_ms"])
    kernels = [(e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA]
    syncs = _syncs(events, steps, cuda=bool(kernels) or any(e.name.startswith("cuda") for e in events))
    return {
        "steps": steps,
        "device_ops": device_ops[:top],
        "cpu_ops": cpu_ops[:top],
        "gpu": _idle(kernels, steps) if kernels else None,
        "syncs": syncs,
        "syncs_per_step": sum(s["count"] for s in syncs) / steps,
    }


def render(summary: dict[str, Any], title: str, *, notes: list[str] | None = None) -> str:
    """Markdown of :func:`summarize`'s numbers under ``title`` (with ``notes`` as a list after it)."""
    steps = summary["steps"]
    lines = [f"# {title}", ""]
    lines += [f"- {note}" for note in notes or []]
    lines += ["", f"Profiled steps: {steps} (torch.profiler, `with_stack=True`).", ""]
    gpu = summary["gpu"]
    lines += ["## GPU idle between kernels", ""]
    if gpu is None:
        lines += ["No device kernels in the trace (a CPU run): nothing to say about GPU idle time.", ""]
    else:
        lines += [
            "| kernels | busy ms / step | span ms / step | idle ms / step | idle share |",
            "|---:|---:|---:|---:|---:|",
            f"| {gpu['kernels']:,} | {gpu['busy_ms'] / steps:.3f} | {gpu['span_ms'] / steps:.3f} | "
            f"{gpu['idle_ms_per_step']:.3f} | {gpu['idle_share']:.1%} |",
            "",
            "Busy = the union of the kernels' intervals; span = first kernel start to last kernel end; idle = span − "
            "busy: the GPU waiting for the host between kernels.",
            "",
        ]
    lines += [f"## Host syncs ({summary['syncs_per_step']:g} per step)", ""]
    if gpu is None:
        lines += [
            "A CPU trace: every read of a tensor's value counts, host tensors included (e.g. an optimizer's step "
            "counters, which are no sync on a GPU); on CUDA only the waits for the device are counted.",
            "",
        ]
    if summary["syncs"]:
        lines += ["| call site | kind | count | per step |", "|---|---|---:|---:|"]
        lines += [f"| `{s['site']}` | {s['kind']} | {s['count']} | {s['per_step']:g} |" for s in summary["syncs"]]
    else:
        lines += ["None seen."]
    lines += [""]
    for key, heading in (("device_ops", "by device (CUDA) time"), ("cpu_ops", "by CPU time")):
        rows = summary[key]
        lines += [f"## Top {len(rows)} ops {heading}", ""]
        if not rows:
            lines += ["None in the trace.", ""]
            continue
        lines += ["| op | calls | self ms | ms / step |", "|---|---:|---:|---:|"]
        lines += [
            f"| `{_cell(r['name'])}` | {r['count']:,} | {r['self_ms']:.3f} | {r['ms_per_step']:.3f} |" for r in rows
        ]
        lines += [""]
    return "\n".join(lines)


def _op_row(name: str, count: int, self_us: float, steps: int) -> dict[str, Any]:
    return {
        "name": name,
        "count": int(count),
        "self_ms": round(self_us / 1e3, 6),
        "ms_per_step": round(self_us / 1e3 / steps, 6),
    }


def _idle(intervals: list[tuple[float, float]], steps: int) -> dict[str, Any]:
    """Busy time as the union of ``(start, end)`` µs intervals; idle = span − busy (module docstring)."""
    intervals.sort()
    busy, current_start, current_end = 0.0, intervals[0][0], intervals[0][1]
    for start, end in intervals[1:]:
        if start > current_end:
            busy += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    busy += current_end - current_start
    span = max(end for _, end in intervals) - intervals[0][0]
    idle = span - busy
    return {
        "kernels": len(intervals),
        "busy_ms": round(busy / 1e3, 6),
        "span_ms": round(span / 1e3, 6),
        "idle_ms": round(idle / 1e3, 6),
        "idle_ms_per_step": round(idle / 1e3 / steps, 6),
        "idle_share": round(idle / span, 6) if span > 0 else 0.0,
    }


def _syncs(events: list[Any], steps: int, *, cuda: bool) -> list[dict[str, Any]]:
    """Host syncs grouped by call site: CUDA runtime ``*Synchronize`` calls on CUDA, the ops of
    :data:`SYNC_OPS_CPU` on a CPU (an op inside another counted op is not counted again)."""
    if cuda:
        found = [(e, e.name) for e in events if e.name.startswith("cuda") and "Synchronize" in e.name]
    else:
        found = [(e, e.name) for e in events if e.name in SYNC_OPS_CPU and not _inside(e, SYNC_OPS_CPU)]
    counts = Counter((_call_site(e), kind) for e, kind in found)
    return [
        {"site": site, "kind": kind, "count": n, "per_step": round(n / steps, 3)}
        for (site, kind), n in counts.most_common()
    ]


def _inside(event: Any, names: tuple[str, ...]) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


def _call_site(event: Any) -> str:
    """The innermost Python frame outside torch and the standard library above ``event`` (``file(line): func``)."""
    parent = event.cpu_parent
    while parent is not None:
        match = _PY_FRAME.match(parent.name)
        if match and not match["file"].startswith(_INTERNAL) and "/torch/" not in match["file"]:
            return parent.name
        parent = parent.cpu_parent
    return "(no Python frame: recorded without with_stack, or from a C++ thread)"


def _cell(text: str) -> str:
    """A Markdown table cell: pipes escaped, long kernel names cut."""
    text = text.replace("|", "\\|")
    return text if len(text) <= 110 else text[:107] + "..."
