"""A detector evaluated over a split with the official metric: every frame in scene order at batch 1 with the
temporal memory on (as StreamPETR's test-time ``seq_mode``), the decoded boxes exported as a nuScenes
submission, then the devkit's ``DetectionEval`` (mAP, NDS, TP errors, per-class AP). Frames of a Lyft Level 5
root are exported as Lyft box records and scored with the Lyft metric (mAP over 3D IoU 0.5:0.95).

The model needs ``detect(batch) -> (boxes, scores, labels)`` beside the engine protocol: lidar-frame boxes
``(B, K, 9)`` ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)``, scores and class indices ``(B, K)``, plain or
:class:`~drivetrain.ragged.RaggedBatch`. Streaming state (module extra state, e.g. the memory bank) is put
aside for the evaluation and restored after it, and the global RNG states are untouched, so a training run
that evaluates every N steps continues exactly as one that does not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from drivetrain.data.dataset import Skipped
from drivetrain.data.evaluate import boxes_to_submission, evaluate, submission_meta, write_submission
from drivetrain.data.lyft_eval import evaluate_lyft, lyft_boxes_to_results
from drivetrain.data.lyft_format import dataset_of
from drivetrain.ragged import RaggedBatch

__all__ = ["EvalResult", "evaluate_model", "predict"]


@dataclass(frozen=True)
class EvalResult:
    """What one evaluation produced.

    Attributes:
        metrics: the devkit's summary (``mean_ap``, ``nd_score``, ``tp_errors``, ``mean_dist_aps``, ...).
        predictions: the submission file written.
        frames: frames evaluated.
        skipped: frames that could not be read (``on_error=skip``); they count as frames without detections.
        seconds: wall time of prediction and metrics.
    """

    metrics: dict[str, Any]
    predictions: Path
    frames: int
    skipped: int
    seconds: float

    def summary(self) -> dict[str, float]:
        """Flat numbers for metrics.jsonl / TensorBoard: ``mAP``, ``NDS``, TP errors and ``AP/<class>`` (Lyft:
        ``mAP`` and ``AP/<class>``)."""
        m = self.metrics
        if "nd_score" not in m:  # the Lyft metric
            return {"mAP": float(m["mAP"]), **{f"AP/{name}": float(v) for name, v in m["AP"].items()}}
        out = {"mAP": float(m["mean_ap"]), "NDS": float(m["nd_score"])}
        out.update({k: float(v) for k, v in m["tp_errors"].items()})
        out.update({f"AP/{name}": float(v) for name, v in m["mean_dist_aps"].items()})
        return out


@contextlib.contextmanager
def _streaming_state_aside(model: nn.Module) -> Iterator[None]:
    """Empty every module's extra state (``set_extra_state({})``) for the block, then put the saved one back."""
    saved = {k: v for k, v in model.state_dict().items() if k.endswith("_extra_state")}
    try:
        model.load_state_dict({key: {} for key in saved}, strict=False)
        yield
    finally:
        model.load_state_dict(saved, strict=False)


def _host(values: Any) -> list[np.ndarray]:
    """Per-sample numpy arrays of a RaggedBatch (its valid rows) or of a dense batch tensor."""
    if isinstance(values, RaggedBatch):
        return [t.cpu().numpy() for t in values.to_list()]
    return [t.cpu().numpy() for t in values]


@torch.no_grad()
def predict(
    model: nn.Module,
    dataset: Any,
    device: torch.device | str,
    *,
    progress: bool = True,
    lyft_classes: tuple[str, ...] | None = None,
    transform: Callable[[Any], Any] | None = None,
    on_frame: Callable[[int, Any, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> tuple[dict[str, Any], int]:
    """The submission of ``model`` on every frame of ``dataset``, in its (scene) order, one frame at a time.

    Args:
        model: a detector with ``detect(batch)`` (see the module docstring); put in eval mode for the call and
            back in its previous mode after it.
        dataset: frames with ``__len__``, ``__getitem__(frame)`` (``prev_exists`` from the frame's place in its
            scene) and ``collate(samples)``, e.g. :class:`~drivetrain.data.sources.StreamingFrames`.
        device: where the model runs.
        progress: show a progress bar.
        lyft_classes: write Lyft box records (labels index these names) instead of nuScenes ones.
        transform: applied to each frame's batch on ``device`` before ``detect`` (the test-time camera
            transform of a run trained with ``data.augment``, ``CameraAugment.test_time``).
        on_frame: called as ``on_frame(frame, batch, boxes, scores, labels)`` after each frame with the batch as
            loaded (before ``transform``) and the detections as NumPy arrays (e.g. to draw one for TensorBoard).

    Returns:
        The submission dict (``meta``, ``results`` keyed by sample token) and the number of unreadable frames
        (listed with no detections).
    """
    detect = getattr(model, "detect", None)
    if not callable(detect):
        raise TypeError(f"{type(model).__name__} has no detect(batch) method; it cannot be evaluated")
    from tqdm import tqdm

    results: dict[str, list[dict[str, Any]]] = {}
    skipped = 0
    was_training = model.training
    model.eval()
    try:
        with _streaming_state_aside(model), torch.random.fork_rng(devices=[]):
            for frame in tqdm(range(len(dataset)), desc="eval", unit="frame", disable=not progress):
                sample = dataset[frame]
                if isinstance(sample, Skipped):  # unreadable with on_error=skip: listed without detections
                    results[sample.token] = []
                    skipped += 1
                    continue
                loaded = dataset.collate([sample]).to(device)
                batch = transform(loaded) if transform is not None else loaded
                boxes, scores, labels = detect(batch)
                # sync: the frame's detections go to the host once, for the submission file
                boxes, scores, labels = _host(boxes)[0], _host(scores)[0], _host(labels)[0]
                if on_frame is not None:
                    on_frame(frame, loaded, boxes, scores, labels)
                token = batch.sample_tokens[0]
                pose = batch.ego_pose[0].cpu().numpy().astype(np.float64)
                if lyft_classes is None:
                    results[token] = boxes_to_submission(token, boxes, labels, scores, pose)
                else:
                    results[token] = lyft_boxes_to_results(token, boxes, labels, scores, pose, lyft_classes)
    finally:
        model.train(was_training)
    modalities = getattr(model, "input_modalities", ("camera",))  # what the model reads: the meta block says so
    meta = submission_meta(camera="camera" in modalities, lidar="lidar" in modalities)
    return {"meta": meta, "results": results}, skipped


def evaluate_model(
    model: nn.Module,
    dataset: Any,
    device: torch.device | str,
    out_dir: str | Path,
    *,
    split: str,
    root: str | Path | None = None,
    version: str | None = None,
    config: str = "detection_cvpr_2019",
    progress: bool = True,
    quiet: bool = False,
    lyft_footprint: str = "heading",
    transform: Callable[[Any], Any] | None = None,
    on_frame: Callable[[int, Any, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> EvalResult:
    """Predict every frame of ``dataset`` (see :func:`predict`), write ``out_dir/results.json`` and score it.

    Args:
        model: the detector.
        dataset: the split's frames (a :class:`~drivetrain.data.sources.StreamingFrames` knows its root).
        device: where the model runs.
        out_dir: folder of ``results.json`` and the devkit's ``metrics_summary.json``.
        split: the devkit split the frames are (``mini_val``, ``val``, ...).
        root: nuScenes-format root (default: the dataset's).
        version: table folder (default: the dataset index's, e.g. ``v1.0-mini``).
        config: the devkit's detection config.
        progress: show a progress bar.
        quiet: send the devkit's printed tables to ``out_dir/devkit.log`` instead of stdout (during training).
        lyft_footprint: the Lyft metric's footprint convention (see :func:`~drivetrain.data.lyft_eval.evaluate_lyft`).
        transform: the per-frame batch transform (see :func:`predict`).
        on_frame: the per-frame callback (see :func:`predict`).
    """
    start = time.perf_counter()
    frames = getattr(dataset, "frames", dataset)
    meta = getattr(getattr(frames, "index", None), "meta", {})
    root = root if root is not None else frames.root
    version = version if version is not None else meta.get("version", "v1.0-mini")
    lyft = dataset_of(meta) == "lyft"
    classes = tuple(meta["classes"]) if lyft else None
    submission, skipped = predict(
        model, dataset, device, progress=progress, lyft_classes=classes, transform=transform, on_frame=on_frame
    )
    out = Path(out_dir)
    path = write_submission(submission, out / "results.json")
    with contextlib.ExitStack() as stack:
        if quiet:
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(out / "devkit.log", "w"))))
        if lyft:
            metrics = evaluate_lyft(path, root, version=version, split=split, out_dir=out, footprint=lyft_footprint)
        else:
            metrics = evaluate(path, root, version=version, split=split, out_dir=out, config=config)
    return EvalResult(metrics, path, len(dataset), skipped, time.perf_counter() - start)


def model_from_checkpoint(path: str | Path) -> tuple[nn.Module, Any, Path]:
    """The model of a checkpoint, built from the config saved in it, with its weights (on the CPU).

    Args:
        path: a checkpoint directory (``.../checkpoints/step-N``) or a run directory (its newest committed
            checkpoint that loads).

    Returns:
        ``(model, config, checkpoint directory)``; the config is the run's :class:`~.config.TrainConfig`.

    Raises:
        CheckpointError: no checkpoint there, or it does not load (checksum, format, weights that do not fit).
    """
    from drivetrain.engine.build import build_model
    from drivetrain.engine.checkpoint import Checkpointer, CheckpointError, checkpoint_dir
    from drivetrain.engine.config import ConfigError, TrainConfig, from_dict

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist (pass a run directory or one of its checkpoints/step-N)")
    path = checkpoint_dir(path)  # a checkpoint's state.pt means its folder
    run_files = ("config.yaml", "metrics.jsonl", ".drivetrain-run")
    if (path / "checkpoints").is_dir():
        found = Checkpointer(path / "checkpoints").load_latest()
        if found is None:
            raise CheckpointError(f"{path}: the run has no committed checkpoint that loads")
        path, state = found
    elif any((path / name).exists() for name in run_files):
        raise CheckpointError(f"{path}: the run has no checkpoints yet (it writes them every checkpoint.every steps)")
    else:
        state = Checkpointer(path.parent).load(path)
    try:
        cfg = from_dict(TrainConfig, state["config"])
        model = build_model(cfg.model)
        model.load_state_dict(state["model"])
    except (ConfigError, KeyError, RuntimeError) as err:
        raise CheckpointError(f"{path}: cannot rebuild the model from the checkpoint ({err})") from None
    return model, cfg, path
