"""``drivetrain viz frame``: one lidar frame as a bird's-eye PNG and a PLY file (points, GT and predicted boxes)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``viz`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "viz",
        help="pictures of data and predictions: a lidar frame as a bird's-eye PNG and a PLY file",
        description="`viz frame` draws one lidar frame: points coloured by sweep age, ground-truth boxes (green) "
        "and, with --checkpoint, the model's detections (orange to red by score) as footprints with a heading "
        "tick in a PNG, and as closed box meshes in a PLY file that MeshLab, Open3D and CloudCompare open.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    frame = actions.add_parser(
        "frame",
        help="one lidar frame: BEV PNG and PLY of points, GT and predicted boxes",
        description="Without --checkpoint, the frame of a nuScenes/Lyft-format root (its drivetrain_index.npz) with "
        "its ground truth; with --checkpoint, the run's own data settings (sweeps, point columns) and the model's "
        "detections on the frame (a lidar model: PointPillars, SSN).",
        epilog="examples:\n"
        "  drivetrain viz frame --root data/synth-tiny --frame 3 --sweeps 2 --png f3.png --ply f3.ply\n"
        "  drivetrain viz frame --checkpoint runs/pointpillars-tiny --frame 3 --ply f3.ply",
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
    frame.set_defaults(run=run_frame)


def run_frame(args: argparse.Namespace) -> int:
    """Draw ``args.frame``; return the exit code."""
    import torch

    from drivetrain.data.errors import DataError
    from drivetrain.engine.build import build_dataset
    from drivetrain.engine.checkpoint import CheckpointError
    from drivetrain.engine.config import ConfigError
    from drivetrain.engine.evaluation import model_from_checkpoint
    from drivetrain.viz.lidar import bev_png, write_ply

    model, extent, use_dim = None, args.extent, (0, 1, 2, 3, 4)
    try:
        if args.checkpoint is not None:
            try:
                model, cfg, _ = model_from_checkpoint(args.checkpoint)
            except CheckpointError as err:
                raise SystemExit(f"viz frame: --checkpoint: {err}") from None
            split = args.split or cfg.eval.split
            data = dataclasses.replace(cfg.data, args={**cfg.data.args, "split": split})
            dataset = build_dataset(data)
            use_dim = tuple(cfg.data.args.get("use_dim", use_dim))
            grid = getattr(model, "grid_test", None)
            if extent is None and grid is not None:
                extent = float(max(abs(v) for v in grid.point_cloud_range[:2] + grid.point_cloud_range[3:5]))
        else:
            from drivetrain.data.sources import INDEX_FILE, frames

            index = args.root / INDEX_FILE
            if not index.is_file():
                raise SystemExit(f"viz frame: --root: {index} not found; build it with drivetrain data index")
            split = args.split or "mini_val"
            dataset = frames(str(index), str(args.root), split, load_points=True, num_sweeps=args.sweeps,
                             load_images=False)  # fmt: skip
    except (ConfigError, DataError) as err:
        raise SystemExit(f"viz frame: {err}") from None
    if not 0 <= args.frame < len(dataset):
        raise SystemExit(f"viz frame: --frame {args.frame}: split {split!r} has frames 0..{len(dataset) - 1}")
    batch = dataset.collate([dataset[args.frame]])
    if batch.points is None:
        raise SystemExit("viz frame: the run's data loads no lidar points (a camera model); nothing to draw")
    points = batch.points.to_list()[0].numpy()
    gt = batch.gt_boxes.to_list()[0].numpy()
    pred = scores = None
    if model is not None:
        if not callable(getattr(model, "detect", None)):
            raise SystemExit(f"viz frame: {type(model).__name__} has no detect(batch)")
        device = torch.device(args.device)
        boxes, det_scores, _ = model.to(device).detect(batch.to(device))
        boxes, det_scores = boxes.to_list()[0].cpu().numpy(), det_scores.to_list()[0].cpu().numpy()
        keep = det_scores >= args.score_threshold
        pred, scores = boxes[keep], det_scores[keep]
    time_column = use_dim.index(4) if 4 in use_dim else None
    token = batch.sample_tokens[0]
    title = f"{split} frame {args.frame} ({token[:8]}…): {len(points)} points, {len(gt)} GT boxes"
    if pred is not None:
        title += f", {len(pred)} detections with score ≥ {args.score_threshold:g}"
    png = bev_png(args.png or Path(f"frame-{args.frame}.png"), points, gt, pred, scores, time_column=time_column,
                  extent=extent or 50.0, title=title)  # fmt: skip
    print(f"wrote {png}")
    if args.ply is not None:
        print(f"wrote {write_ply(args.ply, points, gt, pred, scores, time_column=time_column)}")
    return 0
