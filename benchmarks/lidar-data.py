"""Lidar input: sweep merging on the fly vs from the sweep cache (N = 0/5/10), and voxelization batched vs per sample.

**Sweeps.** Generates a synthetic nuScenes-format set into a temporary folder (or ``--data-dir``): 2 scenes
× 6 key frames with a 32-beam lidar at nuScenes' 1084 rays per beam and 9 sweeps between key frames,
indexed with 10 sweeps per frame (mmdetection3d's default; the chain reaches back across key frames).
For N = 0, 5 and 10 it loads every frame's points (x, y, z, Δt: PointPillars' columns) with
``FrameDataset`` in this process: merging the sweeps from their files (the reference: what
mmdetection3d's loader does every epoch) and reading them from a sweep cache built with the same settings
(``drivetrain data cache``). Rows give ms per frame (median over passes); ``sweeps`` in the JSON adds
frames/s, points/s, CPU ms per frame, the cache build time per frame and bytes on disk per frame
for float32 and float16 storage against the merged float32 array a pickle of the loaded points holds.

**Voxelization.** Random clouds (uniform in the range, ``--points`` per sample for the full grid) for a
batch of 4: ``hard_voxelize`` (one pass for the batch) against the reference loop (mmcv's CPU algorithm
point by point, per sample) and against ``per_sample_hard_voxelize`` (the same vectorised algorithm called
once per sample, as mmdetection3d's data preprocessor loops: what batching alone gains), for the tiny
grid (±16 m, 0.5 m, 16 points, 2000 voxels, ~4k points) and the full one (±50 m, 0.25 m, 64 points,
30000 voxels), plus the pillar scatter to the BEV canvas (one indexed write vs a loop of per-sample
canvases). Outputs are compared for equality before timing.

Run: ``drivetrain bench lidar-data [--device cpu|cuda] [--repeat N] [--save]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from drivetrain.data import DatasetConfig, FrameDataset
from drivetrain.data.index import build_index, save_index
from drivetrain.data.io import read_points
from drivetrain.data.sweep_cache import build_cache
from drivetrain.data.sweeps import merge_sweeps
from drivetrain.data.synth import PRESETS, generate
from drivetrain.pipeline.voxelize import (
    VoxelGrid,
    hard_voxelize,
    per_sample_hard_voxelize,
    reference_hard_voxelize_batch,
    reference_scatter_to_bev,
    scatter_to_bev,
)
from drivetrain.profile import BenchResult, Row, add_bench_arguments, device_name, emit, setup_bench
from drivetrain.profile.bench import compare
from drivetrain.profile.costmodel import count_call
from drivetrain.ragged import RaggedBatch
from drivetrain.safeio.files import remove_path

DESCRIPTION = __doc__.splitlines()[0]
SWEEPS = (0, 5, 10)
USE_DIM = (0, 1, 2, 4)
GRIDS = {
    "tiny": dict(
        point_cloud_range=(-16.0, -16.0, -5.0, 16.0, 16.0, 3.0),
        voxel_size=(0.5, 0.5, 8.0),
        max_points=16,
        max_voxels=2000,
    ),
    "full": dict(
        point_cloud_range=(-50.0, -50.0, -5.0, 50.0, 50.0, 3.0),
        voxel_size=(0.25, 0.25, 8.0),
        max_points=64,
        max_voxels=30000,
    ),
}


def make_dataset(folder: Path, seed: int) -> tuple[Path, Path]:
    """Generate (if absent) and index the lidar benchmark set; return (root, index path)."""
    tiny = PRESETS["tiny"]
    config = tiny.with_overrides(
        scenes=tiny.scenes[:2],
        samples_per_scene=6,
        sweeps_per_sample=9,
        image_width=160,
        image_height=90,
        focal=1266.0 * 0.1,
        lidar_rings=32,
        lidar_azimuths=1084,
        seed=seed,
    )
    root = folder / "synth-lidar"
    index = root / "drivetrain_index.npz"
    if not index.exists():
        generate(root, config, progress=False)
        save_index(build_index(root, max_sweeps=10, progress=False), index)
    return root, index


def time_passes(fn, frames: int, repeat: int) -> tuple[list[float], float, int]:
    """Per pass of ``fn(f)`` over every frame (repeated so a pass lasts ≥ 0.2 s; one warm-up pass first):
    wall ms per frame of each pass, the median CPU ms per frame (this process, all threads), points per frame
    sweep."""
    start = time.perf_counter()
    points = sum(len(fn(f)) for f in range(frames))  # warm-up: page cache, lazy maps
    rounds = max(1, int(0.2 / max(time.perf_counter() - start, 1e-6)))
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            for f in range(frames):
                fn(f)
        wall.append((time.perf_counter() - start) * 1e3 / (frames * rounds))
        cpu.append((time.process_time() - start_cpu) * 1e3 / (frames * rounds))
    return wall, statistics.median(cpu), points


def bench_sweeps(folder: Path, args: argparse.Namespace, result: BenchResult) -> dict[str, dict[str, float]]:
    root, index_path = make_dataset(folder, args.seed)
    index = FrameDataset(index_path).index
    table: dict[str, dict[str, float]] = {}
    for n in SWEEPS:
        config = DatasetConfig(load_images=False, load_points=True, num_sweeps=n, use_dim=USE_DIM)
        sizes, build_s = {}, {}
        for dtype in ("float32", "float16"):
            out = folder / f"cache-{n}-{dtype}"
            remove_path(out, ignore_errors=True)  # time a full build, not the reuse of finished shards
            start = time.perf_counter()
            report = build_cache(index, root, out, config.sweep_config, read_points, dtype=dtype)
            build_s[dtype] = time.perf_counter() - start
            sizes[dtype] = report.bytes / report.frames
        fly = FrameDataset(index_path, config)
        cached = FrameDataset(
            index_path, DatasetConfig(**{**vars(config), "sweep_cache": str(folder / f"cache-{n}-float32")})
        )
        for f in range(len(fly)):  # the cache must give exactly what merging gives
            if not torch.equal(torch.from_numpy(fly[f].points), torch.from_numpy(cached[f].points)):
                raise SystemExit(f"bench lidar-data: cached points of frame {f} differ from merged ones (N = {n})")
        tokens = index.meta["sample_tokens"]
        store = cached._sweep_cache
        assert store is not None
        ms_fly, cpu_fly, points = time_passes(
            lambda f, c=config.sweep_config: merge_sweeps(index, f, root, c, read_points)[0], len(fly), args.repeat
        )
        ms_cache, cpu_cache, _ = time_passes(lambda f, s=store, t=tokens: s.points(t[f]), len(fly), args.repeat)
        ms_fly_sample, _, _ = time_passes(lambda f, d=fly: d[f].points, len(fly), args.repeat)
        ms_cache_sample, _, _ = time_passes(lambda f, d=cached: d[f].points, len(fly), args.repeat)
        per_frame_points = points / len(fly)
        merged_bytes = per_frame_points * 4 * len(USE_DIM)
        parent = result.add(
            Row.from_samples(
                f"N = {n} sweeps ({per_frame_points / 1e3:.0f}k points): points of a frame", ms_fly, ms_cache
            )
        )
        result.add(
            Row.from_samples(
                f"N = {n}: whole sample (FrameDataset[i], no images)",
                ms_fly_sample,
                ms_cache_sample,
                parent=parent.name,
            )
        )
        table[f"N={n}"] = {
            "points_per_frame": round(per_frame_points),
            "frames_per_s_on_the_fly": round(1e3 / statistics.median(ms_fly), 1),
            "frames_per_s_cache": round(1e3 / statistics.median(ms_cache), 1),
            "mpoints_per_s_on_the_fly": round(per_frame_points / statistics.median(ms_fly) / 1e3, 2),
            "mpoints_per_s_cache": round(per_frame_points / statistics.median(ms_cache) / 1e3, 2),
            "cpu_ms_per_frame_on_the_fly": round(cpu_fly, 3),
            "cpu_ms_per_frame_cache": round(cpu_cache, 3),
            "cache_build_ms_per_frame_float32": round(build_s["float32"] * 1e3 / len(fly), 1),
            "merged_float32_kib_per_frame": round(merged_bytes / 1024, 1),
            "cache_float32_kib_per_frame": round(sizes["float32"] / 1024, 1),
            "cache_float16_kib_per_frame": round(sizes["float16"] / 1024, 1),
            "float32_vs_merged": round(sizes["float32"] / merged_bytes, 3),
            "float16_vs_merged": round(sizes["float16"] / merged_bytes, 3),
        }
    return table


def random_clouds(
    grid: VoxelGrid, num_points: int, batch: int, gen: torch.Generator, device: torch.device
) -> RaggedBatch:
    """``batch`` clouds of about ``num_points`` points (±10 %), uniform over the range and 10 % beyond it."""
    lo = torch.tensor(grid.point_cloud_range[:3])
    hi = torch.tensor(grid.point_cloud_range[3:])
    span = hi - lo
    clouds = []
    for _ in range(batch):
        n = int(num_points * (0.9 + 0.2 * torch.rand((), generator=gen)))
        xyz = lo - 0.05 * span + torch.rand(n, 3, generator=gen) * span * 1.1  # (P, 3)
        extra = torch.rand(n, 1, generator=gen)  # (P, 1) Δt-like feature
        clouds.append(torch.cat([xyz, extra], 1))
    return RaggedBatch.from_list(clouds).to(device)


def bench_voxels(args: argparse.Namespace, device: torch.device, result: BenchResult) -> None:
    gen = torch.Generator().manual_seed(args.seed)
    for name, num_points in (("tiny", 4000), ("full", args.points)):
        grid = VoxelGrid(**GRIDS[name])
        points = random_clouds(grid, num_points, args.batch, gen, device)
        clouds = points.to_list()  # what mmdetection3d's preprocessor loops over: a list of per-sample clouds
        batched = hard_voxelize(points, grid)
        looped = per_sample_hard_voxelize(clouds, grid)
        for field in ("voxels", "coors", "num_points"):
            if not torch.equal(getattr(batched, field), getattr(looped, field)):
                raise SystemExit(f"bench lidar-data: batched and per-sample voxelization differ in {field} ({name})")
        ref_ms, bat_ms = compare(
            lambda c=clouds, g=grid: per_sample_hard_voxelize(c, g),
            lambda p=points, g=grid: hard_voxelize(p, g),
            device=device,
            repeat=args.repeat,
            warmup=args.warmup,
        )
        # the reference loop (mmcv's CPU algorithm point by point in Python) is slow: fewer repeats at full size
        loop = reference_hard_voxelize_batch([c.cpu() for c in clouds], grid)
        if not torch.equal(loop.coors, batched.coors.cpu()) or not torch.equal(loop.voxels, batched.voxels.cpu()):
            raise SystemExit(f"bench lidar-data: batched voxelization differs from the reference loop ({name})")
        loop_ms = []
        for _ in range(args.repeat if name == "tiny" else max(1, args.repeat // 3)):
            start = time.perf_counter()
            reference_hard_voxelize_batch([c.cpu() for c in clouds], grid)
            loop_ms.append((time.perf_counter() - start) * 1e3)
        loop_cost = count_call(lambda c=clouds, g=grid: reference_hard_voxelize_batch([x.cpu() for x in c], g))
        label = f"{name} grid {grid.grid_size[0]}×{grid.grid_size[1]}, B = {args.batch} × {num_points // 1000}k points"
        parent = result.add(
            Row.from_samples(
                f"{label}: hard voxelization vs the reference loop",
                loop_ms,
                bat_ms,
                reference_cost=loop_cost,
                batched_cost=bat_ms.cost,
            )
        )
        result.add(
            Row.from_samples(
                f"{name}: vs per-sample calls of the vectorised path",
                ref_ms,
                bat_ms,
                parent=parent.name,
                reference_cost=ref_ms.cost,
                batched_cost=bat_ms.cost,
            )
        )
        feats = torch.randn(batched.coors.shape[0], 64, generator=gen).to(device)  # (V, 64) pillar features
        canvas = scatter_to_bev(feats, batched.coors, args.batch, grid)
        if not torch.equal(canvas, reference_scatter_to_bev(feats, batched.coors, args.batch, grid)):
            raise SystemExit(f"bench lidar-data: batched and per-sample BEV scatter differ ({name})")
        ref_ms, bat_ms = compare(
            lambda f=feats, c=batched.coors, g=grid: reference_scatter_to_bev(f, c, args.batch, g),
            lambda f=feats, c=batched.coors, g=grid: scatter_to_bev(f, c, args.batch, g),
            device=device,
            repeat=args.repeat,
            warmup=args.warmup,
        )
        result.add(
            Row.from_samples(
                f"{name} grid: pillar scatter to BEV (64 channels)",
                ref_ms,
                bat_ms,
                reference_cost=ref_ms.cost,
                batched_cost=bat_ms.cost,
            )
        )


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=5, warmup=1)
    parser.add_argument("--batch", type=int, default=4, help="samples per voxelized batch B (default: 4)")
    parser.add_argument("--points", type=int, default=300_000, help="points per sample, full grid (default: 300000)")
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the generated data and caches here")
    parser.add_argument("--skip-sweeps", action="store_true", help="only the voxelization rows")
    args = parser.parse_args(argv)
    device = setup_bench(args)
    config = {
        "sweeps": list(SWEEPS),
        "use_dim": list(USE_DIM),
        "batch": args.batch,
        "points_full": args.points,
        "grids": GRIDS,
        "repeat": args.repeat,
    }
    result = BenchResult("lidar-data", device_name(device), config)
    if not args.skip_sweeps:
        with tempfile.TemporaryDirectory() as tmp:
            result.extra["sweeps"] = bench_sweeps(args.data_dir or Path(tmp), args, result)
        result.notes.append(
            "sweep rows: reference = merging the sweeps from their files (mmdetection3d's LoadPointsFromMultiSweeps), "
            "batched = the float32 sweep cache (equal points, checked); ms per frame in this process (CPU), median "
            "over passes (max: the slowest pass) after a warm-up pass with the files in the page cache; `sweeps` in "
            "the JSON has frames/s, points/s, CPU ms per frame (process time) and bytes per frame (merged float32 "
            "array = what a pickle of the points holds, before the pickle's own overhead). No kernel or sync counts "
            "(–): reading and merging sweeps is host work on any machine."
        )
    bench_voxels(args, device, result)
    result.notes.append(
        "voxel rows: reference = reference_hard_voxelize_batch (mmcv's CPU kernel point by point, a per-sample "
        "loop; timed on the CPU, fewer repeats at full size), its child = per_sample_hard_voxelize (the batched "
        "algorithm called once per sample, as mmdetection3d's data preprocessor loops: the gain of batching "
        "alone); batched = hard_voxelize over the batch in one pass; all three outputs checked equal before "
        "timing. Scatter rows: one indexed write vs mmdetection3d's per-sample canvases."
    )
    emit(result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
