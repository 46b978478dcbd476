"""Data loader throughput (frames/s) and CPU use: FrameDataset + SequenceSampler + collate, 0 vs 2 workers.

Generates two synthetic nuScenes-format datasets into a temporary folder (or ``--data-dir``): the ``tiny``
image size (320×180) and the ``full`` one (1600×900, nuScenes'), indexes them with the devkit, then loads
batches of B samples × 6 cameras (JPEG decode, 2D ground truth, collate into a ``Batch``) with a
``DataLoader`` in the main process (``workers=0``, the baseline) and with 2 worker processes. Each variant
runs one untimed warm-up pass, then ``--repeat`` timed passes over the sampler's epoch; the process tree's
CPU use is sampled with ``ResourceMonitor``. Rows give milliseconds per frame (median over passes).

A second table (``--backends``, on by default) puts the loader *backends* side by side with StreamPETR's camera
augmentation on (the sets and recipes of ``bench augment``, 8 scenes × 4 frames): the PyTorch DataLoader with
the augmentation in its workers (``data.augment_on=worker``), with the augmentation on the device after the copy
(``augment_on=device``), and NVIDIA DALI (``data.loader=dali``) when it is installed — ms and CPU seconds of the
process tree per frame, ``--batch`` samples a batch, 2 workers (DALI: 2 source processes and 2 threads).

Run: ``drivetrain bench data [--repeat N] [--batch B] [--no-backends] [--save]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import torch

from drivetrain.data import FrameDataset, SequenceSampler, collate
from drivetrain.data.index import build_index, save_index
from drivetrain.data.synth import PRESETS, generate
from drivetrain.profile import BenchResult, ResourceMonitor, Row, add_bench_arguments, device_name, emit, setup_bench

DESCRIPTION = __doc__.splitlines()[0]
WORKERS = (0, 2)


def make_dataset(folder: Path, size: str, seed: int) -> Path:
    """Generate (if absent) and index one synthetic dataset; return its index path."""
    tiny = PRESETS["tiny"]
    if size == "tiny":
        config = tiny.with_overrides(seed=seed)
    else:  # nuScenes image size; fewer frames and a light lidar keep generation to seconds
        config = tiny.with_overrides(
            scenes=tiny.scenes[:2], samples_per_scene=6, image_width=1600, image_height=900, focal=1266.0, seed=seed
        )
    root = folder / f"synth-{size}"
    index = root / "drivetrain_index.npz"
    if not index.exists():
        generate(root, config, progress=False)
        save_index(build_index(root, progress=False), index)
    return index


def measure(index: Path, workers: int, batch: int, repeat: int) -> tuple[list[float], dict[str, float], int]:
    """ms per frame of each timed pass, resource usage over the timed passes, frames per pass."""
    dataset = FrameDataset(index)
    sampler = SequenceSampler(dataset.scene_lengths(), batch, seed=0)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers, persistent_workers=workers > 0
    )
    frames = 0
    for b in loader:  # warm-up pass (starts the workers)
        frames += b.batch_size
    per_frame = []
    with ResourceMonitor("cpu") as monitor:
        for _ in range(repeat):
            start, n = time.perf_counter(), 0
            for b in loader:
                n += b.batch_size
            per_frame.append((time.perf_counter() - start) * 1e3 / n)
    assert monitor.result is not None
    usage = monitor.result.as_dict()
    usage["frames_per_s"] = 1e3 / statistics.median(per_frame)
    return per_frame, usage, frames


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=3, warmup=1)
    parser.add_argument("--batch", type=int, default=2, help="samples per batch B (default: 2)")
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the generated datasets here (default: temp)")
    parser.add_argument("--backends", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the loader backends with the camera augmentation (default: on)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.device != "cpu":
        raise SystemExit("bench data: the loader runs on the CPU; use --device cpu")
    setup_bench(args)  # the allocator setting; forked loader workers inherit it
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.data_dir or Path(tmp)
        config = {"batch": args.batch, "cameras": 6, "repeat": args.repeat, "workers": list(WORKERS)}
        result = BenchResult("data", device_name("cpu"), config)
        throughput: dict[str, dict[str, float]] = {}
        for size, label in (("tiny", "tiny 320×180"), ("full", "full 1600×900")):
            index = make_dataset(folder, size, args.seed)
            medians, slowest = {}, {}
            for workers in WORKERS:
                per_frame, usage, frames = measure(index, workers, args.batch, args.repeat)
                medians[f"workers={workers}"] = statistics.median(per_frame)
                slowest[f"workers={workers}"] = max(per_frame)
                throughput[f"{label}, workers={workers}"] = {
                    "frames_per_s": round(usage["frames_per_s"], 2),
                    "cpu_cores": round(usage["cpu_cores"], 2),
                    "peak_rss_mb": round(usage["peak_rss_mb"], 1),
                    "frames_per_pass": frames,
                }
            result.add(
                Row(
                    name=f"{label}: ms per frame (6 images)",
                    reference_ms=medians["workers=0"],
                    batched_ms=medians["workers=2"],
                    variants=medians,
                    baseline="workers=0",
                    reference_max_ms=slowest["workers=0"],
                    batched_max_ms=slowest["workers=2"],
                    variants_max=slowest,
                )
            )
        if args.backends:
            throughput.update(backend_rows(result, folder, args))
    result.extra["throughput"] = throughput
    result.notes.append(
        "reference = DataLoader without workers (decode and collate in the main process), batched = 2 worker "
        "processes; ms per frame, median over timed passes (max: the slowest pass) after one warm-up pass; "
        "cpu_cores = CPU time of the process tree / wall time over the timed passes. No kernel or sync counts (–): "
        "decoding and collating is host work, in worker processes."
    )
    emit(result, args)
    return 0


BACKENDS = {"worker": "torch, augment in workers", "device": "torch, augment on device", "dali": "DALI"}


def backend_rows(result: BenchResult, folder: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The backends table (see the module docstring): one row per image size, a variant per backend."""
    path = Path(__file__).with_name("augment.py")
    spec = importlib.util.spec_from_file_location("drivetrain_bench_augment", path)
    augment = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(augment)  # type: ignore[union-attr]
    usage: dict[str, dict[str, float]] = {}
    for size in ("tiny", "full"):
        data = augment.dataset_args(folder, size, args.seed)
        measured = {
            BACKENDS[where]: augment.pipeline(
                data, size, where, args.batch, 2, torch.device("cpu"), 1, max(args.repeat, 2) * 2
            )
            for where in augment.PIPELINES
        }
        width, height = augment.SIZES[size][0]
        name = f"{size} {width}×{height}, augmented: ms per frame by backend"
        per_frame = {k: v["ms_per_frame"] for k, v in measured.items()}
        costs = {k: v["cost"] for k, v in measured.items()}  # kernels and syncs per frame, main process
        baseline = BACKENDS["worker"]
        fastest = BACKENDS["dali"] if BACKENDS["dali"] in per_frame else BACKENDS["device"]
        result.add(Row(name, per_frame[baseline], per_frame[fastest], variants=per_frame, baseline=baseline,
                       reference_cost=costs[baseline], batched_cost=costs[fastest], variant_costs=costs))  # fmt: skip
        for backend, m in measured.items():
            usage[f"{size}, {backend}"] = {
                "frames_per_s": round(1e3 / m["ms_per_frame"], 2),
                "cpu_s_per_frame": round(m["cpu_s_per_frame"], 4),
            }
    result.notes.append(
        "backend rows: reference = the PyTorch DataLoader with the augmentation in its 2 workers, batched = DALI "
        "(or the device augmentation without DALI); every backend in the variants columns; CPU seconds per frame "
        "in 'throughput'. No max: each is a throughput over the whole timed window, a one-off inside it counted in "
        "full."
    )
    return usage


if __name__ == "__main__":
    raise SystemExit(main())
