"""``drivetrain eval``: official nuScenes detection metrics of a trained model (``--checkpoint``) or of a
predictions file (``--predictions``); on a Lyft Level 5 root, the Lyft metric of a predictions file."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``eval`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "eval",
        help="nuScenes detection metrics (mAP, NDS, TP errors, per-class AP) of a checkpoint or a predictions file",
        description="With --checkpoint: rebuild the model from a run's checkpoint, run it over the split's frames "
        "in scene order (batch 1, temporal memory on), write the submission and score it. With --predictions: "
        "score a submission-format file "
        '({"meta": {...}, "results": {sample_token: [box, ...]}}, global frame). Prints the nuScenes devkit\'s '
        "DetectionEval tables, then mAP, NDS, the TP errors and the per-class AP as JSON. With "
        "--ground-truth-from INDEX, first write the index's ground truth as the predictions file (a check of the "
        "whole chain: it scores mAP ≈ 1). On a Lyft Level 5 root (told by its categories) predictions are scored "
        "with the Lyft metric instead (mAP over 3D IoU thresholds 0.5:0.95, per-class AP; Lyft box records with "
        "'name' and 'score', see docs/data.md), with --predictions or --checkpoint (a model trained on Lyft labels).",
        epilog="examples:\n  drivetrain eval --checkpoint runs/streampetr-tiny                  # newest checkpoint\n"
        "  drivetrain eval --checkpoint runs/streampetr-tiny/checkpoints/step-00000300 --split mini_val\n"
        "  drivetrain eval --predictions results.json --root data/synth-tiny\n"
        "  drivetrain eval --predictions gt.json --root data/synth-tiny "
        "--ground-truth-from data/synth-tiny/drivetrain_index.npz",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--checkpoint",
        type=Path,
        metavar="RUN_OR_CKPT",
        help="a run directory (its newest checkpoint), a checkpoint directory checkpoints/step-N or its state.pt",
    )
    what.add_argument("--predictions", type=Path, help="submission JSON to evaluate")
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="nuScenes-format root (needed with --predictions; with --checkpoint default: the run's training data, "
        "its drivetrain_index.npz)",
    )
    parser.add_argument(
        "--device", default="auto", choices=("auto", "cpu", "cuda"), help="with --checkpoint (default: auto)"
    )
    parser.add_argument(
        "--version",
        default=None,
        help="table folder (default: v1.0-mini, or v1.01-train where only that exists; with --checkpoint: the index's)",
    )
    parser.add_argument(
        "--split",
        default=None,
        help="devkit split, e.g. mini_val, val (default: mini_val, Lyft: val; with --checkpoint and no --root the "
        "run's eval.split)",
    )
    parser.add_argument(
        "--lyft-footprint",
        choices=["heading", "pypi-0.0.8"],
        default="heading",
        help="Lyft metric: box footprints turned by the heading (lyft_dataset_sdk since its fix of the sign, "
        "GitHub 0.0.10) or by minus it, as lyft-dataset-sdk 0.0.8 from PyPI does (default: heading)",
    )
    parser.add_argument("--config", default="detection_cvpr_2019", help="devkit detection config")
    parser.add_argument(
        "--tta",
        action="store_true",
        help="with --checkpoint of a lidar model: test-time augmentation, the four BEV flips of each frame detected "
        "and merged (class-wise rotated NMS), as mmdetection3d's MultiScaleFlipAug3D with flip=True",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="metrics folder (default: next to the predictions; with --checkpoint RUN/eval/<step>-<split>)",
    )
    parser.add_argument(
        "--ground-truth-from",
        type=Path,
        default=None,
        metavar="INDEX",
        help="write GT as predictions first (to --predictions, which must not exist unless --overwrite)",
    )
    parser.add_argument("--overwrite", action="store_true", help="let --ground-truth-from replace --predictions")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Evaluate ``args.checkpoint`` or ``args.predictions``; print the metrics; return the exit code."""
    if args.checkpoint is not None:
        if args.ground_truth_from is not None:
            raise SystemExit("eval: --ground-truth-from writes a predictions file; use it with --predictions")
        return _run_checkpoint(args)
    if args.root is None:
        raise SystemExit("eval: --predictions needs --root (the nuScenes-format dataset the predictions are of)")
    from drivetrain.data.errors import DataError
    from drivetrain.data.evaluate import evaluate, ground_truth_submission, write_submission
    from drivetrain.data.index import load_index
    from drivetrain.data.lyft_format import default_version, detect_dataset

    args.version = args.version or default_version(args.root)
    if detect_dataset(args.root, args.version) == "lyft":
        return _run_lyft(args)
    args.split = args.split or "mini_val"
    try:
        if args.ground_truth_from is not None:
            from nuscenes.utils.splits import create_splits_scenes

            scenes = create_splits_scenes().get(args.split)
            if scenes is None:
                raise SystemExit(f"eval: --split: unknown devkit split {args.split!r}")
            if args.predictions.exists() and not args.overwrite:
                raise SystemExit(
                    f"eval: {args.predictions} exists; --ground-truth-from would replace it (pass --overwrite)"
                )
            index = load_index(args.ground_truth_from, args.root)
            try:
                write_submission(ground_truth_submission(index, scenes), args.predictions)
            except OSError as err:
                raise SystemExit(f"eval: cannot write {args.predictions} ({err.strerror})") from None
        metrics = evaluate(
            args.predictions, args.root, version=args.version, split=args.split, out_dir=args.out, config=args.config
        )
    except DataError as err:
        raise SystemExit(f"eval: {err}") from None
    _print_summary(metrics)
    return 0


def _run_lyft(args: argparse.Namespace) -> int:
    """``--predictions`` on a Lyft root: the Lyft metric, printed as JSON."""
    from drivetrain.data.errors import DataError
    from drivetrain.data.evaluate import write_submission
    from drivetrain.data.index import load_index
    from drivetrain.data.lyft_eval import evaluate_lyft, lyft_ground_truth_submission
    from drivetrain.data.lyft_splits import LYFT_SPLITS

    split = args.split or "val"
    if split not in LYFT_SPLITS:
        raise SystemExit(f"eval: --split: unknown Lyft split {split!r}; there are {sorted(LYFT_SPLITS)}")
    try:
        if args.ground_truth_from is not None:
            if args.predictions.exists() and not args.overwrite:
                raise SystemExit(
                    f"eval: {args.predictions} exists; --ground-truth-from would replace it (pass --overwrite)"
                )
            index = load_index(args.ground_truth_from, args.root)
            try:
                write_submission(lyft_ground_truth_submission(index, list(LYFT_SPLITS[split])), args.predictions)
            except OSError as err:
                raise SystemExit(f"eval: cannot write {args.predictions} ({err.strerror})") from None
        metrics = evaluate_lyft(
            args.predictions, args.root, version=args.version, split=split, out_dir=args.out,
            footprint=args.lyft_footprint,
        )  # fmt: skip
    except DataError as err:
        raise SystemExit(f"eval: {err}") from None
    _print_lyft(metrics)
    return 0


def _print_lyft(metrics: dict) -> None:
    keys = ("mAP", "AP", "mAP_per_iou", "classes_without_gt", "footprint", "num_gt", "num_predictions")
    print(json.dumps({k: metrics[k] for k in keys}, indent=2))


def _print_summary(metrics: dict) -> None:
    summary = {"mAP": metrics["mean_ap"], "NDS": metrics["nd_score"], **metrics["tp_errors"]}
    summary["AP"] = metrics.get("mean_dist_aps", {})
    print(json.dumps(summary, indent=2))


def _run_checkpoint(args: argparse.Namespace) -> int:
    import torch

    from drivetrain.data.errors import DataError
    from drivetrain.engine.build import build_dataset
    from drivetrain.engine.checkpoint import CheckpointError
    from drivetrain.engine.config import ConfigError
    from drivetrain.engine.evaluation import evaluate_model, model_from_checkpoint

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("eval: --device cuda, but no CUDA device is available")
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    try:
        model, cfg, path = model_from_checkpoint(args.checkpoint)
    except CheckpointError as err:
        raise SystemExit(f"eval: --checkpoint: {err}") from None
    if not callable(getattr(model, "detect", None)):
        raise SystemExit(
            f"eval: --checkpoint: {path} holds a {cfg.model.name} model, which makes no 3D detections (no "
            "detect(batch)) to score with the nuScenes metric; drivetrain eval scores streampetr, pointpillars and ssn "
            "runs (its training loss and curves: drivetrain report RUN)"
        )
    if args.tta:
        if not hasattr(model, "tta_config"):
            raise SystemExit(f"eval: --tta: {type(model).__name__} has no test-time augmentation (lidar models do)")
        from drivetrain.models.pointpillars.tta import TTAConfig

        model.tta_config = model.tta_config or TTAConfig()
    try:
        if args.root is not None:
            from drivetrain.data.lyft_format import default_version, detect_dataset
            from drivetrain.data.sources import INDEX_FILE, frames

            index = args.root / INDEX_FILE
            if not index.is_file():
                raise SystemExit(
                    f"eval: --root: {index} not found; build it with drivetrain data index --root {args.root}"
                )
            lyft = detect_dataset(args.root, args.version or default_version(args.root)) == "lyft"
            args.split = args.split or ("val" if lyft else "mini_val")
            # The run's reading settings (images or points, sweeps, point columns) on the other root.
            keep = ("load_images", "load_points", "num_sweeps", "use_dim", "on_error")
            reading = {k: v for k, v in cfg.data.args.items() if k in keep}
            dataset = frames(str(index), root=str(args.root), split=args.split, **reading)
        else:
            args.split = args.split or cfg.eval.split
            dataset = build_dataset(dataclasses.replace(cfg.data, args={**cfg.data.args, "split": args.split}))
    except (ConfigError, DataError, TypeError) as err:
        raise SystemExit(f"eval: {err}") from None
    if len(dataset) == 0:
        raise SystemExit(f"eval: the dataset has no frames of split {args.split!r}")
    out = args.out or path.parent.parent / "eval" / f"{path.name}-{args.split}"
    print(f"eval: {path} on {args.split} ({len(dataset)} frames, {device}) → {out}", flush=True)
    transform = None
    if cfg.data.augment is not None:  # trained on augmented images: evaluate on the test-time transform of them
        from drivetrain.pipeline.camera_aug import CameraAugConfig, CameraAugment

        transform = CameraAugment(CameraAugConfig.from_dict(cfg.data.augment)).test_time
    try:
        result = evaluate_model(
            model.to(device), dataset, device, out, split=args.split, root=args.root, config=args.config,
            lyft_footprint=args.lyft_footprint, transform=transform,
        )  # fmt: skip
    except DataError as err:
        raise SystemExit(f"eval: {err}") from None
    if "nd_score" in result.metrics:
        _print_summary(result.metrics)
    else:
        _print_lyft(result.metrics)
    if result.skipped:
        print(f"eval: {result.skipped} unreadable frame(s) counted without detections", flush=True)
    return 0
