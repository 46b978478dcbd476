"""``drivetrain viz frame``: one frame as a PNG — the camera images with projected 3D boxes and, with lidar points, a
bird's-eye panel — and a PLY file of the points and boxes."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``viz`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "viz",
        help="pictures of data and predictions: a frame's cameras with projected boxes, a bird's-eye view, a PLY",
        description="`viz frame` draws one frame: the camera images with the 3D boxes projected onto them (ground "
        "truth thick, predictions thin, colour by class) and, when the frame has lidar points, a bird's-eye panel "
        "(points coloured by sweep age, GT footprints green, detections orange to red by score, heading ticks); "
        "--ply writes the points and boxes as closed meshes that MeshLab, Open3D and CloudCompare open.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    frame = actions.add_parser(
        "frame",
        help="one frame: cameras with projected boxes + BEV PNG; PLY of points, GT and predicted boxes",
        description="Without --checkpoint, the frame of a nuScenes/Lyft-format root (its drivetrain_index.npz) with "
        "its ground truth; with --checkpoint, the run's own data settings (sweeps, point columns) and the model's "
        "detections on the frame (camera views for a camera model, the bird's-eye view for a lidar one).",
        epilog="examples:\n"
        "  drivetrain viz frame --root data/synth-tiny --frame 3 --sweeps 2 --png f3.png --ply f3.ply\n"
        "  drivetrain viz frame --checkpoint runs/my-lidar-run --frame 3 --ply f3.ply",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = frame.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", type=Path, metavar="RUN_OR_CKPT", help="a run directory or checkpoints/step-N")
    what.add_argument("--root", type=Path, help="a dataset root with drivetrain_index.npz (ground truth only)")
    frame.add_argument("--frame", type=int, required=True, help="frame number within the split, in scene order")
    frame.add_argument("--split", default=None, help="devkit split (default: the run's eval.split, or mini_val)")
    frame.add_argument("--sweeps", type=int, default=0, help="with --root: sweeps merged into the frame (default: 0)")
    frame.add_argument("--png", type=Path, default=None, help="bird's-eye PNG (default: frame-<K>.png here)")
    frame.add_argument("--ply", type=Path, default=None, help="also write the points and boxes as PLY here")
    frame.add_argument("--score-threshold", type=float, default=0.3, help="detections drawn (default: score ≥ 0.3)")
    frame.add_argument("--extent", type=float, default=None, help="half-width in metres (default: the grid's, or 50)")
    frame.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the model runs (default: cpu)")
    frame.add_argument("--no-cameras", action="store_true", help="with --root: the bird's-eye view only (no images)")
    frame.set_defaults(run=run_frame)


def run_frame(args: argparse.Namespace) -> int:
    """Draw ``args.frame``; return the exit code."""
    import torch

    from drivetrain.cli.predict import pick_device
    from drivetrain.data.dataset import Skipped
    from drivetrain.data.errors import DataError
    from drivetrain.data.sources import StreamingFrames
    from drivetrain.detector.spec import keywords
    from drivetrain.engine.build import build_dataset
    from drivetrain.engine.checkpoint import CheckpointError
    from drivetrain.engine.config import ConfigError
    from drivetrain.engine.eval_run import detections_on_host, model_from_checkpoint, streaming_state_aside
    from drivetrain.engine.protocol import Detector, VoxelModel
    from drivetrain.viz.lidar import bev_png, write_ply

    model, cfg, extent, use_dim = None, None, args.extent, (0, 1, 2, 3, 4)
    try:
        if args.checkpoint is not None:
            try:
                model, cfg, _ = model_from_checkpoint(args.checkpoint)
            except CheckpointError as err:
                raise SystemExit(f"viz frame: --checkpoint: {err}") from None
            split = args.split or cfg.eval.split
            data = dataclasses.replace(cfg.data, args={**keywords(cfg.data.args), "split": split})
            dataset = build_dataset(data)
            use_dim = tuple(keywords(cfg.data.args).get("use_dim", use_dim))
            if extent is None and isinstance(model, VoxelModel):  # the range the model detects in
                pc_range = model.grid_test.point_cloud_range
                extent = float(max(abs(v) for v in pc_range[:2] + pc_range[3:5]))
        else:
            from drivetrain.data.sources import INDEX_FILE, frames

            index = args.root / INDEX_FILE
            if not index.is_file():
                raise SystemExit(f"viz frame: --root: {index} not found; build it with drivetrain data index")
            split = args.split or "mini_val"
            dataset = frames(str(index), str(args.root), split, load_points=True, num_sweeps=args.sweeps,
                             load_images=not args.no_cameras)  # fmt: skip
    except (ConfigError, DataError) as err:
        raise SystemExit(f"viz frame: {err}") from None
    if not 0 <= args.frame < len(dataset):
        raise SystemExit(f"viz frame: --frame {args.frame}: split {split!r} has frames 0..{len(dataset) - 1}")
    try:
        sample = dataset[args.frame]
    except DataError as err:  # a missing or corrupt image or lidar file: named, as train and data inspect do
        raise SystemExit(f"viz frame: --frame {args.frame}: {err}") from None
    if isinstance(sample, Skipped):  # an unreadable frame skipped by the run's on_error=skip
        raise SystemExit(f"viz frame: --frame {args.frame}: unreadable ({sample.reason})")
    batch = dataset.collate([sample])
    if batch.points is None and batch.images is None:
        raise SystemExit("viz frame: the frame has neither lidar points nor camera images to draw")
    if args.ply is not None and batch.points is None:
        raise SystemExit("viz frame: --ply: the frame has no lidar points (a camera model's data)")
    points = batch.points.to_list()[0].numpy() if batch.points is not None else None
    gt = batch.gt_boxes.to_list()[0].numpy()
    gt_labels = batch.gt_labels.to_list()[0].numpy()
    pred = scores = labels = None
    if model is not None:
        if not isinstance(model, Detector):
            raise SystemExit(f"viz frame: {type(model).__name__} has no detect(batch)")
        device = pick_device(args.device, "viz frame")  # one line, not a traceback, for cuda without a GPU
        model_batch = batch.to(device)
        if cfg.data.augment is not None:  # a camera model trained on augmented images: its test-time transform
            from drivetrain.pipeline.augment.stage import Augmentation

            model_batch = Augmentation(cfg.data.augment).test_time(model_batch)
        # One frame alone: a streaming model starts from an empty memory (its training memory is set aside).
        model_batch = dataclasses.replace(model_batch, prev_exists=torch.zeros_like(model_batch.prev_exists))
        with torch.no_grad(), streaming_state_aside(model):
            boxes, det_scores, det_labels = model.to(device).eval().detect(model_batch)
        # plain tensors or RaggedBatch, as the Detector protocol allows: the one frame's rows as NumPy arrays
        boxes, det_scores, det_labels = (detections_on_host(v)[0] for v in (boxes, det_scores, det_labels))
        keep = det_scores >= args.score_threshold
        pred, scores, labels = boxes[keep], det_scores[keep], det_labels[keep]
    time_column = use_dim.index(4) if 4 in use_dim else None
    if extent is None and points is not None:  # no --extent and no model grid: the points' own reach
        from drivetrain.viz.lidar import points_extent

        extent = points_extent(points)
    token = batch.sample_tokens[0]
    what = f"{len(points)} points, " if points is not None else ""
    title = f"{split} frame {args.frame} ({token[:8]}…): {what}{len(gt)} GT boxes"
    if pred is not None:
        title += f", {len(pred)} detections with score ≥ {args.score_threshold:g}"
    out = args.png or Path(f"frame-{args.frame}.png")
    # Each file is written whole and renamed over its name: a link there (the default frame-K.png in the current
    # folder included) is replaced, its target never written (drivetrain.safeio.files).
    try:
        if batch.images is not None:
            from drivetrain.data.formats.registry import DEFAULT
            from drivetrain.viz.camera import frame_png

            meta = dataset.index.meta if isinstance(dataset, StreamingFrames) else {}
            images = batch.images[0].permute(0, 2, 3, 1).numpy()  # (N, H, W, 3)
            png = frame_png(
                out, images, batch.lidar2img[0].numpy(), gt, gt_labels, pred, labels, points=points,
                time_column=time_column, extent=extent or 50.0, camera_names=meta.get("cameras"),
                class_names=meta.get("classes", DEFAULT.classes), title=title,
            )  # fmt: skip
        else:
            png = bev_png(out, points, gt, pred, scores, time_column=time_column, extent=extent or 50.0, title=title)
        print(f"wrote {png}")
        if args.ply is not None:
            print(f"wrote {write_ply(args.ply, points, gt, pred, scores, time_column=time_column)}")
    except OSError as err:
        raise SystemExit(f"viz frame: cannot write {err.filename or out} ({err.strerror or err})") from None
    return 0
