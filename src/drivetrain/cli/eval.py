"""``drivetrain eval``: official nuScenes detection metrics of a trained model (``--checkpoint``) or of a
predictions file (``--predictions``)."""

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
        "whole chain: it scores mAP ≈ 1).",
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
        help="a run directory (its newest checkpoint) or a checkpoint directory checkpoints/step-N",
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
        "--version", default="v1.0-mini", help="table folder (default: v1.0-mini; with --checkpoint: the index's)"
    )
    parser.add_argument("--split", default="mini_val", help="devkit split, e.g. mini_val, val (default: mini_val)")
    parser.add_argument("--config", default="detection_cvpr_2019", help="devkit detection config")
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
    try:
        if args.root is not None:
            from drivetrain.data.sources import INDEX_FILE, frames

            index = args.root / INDEX_FILE
            if not index.is_file():
                raise SystemExit(
                    f"eval: --root: {index} not found; build it with drivetrain data index --root {args.root}"
                )
            dataset = frames(str(index), root=str(args.root), split=args.split)
        else:
            dataset = build_dataset(dataclasses.replace(cfg.data, args={**cfg.data.args, "split": args.split}))
    except (ConfigError, DataError) as err:
        raise SystemExit(f"eval: {err}") from None
    if len(dataset) == 0:
        raise SystemExit(f"eval: the dataset has no frames of split {args.split!r}")
    out = args.out or path.parent.parent / "eval" / f"{path.name}-{args.split}"
    print(f"eval: {path} on {args.split} ({len(dataset)} frames, {device}) → {out}", flush=True)
    try:
        result = evaluate_model(
            model.to(device), dataset, device, out, split=args.split, root=args.root, config=args.config
        )
    except DataError as err:
        raise SystemExit(f"eval: {err}") from None
    _print_summary(result.metrics)
    if result.skipped:
        print(f"eval: {result.skipped} unreadable frame(s) counted without detections", flush=True)
    return 0
