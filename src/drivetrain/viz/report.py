"""A run's pictures and one Markdown page: ``drivetrain report RUN [RUN ...] [--out DIR]``.

Reads each run's ``metrics.jsonl`` as it is (a running run included: what is there; a line cut short by a kill
is skipped), its ``config.yaml`` and the versions recorded in its newest checkpoint, and writes into ``--out``
(default: the run directory; several runs: ``RUN_A/report-vs-...`` unless given):

- ``loss.png``: the weighted total loss (raw and a moving average), every run overlaid;
- ``terms.png``: each loss term (moving averages, log scale), a panel per run;
- ``lr.png``: the learning rate; ``scale.png``: the fp16 loss scale and the cumulative skipped steps;
- ``throughput.png``: samples/s; ``time.png``: step time and the data wait within it (median-smoothed);
- ``memory.png``: peak device memory; ``eval.png``: every evaluation metric over steps (when evaluated);
- ``report.md``: the pictures, a table of each run's last values (loss, throughput, data wait share, memory,
  last metrics), each run's config and versions.

Only these files are written (each replaced whole: a link at one of these names is replaced, never written
through), nothing else in the folder is touched.

``scale.png`` is drawn only when some run trained in fp16 (its config says so, or its loss scale moved): an
fp32 or bf16 run has none to show. A quantity no run logged still gets its picture; a metric no run has (no
evaluation yet) gets none. matplotlib comes with the ``viz`` and ``nuscenes`` extras.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from drivetrain.safeio.files import real_dir, replace_bytes, replace_text
from drivetrain.safeio.reads import read_text
from drivetrain.safeio.torch_files import TorchFileError, load_torch_file
from drivetrain.safeio.yaml_files import load_yaml
from drivetrain.viz.curves import _moving_average, read_metrics

__all__ = ["RunRecords", "load_run", "write_report"]

CONFIG_BYTES = 1 << 20  # a run's config.yaml is ~10 KB; engine.config_files.MAX_CONFIG_BYTES bounds configs alike
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def _fp16(run: RunRecords) -> bool:
    """Whether ``run`` trained with fp16 loss scaling: its config's precision.mode, else a loss scale that moved."""
    mode = ((run.config or {}).get("precision") or {}).get("mode") if isinstance(run.config, dict) else None
    if mode is not None:
        return mode == "fp16"
    return len(set(run.series("loss_scale")[1])) > 1


def _distinct_colours(count: int) -> list[Any]:
    """``count`` colours no two alike: tab10 up to 10, tab20 up to 20, evenly spaced hues beyond."""
    import matplotlib

    if count <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(count)]
    return [matplotlib.colormaps["hsv"](i / count) for i in range(count)]


class RunRecords:
    """One run's records: ``train`` and ``evals`` (metrics.jsonl), ``config`` (dict), ``versions``."""

    def __init__(self, path: Path, train: list[dict[str, Any]], evals: list[dict[str, Any]],
                 config: dict[str, Any] | None, versions: dict[str, str] | None) -> None:  # fmt: skip
        self.path, self.train, self.evals, self.config, self.versions = path, train, evals, config, versions

    @property
    def name(self) -> str:
        """The run directory's name (its label in the pictures)."""
        return self.path.name or str(self.path)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of ``key`` in the training records that have it."""
        rows = [(r["step"], float(r[key])) for r in self.train if isinstance(r.get(key), (int, float))]
        return [s for s, _ in rows], [v for _, v in rows]


def load_run(path: str | Path) -> RunRecords:
    """The records of the run directory ``path`` (see the module docstring).

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` there (naming it).
    """
    path = Path(path)
    train, evals = read_metrics(path)
    config = None
    if (path / "config.yaml").is_file():
        try:  # bounded YAML of a regular file (a run directory may come from someone else)
            config = load_yaml(read_text(path / "config.yaml", limit=CONFIG_BYTES))
        except (OSError, ValueError, yaml.YAMLError):  # not one we can read: the report goes on without it
            config = None
    return RunRecords(path, train, evals, config, _versions(path))


def _versions(path: Path) -> dict[str, str] | None:
    """The versions the newest checkpoint recorded (memory-mapped: the weights are not read)."""
    for state in sorted((path / "checkpoints").glob("step-*/state.pt"), reverse=True):
        try:  # a regular file whose members do not expand (a FIFO would block), tensors only
            versions = load_torch_file(state, mmap=True).get("versions")
        except (TorchFileError, OSError, AttributeError):
            continue
        if isinstance(versions, dict):
            return {str(k): str(v) for k, v in versions.items()}
    return None


def write_report(runs: Sequence[str | Path], out: str | Path | None = None, *, smooth: int = 10) -> Path:
    """Write the pictures and ``report.md`` of ``runs`` (see the module docstring); return the Markdown path.

    Raises:
        FileNotFoundError: a run without metrics.
        ValueError: no training record in any run yet.
        ImportError: matplotlib missing.
        LinkedFolderError: the ``report-vs-...`` folder in the first run is a symbolic link (nothing written).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("drivetrain report draws with matplotlib: pip install 'drivetrain[viz]'") from err
    records = [load_run(r) for r in runs]
    if not any(r.train for r in records):
        raise ValueError(f"{', '.join(str(r.path) for r in records)}: no training records yet")
    if out is None:
        first = records[0].path
        out = first if len(records) == 1 else first / ("report-vs-" + "-".join(r.name for r in records[1:]))
        real_dir(out, base=first, create=True)  # report-vs-...: a folder of the run we name, refused if a link
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.mkdir(exist_ok=True)
    smooth = max(1, smooth)
    pictures: list[tuple[str, str]] = []

    def figure(name: str, title: str, draw: Callable[[Any], None], panels: int = 0) -> None:
        """``panels`` > 0: ``draw`` gets a list of that many axes; 0: one axis."""
        count = max(panels, 1)
        fig, axes = plt.subplots(1, count, figsize=(6.4 * count, 3.8), dpi=100, squeeze=False)
        for ax in axes[0]:
            ax.grid(alpha=0.3)
        draw(list(axes[0]) if panels else axes[0][0])
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png")
        replace_bytes(out / name, png.getvalue())  # a link at the name is replaced, its target never written
        plt.close(fig)
        pictures.append((name, title))

    def overlay(ax: Any, key: str, ylabel: str, *, average: bool = True, raw: bool = False,
                transform: Callable[[float], float] = lambda v: v) -> None:  # fmt: skip
        for run, colour in zip(records, COLOURS * (1 + len(records) // len(COLOURS)), strict=False):
            steps, values = run.series(key)
            values = [transform(v) for v in values]
            if not steps:
                continue
            if raw:
                ax.plot(steps, values, color=colour, alpha=0.3, lw=1)
            ax.plot(steps, _moving_average(values, smooth) if average else values, color=colour, lw=1.8,
                    label=run.name)  # fmt: skip
        ax.set(xlabel="step", ylabel=ylabel)
        if any(run.series(key)[0] for run in records):
            ax.legend(fontsize=7)

    figure("loss.png", f"weighted total loss (mean of {smooth} steps over the raw values)",
           lambda ax: overlay(ax, "loss", "loss", raw=True))  # fmt: skip

    def terms(axes: Any) -> None:
        for ax, run in zip(axes, records, strict=True):
            names = sorted({k for r in run.train for k in r if k.startswith("loss/")})
            colours = _distinct_colours(len(names))  # one per term (a 10-colour cycle repeats past ten)
            for name, colour in zip(names, colours, strict=True):
                steps, values = run.series(name)
                ax.plot(steps, _moving_average(values, smooth), lw=1.2, color=colour,
                        linestyle="-" if len(names) <= 10 else ("-", "--")[names.index(name) % 2],
                        label=name.removeprefix("loss/"))  # fmt: skip
            ax.set(title=run.name, xlabel="step", ylabel="unweighted term")
            if names:
                ax.set_yscale("log")
                ax.legend(fontsize=6, ncol=2)

    figure("terms.png", f"loss terms (mean of {smooth} steps)", terms, panels=len(records))
    figure("lr.png", "learning rate", lambda ax: overlay(ax, "lr", "lr", average=False))

    def scale(axes: Any) -> None:
        overlay(axes[0], "loss_scale", "loss scale", average=False)
        axes[0].set_yscale("log")
        overlay(axes[1], "skipped_steps", "skipped steps (cumulative)", average=False)

    if any(_fp16(run) for run in records):  # an fp32/bf16 run has no loss scale to watch
        figure("scale.png", "fp16 loss scale and skipped steps", scale, panels=2)
    figure(
        "throughput.png", f"samples/s (mean of {smooth} steps)", lambda ax: overlay(ax, "samples_per_s", "samples/s")
    )

    def timing(ax: Any) -> None:
        for run, colour in zip(records, COLOURS * (1 + len(records) // len(COLOURS)), strict=False):
            steps, step_s = run.series("step_time_s")
            wait_steps, wait_s = run.series("data_wait_s")
            if steps:
                ax.plot(steps, [v * 1e3 for v in _moving_average(step_s, smooth)], color=colour, lw=1.8,
                        label=f"{run.name}: step")  # fmt: skip
            if wait_steps:
                ax.plot(wait_steps, [v * 1e3 for v in _moving_average(wait_s, smooth)], color=colour, lw=1.2,
                        ls="--", label=f"{run.name}: data wait")  # fmt: skip
        ax.set(xlabel="step", ylabel="ms", ylim=(0, None))
        ax.legend(fontsize=7)

    figure("time.png", f"step time and the data wait within it (mean of {smooth} steps)", timing)
    figure("memory.png", "peak device memory", lambda ax: overlay(ax, "peak_memory_mb", "MB", average=False))
    metrics = sorted({k for run in records for r in run.evals for k in r if k.startswith("eval/")})
    headline = [m for m in metrics if m.rsplit("/", 1)[-1] in ("mAP", "NDS")] or metrics[:4]
    if metrics:

        def evaluation(axes: Any) -> None:
            for ax, metric in zip(axes, headline, strict=True):
                for run, colour in zip(records, COLOURS * (1 + len(records) // len(COLOURS)), strict=False):
                    rows = [(r["step"], r[metric]) for r in run.evals if isinstance(r.get(metric), (int, float))]
                    if rows:
                        ax.plot([s for s, _ in rows], [v for _, v in rows], "o-", color=colour, label=run.name)
                ax.set(title=metric.removeprefix("eval/"), xlabel="step", ylim=(0, None))
                ax.legend(fontsize=7)

        figure("eval.png", "evaluation over steps", evaluation, panels=len(headline))
    return replace_text(out / "report.md", _markdown(records, pictures, metrics))


def _markdown(records: Sequence[RunRecords], pictures: list[tuple[str, str]], metrics: list[str]) -> str:
    lines = ["# Run report", "", "| run | steps | last loss (mean of 10) | samples/s (median) | data wait / step | "
             "peak memory MB | last evaluation |", "|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for run in records:
        _, loss = run.series("loss")
        _, rate = run.series("samples_per_s")
        _, memory = run.series("peak_memory_mb")
        last = run.evals[-1] if run.evals else {}
        evaluation = ", ".join(f"{k.removeprefix('eval/')} {v:.4f}" for k, v in last.items()
                               if k in metrics and k.rsplit("/", 1)[-1] in ("mAP", "NDS"))  # fmt: skip
        if last:
            evaluation = f"step {last['step']}: {evaluation}" if evaluation else f"step {last['step']}"
        shares = [r["data_wait_s"] / r["step_time_s"] for r in run.train if r.get("step_time_s") and "data_wait_s" in r]
        share = statistics.median(shares) if shares else float("nan")
        lines.append(
            f"| {run.name} | {len(run.train)} | {statistics.fmean(loss[-10:]):.4f} | "
            f"{statistics.median(rate) if rate else float('nan'):.2f} | {share:.1%} | "
            f"{max(memory) if memory else float('nan'):.0f} | {evaluation or '—'} |"
            if loss
            else f"| {run.name} | 0 | — | — | — | — | — |"
        )
    lines.append("")
    for name, title in pictures:
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    for run in records:
        lines += [f"## {run.name}: config and versions", "", f"Run directory: `{run.path}`", ""]
        if run.versions:
            lines += ["Versions (newest checkpoint): " + ", ".join(f"{k} {v}" for k, v in run.versions.items()), ""]
        else:
            lines += ["Versions: no checkpoint written yet.", ""]
        if run.config is not None:
            lines += ["```yaml", yaml.safe_dump(run.config, sort_keys=False).rstrip(), "```", ""]
        else:
            lines += ["No readable config.yaml.", ""]
    return "\n".join(lines)
