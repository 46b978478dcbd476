"""A detector evaluated over a split with the official metric: every frame in scene order at batch 1 with the
temporal memory on (as a streaming detector's test-time ``seq_mode``), the decoded boxes exported as a submission, then
scored. What the submission holds and which metric scores it is the dataset format's
(:class:`~drivetrain.data.formats.record.DatasetFormat`, recorded in the frames' index): nuScenes frames give a nuScenes
submission and the devkit's ``DetectionEval`` (mAP, NDS, TP errors, per-class AP), Lyft Level 5 frames Lyft box
records and the Lyft metric (mAP over 3D IoU 0.5:0.95). A model without streaming state may detect several
consecutive frames per call (:func:`predict`'s ``batch_size``, ``drivetrain predict --batch-size``).

The model is a :class:`~drivetrain.engine.protocol.Detector` (``detect(batch) -> (boxes, scores, labels)``).
Streaming state (module extra state, e.g. the memory bank) is put
aside for the evaluation and restored after it, and the global RNG states are untouched, so a training run
that evaluates every N steps continues exactly as one that does not.

:func:`blank_inputs` is the control of an evaluation: the same frames with their sensor data blanked (grey images,
empty point clouds), so the score a model reaches without seeing anything (its priors, or a leak) can be set beside
its real one (``drivetrain eval --blank-inputs``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from drivetrain.batch import Batch
from drivetrain.constants import constant
from drivetrain.data.dataset import Sample, Skipped
from drivetrain.data.formats.record import DatasetFormat, MetricOptions
from drivetrain.data.formats.registry import DEFAULT
from drivetrain.data.formats.submission import submission_meta, write_submission
from drivetrain.data.index import FrameIndex
from drivetrain.engine.protocol import Detector, input_modalities
from drivetrain.ragged import RaggedBatch
from drivetrain.safeio.files import open_output, staged_outputs

__all__ = [
    "BLANK_GREY",
    "EvalFrames",
    "EvalResult",
    "FrameDetections",
    "blank_inputs",
    "detect_frames",
    "detections_on_host",
    "evaluate_model",
    "has_streaming_state",
    "predict",
    "score_submission",
    "streaming_state_aside",
    "submission_of",
]

# The RGB value of a blanked image: the mean colour of the statistics the camera models normalise with (ImageNet's
# (123.675, 116.28, 103.53), the camera recipes' img_norm_cfg), rounded to uint8. Normalised, every pixel is within
# 0.5 / 57.1 < 0.01 of 0 in each channel: the input the network reads as "average", the value its own padding gets.
BLANK_GREY = (124, 116, 104)


@runtime_checkable
class EvalFrames(Protocol):
    """What :func:`evaluate_model` evaluates: the frames of one index, in scene order, that batch themselves (a
    :class:`~drivetrain.data.sources.StreamingFrames`, what the ``frames`` and ``synthetic`` builders return)."""

    @property
    def index(self) -> FrameIndex:
        """The frames' index: its format (submission writer, metric) and table folder."""

    @property
    def root(self) -> Path:
        """The dataset root the metric reads the ground truth from."""

    def __len__(self) -> int: ...

    def __getitem__(self, frame: int) -> Sample | Skipped: ...

    def collate(self, samples: list[Sample]) -> Batch:
        """One batch of the samples."""


@dataclass(frozen=True)
class EvalResult:
    """What one evaluation produced.

    Attributes:
        metrics: the metric's result (nuScenes: the devkit's summary, ``mean_ap``, ``nd_score``, ``tp_errors``,
            ``mean_dist_aps``, ...; Lyft: ``mAP``, ``AP``, ...).
        predictions: the submission file written.
        frames: frames evaluated.
        skipped: frames that could not be read (``on_error=skip``); they count as frames without detections.
        seconds: wall time of prediction and metrics.
        dataset_format: the format that wrote the submission and scored it.
    """

    metrics: dict[str, Any]
    predictions: Path
    frames: int
    skipped: int
    seconds: float
    dataset_format: DatasetFormat

    def summary(self) -> dict[str, float]:
        """Flat numbers for metrics.jsonl / TensorBoard: ``mAP``, ``NDS``, TP errors and ``AP/<class>`` (Lyft:
        ``mAP`` and ``AP/<class>``)."""
        return self.dataset_format.summary(self.metrics)


@contextlib.contextmanager
def streaming_state_aside(model: nn.Module) -> Iterator[None]:
    """Empty every module's extra state (``set_extra_state({})``) for the block, then put the saved one back.

    Args:
        model: the model whose streaming state (temporal memory, ...) is set aside.
    """
    saved = {k: v for k, v in model.state_dict().items() if k.endswith("_extra_state")}
    try:
        model.load_state_dict({key: {} for key in saved}, strict=False)
        yield
    finally:
        model.load_state_dict(saved, strict=False)


def has_streaming_state(model: nn.Module) -> bool:
    """Whether a module of ``model`` keeps state between calls (module extra state, e.g. a temporal memory bank)."""
    return any(key.endswith("_extra_state") for key in model.state_dict())


def blank_inputs(batch: Batch, grey: tuple[int, int, int] = BLANK_GREY) -> Batch:
    """The batch with its sensor data blanked: every image pixel set to ``grey``, every point cloud emptied.

    Everything else (calibration, poses, timestamps, the ground truth) is kept, so a model scores with blanked
    inputs what it detects without looking: its priors, or what it reads from anything but the sensors.

    Args:
        batch: a collated :class:`~drivetrain.batch.Batch` as loaded (images ``(B, N, 3, H, W)`` uint8 or
            float, not normalised yet; points a RaggedBatch ``(B, P, C)``); either may be None.
        grey: RGB 0–255 of the blanked images (default :data:`BLANK_GREY`).

    Returns:
        The batch with ``images`` constant ``grey`` (same shape and dtype) and ``points`` ``(B, 0, C)`` with every
        size 0.
    """
    changes: dict[str, Any] = {}
    if batch.images is not None:
        if batch.images_normalized:
            raise ValueError("batch.images: normalised already; blank the batch as loaded, before the transform")
        value = constant(grey, dtype=batch.images.dtype, device=batch.images.device)  # (3,), copied once per device
        changes["images"] = value.view(1, 1, 3, 1, 1).expand(batch.images.shape).contiguous()  # (B, N, 3, H, W)
    if batch.points is not None:
        tensor = batch.points.tensor
        empty = tensor.new_zeros(tensor.shape[0], 0, *tensor.shape[2:])  # (B, 0, C)
        changes["points"] = RaggedBatch(empty, torch.zeros_like(batch.points.sizes))  # every size 0
    return dataclasses.replace(batch, **changes)


def detections_on_host(values: Any) -> list[np.ndarray]:
    """Per-sample NumPy arrays of one of :meth:`~drivetrain.engine.protocol.Detector.detect`'s outputs: a
    RaggedBatch (each sample's valid rows) or a plain batch tensor (``(B, K, ...)``: each sample's ``K`` rows), as the
    protocol allows either."""
    if isinstance(values, RaggedBatch):
        return [t.cpu().numpy() for t in values.to_list()]
    return [t.cpu().numpy() for t in values]


@dataclass(frozen=True)
class FrameDetections:
    """One frame's detections on the host, before they become submission records (what the ranks of a run send
    to rank 0: :mod:`drivetrain.engine.eval_shards`).

    Attributes:
        frame: the frame's place in the dataset.
        token: its sample token.
        boxes: ``(K, D)`` float32 decoded boxes in the lidar frame; None for an unreadable frame (no detections).
        scores: ``(K,)`` float32.
        labels: ``(K,)`` int64 class indices.
        pose: ``(4, 4)`` float64 lidar → global of the frame.
    """

    frame: int
    token: str
    boxes: np.ndarray | None
    scores: np.ndarray | None = None
    labels: np.ndarray | None = None
    pose: np.ndarray | None = None


@torch.no_grad()
def detect_frames(
    model: nn.Module,
    dataset: Any,
    device: torch.device | str,
    *,
    frames: range | None = None,
    progress: bool = True,
    transform: Callable[[Batch], Batch] | None = None,
    on_frame: Callable[[int, Batch, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
    batch_size: int = 1,
    label: str = "eval",
    after_batch: Callable[[], None] | None = None,
    score_threshold: float | None = None,
) -> list[FrameDetections]:
    """The detections of ``model`` on ``frames`` of ``dataset``, in that (scene) order (see :func:`predict`).

    Args:
        model: a :class:`~drivetrain.engine.protocol.Detector` (eval mode for the call, its mode back after it).
        dataset: the frames (as :func:`predict`'s).
        device: where the model runs.
        frames: consecutive frames of ``dataset`` to detect (default: all); a streaming model's share starts at a
            scene start, where its memory is cleared, so it sees what it sees in a pass over every frame.
        progress: show a progress bar.
        transform: the per-frame batch transform (see :func:`predict`).
        on_frame: the per-frame callback, with the frame's place in ``dataset`` (see :func:`predict`).
        batch_size: frames per ``detect`` call (see :func:`predict`).
        label: the progress bar's label.
        after_batch: called after each ``detect`` call's frames (it may raise to abandon the pass).
        score_threshold: drop detections scoring below it (None: keep all, as a metric needs).

    Returns:
        One :class:`FrameDetections` per frame, in frame order.
    """
    if not isinstance(model, Detector):
        raise TypeError(f"{type(model).__name__} has no detect(batch) method; it cannot be evaluated")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be ≥ 1, got {batch_size}")
    if batch_size > 1 and has_streaming_state(model):
        raise ValueError(
            f"batch_size: {type(model).__name__} keeps streaming state (a temporal memory) and detects one frame at "
            f"a time in scene order; got {batch_size}"
        )
    if batch_size > 1 and on_frame is not None:
        raise ValueError("on_frame: called per frame of a one-frame batch; use batch_size=1")
    from tqdm import tqdm

    frames = range(len(dataset)) if frames is None else frames
    detections: list[FrameDetections] = []
    # The CPU's generator and, on CUDA, the device's: a detector that draws at test time leaves the run's RNGs be
    on_cuda = [torch.device(device)] if torch.device(device).type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with (
            streaming_state_aside(model),
            torch.random.fork_rng(devices=on_cuda, device_type="cuda"),
            tqdm(total=len(frames), desc=label, unit="frame", disable=not progress) as bar,
        ):
            for start in range(frames.start, frames.stop, batch_size):
                chunk = range(start, min(start + batch_size, frames.stop))
                samples = [dataset[frame] for frame in chunk]
                readable = [(f, s) for f, s in zip(chunk, samples, strict=True) if not isinstance(s, Skipped)]
                found: dict[int, FrameDetections] = {}
                if readable:
                    loaded = dataset.collate([s for _, s in readable]).to(device)
                    batch = transform(loaded) if transform is not None else loaded
                    boxes, scores, labels = model.detect(batch)
                    # sync: the batch's detections and poses go to the host once, for the submission file
                    boxes, scores, labels = (detections_on_host(v) for v in (boxes, scores, labels))
                    if score_threshold is not None:
                        kept = [s >= score_threshold for s in scores]
                        boxes, scores, labels = ([v[k] for v, k in zip(vs, kept, strict=True)]
                                                 for vs in (boxes, scores, labels))  # fmt: skip
                    poses = batch.ego_pose.cpu().numpy().astype(np.float64)  # (B, 4, 4)
                    for b, (frame, _) in enumerate(readable):
                        if on_frame is not None:
                            on_frame(frame, loaded, boxes[b], scores[b], labels[b])
                        token = batch.sample_tokens[b]
                        found[frame] = FrameDetections(frame, token, boxes[b], scores[b], labels[b], poses[b])
                for frame, sample in zip(chunk, samples, strict=True):  # unreadable ones (on_error=skip): no boxes
                    detections.append(found.get(frame) or FrameDetections(frame, sample.token, None))
                bar.update(len(chunk))
                if after_batch is not None:
                    after_batch()
    finally:
        model.train(was_training)
    return detections


def submission_of(
    detections: list[FrameDetections], model: nn.Module, dataset_format: DatasetFormat = DEFAULT
) -> tuple[dict[str, Any], int]:
    """The submission dict of ``detections`` (records by ``dataset_format.write_boxes``, in their order) and the
    number of unreadable frames among them (listed without detections)."""
    results: dict[str, list[dict[str, Any]]] = {}
    for d in detections:
        has = d.boxes is not None
        results[d.token] = dataset_format.write_boxes(d.token, d.boxes, d.labels, d.scores, d.pose) if has else []
    modalities = input_modalities(model)  # what the model reads: the meta block says so
    meta = submission_meta(camera="camera" in modalities, lidar="lidar" in modalities)
    return {"meta": meta, "results": results}, sum(d.boxes is None for d in detections)


def predict(
    model: nn.Module,
    dataset: Any,
    device: torch.device | str,
    *,
    progress: bool = True,
    dataset_format: DatasetFormat = DEFAULT,
    transform: Callable[[Batch], Batch] | None = None,
    on_frame: Callable[[int, Batch, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
    batch_size: int = 1,
    label: str = "eval",
    limit: int | None = None,
    score_threshold: float | None = None,
) -> tuple[dict[str, Any], int]:
    """The submission of ``model`` on every frame of ``dataset`` (or its first ``limit``), in its (scene) order, one
    frame at a time (``batch_size`` consecutive frames at a time for a model without streaming state).

    Args:
        model: a :class:`~drivetrain.engine.protocol.Detector`; put in eval mode for the call and back in its
            previous mode after it.
        dataset: frames with ``__len__``, ``__getitem__(frame)`` (``prev_exists`` from the frame's place in its
            scene) and ``collate(samples)``, e.g. :class:`~drivetrain.data.sources.StreamingFrames`.
        device: where the model runs.
        progress: show a progress bar.
        dataset_format: whose records are written (its ``write_boxes``; labels index its classes).
        transform: applied to each frame's batch on ``device`` before ``detect`` (the test-time camera
            transform of a run trained with ``data.augment``, ``Augmentation.test_time``).
        on_frame: called as ``on_frame(frame, batch, boxes, scores, labels)`` after each frame with the batch as
            loaded (before ``transform``) and the detections as NumPy arrays (e.g. to draw one for TensorBoard);
            only with ``batch_size`` 1.
        batch_size: frames per ``detect`` call; above 1 only for a model without streaming state (a temporal
            memory sees one frame per call in scene order, as the :class:`~drivetrain.engine.protocol.Detector`
            protocol says).
        label: the progress bar's label.
        limit: only the first this many frames (a quick look; the submission lists just those).
        score_threshold: drop detections scoring below it (None: keep all, as a metric needs).

    Returns:
        The submission dict (``meta``, ``results`` keyed by sample token, in frame order) and the number of
        unreadable frames (listed with no detections).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit: must be ≥ 1, got {limit}")
    frames = range(len(dataset) if limit is None else min(limit, len(dataset)))
    detections = detect_frames(
        model, dataset, device, frames=frames, progress=progress, transform=transform, on_frame=on_frame,
        batch_size=batch_size, label=label, score_threshold=score_threshold,
    )  # fmt: skip
    return submission_of(detections, model, dataset_format)


def evaluate_model(
    model: nn.Module,
    dataset: EvalFrames,
    device: torch.device | str,
    out_dir: str | Path,
    *,
    split: str,
    root: str | Path | None = None,
    options: MetricOptions | None = None,
    progress: bool = True,
    quiet: bool = False,
    transform: Callable[[Batch], Batch] | None = None,
    on_frame: Callable[[int, Batch, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> EvalResult:
    """Predict every frame of ``dataset`` (see :func:`predict`), write ``out_dir/results.json`` and score it with
    the metric of the frames' format (``dataset.index.format``).

    Args:
        model: the detector.
        dataset: the split's frames (:class:`EvalFrames`: they know their index and root).
        device: where the model runs.
        out_dir: folder of ``results.json`` and the metric's files (``metrics_summary.json``, ``lyft_metrics.json``).
        split: the split the frames are (``mini_val``, ``val``, ...).
        root: dataset root holding the index's table folder (default: the dataset's).
        options: the metric's options (the devkit's detection config, the Lyft footprint convention).
        progress: show a progress bar.
        quiet: send the devkit's printed tables to ``out_dir/devkit.log`` instead of stdout (during training).
        transform: the per-frame batch transform (see :func:`predict`).
        on_frame: the per-frame callback (see :func:`predict`).
    """
    if not isinstance(dataset, EvalFrames):
        raise TypeError(f"{type(dataset).__name__} is not the frames of an index (index, root, collate) to evaluate")
    start = time.perf_counter()
    fmt = dataset.index.format
    submission, skipped = predict(
        model, dataset, device, progress=progress, dataset_format=fmt, transform=transform, on_frame=on_frame
    )
    return score_submission(
        submission, skipped, dataset, out_dir, split=split, root=root, options=options, quiet=quiet, started=start
    )


def score_submission(
    submission: dict[str, Any],
    skipped: int,
    dataset: EvalFrames,
    out_dir: str | Path,
    *,
    split: str,
    root: str | Path | None = None,
    options: MetricOptions | None = None,
    quiet: bool = False,
    started: float | None = None,
) -> EvalResult:
    """Write ``submission`` (of every frame of ``dataset``) to ``out_dir/results.json`` and score it with the metric
    of the frames' format: the second half of :func:`evaluate_model`.

    Args:
        submission: :func:`predict`'s submission dict.
        skipped: its unreadable frames.
        dataset: the split's frames (their index's format, root and version).
        out_dir: folder of ``results.json`` and the metric's files.
        split: the split the frames are.
        root: dataset root holding the index's table folder (default: the dataset's).
        options: the metric's options.
        quiet: send the devkit's printed tables to ``out_dir/devkit.log`` instead of stdout.
        started: the ``time.perf_counter()`` the evaluation started at (default: now), for ``EvalResult.seconds``.
    """
    start = time.perf_counter() if started is None else started
    fmt = dataset.index.format
    out = Path(out_dir)
    path = write_submission(submission, out / "results.json")
    # The devkit opens its files itself: it writes into a folder made just now, renamed into out (a link planted
    # at one of those names in out is replaced, never written through).
    with staged_outputs(out) as stage, contextlib.ExitStack() as stack:
        if quiet:
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open_output(stage / "devkit.log"))))
        metrics = fmt.metric(
            path, root if root is not None else dataset.root, version=dataset.index.meta["version"], split=split,
            out_dir=stage, options=options or MetricOptions(),
        )  # fmt: skip
    return EvalResult(metrics, path, len(dataset), skipped, time.perf_counter() - start, fmt)


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
    from drivetrain.engine.compat import drop_own_augmentation_generator, upgrade_saved_config
    from drivetrain.engine.config import ConfigError, TrainConfig, from_dict, over_model_recipe

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
        saved = over_model_recipe(upgrade_saved_config(state["config"]))  # an older run's spelling too
        cfg = from_dict(TrainConfig, saved)
        model = build_model(cfg.model)
        model.load_state_dict(drop_own_augmentation_generator(model, state["model"]))  # compat rule 3
    except (ConfigError, KeyError, RuntimeError) as err:
        raise CheckpointError(f"{path}: cannot rebuild the model from the checkpoint ({err})") from None
    return model, cfg, path
