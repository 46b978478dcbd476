"""A benchmark result as a picture: time per row, reference vs batched, and the ratio, with the published anchor.

Left panel: each row's median time, reference and batched side by side (log scale; children indented under
their parent, as in the Markdown table), a whisker from each median to the path's slowest timed repeat where the
result records it, and ``⚠`` before the label of a row whose max exceeds ``MAX_OVER_MEDIAN`` × its median. Right
panel: each row's speedup (reference / batched), a line at ×1 and, where the benchmark names a published figure for
a row (``BenchResult.extra["published"]``: row name → ``(speedup, source)``), a line with a diamond at that figure.
Every ``drivetrain bench`` writes it next to its JSON with ``--save`` (or where ``--png`` says); benchmarks with a
picture of their own (iteration, sweeps, precision of the lidar detector, augment) draw that instead. Needs
matplotlib (the ``viz`` extra); without it a note is printed.

``python -m drivetrain.profile.charts RESULT.json [...]`` draws saved results (``benchmarks/results/*.json``) next
to their JSON.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from drivetrain.profile.results import FLAG, BenchResult, Row
from drivetrain.safeio import json_files
from drivetrain.safeio.files import save_figure

__all__ = ["bench_chart", "load_result"]

REFERENCE, BATCHED, ANCHOR = "#ff7f0e", "#1f77b4", "#2ca02c"


def bench_chart(result: BenchResult, path: str | Path) -> Path | None:
    """Write ``result``'s chart to ``path``; None (with a printed note) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: matplotlib is not installed; no chart written to {path} (pip install 'drivetrain[viz]')")
        return None
    rows = list(result.rows)
    if not rows:
        return None
    depth: dict[str, int] = {}
    for row in rows:
        depth[row.name] = 0 if row.parent is None else depth[row.parent] + 1
    # tick labels are right-aligned: nesting shows as the parent's name before the child's
    labels = [r.name.replace("/", " › ") if r.parent else r.name for r in rows]
    labels = [label if len(label) <= 60 else "…" + label[-57:] for label in labels]
    labels = [
        f"{FLAG} {label}" if row.max_over_median_paths else label for row, label in zip(rows, labels, strict=True)
    ]
    published = result.extra.get("published", {})
    height = 1.2 + 0.32 * len(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, height), dpi=100, sharey=True,
                                      gridspec_kw={"width_ratios": [3, 2]})  # fmt: skip
    positions = list(range(len(rows)))[::-1]  # the first row on top
    left.barh([p + 0.2 for p in positions], [max(r.reference_ms, 1e-6) for r in rows], height=0.38,
              color=REFERENCE, label="reference")  # fmt: skip
    left.barh([p - 0.2 for p in positions], [max(r.batched_ms, 1e-6) for r in rows], height=0.38, color=BATCHED,
              label="batched")  # fmt: skip
    for offset, colour, spans in (
        (0.2, REFERENCE, [(r.reference_ms, r.reference_max_ms) for r in rows]),
        (-0.2, BATCHED, [(r.batched_ms, r.batched_max_ms) for r in rows]),
    ):
        whiskers = [(p + offset, max(lo, 1e-6), max(hi, 1e-6)) for p, (lo, hi) in zip(positions, spans, strict=True)
                    if hi is not None]  # fmt: skip
        if whiskers:
            ys, lows, highs = zip(*whiskers, strict=True)
            left.hlines(ys, lows, highs, color=colour, lw=0.8)
            left.plot(highs, ys, "|", color=colour, ms=5)
    left.set_xscale("log")
    left.set_yticks(positions, labels, fontsize=7)
    left.set_xlabel("ms (median; whisker to the max)")
    left.legend(fontsize=7, loc="lower right")
    speedups = [min(r.speedup, 1e4) for r in rows]
    right.barh(positions, speedups, height=0.6, color=[BATCHED if s >= 1 else REFERENCE for s in speedups])
    right.axvline(1.0, color="black", lw=0.8)
    for row, position in zip(rows, positions, strict=True):
        if row.name in published:
            figure, source = published[row.name]
            right.plot([figure, figure], [position - 0.45, position + 0.45], color=ANCHOR, lw=2.5)  # the anchor line
            right.plot([figure], [position], marker="D", color=ANCHOR, ms=7)
            right.annotate(f"published ×{figure:g} ({source})", (figure, position), xytext=(4, 6),
                           textcoords="offset points", fontsize=6, color=ANCHOR)  # fmt: skip
    right.set_xscale("log")
    right.set_xlabel("speedup, reference / batched (log)")
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{result.benchmark} on {result.device} ({result.date[:10]})", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)  # a link at the name is replaced, its target never written
    plt.close(fig)
    return path


def load_result(path: str | Path) -> BenchResult:
    """A saved result (the JSON ``BenchResult.write`` wrote) back as a :class:`BenchResult` (rows, their counts
    and maxima where recorded, and anchors)."""
    data = json_files.load(path)
    result = BenchResult(data["benchmark"], data["device"], data.get("config", {}), date=data.get("date", ""))
    for row in data["rows"]:
        result.add(Row.from_dict(row))  # kernels and syncs too, where the file has them
    anchors = {}
    for name, value in (data.get("published") or {}).items():  # (ratio, source) pairs; older files: a bare ratio
        if isinstance(value, (int, float)) and name in {r.name for r in result.rows}:
            anchors[name] = (float(value), "published")
        elif isinstance(value, list) and len(value) == 2 and isinstance(value[0], (int, float)):
            anchors[name] = (float(value[0]), str(value[1]))
    if anchors:
        result.extra["published"] = anchors
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m drivetrain.profile.charts RESULT.json [...]``: a chart next to each saved result."""
    parser = argparse.ArgumentParser(prog="python -m drivetrain.profile.charts", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="saved benchmark results (JSON)")
    args = parser.parse_args(argv)
    for path in args.results:
        try:
            result = load_result(path)
        except (OSError, ValueError, KeyError) as err:
            raise SystemExit(f"charts: {path}: not a saved benchmark result ({err})") from None
        written = bench_chart(result, path.with_suffix(".png"))
        if written is not None:
            print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
