"""Shared plumbing of ``drivetrain bench <what>``: options, paired timing, rows from profilers, output.

Every benchmark times its reference and batched paths in one process on the same data, after warm-up,
with the device synchronised around each timed region; the two paths are interleaved repeat by repeat so
drifting machine load hits both alike. Results are medians, each with the slowest timed repeat beside it
(:class:`~drivetrain.profile.results.Row`: a max over ``MAX_OVER_MEDIAN`` × the median is flagged, so a compile or
a cold start inside the timed repeats shows). Each path's ATen kernels and host syncs are
counted in an untimed call of their own (:mod:`drivetrain.profile.costmodel`): :func:`compare` after timing,
a :class:`~drivetrain.profile.Profiler` in its last warm-up step.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from drivetrain.profile.allocator import retain_freed_memory
from drivetrain.profile.costmodel import Cost, count_call
from drivetrain.profile.results import BenchResult, Row, backend_flags, device_slug
from drivetrain.profile.timer import Profiler, synchronize

__all__ = [
    "Samples",
    "add_bench_arguments",
    "compare",
    "count_variation",
    "emit",
    "resolve_device",
    "rows_from_profilers",
    "setup_bench",
]

RESULTS_DIR = Path("benchmarks") / "results"
# Every benchmark starts from the trainer's defaults (``speed.tf32``, ``speed.cudnn_benchmark``: both off), so that
# the networks two benchmarks time run under the same settings, those of a default training run (torch's own
# default leaves cuDNN's TF32 on, which the trainer turns off); a benchmark that trains applies its config's speed
# section on top, and :func:`emit` records the settings in effect (``config.backends``).
BENCH_TF32 = False
BENCH_CUDNN_BENCHMARK = False


def add_bench_arguments(parser: argparse.ArgumentParser, *, repeat: int = 20, warmup: int = 3) -> None:
    """The options every benchmark takes (docs/benchmarks.md): device, repeat, warmup, output files."""
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--repeat", type=int, default=repeat, help=f"timed repeats per path (default: {repeat})")
    parser.add_argument("--warmup", type=int, default=warmup, help=f"untimed repeats first (default: {warmup})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random benchmark data (default: 0)")
    parser.add_argument("--json", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--md", type=Path, default=None, help="write the result as Markdown here")
    parser.add_argument(
        "--save",
        action="store_true",
        help=f"write both to {RESULTS_DIR}/<benchmark>-<device>.{{json,md}} (the committed results)",
    )
    parser.add_argument("--png", type=Path, default=None, help="also write a chart here (--save: next to the JSON)")
    parser.add_argument("--nvtx", action="store_true", help="emit NVTX ranges per region (CUDA only)")
    parser.add_argument(
        "--malloc",
        choices=["retain", "default"],
        default="retain",
        help="host allocator: 'retain' keeps freed memory in the process (glibc mallopt), so both paths reuse "
        "warm pages as in a long training run instead of timing page faults; 'default' leaves glibc as it is "
        "(default: retain; see drivetrain.profile.allocator)",
    )


def setup_bench(args: argparse.Namespace) -> torch.device:
    """Apply the process settings the options ask for (``--malloc``), set TF32 and cuDNN's autotuner to the trainer's
    defaults (:data:`BENCH_TF32`, :data:`BENCH_CUDNN_BENCHMARK`) and resolve ``--device``."""
    device = resolve_device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = BENCH_TF32
    torch.backends.cudnn.allow_tf32 = BENCH_TF32
    torch.backends.cudnn.benchmark = BENCH_CUDNN_BENCHMARK
    if getattr(args, "malloc", "default") == "retain" and not retain_freed_memory():
        print("note: --malloc retain needs glibc's mallopt, which this system lacks; the allocator is unchanged")
        args.malloc = "default"
    return device


def resolve_device(name: str) -> torch.device:
    """``torch.device`` for a ``--device`` value, with a clear error when it is unavailable."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise SystemExit(f"--device: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available on this machine; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device: expected cpu or cuda, got {name!r}")
    return device


class Samples(list):
    """Per-repeat milliseconds of one path, with ``cost``: its kernels and host syncs in one untimed call (None
    when not counted). ``Row.from_samples(name, reference, batched, reference_cost=reference.cost, ...)`` makes a
    row of two of them (medians and maxima)."""

    cost: Cost | None = None


def compare(
    reference: Callable[[], Any],
    batched: Callable[[], Any],
    *,
    device: torch.device | str,
    repeat: int,
    warmup: int,
    count: bool = True,
) -> tuple[Samples, Samples]:
    """Time two callables alternately; return their per-repeat milliseconds (warm-up excluded).

    With ``count``, each callable then runs once more, untimed, under a
    :class:`~drivetrain.profile.costmodel.CostCounter`; the counts are the returned lists' ``cost``.
    """
    if repeat < 1:
        raise ValueError(f"repeat: must be ≥ 1, got {repeat}")
    prof = Profiler(device, warmup=warmup, count=False)
    for _ in range(warmup + repeat):
        for name, fn in (("reference", reference), ("batched", batched)):
            synchronize(prof.device)
            with prof.region(name):
                fn()
            synchronize(prof.device)
        prof.step()
    out = Samples(prof.samples("reference")), Samples(prof.samples("batched"))
    if count:
        for samples, fn in zip(out, (reference, batched), strict=True):
            synchronize(prof.device)
            samples.cost = count_call(fn)
            synchronize(prof.device)
    return out


def count_variation(per_batch: list[dict[str, int]], warmup: int) -> dict[str, Any]:
    """How counts that set a shape (e.g. the padded ground-truth count G a matcher solves) varied over the timed
    batches, for a benchmark's config.

    Args:
        per_batch: each batch's counts by name (the same names in every batch), warm-up batches first.
        warmup: how many leading batches are warm-up batches; the rest are timed.

    Returns:
        ``{"batches": number timed, name: {"per_batch": [count of each timed batch], "distinct": how many values
        those took, "not_in_warmup": how many of them no warm-up batch had}}``: a kernel compiled per shape compiles
        ``not_in_warmup`` times inside the timed repeats.
    """
    timed = per_batch[warmup:]
    out: dict[str, Any] = {"batches": len(timed)}
    for name in per_batch[0] if per_batch else {}:
        seen = {b[name] for b in per_batch[:warmup]}
        values = [b[name] for b in timed]
        out[name] = {"per_batch": values, "distinct": len(set(values)), "not_in_warmup": len(set(values) - seen)}
    return out


def rows_from_profilers(reference: Profiler, batched: Profiler) -> list[Row]:
    """Rows for every region both profilers timed, parents from the ``/``-separated names: each path's median and
    slowest timed step, and its kernels and host syncs from its counted step (:meth:`Profiler.cost`)."""
    ref, bat = reference.summary(), batched.summary()
    rows = []
    for name in reference.names:
        if name in ref and name in bat:
            parent = name.rsplit("/", 1)[0] if "/" in name else None
            rows.append(
                Row(
                    name=name,
                    reference_ms=ref[name].median,
                    batched_ms=bat[name].median,
                    parent=parent,
                    reference_cost=reference.cost(name),
                    batched_cost=batched.cost(name),
                    reference_max_ms=ref[name].max,
                    batched_max_ms=bat[name].max,
                )
            )
    return rows


def result_paths(result: BenchResult, args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    """Where :func:`emit` writes the JSON and the Markdown: ``--json`` and ``--md``, else with ``--save``
    ``benchmarks/results/<benchmark>-<device>.{json,md}`` (None: not written)."""
    json_path, md_path = args.json, args.md
    if args.save:
        stem = f"{result.benchmark}-{device_slug(args.device)}"
        json_path = json_path or RESULTS_DIR / f"{stem}.json"
        md_path = md_path or RESULTS_DIR / f"{stem}.md"
    return json_path, md_path


def emit(result: BenchResult, args: argparse.Namespace, *, chart: bool = True) -> list[Path]:
    """Print the table and write the files the options ask for (JSON, Markdown and, with ``chart``, the
    :func:`~drivetrain.profile.charts.bench_chart` PNG at ``--png`` or, with ``--save``, next to the JSON);
    return the paths written. Benchmarks that draw a picture of their own pass ``chart=False``. The config records
    the TF32 and ``cudnn.benchmark`` settings in effect (``backends``) unless the benchmark recorded its own."""
    if hasattr(args, "malloc"):
        result.config.setdefault("malloc", args.malloc)
    result.config.setdefault("backends", backend_flags())
    print(result.render_table())
    json_path, md_path = result_paths(result, args)
    written = result.write(json_path, md_path)
    png = getattr(args, "png", None) or (Path(json_path).with_suffix(".png") if args.save and json_path else None)
    if chart and png is not None:
        from drivetrain.profile.charts import bench_chart

        if bench_chart(result, png) is not None:
            written.append(Path(png))
    for path in written:
        print(f"wrote {path}")
    return written
