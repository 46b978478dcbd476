"""Evaluation during training: every ``eval.every`` steps (and at the end), and before the first with
``eval.at_start``, the current weights are scored on ``eval.split``; under torchrun every rank predicts its share of
the frames and rank 0 scores them all (:mod:`drivetrain.engine.eval_shards`).

:func:`eval_frames` builds the frames once on every rank, from the training data builder with ``split`` replaced
(warning when it is the split the run trains on); :func:`evaluate_step` predicts them, writes the submission and the
metric's files into ``eval/step-N/`` of the run, logs the metrics and a picture of the first frame (TensorBoard). The
streaming state and the RNGs are left as they were; an unreadable evaluation frame or a devkit failure is reported in
one line and training goes on. A stop signal (SIGTERM, SIGINT) abandons the evaluation within a frame: nothing is
logged as its result, and the trainer checkpoints the step and stops; a run resumed there evaluates that step first
(:func:`evaluation_logged` tells whether the metric log holds a step's evaluation).
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drivetrain.batch import Batch
from drivetrain.data.errors import DataError
from drivetrain.detector.spec import keywords
from drivetrain.engine.build import build_dataset
from drivetrain.engine.config import ConfigError, TrainConfig
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.eval_run import EvalFrames, FrameDetections, score_submission, submission_of
from drivetrain.engine.eval_shards import EvaluationFailed, EvaluationStopped, agree_on_stop, predict_shared
from drivetrain.engine.metrics import MetricsLogger
from drivetrain.engine.protocol import Detector
from drivetrain.pipeline.augment.stage import Augmentation
from drivetrain.safeio.files import LinkedFolderError, real_dir
from drivetrain.safeio.json_files import loads

__all__ = ["eval_frames", "evaluate_step", "evaluation_logged"]


def eval_frames(cfg: TrainConfig, model: torch.nn.Module, generate_data: bool, *, warn: bool = True) -> EvalFrames:
    """The ``eval.split`` frames, from the training data builder with ``split`` replaced (every rank).

    Args:
        cfg: the run's configuration.
        model: the run's model (it must detect).
        generate_data: the data builder may generate a missing synthetic set (the trainer's switch).
        warn: warn when ``eval.split`` is also the training split (rank 0 does; the others stay quiet).

    Returns:
        The frames to score.

    Raises:
        ConfigError: the model cannot detect, or the data builder gives no frames of an index.
    """
    if not isinstance(model, Detector):
        raise ConfigError(f"eval.every: {cfg.model.name} has no detect(batch) method to evaluate with")
    args = {**keywords(cfg.data.args), "split": cfg.eval.split}
    trained_on = keywords(cfg.data.args).get("split", _default_split(cfg.data.name))
    if warn and (trained_on is None or trained_on == cfg.eval.split):  # None: every scene, the evaluated ones too
        warnings.warn(
            f"eval.split: {cfg.eval.split!r} is also what the run trains on (data.args.split={trained_on!r}): "
            "its scores measure memorisation, not detection of unseen scenes; train on another split "
            "(mini_train, train) or evaluate another (eval.split=mini_val, val)",
            RuntimeWarning,
            stacklevel=2,
        )
    with torch.random.fork_rng(devices=[]):  # building it draws nothing from the run's RNG
        frames = build_dataset(replace(cfg.data, args=args), generate=generate_data)
    if not isinstance(frames, EvalFrames):
        raise ConfigError(
            f"eval.every: data.name {cfg.data.name} builds no frames of an index to score (they need index, "
            "root and collate, as the frames and synthetic sources give)"
        )
    return frames


def evaluate_step(
    step: int,
    model: torch.nn.Module,
    frames: EvalFrames,
    cfg: TrainConfig,
    ctx: DistContext,
    out_dir: Path,
    log: MetricsLogger,
    augment: Augmentation | None,
    stop_signal: Callable[[], str | None],
) -> str | None:
    """Score the current weights at ``step`` into ``out_dir/eval/step-N`` and log the metrics (collective: every rank
    predicts its share, rank 0 scores and logs).

    A stop signal on any rank abandons the evaluation (nothing is logged as its result; one received while rank 0
    scores lets the score finish); the ranks agree on it after every frame and once more at the end.

    Args:
        step: optimizer iterations done.
        model: the run's model.
        frames: :func:`eval_frames`' frames.
        cfg: the run's configuration (``eval``).
        ctx: this process's place in the process group (its device runs the model).
        out_dir: the run directory.
        log: the run's metric log (metrics, messages, the first frame's picture).
        augment: the run's augmentation stage (its test-time part applies), or None.
        stop_signal: the name of a stop signal this process received, or None.

    Returns:
        The stop signal that arrived during the evaluation (on any rank; agreed), or None.
    """
    start = time.perf_counter()
    first: dict[str, Any] = {}

    def keep_first(frame: int, batch: Batch, boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray) -> None:
        if frame == 0:
            first.update(batch=batch.to("cpu"), boxes=boxes, scores=scores, labels=labels)

    detections = None
    try:
        detections = predict_shared(
            model, frames, ctx, stop_signal=stop_signal, progress=cfg.eval.progress and ctx.is_main,
            transform=augment.test_time if augment is not None else None, on_frame=keep_first,
        )  # fmt: skip
    except EvaluationStopped as stop:
        log.message(f"drivetrain train: evaluation at step {step} abandoned: {stop.signal} received")
        return stop.signal
    except EvaluationFailed as err:
        log.message(f"drivetrain train: evaluation at step {step} failed, training goes on: {err}")
    if detections is not None:  # rank 0
        if stop_signal() is None:
            _score(step, detections, model, frames, cfg, out_dir, log, first, start)
        else:  # arrived since the last frame's round: not scored either
            log.message(f"drivetrain train: evaluation at step {step} abandoned: {stop_signal()} received")
    return agree_on_stop(ctx, stop_signal)  # every rank waits here while rank 0 scores


def _score(
    step: int,
    detections: list[FrameDetections],
    model: torch.nn.Module,
    frames: EvalFrames,
    cfg: TrainConfig,
    out_dir: Path,
    log: MetricsLogger,
    first: dict[str, Any],
    start: float,
) -> None:
    """Rank 0: score every frame's detections into ``out_dir/eval/step-N`` and log the metrics and the first frame."""
    out = out_dir / "eval" / f"step-{step:08d}"
    try:
        real_dir(out, base=out_dir, create=True)  # eval/ and step-N/ real folders of the run, not links
        submission, skipped = submission_of(detections, model, frames.index.format)
        result = score_submission(
            submission, skipped, frames, out, split=cfg.eval.split, quiet=True, started=start
        )  # fmt: skip
        if first:
            try:
                log.image("eval/frame-0", _frame_picture(**first), step)
            except ImportError as err:  # a lidar frame's picture needs matplotlib
                log.message(f"drivetrain train: no frame picture in TensorBoard ({err})")
    except (DataError, LinkedFolderError, NotADirectoryError) as err:
        log.message(f"drivetrain train: evaluation at step {step} failed, training goes on: {err}")
    else:
        summary = result.summary()
        log.evaluation(step, summary)
        scores = f"mAP {summary['mAP']:.4f}" + (f"  NDS {summary['NDS']:.4f}" if "NDS" in summary else "")
        log.message(
            f"eval step {step} ({cfg.eval.split}, {result.frames} frames, {result.seconds:.0f} s): {scores}  → {out}"
        )


def evaluation_logged(out_dir: Path, step: int) -> bool:
    """Whether the run's metric log (``out_dir/metrics.jsonl``) holds an evaluation of ``step`` (a record with
    ``eval/…`` numbers); lines that do not parse (cut short by a kill) hold none."""
    path = out_dir / "metrics.jsonl"
    if path.is_symlink() or not path.is_file():
        return False
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            record = loads(line, source=path, line=number)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("step") == step and any(k.startswith("eval/") for k in record):
            return True
    return False


def _default_split(data_name: str) -> Any:
    """The ``split`` a registered data builder uses when the config names none (``"?"`` if it takes no split)."""
    from drivetrain.engine.registry import lookup

    try:
        parameter = inspect.signature(lookup("data", data_name)).parameters.get("split")
    except (TypeError, ValueError):
        return "?"
    return "?" if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _frame_picture(
    batch: Batch, boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, threshold: float = 0.3
) -> np.ndarray:
    """The first evaluation frame for TensorBoard: its cameras with ground truth (thick) and the detections
    scoring at least ``threshold`` (thin) projected, or, for a lidar frame, its bird's-eye view."""
    keep = scores >= threshold
    gt, gt_labels = batch.gt_boxes.to_list()[0].numpy(), batch.gt_labels.to_list()[0].numpy()
    if batch.images is not None:
        from drivetrain.viz.camera import camera_grid

        images = batch.images[0].permute(0, 2, 3, 1).numpy()
        return camera_grid(images, batch.lidar2img[0].numpy(), gt, gt_labels, boxes[keep], labels[keep])
    from drivetrain.viz.lidar import bev_array

    points = batch.points.to_list()[0].numpy() if batch.points is not None else np.zeros((0, 3))
    return bev_array(points, gt, boxes[keep], scores[keep])
