"""``drivetrain data cache``: merge every key frame's lidar sweeps once into a memory-mapped sweep cache."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drivetrain.data.sweeps import SweepConfig

__all__ = ["add_cache_parser", "run_args"]


def add_cache_parser(data_sub: argparse._SubParsersAction) -> None:
    """Register ``data cache`` on the ``data`` subcommand's actions."""
    cache = data_sub.add_parser(
        "cache",
        help="merge each key frame's lidar sweeps once into a memory-mapped sweep cache",
        description="Merge every key frame of an index with its N most recent lidar sweeps (train: a random N when "
        "there are more, drawn once per sample; see --choice), as mmdetection3d's LoadPointsFromMultiSweeps does, and "
        "store the merged clouds in a pickle-free cache the loader memory-maps. A run reads it with "
        "data.args.sweep_cache=OUT and the same reading settings (num_sweeps, use_dim, sweep_choice, remove_close, "
        "pad_empty_sweeps, sweep_seed), in its YAML or as overrides of drivetrain train: the command prints them. A "
        "manifest records the settings, a digest per frame and the size and SHA-256 of every shard: a cache of "
        "other settings or of a changed index is refused by the loader. An interrupted build resumes from its "
        "finished shards.",
        epilog="examples:\n"
        "  drivetrain data cache --index data/synth-tiny/drivetrain_index.npz --sweeps 10 --use-dim 0,1,2,4\n"
        "  drivetrain data cache --index INDEX --sweeps 5 --workers 2 --out /fast/cache/nus-5\n"
        "  drivetrain data cache --out /fast/cache/nus-5 --verify\n"
        "  drivetrain train --config configs/my_lidar_run.yaml data.args.sweep_cache=/fast/cache/nus-5 ...  "
        "# the printed settings",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cache.add_argument("--index", type=Path, default=None, help="index file from `drivetrain data index`")
    cache.add_argument("--root", type=Path, default=None, help="dataset root (default: the one the index names)")
    cache.add_argument("--sweeps", type=int, default=10, help="sweeps merged per key frame, N (default: 10)")
    cache.add_argument(
        "--use-dim",
        default="0,1,2,3,4",
        help="columns kept of x,y,z,intensity,Δt = 0..4 (default: all; the shipped lidar configs: 0,1,2,4)",
    )
    cache.add_argument(
        "--choice",
        choices=("random", "nearest"),
        default="random",
        help="a frame with more than N sweeps: a random N (training, default) or the N most recent (test)",
    )
    cache.add_argument("--remove-close", action="store_true", help="drop sweep points with |x| < 1 m and |y| < 1 m")
    cache.add_argument(
        "--pad-empty-sweeps", action="store_true", help="a frame without sweeps repeats its key frame N times"
    )
    cache.add_argument("--seed", type=int, default=0, help="seed of the random sweep subsets (default: 0)")
    cache.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default="float32",
        help="point storage: float32 is lossless (default); float16 halves the file and rounds x, y, z",
    )
    cache.add_argument("--out", type=Path, default=None, help="cache folder (default: next to the index, sweeps-N)")
    cache.add_argument("--workers", type=int, default=1, help="processes building shards (default: 1)")
    cache.add_argument("--frames-per-shard", type=int, default=64, help="frames per shard file (default: 64)")
    cache.add_argument("--rebuild", action="store_true", help="replace a cache of other settings at --out")
    cache.add_argument("--verify", action="store_true", help="check every shard's size and SHA-256 and exit")
    cache.add_argument("--quiet", action="store_true", help="no progress bar")
    cache.set_defaults(run=_cache)


def _cache(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from drivetrain.data.errors import DataError
    from drivetrain.data.index import load_index
    from drivetrain.data.io import read_points
    from drivetrain.data.sweep_cache import build_cache, verify_cache
    from drivetrain.data.sweeps import SweepConfig

    if args.verify:
        if args.out is None:
            raise SystemExit("data cache: --verify needs --out (the cache folder)")
        problems = verify_cache(args.out)
        for p in problems:
            print(p)
        print(f"{args.out}: {'sound' if not problems else f'{len(problems)} problems'}")
        return 1 if problems else 0
    if args.index is None:
        raise SystemExit("data cache: --index is required (except with --verify)")
    try:
        use_dim = tuple(int(v) for v in args.use_dim.split(","))
        config = SweepConfig(
            num_sweeps=args.sweeps,
            use_dim=use_dim,
            choice=args.choice,
            remove_close=args.remove_close,
            pad_empty_sweeps=args.pad_empty_sweeps,
            seed=args.seed,
        )
    except ValueError as err:
        raise SystemExit(f"data cache: {err}") from None
    if args.workers < 1 or args.frames_per_shard < 1:
        raise SystemExit("data cache: --workers and --frames-per-shard must be ≥ 1")
    try:
        index = load_index(args.index, args.root)
    except DataError as err:
        raise SystemExit(f"data cache: {err}") from None
    root = Path(args.root if args.root is not None else index.meta["root"])
    out = args.out or args.index.parent / f"sweeps-{args.sweeps}"
    bar = tqdm(total=len(index), unit="frame", desc="sweep cache", disable=args.quiet)
    try:
        report = build_cache(
            index,
            root,
            out,
            config,
            read_points,
            dtype=args.dtype,
            frames_per_shard=args.frames_per_shard,
            workers=args.workers,
            rebuild=args.rebuild,
            progress=bar.update,
        )
    except DataError as err:
        raise SystemExit(f"data cache: {err}") from None
    finally:
        bar.close()
    per_frame = report.bytes / max(report.frames, 1)
    print(
        f"sweep cache: {report.frames} frames, {report.points} points, {report.bytes / 2**20:.1f} MiB "
        f"({per_frame / 1024:.1f} KiB per frame; {report.shards_built} shards built, {report.shards_reused} reused) "
        f"→ {report.path}"
    )
    print("use it in a run (YAML data.args, or these overrides of drivetrain train):", " ".join(run_args(config, out)))
    return 0


def run_args(config: SweepConfig, out: Path) -> list[str]:
    """The ``data.args.KEY=VALUE`` overrides that read the cache at ``out`` built with ``config``."""
    values = {
        "load_points": "true",
        "num_sweeps": config.num_sweeps,
        "use_dim": f"[{','.join(map(str, config.use_dim))}]",
        "sweep_choice": config.choice,
        "remove_close": str(config.remove_close).lower(),
        "pad_empty_sweeps": str(config.pad_empty_sweeps).lower(),
        "sweep_seed": config.seed,
        "sweep_cache": out,
    }
    return [f"data.args.{key}={value}" for key, value in values.items()]
