"""Evaluation during training: every ``eval.every`` steps (and at the end), and before the first with
``eval.at_start``, the current weights are scored on ``eval.split`` by rank 0 while the other ranks wait.

:func:`eval_frames` builds the frames once, from the training data builder with ``split`` replaced (warning when it
is the split the run trains on); :func:`evaluate_step` scores them with
:func:`~drivetrain.engine.evaluation.evaluate_model` into ``eval/step-N/`` of the run, logs the metrics and a
picture of the first frame (TensorBoard). The streaming state and the RNGs are left as they were; an unreadable
evaluation frame or a devkit failure is reported in one line and training goes on.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drivetrain.batch import Batch
from drivetrain.data.errors import DataError
from drivetrain.engine.build import build_dataset
from drivetrain.engine.config import ConfigError, TrainConfig
from drivetrain.engine.evaluation import EvalFrames, evaluate_model
from drivetrain.engine.metrics import MetricsLogger
from drivetrain.engine.protocol import Detector
from drivetrain.model_spec import keywords
from drivetrain.pipeline.augment.stage import Augmentation
from drivetrain.safe_files import LinkedFolderError, real_dir

__all__ = ["eval_frames", "evaluate_step"]


def eval_frames(cfg: TrainConfig, model: torch.nn.Module, generate_data: bool) -> EvalFrames:
    """The ``eval.split`` frames, from the training data builder with ``split`` replaced (rank 0 only).

    Args:
        cfg: the run's configuration.
        model: the run's model (it must detect).
        generate_data: the data builder may generate a missing synthetic set (the trainer's switch).

    Returns:
        The frames to score.

    Raises:
        ConfigError: the model cannot detect, or the data builder gives no frames of an index.
    """
    if not isinstance(model, Detector):
        raise ConfigError(f"eval.every: {cfg.model.name} has no detect(batch) method to evaluate with")
    args = {**keywords(cfg.data.args), "split": cfg.eval.split}
    trained_on = keywords(cfg.data.args).get("split", _default_split(cfg.data.name))
    if trained_on is None or trained_on == cfg.eval.split:  # None: every scene, the evaluated ones too
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
    device: torch.device,
    out_dir: Path,
    log: MetricsLogger,
    augment: Augmentation | None,
) -> None:
    """Score the current weights at ``step`` into ``out_dir/eval/step-N`` and log the metrics (rank 0).

    Args:
        step: optimizer iterations done.
        model: the run's model.
        frames: :func:`eval_frames`' frames.
        cfg: the run's configuration (``eval``).
        device: the training device.
        out_dir: the run directory.
        log: the run's metric log (metrics, messages, the first frame's picture).
        augment: the run's augmentation stage (its test-time part applies), or None.
    """
    out = out_dir / "eval" / f"step-{step:08d}"
    try:
        real_dir(out, base=out_dir, create=True)  # eval/ and step-N/ real folders of the run, not links
        first: dict[str, Any] = {}

        def keep_first(frame: int, batch: Batch, boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray) -> None:
            if frame == 0:
                first.update(batch=batch.to("cpu"), boxes=boxes, scores=scores, labels=labels)

        result = evaluate_model(
            model, frames, device, out, split=cfg.eval.split, progress=cfg.eval.progress, quiet=True,
            transform=augment.test_time if augment is not None else None, on_frame=keep_first,
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
