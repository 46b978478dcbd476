"""``drivetrain predict``: a trained model's submission for the frames of any nuScenes-format root — with or without
annotations (a test split) — and the pieces ``drivetrain eval --checkpoint`` shares with it (it is predict, then
the metric of ``eval --predictions``).

The root's :class:`~drivetrain.data.formats.record.DatasetFormat` (recorded in its index) decides what is written: a
nuScenes submission or Lyft box records. The model sees each frame as in evaluation: the run's reading settings
(images or points, sweeps, point columns), the test-time transform of a run trained with ``data.augment``, scene
order with the temporal memory on; ``--blank-inputs`` blanks the sensor data first (the control of
:func:`~drivetrain.engine.eval_run.blank_inputs`). Nothing is written but ``--out`` (through a temporary file
beside it, renamed over it): a root without ``drivetrain_index.npz`` is indexed in memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivetrain.batch import Batch

__all__ = [
    "add_model_options",
    "add_parser",
    "blank_grey",
    "blank_note",
    "frame_transform",
    "load_detector",
    "pick_device",
    "predict_frames",
    "root_index",
]

EPILOG = """\
examples:
  drivetrain predict --checkpoint runs/my-lidar-run --root data/synth-tiny --split mini_val --out results.json
  drivetrain predict --checkpoint runs/my-camera-run --root /data/nuscenes --version v1.0-test --out test.json
  drivetrain predict --checkpoint runs/my-lidar-run --root data/synth-tiny --out blank.json --blank-inputs
  drivetrain predict --checkpoint runs/my-lidar-run --root data/synth-tiny --split mini_val --frames 3 \
      --score-threshold 0.3 --out look.json                             # a quick look at a few frames

Without --split every scene of the root is predicted (a test split's root holds just that split). A root without
drivetrain_index.npz is indexed in memory first (not saved: predict writes nothing but --out; `drivetrain data
index --root ROOT` saves the index for the next call).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``predict`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "predict",
        help="write a checkpoint's submission (nuScenes or Lyft format) for the frames of any nuScenes-format root, "
        "with or without annotations",
        description="Rebuild the model from a run's checkpoint, run it over the root's frames (one split, or all) in "
        "scene order with the run's test-time transform, and write the submission of the root's format to --out: "
        'nuScenes {"meta": {...}, "results": {sample_token: [box, ...]}} (global frame), Lyft box records on a Lyft '
        "root. No ground truth is read: a test split's root (no sample_annotation table) works. `drivetrain eval "
        "--checkpoint` is this, then the metric.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        metavar="RUN_OR_CKPT",
        help="a run directory (its newest checkpoint), a checkpoint directory checkpoints/step-N or its state.pt",
    )
    parser.add_argument("--root", type=Path, required=True, help="nuScenes-format root (holds VERSION/ and samples/)")
    parser.add_argument(
        "--split", default=None, help="devkit split of the root's scenes, e.g. mini_val, val, test (default: all)"
    )
    parser.add_argument("--out", type=Path, required=True, help="submission file to write (its folder must exist)")
    parser.add_argument(
        "--version",
        default=None,
        help="table folder (default: the one ROOT/drivetrain_index.npz was built from; without an index v1.0-mini, "
        "or the one other table folder, as `data index`)",
    )
    add_model_options(parser)
    parser.add_argument(
        "--frames", type=int, default=None, metavar="N",
        help="only the first N frames of the split (or root) in scene order: a quick look (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--score-threshold", type=float, default=None, metavar="S",
        help="write only boxes scoring at least S (default: all, as a metric needs them)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The options of how the model runs, shared by ``predict`` and ``eval --checkpoint``."""
    parser.add_argument(
        "--device", default="auto", choices=("auto", "cpu", "cuda"), help="where the model runs (default: auto)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1,
        metavar="N",
        help="frames per detect call (default: 1; a model with a temporal memory takes one frame at a time in scene "
        "order)",
    )
    parser.add_argument(
        "--tta",
        action="store_true",
        help="test-time augmentation of a lidar model: the four BEV flips of each frame detected and merged "
        "(class-wise rotated NMS), as mmdetection3d's MultiScaleFlipAug3D with flip=True",
    )
    parser.add_argument(
        "--blank-inputs",
        action="store_true",
        help="a control: blank the sensor data before the model sees it — every image pixel RGB (124, 116, 104), the "
        "mean colour the camera models normalise with (≈ 0 once normalised), and no lidar points — so the score "
        "shows what the model reaches without looking",
    )


def run(args: argparse.Namespace) -> int:
    """Write the submission of ``args.checkpoint`` on ``args.root``'s frames to ``args.out``; return the exit code."""
    from drivetrain.data.dataset import FrameDataset
    from drivetrain.data.errors import DataError
    from drivetrain.data.formats.submission import write_submission
    from drivetrain.data.sources import StreamingFrames, reading_options

    if not args.root.is_dir():
        raise SystemExit(f"predict: --root: {args.root} is not a folder (a nuScenes-format dataset root)")
    if args.out.is_dir():
        raise SystemExit(f"predict: --out: {args.out} is a folder; name the submission file to write")
    if not args.out.parent.is_dir():
        raise SystemExit(f"predict: --out: the folder {args.out.parent} does not exist")
    if args.frames is not None and args.frames < 1:
        raise SystemExit(f"predict: --frames: must be ≥ 1, got {args.frames}")
    device = pick_device(args.device, "predict")
    model, cfg, path = load_detector(args.checkpoint, "predict", tta=args.tta, batch_size=args.batch_size)
    try:
        index = root_index(args.root, args.version, "predict", progress=not args.quiet)
        fmt = index.format
        if args.split is not None and args.split not in fmt.splits():
            raise SystemExit(
                f"predict: --split: unknown {fmt.title} split {args.split!r}; there are {sorted(fmt.splits())}"
            )
        if args.split is not None and not index.meta["splits"].get(args.split):
            raise SystemExit(
                f"predict: --split: no frames of split {args.split!r} under {args.root} (its "
                f"{len(index.meta['scenes'])} indexed scenes of {index.meta['version']} are in "
                f"{sorted(k for k, v in index.meta['splits'].items() if v)})"
            )
        # The run's reading settings (images or points, sweeps, point columns); its sweep cache holds the training
        # root's frames, so the sweeps are merged from the files instead.
        reading = reading_options(cfg.data.args, drop=("sweep_cache",))
        dataset = StreamingFrames(FrameDataset(index, reading, args.root, args.split))
    except (DataError, TypeError, ValueError) as err:
        raise SystemExit(f"predict: {err}") from None
    if len(dataset) == 0:
        raise SystemExit(f"predict: --root: {args.root} holds no key frames to predict")
    which = args.split or f"all {len(dataset.index.meta['scenes'])} scenes"
    if args.frames is not None and args.frames < len(dataset):
        which += f", its first {args.frames} of {len(dataset)} frames"
    blank = f" with inputs blanked ({blank_note(model, cfg)})" if args.blank_inputs else ""
    print(f"predict: {path} on {args.root} {which} ({len(dataset)} frames, {device}){blank} → {args.out}", flush=True)
    submission, skipped = predict_frames(
        model.to(device), cfg, dataset, device, batch_size=args.batch_size, blank=args.blank_inputs,
        progress=not args.quiet, label="predict", limit=args.frames, score_threshold=args.score_threshold,
    )  # fmt: skip
    try:
        write_submission(submission, args.out)
    except OSError as err:
        raise SystemExit(f"predict: cannot write {args.out} ({err.strerror})") from None
    boxes = sum(len(v) for v in submission["results"].values())
    unreadable = f", {skipped} unreadable frame(s) listed without detections" if skipped else ""
    print(
        f"predict: {boxes} boxes in {len(submission['results'])} frames ({fmt.title} format){unreadable} → {args.out}"
    )
    return 0


def pick_device(name: str, command: str) -> Any:
    """The torch device of ``--device`` (``auto``: CUDA when available); SystemExit for ``cuda`` without one."""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{command}: --device cuda, but no CUDA device is available")
    return torch.device("cuda" if name != "cpu" and torch.cuda.is_available() else "cpu")


def load_detector(checkpoint: Path, command: str, *, tta: bool, batch_size: int) -> tuple[Any, Any, Path]:
    """The :class:`~drivetrain.engine.protocol.Detector` of ``--checkpoint`` (TTA on with ``tta``), its run config
    and checkpoint folder; SystemExit naming the option for a checkpoint that does not load, a model without
    detections, ``--tta`` of a model without it, or ``--batch-size`` > 1 of a model with a temporal memory."""
    from drivetrain.engine.checkpoint import CheckpointError
    from drivetrain.engine.eval_run import has_streaming_state, model_from_checkpoint
    from drivetrain.engine.protocol import Detector, TTADetector

    if batch_size < 1:
        raise SystemExit(f"{command}: --batch-size: must be ≥ 1, got {batch_size}")
    try:
        model, cfg, path = model_from_checkpoint(checkpoint)
    except CheckpointError as err:
        raise SystemExit(f"{command}: --checkpoint: {err}") from None
    if not isinstance(model, Detector):
        raise SystemExit(
            f"{command}: --checkpoint: {path} holds a {cfg.model.name} model, which makes no 3D detections (no "
            "detect(batch)) to score with a dataset's metric; drivetrain eval scores runs of detectors "
            "(its training loss and curves: drivetrain report RUN)"
        )
    if tta:
        if not isinstance(model, TTADetector):
            raise SystemExit(
                f"{command}: --tta: {type(model).__name__} has no test-time augmentation (lidar models do)"
            )
        model.enable_tta()
    if batch_size > 1 and has_streaming_state(model):
        raise SystemExit(
            f"{command}: --batch-size: {type(model).__name__} keeps a temporal memory and detects one frame at a time "
            f"in scene order (as the original's test-time seq_mode); use --batch-size 1, got {batch_size}"
        )
    return model, cfg, path


def root_index(root: Path, version: str | None, command: str, *, progress: bool, build: bool = True) -> Any:
    """The frame index of ``root``: its ``drivetrain_index.npz`` (when of ``version``, if one is named), else — with
    ``build`` — one built in memory (written nowhere), else SystemExit naming the command that builds it."""
    from drivetrain.data.formats.registry import default_version
    from drivetrain.data.index import build_index, load_index
    from drivetrain.data.sources import INDEX_FILE

    index_file = root / INDEX_FILE
    if index_file.is_file():
        index = load_index(index_file, root)
        if version is None or index.meta["version"] == version:
            return index
    elif not build:
        raise SystemExit(
            f"{command}: --root: {index_file} not found; build it with drivetrain data index --root {root}"
        )
    version = version or default_version(root)
    print(
        f"{command}: indexing {root / version} in memory (not saved: {command} writes nothing but its output; "
        f"`drivetrain data index --root {root}"
        + (f" --version {version}" if version != default_version(root) else "")
        + "` saves an index for the next call)",
        flush=True,
    )
    return build_index(root, version, progress=progress)


def frame_transform(cfg: Any, *, blank: bool) -> Callable[[Batch], Batch] | None:
    """What a frame's batch goes through before ``detect``: the inputs blanked (with ``blank``, to
    :func:`blank_grey`), then the run's test-time camera transform (a run trained with ``data.augment``); None when
    neither applies."""
    from drivetrain.engine.eval_run import blank_inputs

    test_time = None
    if cfg.data.augment is not None:  # trained on augmented images: evaluate on the test-time transform of them
        from drivetrain.pipeline.augment.stage import Augmentation

        test_time = Augmentation(cfg.data.augment).test_time
    if not blank:
        return test_time
    grey = blank_grey(cfg)

    def transform(batch: Batch) -> Batch:
        blanked = blank_inputs(batch, grey)
        return test_time(blanked) if test_time is not None else blanked

    return transform


def blank_grey(cfg: Any) -> tuple[int, int, int]:
    """The RGB of a blanked image for the run ``cfg``: the mean its images are normalised with, rounded — the
    camera recipe's ``data.augment.camera.mean`` when it normalises, else the model's ImageNet mean
    (:data:`~drivetrain.engine.eval_run.BLANK_GREY`)."""
    from drivetrain.engine.eval_run import BLANK_GREY

    camera = cfg.data.augment.camera if cfg.data.augment is not None else None
    if camera is not None and camera.normalize:
        return (round(camera.mean[0]), round(camera.mean[1]), round(camera.mean[2]))
    return BLANK_GREY


def blank_note(model: Any, cfg: Any) -> str:
    """What ``--blank-inputs`` does to the sensors ``model`` reads, for the command's header line."""
    from drivetrain.engine.protocol import input_modalities

    modalities = input_modalities(model)
    said = []
    if "camera" in modalities:
        said.append(f"camera images grey RGB {blank_grey(cfg)}")
    if "lidar" in modalities:
        said.append("lidar point clouds empty")
    return ", ".join(said) or "no camera or lidar input to blank"


def predict_frames(
    model: Any,
    cfg: Any,
    dataset: Any,
    device: Any,
    *,
    batch_size: int,
    blank: bool,
    progress: bool,
    label: str,
    limit: int | None = None,
    score_threshold: float | None = None,
) -> tuple[dict[str, Any], int]:
    """The submission of ``model`` (on ``device``) for every frame of ``dataset`` (or its first ``limit``) in the
    format of its index, with the run's test-time transform (and the inputs blanked with ``blank``), boxes below
    ``score_threshold`` dropped when one is given; and the number of unreadable frames."""
    from drivetrain.engine.eval_run import predict

    return predict(
        model, dataset, device, progress=progress, dataset_format=dataset.index.format,
        transform=frame_transform(cfg, blank=blank), batch_size=batch_size, label=label, limit=limit,
        score_threshold=score_threshold,
    )  # fmt: skip
