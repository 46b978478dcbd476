"""``drivetrain report``: the pictures exist at their size, are not blank, carry every run's colour when runs
are overlaid, and report.md holds the right last values, the config and the versions; a running run's cut-short
last line is skipped; a folder without metrics is named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from drivetrain.cli.main import main
from drivetrain.engine import Trainer, load_config
from helpers.engine import FAST, SMOKE

mpimg = pytest.importorskip("matplotlib.image")

PICTURES = ("loss.png", "terms.png", "lr.png", "scale.png", "throughput.png", "time.png", "memory.png")
BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # tab:blue, tab:orange: the first two runs


def _write_run(folder: Path, loss_offset: float, *, cut_short: bool = False) -> None:
    folder.mkdir(parents=True)
    lines = []
    for step in range(1, 41):
        lines.append(json.dumps({
            "step": step, "loss": 10.0 / step + loss_offset, "loss/a": 5.0 / step, "loss/b": 1.0 + 0.01 * step,
            "lr": 1e-3 * min(1.0, step / 10), "loss_scale": 65536.0 / (2 ** (step // 20)), "skipped_steps": step // 20,
            "samples_per_s": 8.0 + loss_offset, "step_time_s": 0.25, "data_wait_s": 0.05, "peak_memory_mb": 512.0,
        }))  # fmt: skip
        if step % 20 == 0:
            lines.append(json.dumps({"step": step, "eval/mAP": 0.01 * step, "eval/NDS": 0.02 * step}))
    text = "\n".join(lines) + "\n"
    if cut_short:
        text += '{"step": 41, "loss": 0.'  # a run killed mid-write
    (folder / "metrics.jsonl").write_text(text)
    (folder / "config.yaml").write_text("model:\n  name: demo\ntrain:\n  steps: 40\n")


def _colour_pixels(image: np.ndarray, rgb: tuple[int, int, int]) -> int:
    pixels = (image[..., :3] * 255).round().astype(int)
    return int((np.abs(pixels - np.array(rgb)).max(-1) <= 8).sum())


def test_report_of_two_runs_overlays_them_and_tabulates_their_last_values(tmp_path, capsys):
    _write_run(tmp_path / "plain", 0.0)
    _write_run(tmp_path / "aug", 1.0, cut_short=True)
    assert main(["report", str(tmp_path / "plain"), str(tmp_path / "aug"), "--out", str(tmp_path / "out")]) == 0
    assert "report.md" in capsys.readouterr().out
    for name in (*PICTURES, "eval.png"):
        image = mpimg.imread(tmp_path / "out" / name)
        assert image.shape[0] >= 300 and image.shape[1] >= 600, name
        assert image[..., :3].std() > 0.05, name  # not blank
    loss = mpimg.imread(tmp_path / "out" / "loss.png")
    assert _colour_pixels(loss, BLUE) > 200 and _colour_pixels(loss, ORANGE) > 200  # both runs drawn
    report = (tmp_path / "out" / "report.md").read_text()
    last_plain = np.mean([10.0 / s for s in range(31, 41)])
    assert f"| plain | 40 | {last_plain:.4f} | 8.00 | 20.0% | 512 | step 40: mAP 0.4000, NDS 0.8000 |" in report
    assert f"| aug | 40 | {last_plain + 1:.4f} | 9.00 |" in report  # the cut-short 41st line is not a step
    for name in PICTURES:
        assert f"]({name})" in report
    assert "name: demo" in report and "Versions: no checkpoint written yet." in report


def test_report_of_a_real_run_writes_into_it_with_its_versions(tmp_path):
    cfg = load_config(SMOKE, [f"run.out_dir={tmp_path / 'run'}", *FAST, "train.steps=3", "checkpoint.every=3"])
    Trainer(cfg).fit()
    assert main(["report", str(tmp_path / "run")]) == 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Versions (newest checkpoint): drivetrain" in report and "| run | 3 |" in report
    assert not (tmp_path / "run" / "eval.png").exists()  # nothing evaluated: no evaluation picture
    assert mpimg.imread(tmp_path / "run" / "time.png")[..., :3].std() > 0.05


def test_a_folder_without_metrics_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"metrics\.jsonl"):
        main(["report", str(tmp_path)])


def test_a_run_on_a_read_only_mount_is_one_line_pointing_to_out(tmp_path, monkeypatch):
    import errno

    import drivetrain.viz.report as report

    _write_run(tmp_path / "run", 0.0)

    def read_only(path, data):  # what the kernel answers on a read-only mount (root ignores chmod, so simulate it)
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(report, "replace_bytes", read_only)
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path / "run")])
    message = str(exit_.value.code)
    assert message.startswith("report: cannot write ") and "Read-only file system" in message
    assert "--out DIR" in message and "\n" not in message


def test_fifteen_terms_get_fifteen_colours_and_an_fp32_run_no_scale_picture(tmp_path):
    from drivetrain.viz.report import _distinct_colours

    assert len(set(_distinct_colours(15))) == 15 and len(set(_distinct_colours(25))) == 25
    cfg = load_config(SMOKE, [f"run.out_dir={tmp_path / 'run'}", *FAST, "train.steps=3", "checkpoint.every=3"])
    Trainer(cfg).fit()  # fp32: the loss scale never moves
    assert main(["report", str(tmp_path / "run")]) == 0
    assert (
        not (tmp_path / "run" / "scale.png").exists()
        and "scale.png" not in (tmp_path / "run" / "report.md").read_text()
    )
    _write_run(tmp_path / "fp16", 0.0)  # a scale that backs off: fp16
    assert main(["report", str(tmp_path / "fp16")]) == 0
    assert (tmp_path / "fp16" / "scale.png").is_file()
