"""``drivetrain eval``: official nuScenes detection metrics of a predictions file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``eval`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "eval",
        help="nuScenes detection metrics (mAP, NDS, TP errors) of a predictions file (needs the nuscenes extra)",
        description="Run the nuScenes devkit's DetectionEval on a submission-format predictions file "
        '({"meta": {...}, "results": {sample_token: [box, ...]}}, global frame) and print mAP, NDS and the TP '
        "errors. With --ground-truth-from INDEX, first write the index's ground truth as the predictions file "
        "(a check of the whole chain: it scores mAP ≈ 1).",
        epilog="examples:\n  drivetrain eval --predictions results.json --root data/synth-tiny\n"
        "  drivetrain eval --predictions gt.json --root data/synth-tiny "
        "--ground-truth-from data/synth-tiny/drivetrain_index.npz",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--predictions", type=Path, required=True, help="submission JSON to evaluate")
    parser.add_argument("--root", type=Path, required=True, help="nuScenes-format root")
    parser.add_argument("--version", default="v1.0-mini", help="table folder (default: v1.0-mini)")
    parser.add_argument("--split", default="mini_val", help="devkit split, e.g. mini_val, val (default: mini_val)")
    parser.add_argument("--config", default="detection_cvpr_2019", help="devkit detection config")
    parser.add_argument("--out", type=Path, default=None, help="metrics folder (default: next to the predictions)")
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
    summary = {"mAP": metrics["mean_ap"], "NDS": metrics["nd_score"], **metrics["tp_errors"]}
    print(json.dumps(summary, indent=2))
    return 0
