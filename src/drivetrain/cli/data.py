"""``drivetrain data synth|index|inspect|cache``: make, index, look at and cache nuScenes-format data."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path

from drivetrain.cli.data_cache import add_cache_parser

__all__ = ["add_parser"]


class FormatNames:
    """The ``--format`` choices: ``first`` and the names of the format registry
    (:data:`~drivetrain.data.formats.registry.FORMATS`), read when argparse first asks — to print help or check a
    value — so that building the parser imports no data module (``drivetrain.data`` loads torch). Set on the action
    after ``add_argument``, which would read them at once."""

    def __init__(self, *first: str) -> None:
        self.first = first

    def names(self) -> list[str]:
        from drivetrain.data.formats.registry import FORMATS

        return [*self.first, *FORMATS]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``data`` subcommand and its ``synth``, ``index`` and ``inspect`` actions on ``sub``."""
    parser = sub.add_parser(
        "data",
        help="generate synthetic nuScenes-format data, index a nuScenes-format root, inspect a batch",
        description="nuScenes-format data: `synth` writes a synthetic dataset the devkit loads, `index` builds the "
        "frame index the loader reads (no pickle), `inspect` loads one batch and prints its fields.",
    )
    data_sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    synth = data_sub.add_parser(
        "synth",
        help="write a synthetic nuScenes-format dataset (v1.0-mini scene names)",
        description="Write a synthetic dataset in the nuScenes format: shaded class-coloured cuboids seen by six "
        "cameras, a ray-cast lidar (32 beams; 16 in the tiny preset) with sweeps, all tables the devkit reads. "
        "Scenes carry the v1.0-mini "
        "names, so the devkit's mini_train/mini_val splits apply. Deterministic for a seed.",
        epilog="examples:\n  drivetrain data synth --out data/synth-tiny --size tiny\n"
        "  drivetrain data synth --out data/synth-full --size full --workers 2\n"
        "  drivetrain data synth --out data/small --size tiny --scenes 4 --frames-per-scene 3 --image-size 160x90",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    synth.add_argument("--out", "--root", dest="root", type=Path, required=True, help="output folder (created)")
    synth.add_argument(
        "--size",
        "--preset",
        dest="preset",
        choices=["tiny", "full"],
        default="tiny",
        help="tiny: the 10 v1.0-mini scenes × 8 frames at 320×180 (seconds); full: 10 scenes × 40 frames at "
        "1600×900 (default: tiny)",
    )
    synth.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    synth.add_argument(
        "--scenes",
        type=int,
        default=None,
        help="use only the first N scenes (2 mini_train, the 2 mini_val, then the other mini_train)",
    )
    synth.add_argument(
        "--frames-per-scene",
        "--samples",
        dest="samples",
        type=int,
        default=None,
        help="key frames per scene (overrides the preset)",
    )
    synth.add_argument(
        "--image-size", default=None, metavar="WxH", help="image size, e.g. 800x450 (focal scales with W)"
    )
    synth.add_argument(
        "--sweeps-per-sample",
        type=int,
        default=None,
        help="lidar sweeps between key frames, 0-9 (overrides the preset's: tiny 2, full 9)",
    )
    synth.add_argument("--workers", type=int, default=1, help="processes, one scene each at a time (default: 1)")
    synth_format = synth.add_argument(
        "--format",
        dest="dataset",
        default=None,
        help="nuscenes: tables in v1.0-mini/, samples/, sweeps/; lyft: a Lyft Level 5 v1.01-train folder (Lyft "
        "classes, tables in v1.01-train/, images/, lidar/, maps/; scene names of mmdetection3d's Lyft train/val "
        "split) (default: nuscenes)",
    )
    synth_format.choices = FormatNames()
    synth.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the synthetic dataset already in --out (its tables, the files they list under samples/, "
        "sweeps/, maps/, its index and settings are deleted first, nothing else; a folder without "
        "drivetrain_synth.json is refused); without it a non-empty --out is refused, except an unfinished "
        "generation of ours (killed), which is replaced",
    )
    synth.add_argument("--quiet", action="store_true", help="no progress bar")
    synth.set_defaults(run=_synth)

    index = data_sub.add_parser(
        "index",
        help="build the frame index of a nuScenes-format root (needs the nuscenes extra)",
        description="Read the tables with the nuScenes devkit and write the frame index the loader uses: per key "
        "frame the camera matrices, ego pose, GT boxes in the lidar frame (x, y, z_centre, dx, dy, dz, yaw, vx, vy) "
        "and lidar sweeps, as one .npz (no pickle). Checks that every referenced file exists.",
        epilog="example:\n  drivetrain data index --root data/synth-tiny",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    index.add_argument("--root", type=Path, required=True, help="nuScenes-format root (holds VERSION/ and samples/)")
    index.add_argument(
        "--version",
        default=None,
        help="table folder (default: v1.0-mini; v1.01-train with --format lyft or when only that folder exists)",
    )
    index_format = index.add_argument(
        "--format",
        dest="dataset",
        default="auto",
        help="auto: Lyft Level 5 when every category is a Lyft class, else nuScenes (default: auto)",
    )
    index_format.choices = FormatNames("auto")
    index.add_argument("--out", type=Path, default=None, help="index file (default: ROOT/drivetrain_index.npz)")
    index.add_argument(
        "--max-sweeps", type=int, default=10, help="lidar sweeps recorded per frame (default: 10, as mmdetection3d)"
    )
    index.add_argument("--no-check-files", action="store_true", help="skip checking that data files exist")
    index.add_argument("--quiet", action="store_true", help="no progress bar")
    index.set_defaults(run=_index)

    inspect = data_sub.add_parser(
        "inspect",
        help="load one batch through FrameDataset + SequenceSampler and print its fields",
        description="Load one batch (B frames, one per slot of the sequence sampler) and print every field's shape.",
    )
    inspect.add_argument("--index", type=Path, required=True, help="index file from `drivetrain data index`")
    inspect.add_argument(
        "--root", type=Path, default=None, help="dataset root (default: the one the index names, relative to it)"
    )
    inspect.add_argument("--split", default=None, help="only the scenes of this split, e.g. mini_train (default: all)")
    inspect.add_argument("--batch-size", type=int, default=2, help="B (default: 2)")
    inspect.add_argument("--points", action="store_true", help="also load lidar points")
    inspect.set_defaults(run=_inspect)
    add_cache_parser(data_sub)


def _synth(args: argparse.Namespace) -> int:
    from drivetrain.data.formats.registry import DEFAULT, FORMATS
    from drivetrain.data.synth import PRESETS, generate

    for name, value in (("--scenes", args.scenes), ("--frames-per-scene", args.samples), ("--workers", args.workers)):
        if value is not None and value < 1:
            raise SystemExit(f"data synth: {name}: must be ≥ 1, got {value}")
    if args.sweeps_per_sample is not None and not 0 <= args.sweeps_per_sample <= 9:
        raise SystemExit(f"data synth: --sweeps-per-sample: must be in 0..9, got {args.sweeps_per_sample}")
    try:
        config = PRESETS[args.preset].with_overrides(seed=args.seed)
        synth_format = FORMATS[args.dataset or DEFAULT.name].synth
        if synth_format.scene_names is not None:  # the format's own scene names (Lyft: mmdetection3d's split)
            config = config.with_overrides(scenes=synth_format.scene_names[: len(config.scenes)])
        if args.scenes is not None:
            config = config.with_overrides(scenes=config.scenes[: args.scenes])
        if args.samples is not None:
            config = config.with_overrides(samples_per_scene=args.samples)
        if args.sweeps_per_sample is not None:
            config = config.with_overrides(sweeps_per_sample=args.sweeps_per_sample)
        if args.image_size is not None:
            try:
                width, height = (int(v) for v in args.image_size.lower().split("x"))
            except ValueError:
                raise SystemExit(
                    f"data synth: --image-size: expected WxH such as 800x450, got {args.image_size!r}"
                ) from None
            config = config.with_overrides(image_width=width, image_height=height, focal=1266.0 * width / 1600)
    except ValueError as err:
        raise SystemExit(f"data synth: {err}") from None
    from drivetrain.data.errors import DataError
    from drivetrain.data.synth.manifest import generation_lock

    _check_out(args.root, args.overwrite)  # before anything is created: a refused folder is left as it was
    start = time.perf_counter()
    try:
        args.root.mkdir(parents=True, exist_ok=True)
        with generation_lock(args.root, wait=False):  # not while a trainer (or another data synth) generates here
            _check_out(args.root, args.overwrite)  # again under the lock: what is there now is what is replaced
            counts = generate(
                args.root, config, workers=args.workers, progress=not args.quiet, synth_format=synth_format
            )
    except DataError as err:
        raise SystemExit(f"data synth: {err}") from None
    except OSError as err:
        raise SystemExit(f"data synth: cannot write {err.filename or args.root} ({err.strerror})") from None
    print(
        f"wrote {counts['sample']} key frames of {counts['scene']} scenes, {counts['sample_annotation']} annotations "
        f"to {args.root} in {time.perf_counter() - start:.1f} s"
    )
    return 0


def _check_out(root: Path, overwrite: bool) -> None:
    """Refuse an output folder that is not empty, unless it holds a synthetic dataset of ours that may be replaced:
    an unfinished one (a generation that was killed) always, a finished one with ``overwrite``. The generator then
    deletes only what it made there (:mod:`drivetrain.data.synth.outputs`); a folder without its manifest is never
    touched."""
    from drivetrain.data.errors import DataError
    from drivetrain.data.synth.manifest import MANIFEST, folder_state

    try:
        state, _ = folder_state(root)
    except DataError as err:  # not a folder, or a manifest that is not the generator's
        raise SystemExit(f"data synth: {err}") from None
    if state == "foreign":
        raise SystemExit(
            f"data synth: --out {root} is not empty and holds no synthetic dataset (no {MANIFEST}); not writing into "
            "it — choose a new or empty folder"
        )
    if state == "complete" and not overwrite:
        raise SystemExit(
            f"data synth: --out {root} is not empty; pass --overwrite to replace the dataset there, or choose an "
            "empty folder (files of an earlier, larger dataset would otherwise remain beside the new one)"
        )
    if state == "unfinished":
        print(f"data synth: {root} holds an unfinished synthetic dataset (its generation was stopped); replacing it")


def _index(args: argparse.Namespace) -> int:
    from drivetrain.data.errors import DataError
    from drivetrain.data.formats.registry import default_version
    from drivetrain.data.index import build_index, save_index

    out = args.out or args.root / "drivetrain_index.npz"
    if args.max_sweeps < 0:
        raise SystemExit(f"data index: --max-sweeps: must be ≥ 0, got {args.max_sweeps}")
    dataset = None if args.dataset == "auto" else args.dataset
    try:
        index = build_index(
            args.root,
            args.version or default_version(args.root, dataset),
            max_sweeps=args.max_sweeps,
            check_files=not args.no_check_files,
            progress=not args.quiet,
            dataset=dataset,
        )
    except DataError as err:
        raise SystemExit(f"data index: {err}") from None
    try:
        save_index(index, out)
    except OSError as err:
        raise SystemExit(f"data index: cannot write {out} ({err.strerror})") from None
    print(
        f"indexed {len(index)} frames of {len(index.meta['scenes'])} scenes, {len(index.arrays['boxes'])} boxes → {out}"
    )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import torch

    from drivetrain.data import DatasetConfig, FrameDataset, SequenceSampler, collate
    from drivetrain.data.errors import DataError
    from drivetrain.ragged import RaggedBatch

    if args.batch_size < 1:
        raise SystemExit(f"data inspect: --batch-size: must be ≥ 1, got {args.batch_size}")
    try:
        dataset = FrameDataset(args.index, DatasetConfig(load_points=args.points), args.root, args.split)
        scenes = len(dataset.scene_lengths())
        if args.batch_size > scenes:  # each of the B slots walks a scene of its own
            which = f"split {args.split!r}" if args.split else "the index"
            raise SystemExit(
                f"data inspect: --batch-size: {args.batch_size} slots need as many scenes (one each), but {which} "
                f"has {scenes}" + (f"; pass --batch-size {scenes} or less" if scenes else "")
            )
        sampler = SequenceSampler(dataset.scene_lengths(), args.batch_size)
        batch = collate([dataset[key] for key in next(iter(sampler))])
    except DataError as err:
        raise SystemExit(f"data inspect: {err}") from None
    for name, value in vars(batch).items():
        if isinstance(value, RaggedBatch):
            print(f"{name:<14} RaggedBatch {tuple(value.shape)} {value.dtype}, sizes {value.sizes.tolist()}")
        elif isinstance(value, torch.Tensor):
            print(f"{name:<14} {tuple(value.shape)} {value.dtype}")
        else:
            print(f"{name:<14} {value}")
    return 0
