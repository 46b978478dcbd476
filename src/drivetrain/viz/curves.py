"""Loss curves of a run: the weighted total, each loss term and the evaluation metrics over steps, as one PNG.

``python -m drivetrain.viz.curves RUN_DIR [--out PNG]`` writes ``RUN_DIR/losses.png``. Reads ``metrics.jsonl``
as it is (a running run included): training records carry ``loss`` and ``loss/<term>``, evaluation records
``eval/<metric>`` (see :class:`drivetrain.engine.metrics.MetricsLogger`). matplotlib comes with the
``nuscenes`` extra (the devkit plots with it) and the ``viz`` extra.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from drivetrain.safeio.files import save_figure
from drivetrain.safeio.json_files import jsonl_records
from drivetrain.safeio.reads import read_text

__all__ = ["plot_losses", "read_metrics"]


def read_metrics(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and evaluation records of ``run_dir/metrics.jsonl`` (lines cut short by a kill are skipped), with
    the numbers they hold (a record without a numeric ``step`` is skipped, a field that is no number left out).

    Raises:
        FileNotFoundError: naming the file when the run has none.
        drivetrain.safeio.json_files.JSONLimitError: a ``ValueError`` naming the file and the line that nests
            deeper than :data:`~drivetrain.safeio.json_files.MAX_DEPTH` or holds an integer outside 64 bits (no kill
            writes that).
    """
    path = Path(run_dir) / "metrics.jsonl"
    try:  # a regular file only: a FIFO planted there would block the read forever
        text = read_text(path, errors="replace")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no metrics file (is {run_dir} a run directory?)") from None
    except OSError as err:
        raise FileNotFoundError(f"{path}: cannot be read ({err.strerror or type(err).__name__})") from None
    train, evals = [], []
    for _, _, record in jsonl_records(text, source=path):  # a line nested too deep is refused, naming it
        if not isinstance(record, dict) or not _is_number(record.get("step")):
            continue
        # The logger writes numbers only: anything else (a string, a list, true) is not ours and is left out, so the
        # report's and doctor's arithmetic never meets it.
        record = {k: v for k, v in record.items() if _is_number(v)}
        if "loss" in record:
            train.append(record)
        elif any(k.startswith("eval/") for k in record):
            evals.append(record)
    return train, evals


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def plot_losses(run_dir: str | Path, out: str | Path | None = None, *, smooth: int = 10) -> Path:
    """Write the run's curves as a PNG: total loss, every term (log scale), and mAP/NDS when evaluated.

    Args:
        run_dir: the run directory.
        out: the PNG (default ``run_dir/losses.png``).
        smooth: moving-average window over steps drawn over the raw curves (1: none).

    Returns:
        The PNG path.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("plots need matplotlib: pip install 'drivetrain[viz]'") from err
    train, evals = read_metrics(run_dir)
    if not train:
        raise ValueError(f"{Path(run_dir) / 'metrics.jsonl'}: no training records yet")
    steps = [r["step"] for r in train]
    terms = sorted({k for r in train for k in r if k.startswith("loss/")})
    panels = 3 if evals else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.2), dpi=100)
    total = [r["loss"] for r in train]
    axes[0].plot(steps, total, color="tab:blue", alpha=0.35, lw=1)
    axes[0].plot(steps, _moving_average(total, smooth), color="tab:blue", lw=2, label="weighted total")
    axes[0].set(title="training loss", xlabel="step", ylabel="loss")
    axes[0].legend()
    for term in terms:
        values = [r.get(term, float("nan")) for r in train]
        axes[1].plot(steps, _moving_average(values, smooth), lw=1.2, label=term.removeprefix("loss/"))
    axes[1].set(title=f"loss terms (unweighted, mean of {smooth} steps)", xlabel="step", yscale="log")
    axes[1].legend(fontsize=6, ncol=2)
    if evals:
        e_steps = [r["step"] for r in evals]
        for key, colour in (("eval/mAP", "tab:green"), ("eval/NDS", "tab:orange")):
            axes[2].plot(e_steps, [r.get(key, float("nan")) for r in evals], "o-", color=colour, label=key[5:])
        axes[2].set(title="evaluation", xlabel="step", ylim=(0, None))
        axes[2].legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    out = Path(out) if out is not None else Path(run_dir) / "losses.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, out)  # a link at the name is replaced, its target never written
    plt.close(fig)
    return out


def _moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over at most ``window`` values (the first points average what there is)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m drivetrain.viz.curves RUN_DIR [--out PNG]``."""
    parser = argparse.ArgumentParser(prog="python -m drivetrain.viz.curves", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (holds metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: RUN_DIR/losses.png)")
    parser.add_argument("--smooth", type=int, default=10, help="moving-average window in steps (default: 10)")
    args = parser.parse_args(argv)
    try:
        path = plot_losses(args.run_dir, args.out, smooth=max(1, args.smooth))
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"curves: {err}") from None
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
