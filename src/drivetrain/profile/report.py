"""Benchmark results: rows of reference-vs-batched medians, rendered as a breakdown table, JSON and Markdown.

One format for every ``drivetrain bench <what>`` (see DESIGN.md):
``{"benchmark", "device", "torch", "date", "config", "rows": [row, ...]}`` with
``row = {"name", "parent", "reference_ms", "batched_ms", "speedup"}`` (medians; ``parent`` names the
enclosing row and builds the tree). Rows that compare more than two variants add
``"variants": {name: ms}`` and ``"baseline"``. Extra top-level keys (``versions``, ``resources``,
``notes``) carry context for people and never change the meaning of the rows.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["BenchResult", "Row", "device_name", "device_slug", "environment"]


@dataclass
class Row:
    """One line of the breakdown: medians of the two paths in milliseconds."""

    name: str
    reference_ms: float
    batched_ms: float
    parent: str | None = None
    variants: dict[str, float] | None = None
    baseline: str | None = None

    @property
    def speedup(self) -> float:
        """``reference_ms / batched_ms``; inf when ``batched_ms`` is not positive."""
        return self.reference_ms / self.batched_ms if self.batched_ms > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        """The row in the JSON format; ``variants`` and ``baseline`` only when ``variants`` is set."""
        out: dict[str, Any] = {
            "name": self.name,
            "parent": self.parent,
            "reference_ms": round(self.reference_ms, 6),
            "batched_ms": round(self.batched_ms, 6),
            "speedup": round(self.speedup, 4),
        }
        if self.variants is not None:
            out["variants"] = {k: round(v, 6) for k, v in self.variants.items()}
            out["baseline"] = self.baseline
        return out


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
            **self.extra,
        }

    def _depths(self) -> dict[str, int]:
        depth: dict[str, int] = {}
        for r in self.rows:
            depth[r.name] = 0 if r.parent is None else depth[r.parent] + 1
        return depth

    def _table_rows(self) -> list[tuple[str, str, str, str]]:
        depth = self._depths()
        lines = []
        for r in self.rows:
            label = "  " * depth[r.name] + ("↳ " if depth[r.name] else "") + r.name
            lines.append((label, f"{r.reference_ms:.3f}", f"{r.batched_ms:.3f}", f"×{r.speedup:.2f}"))
        return lines

    def render_table(self) -> str:
        """Plain-text breakdown table for the console."""
        header = ("region", "reference ms", "batched ms", "speedup")
        rows = [header, *self._table_rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        fmt = [f"{{:<{widths[0]}}}"] + [f"{{:>{w}}}" for w in widths[1:]]
        out = [f"{self.benchmark} on {self.device} (medians)"]
        for i, row in enumerate(rows):
            out.append("  ".join(f.format(c) for f, c in zip(fmt, row, strict=True)))
            if i == 0:
                out.append("  ".join("-" * w for w in widths))
        return "\n".join(out)

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
            "| region | reference (ms) | batched (ms) | speedup |",
            "|---|---:|---:|---:|",
        ]
        for label, ref, bat, sp in self._table_rows():
            lines.append(f"| {label.replace('  ', '&nbsp;&nbsp;')} | {ref} | {bat} | {sp} |")
        if any(r.variants for r in self.rows):
            lines += ["", "| region | baseline | " + " | ".join(self._variant_names()) + " |"]
            lines.append("|---|---|" + "---:|" * len(self._variant_names()))
            for r in self.rows:
                if r.variants:
                    cells = [f"{r.variants[v]:.3f}" if v in r.variants else "" for v in self._variant_names()]
                    lines.append(f"| {r.name} | {r.baseline} | " + " | ".join(cells) + " |")
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
        """Write the JSON and/or Markdown files (parent folders are created); return the paths written."""
        written = []
        if json_path is not None:
            path = Path(json_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
            written.append(path)
        if md_path is not None:
            path = Path(md_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.to_markdown())
            written.append(path)
        return written


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
