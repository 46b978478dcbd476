"""``drivetrain eval``: the official metric of a trained model (``--checkpoint``) or of a predictions file
(``--predictions``). One path for every dataset format: the root's (or the run's index's)
:class:`~drivetrain.data.formats.record.DatasetFormat` names the default split, the splits, the ground-truth writer, the
metric (nuScenes: the devkit's; Lyft Level 5: the Lyft mAP) and what is printed.

``--checkpoint`` is ``drivetrain predict`` (:mod:`drivetrain.cli.predict`: the same model loading, frames and
prediction) writing ``results.json``, then the scoring of ``--predictions`` on it; under torchrun
(``torchrun --nproc_per_node N --no-python drivetrain eval --checkpoint ...``) each rank predicts its share of the
frames and rank 0 writes and scores them all. ``--blank-inputs`` scores the
control (the sensor data blanked); ``--json FILE`` writes the flat summary (``mAP``, ``NDS``, ...) for scripts."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

from drivetrain.cli.predict import (
    add_model_options,
    blank_note,
    load_detector,
    pick_device,
    predict_frames,
    root_index,
)

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``eval`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "eval",
        help="official detection metrics of a checkpoint or a predictions file (nuScenes: mAP, NDS, TP errors, "
        "per-class AP; Lyft Level 5: mAP over 3D IoU thresholds)",
        description="With --checkpoint: rebuild the model from a run's checkpoint, run it over the split's frames "
        "in scene order (batch 1, temporal memory on), write the submission and score it. With --predictions: "
        "score a submission-format file "
        '({"meta": {...}, "results": {sample_token: [box, ...]}}, global frame). Prints the nuScenes devkit\'s '
        "DetectionEval tables, then mAP, NDS, the TP errors and the per-class AP as JSON. With "
        "--ground-truth-from INDEX, first write the index's ground truth as the predictions file (a check of the "
        "whole chain: it scores mAP ≈ 1). The dataset's format decides the metric, the same way for both: on a Lyft "
        "Level 5 root (told by its categories; with --checkpoint, by the index) predictions are Lyft box records "
        "('name' and 'score', see docs/data.md) scored with the Lyft metric (mAP over 3D IoU thresholds 0.5:0.95, "
        "per-class AP), and its default split is val.",
        epilog="examples:\n  drivetrain eval --checkpoint runs/my-run                           # newest checkpoint\n"
        "  drivetrain eval --checkpoint runs/my-run/checkpoints/step-00000300 --split mini_val\n"
        "  drivetrain eval --checkpoint runs/my-run --blank-inputs --json control.json        # the control\n"
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
    add_model_options(parser.add_argument_group("with --checkpoint (as drivetrain predict)"))
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
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the flat summary to FILE: mAP (and NDS, the TP errors, AP/<class>), the split, "
        "blank_inputs and the predictions file (its folder must exist)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Evaluate ``args.checkpoint`` or ``args.predictions``; print the metrics; return the exit code."""
    from drivetrain.data.errors import DataError
    from drivetrain.data.formats.record import MetricOptions
    from drivetrain.safeio.files import replace_text

    options = MetricOptions(devkit_config=args.config, lyft_footprint=args.lyft_footprint)
    if args.json is not None and (args.json.is_dir() or not args.json.parent.is_dir()):
        raise SystemExit(f"eval: --json: {args.json} is a folder or its folder does not exist; name a file to write")
    try:
        if args.checkpoint is not None:
            if args.ground_truth_from is not None:
                raise SystemExit("eval: --ground-truth-from writes a predictions file; use it with --predictions")
            scored_here = _score_checkpoint(args, options)
            if scored_here is None:  # a torchrun rank other than 0: its share is with rank 0
                return 0
            fmt, metrics, scored = scored_here
        else:
            if args.blank_inputs:
                raise SystemExit("eval: --blank-inputs blanks a model's inputs; use it with --checkpoint")
            fmt, metrics, scored = _score_predictions(args, options)
    except DataError as err:
        raise SystemExit(f"eval: {err}") from None
    print(json.dumps(fmt.report(metrics), indent=2))
    if args.json is not None:
        summary = {**fmt.summary(metrics), **scored, "blank_inputs": args.blank_inputs}
        try:
            replace_text(args.json, json.dumps(summary, indent=2) + "\n")
        except OSError as err:
            raise SystemExit(f"eval: --json: cannot write {args.json} ({err.strerror})") from None
    return 0


def _score(fmt: Any, predictions: Path, root: Path, *, version: str, split: str, out: Path | None, options: Any) -> Any:
    """The metric of ``fmt`` on a predictions file: what ``--predictions`` and ``--checkpoint`` both print.

    Its files go to ``out`` (default: ``<predictions stem>_eval`` beside the file, which must be a real folder, not
    a link), written first into a folder made just now inside it and renamed into place
    (:func:`~drivetrain.safeio.files.staged_outputs`): a link at one of their names is replaced, never written
    through. A folder this call made is removed again when scoring fails.
    """
    from drivetrain.data.errors import DataError
    from drivetrain.safeio.files import LinkedFolderError, real_dir, staged_outputs

    if not predictions.parent.is_dir():  # the metric's own check, before a folder is made beside the file
        raise DataError("predictions file does not exist", predictions)
    named = out is not None
    out = out if out is not None else predictions.parent / f"{predictions.stem}_eval"
    made = not (out.exists() or out.is_symlink())
    try:
        if named:
            out.mkdir(parents=True, exist_ok=True)  # the user's folder (a link there is where they send it)
        else:
            real_dir(out, create=True)  # a name we picked: a link planted there is refused
    except (LinkedFolderError, NotADirectoryError) as err:
        raise SystemExit(f"eval: not writing the metrics into {err}") from None
    except OSError as err:
        raise SystemExit(f"eval: cannot create the metrics folder {out} ({err.strerror})") from None
    try:
        with staged_outputs(out) as stage:
            return fmt.metric(predictions, root, version=version, split=split, out_dir=stage, options=options)
    except BaseException:
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty: the folder of a refused or failed scoring is not left behind
        raise


def _score_predictions(args: argparse.Namespace, options: Any) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """``--predictions`` (written first from ``--ground-truth-from``), scored with the metric of the root's format."""
    from drivetrain.data.formats.registry import default_version, detect_format
    from drivetrain.data.formats.submission import write_submission
    from drivetrain.data.index import load_index

    if args.root is None:
        raise SystemExit("eval: --predictions needs --root (the nuScenes-format dataset the predictions are of)")
    version = args.version or default_version(args.root)
    fmt = detect_format(args.root, version)
    split = args.split or fmt.default_split
    splits = fmt.splits()
    if split not in splits:
        raise SystemExit(f"eval: --split: unknown {fmt.title} split {split!r}; there are {sorted(splits)}")
    if args.ground_truth_from is not None:
        if args.predictions.exists() and not args.overwrite:
            raise SystemExit(
                f"eval: {args.predictions} exists; --ground-truth-from would replace it (pass --overwrite)"
            )
        index = load_index(args.ground_truth_from, args.root)
        try:
            write_submission(fmt.ground_truth(index, splits[split]), args.predictions)
        except OSError as err:
            raise SystemExit(f"eval: cannot write {args.predictions} ({err.strerror})") from None
    metrics = _score(fmt, args.predictions, args.root, version=version, split=split, out=args.out, options=options)
    return fmt, metrics, {"split": split, "predictions": str(args.predictions)}


def _score_checkpoint(args: argparse.Namespace, options: Any) -> tuple[Any, dict[str, Any], dict[str, str]] | None:
    """``drivetrain predict`` of the run's model over the split's frames (the run's data, or ``--root``'s index),
    written to ``OUT/results.json``, then scored as ``--predictions`` with the metric of the frames' format.

    Under torchrun every rank predicts its share of the frames (:mod:`drivetrain.engine.eval_shards`) and rank
    0 writes and scores them all; the other ranks return None."""
    from drivetrain.data.formats.submission import write_submission
    from drivetrain.safeio.files import LinkedFolderError, real_dir

    model, cfg, path = load_detector(args.checkpoint, "eval", tta=args.tta, batch_size=args.batch_size)
    dataset, split = _checkpoint_frames(args, cfg)
    ctx = _join_ranks(pick_device(args.device, "eval"), cfg.distributed.timeout_s)
    device = ctx.device
    default = f"{path.name}-{split}" + ("-blank" if args.blank_inputs else "")  # the control beside the real one
    out = args.out or path.parent.parent / "eval" / default

    def check_out(create: bool) -> None:
        """RUN/eval and RUN/eval/step-N-SPLIT: real folders of the run, never links to elsewhere (the user's
        --out may be one); checked before predicting, made only once there is something to write."""
        if args.out is None:
            try:
                real_dir(out, base=path.parent.parent, create=create)
            except (LinkedFolderError, NotADirectoryError) as err:
                raise SystemExit(f"eval: not writing into {err}") from None
            except OSError as err:
                raise SystemExit(f"eval: cannot create {out} ({err.strerror})") from None

    check_out(create=False)
    blank = f" with inputs blanked ({blank_note(model, cfg)})" if args.blank_inputs else ""
    ranks = f", {ctx.world_size} ranks" if ctx.initialized else ""
    if ctx.is_main:
        print(f"eval: {path} on {split} ({len(dataset)} frames, {device}{ranks}){blank} → {out}", flush=True)
    if ctx.initialized:
        shared = _predict_shared(model.to(device), cfg, dataset, ctx, args)
        if shared is None:
            return None
        submission, skipped = shared
    else:
        submission, skipped = predict_frames(
            model.to(device), cfg, dataset, device, batch_size=args.batch_size, blank=args.blank_inputs,
            progress=True, label="eval",
        )  # fmt: skip
    check_out(create=True)
    predictions = write_submission(submission, out / "results.json")
    fmt, index = dataset.index.format, dataset.index
    metrics = _score(
        fmt, predictions, dataset.root, version=index.meta["version"], split=split, out=out, options=options
    )
    if skipped:
        print(f"eval: {skipped} unreadable frame(s) counted without detections", flush=True)
    return fmt, metrics, {"split": split, "predictions": str(predictions), "checkpoint": str(path)}


def _join_ranks(device: Any, timeout_s: float) -> Any:
    """The :class:`~drivetrain.engine.distributed.DistContext` of this process: torchrun's ranks (``WORLD_SIZE`` > 1)
    joined in a process group (gloo on the CPU; NCCL on CUDA, each rank on its ``LOCAL_RANK``'s GPU; the run's
    ``distributed.timeout_s``), else one process on ``device``."""
    import datetime
    import os

    import torch
    import torch.distributed as dist

    from drivetrain.engine.distributed import DistContext

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(0, 1, 0, device, "none", initialized=False)
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise SystemExit(
                f"eval: this process is LOCAL_RANK={local} but {torch.cuda.device_count()} CUDA device(s) are "
                "visible; start at most one process per GPU (torchrun --nproc_per_node) or pass --device cpu"
            )
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return DistContext(rank, world, local, device, "none", initialized=True)


def _predict_shared(model: Any, cfg: Any, dataset: Any, ctx: Any, args: argparse.Namespace) -> tuple[dict, int] | None:
    """This rank's share of the frames predicted, every rank's gathered on rank 0: its submission and unreadable
    frames there, None elsewhere; the process group is left afterwards (rank 0 scores alone)."""
    from drivetrain.cli.predict import frame_transform
    from drivetrain.engine.distributed import exit_failed, teardown
    from drivetrain.engine.eval_run import submission_of
    from drivetrain.engine.eval_shards import EvaluationFailed, predict_shared

    try:
        detections = predict_shared(
            model, dataset, ctx, stop_signal=lambda: None, progress=ctx.is_main,
            transform=frame_transform(cfg, blank=args.blank_inputs), batch_size=args.batch_size,
        )  # fmt: skip
    except EvaluationFailed as err:  # on every rank alike; rank 0 says why
        teardown(ctx)
        raise SystemExit(f"eval: {err}" if ctx.is_main else 1) from None
    except BaseException as err:  # perhaps this rank's alone (an interrupt, an out-of-memory): the others are in a
        # frame's agreement, where teardown's barrier would wait until distributed.timeout_s
        exit_failed(err, 130 if isinstance(err, KeyboardInterrupt) else 1)
    teardown(ctx)
    return submission_of(detections, model, dataset.index.format) if detections is not None else None


def _checkpoint_frames(args: argparse.Namespace, cfg: Any) -> tuple[Any, str]:
    """The frames ``--checkpoint`` is scored on and their split: ``--root``'s index read with the run's reading
    settings, or the run's own data builder with ``split`` replaced."""
    from drivetrain.data.dataset import FrameDataset
    from drivetrain.data.errors import DataError
    from drivetrain.data.sources import StreamingFrames, reading_options
    from drivetrain.detector.spec import keywords
    from drivetrain.engine.build import build_dataset
    from drivetrain.engine.config import ConfigError
    from drivetrain.engine.eval_run import EvalFrames

    try:
        if args.root is not None:
            index = root_index(args.root, None, "eval", progress=True, build=False)  # the index's version
            split = args.split or index.format.default_split
            # The run's reading settings (images or points, sweeps, point columns, GT filters) on the other root;
            # its sweep cache holds the training root's frames, so the sweeps are merged from the files instead.
            reading = reading_options(cfg.data.args, drop=("sweep_cache",))
            dataset: Any = StreamingFrames(FrameDataset(index, reading, args.root, split))
        else:
            split = args.split or cfg.eval.split
            dataset = build_dataset(dataclasses.replace(cfg.data, args={**keywords(cfg.data.args), "split": split}))
    except (ConfigError, DataError, TypeError, ValueError) as err:
        raise SystemExit(f"eval: {err}") from None
    if not isinstance(dataset, EvalFrames):
        raise SystemExit(f"eval: data.name {cfg.data.name} builds no frames of an index to score; pass --root")
    if len(dataset) == 0:
        raise SystemExit(f"eval: the dataset has no frames of split {split!r}")
    return dataset, split
