"""Loss curves of a run: a PNG of the right size with drawn content, from training and evaluation records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from drivetrain.viz.curves import main, plot_losses, read_metrics


def _write_run(run, steps: int = 30) -> None:
    run.mkdir()
    lines = []
    for s in range(1, steps + 1):
        lines.append({"step": s, "loss": 10.0 / s, "loss/loss_cls": 1.0 / s, "loss/loss_bbox": 5.0 / s, "lr": 1e-3})
        if s % 10 == 0:
            lines.append({"step": s, "eval/mAP": s / 100, "eval/NDS": s / 50})
    text = "\n".join(json.dumps(r) for r in lines) + '\n{"step": 31, "loss": 0.3'  # a line cut short by a kill
    (run / "metrics.jsonl").write_text(text)


def test_curves_png_has_three_panels_of_content(tmp_path):
    from PIL import Image

    run = tmp_path / "run"
    _write_run(run)
    train, evals = read_metrics(run)
    assert len(train) == 30 and [r["step"] for r in evals] == [10, 20, 30]
    path = plot_losses(run)
    assert path == run / "losses.png"
    image = np.asarray(Image.open(path).convert("L"))
    assert image.shape == (420, 1800)  # 3 panels × 6 in × 100 dpi, 4.2 in high
    for third in np.array_split(image, 3, axis=1):  # every panel has drawn (non-white) pixels
        assert (third < 200).mean() > 0.01


def test_missing_or_empty_metrics_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit, match="no metrics file"):
        main([str(tmp_path)])
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/mAP": 0.0}\n')
    with pytest.raises(SystemExit, match="no training records"):
        main([str(tmp_path)])
