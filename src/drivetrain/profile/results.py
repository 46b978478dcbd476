"""Benchmark results: rows of reference-vs-batched medians, rendered as a breakdown table, JSON and Markdown.

One format for every ``drivetrain bench <what>`` (docs/design.md, "Two paths"; docs/benchmarks.md):
``{"benchmark", "device", "torch", "date", "config", "rows": [row, ...]}`` with
``row = {"name", "parent", "reference_ms", "batched_ms", "speedup", "reference_max_ms", "batched_max_ms",
"max_over_median", "max_over_median_paths"}`` (medians, and each path's slowest timed repeat: null where the
benchmark recorded none; ``parent`` names the enclosing row and builds the tree). ``"max_over_median"`` is true
when some path's max exceeds :data:`MAX_OVER_MEDIAN` × its median, and ``"max_over_median_paths"`` lists those
paths (``"reference"``, ``"batched"``, variant names): a compile, a cold start or a stall in a timed repeat, which
the median hides. Rows that compare more than two variants add ``"variants": {name: ms}``, ``"baseline"`` and,
where recorded, ``"variants_max": {name: ms}``. Extra top-level keys (``versions``, ``resources``, ``notes``)
carry context for people and never change the meaning of the rows.

Counted rows (:mod:`drivetrain.profile.costmodel`) add ``"reference_kernels"``, ``"reference_syncs"``,
``"reference_gpu_est_ms"`` and the same three for ``batched`` (null for a path that was not counted), and
rows with variants ``"variants_cost": {name: {"kernels", "syncs", "gpu_est_ms"}}``; the top-level
``"cost_model"`` records the constants of the estimate. Files without these keys read as rows not counted, and
files without the max keys as rows without a recorded max.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from drivetrain.profile import costmodel
from drivetrain.profile.costmodel import LABEL, Cost
from drivetrain.profile.timer import Stats
from drivetrain.safeio.files import replace_text

__all__ = ["MAX_OVER_MEDIAN", "BenchResult", "Row", "device_name", "device_slug", "environment"]

MISSING = "–"  # a path or row that was not counted
# A path whose slowest timed repeat exceeds this many times its median is flagged. Steady repeats spread far less:
# the committed ragged results' max / median is at most 2.2 on a shared CPU and 1.4 on CUDA. A one-off costs far
# more than a warm call: a Triton kernel compiled for a new shape took 0.3–0.75 s against a solve well under 1 ms
# (issue 38), a torch.compile recompile seconds against a loss of milliseconds. 5 lies between the two: noise
# seldom reaches it, and a one-off in fewer than half the repeats passes it (in more than half it is the median
# itself, which no max shows: a benchmark says how many distinct shapes its timed repeats saw for that).
MAX_OVER_MEDIAN = 5.0
FLAG = "⚠"  # marks a flagged path's max in the tables


@dataclass
class Row:
    """One line of the breakdown: medians of the two paths in milliseconds, each path's slowest timed repeat (None
    when not recorded), and what each path costs a GPU (kernels, host syncs; None when not counted).

    Build it from per-repeat samples with :meth:`from_samples` (medians and maxima), or give the medians and
    ``reference_max_ms`` / ``batched_max_ms`` (and ``variants_max``) by hand.
    """

    name: str
    reference_ms: float
    batched_ms: float
    parent: str | None = None
    variants: dict[str, float] | None = None
    baseline: str | None = None
    reference_cost: Cost | None = None
    batched_cost: Cost | None = None
    variant_costs: dict[str, Cost | None] | None = None
    reference_max_ms: float | None = None
    batched_max_ms: float | None = None
    variants_max: dict[str, float | None] | None = None

    @classmethod
    def from_samples(cls, name: str, reference: Sequence[float], batched: Sequence[float], **kwargs: Any) -> Row:
        """A row from each path's per-repeat milliseconds: their medians and maxima; ``kwargs`` as the fields.

        Raises:
            ValueError: if a path has no samples.
        """
        ref, bat = Stats.of(list(reference)), Stats.of(list(batched))
        return cls(name, ref.median, bat.median, reference_max_ms=ref.max, batched_max_ms=bat.max, **kwargs)

    @property
    def max_over_median_paths(self) -> list[str]:
        """The paths whose max exceeds :data:`MAX_OVER_MEDIAN` × their median: ``"reference"``, ``"batched"``,
        then the variants' names (those also named by ``reference``/``batched`` included), in that order."""
        paths = [
            ("reference", self.reference_ms, self.reference_max_ms),
            ("batched", self.batched_ms, self.batched_max_ms),
        ]
        paths += [(k, v, (self.variants_max or {}).get(k)) for k, v in (self.variants or {}).items()]
        flagged: list[str] = []
        for path, median, slowest in paths:
            if _flagged(median, slowest) and path not in flagged:
                flagged.append(path)
        return flagged

    @property
    def speedup(self) -> float:
        """``reference_ms / batched_ms``; inf when ``batched_ms`` is not positive."""
        return self.reference_ms / self.batched_ms if self.batched_ms > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        """The row in the JSON format: the maxima and the flag always (null and false where no max was recorded),
        ``variants`` and ``baseline`` only when ``variants`` is set, the counts only when a path was counted."""
        out: dict[str, Any] = {
            "name": self.name,
            "parent": self.parent,
            "reference_ms": round(self.reference_ms, 6),
            "batched_ms": round(self.batched_ms, 6),
            "speedup": round(self.speedup, 4),
            "reference_max_ms": _rounded(self.reference_max_ms),
            "batched_max_ms": _rounded(self.batched_max_ms),
        }
        flagged = self.max_over_median_paths
        out.update(max_over_median=bool(flagged), max_over_median_paths=flagged)
        if self.reference_cost is not None or self.batched_cost is not None:
            for path, cost in (("reference", self.reference_cost), ("batched", self.batched_cost)):
                counts = cost.as_dict() if cost is not None else {"kernels": None, "syncs": None, "gpu_est_ms": None}
                out.update({f"{path}_{key}": value for key, value in counts.items()})
        if self.variants is not None:
            out["variants"] = {k: round(v, 6) for k, v in self.variants.items()}
            out["baseline"] = self.baseline
            if self.variants_max:
                out["variants_max"] = {k: _rounded(v) for k, v in self.variants_max.items()}
            if self.variant_costs:
                out["variants_cost"] = {
                    k: c.as_dict() if c is not None else None for k, c in self.variant_costs.items()
                }
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        """A row of a saved result (:meth:`as_dict`'s format; files from before the counts read as not counted,
        files from before the maxima as rows without a recorded max; the flag is derived, not read)."""
        variant_costs = {k: Cost.from_dict(v) for k, v in (data.get("variants_cost") or {}).items()} or None
        return cls(data["name"], data["reference_ms"], data["batched_ms"], parent=data.get("parent"),
                   variants=data.get("variants"), baseline=data.get("baseline"),
                   reference_cost=Cost.from_dict(data, "reference_"), batched_cost=Cost.from_dict(data, "batched_"),
                   variant_costs=variant_costs, reference_max_ms=data.get("reference_max_ms"),
                   batched_max_ms=data.get("batched_max_ms"), variants_max=data.get("variants_max"))  # fmt: skip

    def time_cells(self) -> tuple[str, str]:
        """Table cells of the two paths: the median, then the max in parentheses where recorded, with
        :data:`FLAG` after a max over :data:`MAX_OVER_MEDIAN` × the median (``"12.300 (80.100 ⚠)"``)."""
        return _time_cell(self.reference_ms, self.reference_max_ms), _time_cell(self.batched_ms, self.batched_max_ms)

    def cost_cells(self) -> tuple[str, str, str]:
        """Table cells: kernels "reference / batched", syncs likewise, and the GPU estimate in ms."""
        ref, bat = self.reference_cost, self.batched_cost
        return (
            f"{_count(ref, 'kernels')} / {_count(bat, 'kernels')}",
            f"{_count(ref, 'syncs')} / {_count(bat, 'syncs')}",
            f"{_estimate(ref)} / {_estimate(bat)}",
        )


def _flagged(median: float, slowest: float | None) -> bool:
    return slowest is not None and slowest > MAX_OVER_MEDIAN * median


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 6)


def _time_cell(median: float, slowest: float | None) -> str:
    """``"12.300"``, ``"12.300 (15.000)"`` or, flagged, ``"12.300 (80.100 ⚠)"``."""
    if slowest is None:
        return f"{median:.3f}"
    return f"{median:.3f} ({slowest:.3f}{' ' + FLAG if _flagged(median, slowest) else ''})"


def _count(cost: Cost | None, field: str) -> str:
    if cost is None:
        return MISSING
    value = getattr(cost, field)
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _estimate(cost: Cost | None) -> str:
    return MISSING if cost is None else f"{cost.gpu_est_ms:.3f}"


COST_HEADERS = ("kernels ref / bat", "syncs ref / bat", f"{LABEL} ms ref / bat")


@dataclass
class BenchResult:
    """A benchmark's result; ``rows`` in display order, children after their parent."""

    benchmark: str
    device: str
    config: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    date: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    versions: dict[str, str] = field(default_factory=lambda: environment())
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> Row:
        """Append ``row`` and return it.

        Raises:
            ValueError: if ``row.parent`` does not name a row added before.
        """
        if row.parent is not None and row.parent not in {r.name for r in self.rows}:
            raise ValueError(f"parent: row {row.name!r} names parent {row.parent!r}, which is not a row yet")
        self.rows.append(row)
        return row

    def as_dict(self) -> dict[str, Any]:
        """The result in the JSON format of the module docstring; ``extra`` keys are merged at the top level."""
        return {
            "benchmark": self.benchmark,
            "device": self.device,
            "torch": torch.__version__,
            "date": self.date,
            "config": self.config,
            "rows": [r.as_dict() for r in self.rows],
            "versions": self.versions,
            "notes": self.notes,
            "cost_model": {
                "label": LABEL,
                "per_kernel_us": costmodel.PER_KERNEL_US,
                "per_sync_us": costmodel.PER_SYNC_US,
                "gpu_est_ms": "(kernels * per_kernel_us + syncs * per_sync_us) / 1000",
            },
            **self.extra,
        }

    def _depths(self) -> dict[str, int]:
        depth: dict[str, int] = {}
        for r in self.rows:
            depth[r.name] = 0 if r.parent is None else depth[r.parent] + 1
        return depth

    def _table_rows(self) -> list[tuple[str, ...]]:
        depth = self._depths()
        lines = []
        for r in self.rows:
            label = "  " * depth[r.name] + ("↳ " if depth[r.name] else "") + r.name
            label += f" {FLAG}" if r.max_over_median_paths else ""  # the row, whichever path (or variant) it is
            lines.append((label, *r.time_cells(), f"×{r.speedup:.2f}", *r.cost_cells()))
        return lines

    def flagged(self) -> list[Row]:
        """Rows with a path whose max exceeds :data:`MAX_OVER_MEDIAN` × its median."""
        return [r for r in self.rows if r.max_over_median_paths]

    def _max_notes(self) -> list[str]:
        """The note on the (max) cells, and one line naming the flagged rows and paths, if any."""
        notes = [
            f"(max) = the slowest timed repeat, beside the median (a median alone: no max recorded); {FLAG} = max > "
            f"{MAX_OVER_MEDIAN:g}× median: a compile, a cold start or a stall in a timed repeat, which the median hides"
        ]
        flagged = self.flagged()
        if flagged:
            listed = "; ".join(f"{r.name} ({', '.join(r.max_over_median_paths)})" for r in flagged)
            notes.append(f"{FLAG} max > {MAX_OVER_MEDIAN:g}× median in {len(flagged)} row(s): {listed}")
        return notes

    def render_table(self) -> str:
        """Plain-text breakdown table for the console: times, then each path's kernels, syncs and GPU estimate."""
        header = ("region", "reference ms (max)", "batched ms (max)", "speedup", *COST_HEADERS)
        rows = [header, *self._table_rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        fmt = [f"{{:<{widths[0]}}}"] + [f"{{:>{w}}}" for w in widths[1:]]
        out = [f"{self.benchmark} on {self.device} (medians; {self._cost_note()})"]
        for i, row in enumerate(rows):
            out.append("  ".join(f.format(c) for f, c in zip(fmt, row, strict=True)))
            if i == 0:
                out.append("  ".join("-" * w for w in widths))
        out += self._max_notes()
        return "\n".join(out)

    @staticmethod
    def _cost_note() -> str:
        return (
            f"{LABEL} = kernels × {costmodel.PER_KERNEL_US:g} µs + syncs × {costmodel.PER_SYNC_US:g} µs, "
            f"counted in one untimed call per path: an estimate, a lower bound for launch-bound work; "
            f"{MISSING} = not counted"
        )

    def to_markdown(self) -> str:
        """Markdown report: header, breakdown table, variants table (if any), ``extra`` entries and notes."""
        lines = [
            f"# Benchmark `{self.benchmark}`",
            "",
            f"- device: {self.device}",
            f"- torch {torch.__version__}; " + ", ".join(f"{k} {v}" for k, v in self.versions.items()),
            f"- date: {self.date}",
            "- config: " + ", ".join(f"{k}={v}" for k, v in self.config.items()),
            "",
            "| region | reference ms (max) | batched ms (max) | speedup | " + " | ".join(COST_HEADERS) + " |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for label, *cells in self._table_rows():
            lines.append(f"| {label.replace('  ', '&nbsp;&nbsp;')} | " + " | ".join(cells) + " |")
        lines += ["", f"*{self._cost_note()} (drivetrain.profile.costmodel).*"]
        max_note, *flagged = self._max_notes()
        lines += ["", f"*{max_note}.*", *[f"\n**{line}**" for line in flagged]]
        if any(r.variants for r in self.rows):
            lines += ["", "| region | baseline | " + " | ".join(self._variant_names()) + " |"]
            lines.append("|---|---|" + "---:|" * len(self._variant_names()))
            for r in self.rows:
                if r.variants:
                    slowest = r.variants_max or {}
                    cells = [
                        _time_cell(r.variants[v], slowest.get(v)) if v in r.variants else ""
                        for v in self._variant_names()
                    ]
                    lines.append(f"| {r.name} | {r.baseline} | " + " | ".join(cells) + " |")
            lines += ["", f"Variants, kernels / syncs / {LABEL} ms:", ""]
            lines += ["| region | " + " | ".join(self._variant_names()) + " |"]
            lines.append("|---|" + "---:|" * len(self._variant_names()))
            for r in self.rows:
                if r.variants:
                    costs = r.variant_costs or {}
                    cells = [_variant_cost(costs.get(v)) if v in r.variants else "" for v in self._variant_names()]
                    lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
        for key, value in self.extra.items():
            lines += ["", f"**{key}**: `{json.dumps(value)}`"]
        if self.notes:
            lines += ["", *[f"- {n}" for n in self.notes]]
        return "\n".join(lines) + "\n"

    def _variant_names(self) -> list[str]:
        names: list[str] = []
        for r in self.rows:
            for v in r.variants or {}:
                if v not in names:
                    names.append(v)
        return names

    def write(self, json_path: str | Path | None = None, md_path: str | Path | None = None) -> list[Path]:
        """Write the JSON and/or Markdown files (parent folders are created; a link at either name is replaced, its
        target never written: :func:`~drivetrain.safeio.files.replace_text`); return the paths written."""
        written = []
        if json_path is not None:
            path = Path(json_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_text(path, json.dumps(self.as_dict(), indent=2) + "\n")
            written.append(path)
        if md_path is not None:
            path = Path(md_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_text(path, self.to_markdown())
            written.append(path)
        return written


def _variant_cost(cost: Cost | None) -> str:
    if cost is None:
        return MISSING
    return f"{_count(cost, 'kernels')} / {_count(cost, 'syncs')} / {_estimate(cost)}"


def device_name(device: torch.device | str) -> str:
    """Human-readable device: the GPU's name, or the CPU model and its logical core count."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {model} ({os.cpu_count()} logical cores)"


def device_slug(device: torch.device | str) -> str:
    """Short file-name part for result files: ``cpu`` or the GPU's name, e.g. ``nvidia-h100-80gb-hbm3``."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


def backend_flags() -> dict[str, bool | str]:
    """The process-wide math settings a timing depends on: TF32 for matmuls and for cuDNN convolutions, cuDNN's
    autotuner (``cudnn.benchmark``) and the float32 matmul precision, as they are now."""
    return {
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def environment() -> dict[str, str]:
    """Versions that matter for a timing: Python, NumPy, CUDA/cuDNN when present, drivetrain."""
    import numpy

    import drivetrain

    env = {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "drivetrain": drivetrain.__version__,
        "threads": str(torch.get_num_threads()),
    }
    if torch.version.cuda:
        env["cuda"] = torch.version.cuda
    if torch.backends.cudnn.is_available():
        env["cudnn"] = str(torch.backends.cudnn.version())
    return env
