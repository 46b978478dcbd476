"""Camera augmentation: per-sample in the loader workers (the original pipelines) vs the whole batch on the device.

Data: synthetic nuScenes-format sets generated into a temporary folder (or ``--data-dir``): ``tiny`` 320×180
images augmented to 256×96 (configs/streampetr_tiny_aug.yaml's recipe) and ``full`` 1600×900 augmented to
704×256 (StreamPETR's published recipe); 8 scenes × 4 key frames × 6 cameras each, so a batch of 8 has a scene
per slot. Augmentation: resize/crop/flip, the BEV rotation and scale, the invisible-box filter, normalisation.

Two measurements per image size and batch size B (``--batch``, default 1, 4, 8):

1. **pipeline** (no model): batches through drivetrain's loader (``--workers`` processes decode the JPEGs) and
   onto the device, augmented either in the workers (``worker``: ``data.augment_on=worker``, the reference) or
   after the copy on the device (``device``). Timed: ``--repeat`` batches after ``--warmup``, the device
   synchronised at the end; also the CPU time of the whole process tree (main + workers) per frame — the
   figure that says how much CPU a GPU machine needs per frame. With NVIDIA DALI installed also ``dali``
   (``data.loader=dali``: decode and image augmentation in DALI, ``--workers`` source processes and threads).
2. **training** (``--train``; default on CUDA only): the Trainer with StreamPETR (``--encoder`` tiny or
   resnet50 image encoder, frozen so the four variants train the same function) for ``--warmup`` +
   ``--repeat`` steps: ``worker``, ``device`` (inline on the current stream), ``device+stream``
   (``data.prefetch``: batch n+1 copied and augmented on a side stream while batch n trains) and
   ``device+stream+encoder`` (``speed.encoder_overlap``: the frozen encoder for batch n+1 runs there too).
   Frames/s from the median step time of the timed steps (the trainer's own step timer).

On a CPU the "device" is the CPU: the side stream does not exist (``device+stream`` is the ``device`` code path)
and nothing overlaps, so the ratios there measure the batched vs per-sample implementations on the same cores
(and that the loader workers, with 2 cores, compete with the main process). The published figures these aim
at are GPU ones: +72 % training throughput from moving augmentation to the GPU, +90 % on a side stream, +9.6 %
from the frozen-encoder overlap.

Run: ``drivetrain bench augment [--device cpu|cuda] [--batch 1,4,8] [--sizes tiny,full] [--train] [--save]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from drivetrain.data.sources import synthetic
from drivetrain.engine.batches import BatchStream
from drivetrain.engine.config import DataConfig
from drivetrain.engine.stepsplit import step_cost, step_profiler
from drivetrain.models.streampetr.recipe import CAMERA_AUG
from drivetrain.pipeline.augment.camera import CameraAugConfig
from drivetrain.pipeline.augment.stage import Augmentation, AugmentConfig
from drivetrain.pipeline.dali import DaliStream, dali_available
from drivetrain.pipeline.prefetch import DevicePrefetcher
from drivetrain.profile import (
    BenchResult,
    ResourceMonitor,
    Row,
    active,
    add_bench_arguments,
    device_name,
    emit,
    setup_bench,
)
from drivetrain.profile.costmodel import count_call
from drivetrain.profile.timer import synchronize
from drivetrain.safeio.files import remove_path, save_figure

DESCRIPTION = __doc__.splitlines()[0]
ROOT = Path(__file__).resolve().parents[1]
# (W, H) of the source images, the augmentation recipe
SIZES = {
    "tiny": ((320, 180), {"source_size": [320, 180], "final_size": [256, 96], "resize_lim": [0.76, 1.1]}),
    "full": ((1600, 900), {"source_size": [1600, 900], "final_size": [704, 256], "resize_lim": [0.38, 0.55]}),
}
PIPELINES = ["worker", "device", *(["dali"] if dali_available() else [])]
TRAIN_VARIANTS = {
    "worker": ["data.augment_on=worker", "data.prefetch=false", "speed.encoder_overlap=false"],
    "device": ["data.augment_on=device", "data.prefetch=false", "speed.encoder_overlap=false"],
    "device+stream": ["data.augment_on=device", "data.prefetch=true", "speed.encoder_overlap=false"],
    "device+stream+encoder": ["data.augment_on=device", "data.prefetch=true", "speed.encoder_overlap=true"],
    **(
        {"dali": ["data.loader=dali", "data.prefetch=false", "speed.encoder_overlap=false"]} if dali_available() else {}
    ),
}


def dataset_args(folder: Path, size: str, seed: int) -> dict[str, Any]:
    """The ``synthetic`` builder's arguments of one benchmark set (generated on first use)."""
    image_size, _ = SIZES[size]
    args = {
        "root": str(folder / f"synth-aug-{size}"),
        "size": "tiny",
        "image_size": list(image_size),
        "frames_per_scene": 4,
        "seed": seed,
        "split": "mini_train",
    }
    synthetic(generate=True, **args)  # generate and index now, outside every timed region
    return args


def pipeline(
    args: dict[str, Any],
    size: str,
    where: str,
    batch: int,
    workers: int,
    device: torch.device,
    warmup: int,
    repeat: int,
) -> dict[str, float]:
    """ms per frame and CPU core-seconds per frame of the loader + augmentation (no model)."""
    config = CameraAugConfig.from_dict({"image": SIZES[size][1]}, CAMERA_AUG)  # StreamPETR's recipe at this size
    if where == "dali":
        source: Any = DaliStream(
            synthetic(**args), batch, augment=config, device=device, workers=max(workers, 1), threads=max(workers, 1)
        )
        return _closed(source, _timed(source, batch, device, warmup, repeat))
    augment = Augmentation(AugmentConfig(camera=config), seed=0, on=where)
    data = DataConfig(
        batch_size=batch,
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
        pin_memory=device.type == "cuda",
    )
    stream = BatchStream(synthetic(**args), data, seed=0, transform=augment if where == "worker" else None)
    source = DevicePrefetcher(stream, device, transform=augment if where == "device" else None, overlap=False)
    measured = _timed(source, batch, device, warmup, repeat)
    del stream
    return _closed(source, measured)


def _closed(source: Any, measured: dict[str, float]) -> dict[str, float]:
    """Stop ``source``'s workers now, not in a later loader's forked workers; return ``measured``."""
    if callable(getattr(source, "close", None)):
        source.close()
    del source
    gc.collect()
    return measured


def _timed(source: Any, batch: int, device: torch.device, warmup: int, repeat: int) -> dict[str, Any]:
    """Pull ``warmup`` then ``repeat`` timed batches from ``source``; ms and CPU seconds per frame, and the kernels
    and host syncs per frame of one more batch, untimed (the main process only: loader workers are not seen)."""
    for _ in range(warmup):  # starts the workers, fills their queues
        source.next()
    synchronize(device)
    with ResourceMonitor(device) as monitor:
        start = time.perf_counter()
        for _ in range(repeat):
            out, _ = source.next()
        synchronize(device)
        wall = time.perf_counter() - start
    assert monitor.result is not None and out.images.dtype == torch.float32
    frames = repeat * batch
    cost = count_call(source.next).per(batch)
    synchronize(device)
    return {"ms_per_frame": wall * 1e3 / frames, "cpu_s_per_frame": monitor.result.cpu_cores * wall / frames,
            "cost": cost}  # fmt: skip


def training(
    args: dict[str, Any],
    size: str,
    variant: str,
    batch: int,
    workers: int,
    device: torch.device,
    encoder: str,
    warmup: int,
    repeat: int,
    folder: Path,
) -> dict[str, float]:
    """Median step time per frame, data wait, CPU cores of a short frozen-encoder training run."""
    from drivetrain.engine import Trainer, load_config

    out = folder / f"run-{size}-{batch}-{variant}"
    remove_path(out, ignore_errors=True)  # a run of an earlier benchmark in a kept --data-dir (a link: unlinked)
    image = SIZES[size][1]
    overrides = [
        f"run.out_dir={out}",
        "log.progress=false",
        "log.tensorboard=false",
        "log.every=1",
        f"train.steps={warmup + repeat}",
        f"checkpoint.every={warmup + repeat}",
        "checkpoint.keep=1",
        f"train.device={device.type}",
        f"data.batch_size={batch}",
        f"data.num_workers={workers}",
        f"data.persistent_workers={str(workers > 0).lower()}",
        f"data.args={json.dumps(args)}",
        f"data.augment.camera.image={json.dumps(image)}",
        "model.args.freeze_backbone=true",
        f"model.args.backbone={encoder}",
        *TRAIN_VARIANTS[variant],
    ]
    if encoder == "resnet50":
        overrides.append("model.args.backbone_args={}")
    cfg = load_config(ROOT / "configs" / "streampetr_tiny_aug.yaml", overrides)
    trainer = Trainer(cfg)
    # the last warm-up step's kernels and syncs, its data region included: the device variants augment there
    profiler = step_profiler(trainer.device, warmup, data=True)
    try:
        with ResourceMonitor(device) as monitor, active(profiler):
            trainer.fit()
    finally:
        trainer.close()
        del trainer
        gc.collect()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    remove_path(out, ignore_errors=True)
    steps = [r for r in records if "step_time_s" in r][warmup:]
    step = statistics.median(r["step_time_s"] for r in steps)
    slowest = max(r["step_time_s"] for r in steps)
    wait = statistics.median(r["data_wait_s"] for r in steps)
    assert monitor.result is not None
    cost = step_cost(profiler)
    return {"ms_per_frame": step * 1e3 / batch, "max_ms_per_frame": slowest * 1e3 / batch, "data_wait_ms": wait * 1e3,
            "cpu_cores": monitor.result.cpu_cores, "cost": cost.per(batch) if cost is not None else None}  # fmt: skip


def variant_row(name: str, measured: dict[str, dict[str, Any]], batched: str) -> Row:
    """A row of every variant's ms per frame (and kernels and syncs per frame, and the slowest step's ms per frame
    where measured per step): reference = ``worker``, batched = ``batched``."""
    per_frame = {k: v["ms_per_frame"] for k, v in measured.items()}
    slowest = {k: v.get("max_ms_per_frame") for k, v in measured.items()}
    costs = {k: v.get("cost") for k, v in measured.items()}
    return Row(name, per_frame["worker"], per_frame[batched], variants=per_frame, baseline="worker",
               reference_cost=costs["worker"], batched_cost=costs[batched], variant_costs=costs,
               reference_max_ms=slowest["worker"], batched_max_ms=slowest[batched],
               variants_max=slowest if any(v is not None for v in slowest.values()) else None)  # fmt: skip


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=6, warmup=2)
    parser.add_argument("--batch", default="1,4,8", help="batch sizes B, comma-separated (default: 1,4,8)")
    parser.add_argument("--sizes", default="tiny,full", help="image sizes: tiny, full (default: both)")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="loader processes")
    parser.add_argument(
        "--train",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time training steps (default: on CUDA only)",
    )
    parser.add_argument("--train-sizes", default=None, help="image sizes of the training runs (default: --sizes)")
    parser.add_argument(
        "--encoder",
        choices=["tiny", "resnet50"],
        default=None,
        help="the frozen image encoder of the training runs (default: resnet50 on CUDA, else tiny)",
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the generated datasets here (default: temp)")
    args = parser.parse_args(argv)
    device = setup_bench(args)
    batches = [int(b) for b in args.batch.split(",")]
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = sorted(set(sizes) - set(SIZES))
    if unknown or not batches or min(batches) < 1 or max(batches) > 8:
        raise SystemExit(f"bench augment: --sizes from {sorted(SIZES)}, --batch in 1..8 (got {sizes}, {batches})")
    train = device.type == "cuda" if args.train is None else args.train
    train_sizes = sizes if args.train_sizes is None else [s for s in args.train_sizes.split(",") if s]
    encoder = args.encoder or ("resnet50" if device.type == "cuda" else "tiny")
    config = {
        "batch": batches,
        "sizes": sizes,
        "workers": args.workers,
        "cameras": 6,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "train": train,
        "train_sizes": train_sizes if train else [],
        "encoder": encoder,
    }
    result = BenchResult("augment", device_name(device), config)
    cpu: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.data_dir or Path(tmp)
        for size in sizes:
            data = dataset_args(folder, size, args.seed)
            label = f"{size} {SIZES[size][0][0]}×{SIZES[size][0][1]}"
            for batch in batches:
                measured = {
                    where: pipeline(data, size, where, batch, args.workers, device, args.warmup, args.repeat)
                    for where in PIPELINES
                }
                name = f"{label}, B={batch}: pipeline ms/frame"
                result.add(variant_row(name, measured, "device"))
                cpu[name] = {f"{k} cpu_s_per_frame": round(v["cpu_s_per_frame"], 5) for k, v in measured.items()}
                print(
                    f"{name}: "
                    + ", ".join(
                        f"{k} {v['ms_per_frame']:.2f} ms, {v['cpu_s_per_frame']:.4f} CPU s" for k, v in measured.items()
                    ),
                    flush=True,
                )
                if not train or size not in train_sizes:
                    continue
                runs = {
                    v: training(data, size, v, batch, args.workers, device, encoder, args.warmup, args.repeat, folder)
                    for v in TRAIN_VARIANTS
                }
                tname = f"{label}, B={batch}: training ms/frame ({encoder} encoder, frozen)"
                result.add(variant_row(tname, runs, "device+stream+encoder"))
                cpu[tname] = {
                    f"{k} {m}": round(val, 3)
                    for k, v in runs.items()
                    for m, val in v.items()
                    if m not in ("ms_per_frame", "max_ms_per_frame", "cost")
                }
                print(
                    f"{tname}: "
                    + ", ".join(
                        f"{k} {v['ms_per_frame']:.1f} ms (wait {v['data_wait_ms']:.1f} ms)" for k, v in runs.items()
                    ),
                    flush=True,
                )
    result.extra["cpu"] = cpu
    result.notes.append(
        "pipeline rows: reference = augmentation per sample in the loader workers (PIL, NumPy: the originals), "
        "batched = the whole batch on the device after the copy; ms per frame over the timed batches, device "
        "synchronised at the end; 'cpu' gives the CPU seconds of the whole process tree (main + workers) per frame. "
        "No max: a pipeline row is a throughput over the whole timed window, which counts a one-off in full (a "
        "prefetching loader's per-batch times measure its queue, not a cold start)."
    )
    if train:
        result.notes.append(
            "training rows: reference = worker augmentation, batched = device augmentation on the side stream with "
            "the frozen encoder run ahead; ms per frame = median trainer step time / B over the timed steps (max: "
            "the slowest timed step / B); "
            "'cpu' gives the median data wait and the process tree's CPU cores over the whole run."
        )
    if device.type == "cpu":
        result.notes.append(
            "CPU: the device is the CPU, so there is no side stream and nothing to overlap; the loader workers share "
            "the machine's cores with the main process."
        )
    written = emit(result, args, chart=False)
    for path in written:
        if path.suffix == ".json":
            args.png = args.png or path.with_suffix(".png")
    if args.png is not None and write_png(result, args.png):
        print(f"wrote {args.png}")
    return 0


def write_png(result: BenchResult, path: Path) -> bool:
    """ms per frame of every variant, one group of bars per row; False (with a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: matplotlib is not installed; no chart written to {path} (pip install 'drivetrain[viz]')")
        return False
    rows = [r for r in result.rows if r.variants]
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * sum(len(r.variants or {}) for r in rows)))
    labels, values, colours = [], [], []
    palette = {
        "worker": "#ff7f0e",
        "device": "#1f77b4",
        "device+stream": "#2ca02c",
        "device+stream+encoder": "#9467bd",
        "dali": "#76b900",
    }
    for row in reversed(rows):
        for name, value in reversed(list((row.variants or {}).items())):
            labels.append(f"{row.name.split(':')[0]} {row.name.split(':')[1].split()[0]}: {name}")
            values.append(value)
            colours.append(palette.get(name, "gray"))
    ax.barh(range(len(values)), values, color=colours)
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.set_xlabel("ms per frame (median; lower is faster)")
    ax.set_xscale("log")
    fig.suptitle(f"camera augmentation: worker vs device on {result.device}", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=110)  # a link at the name is replaced, its target never written
    plt.close(fig)
    return True


if __name__ == "__main__":
    raise SystemExit(main())
