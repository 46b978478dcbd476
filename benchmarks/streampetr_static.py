"""StreamPETR tiny's training step (forward with targets, both losses, backward; no optimizer step) three ways on the
same batches: the eager batched path, the static path (``model.args.static_targets``) eager, and the static path
compiled as one graph (``torch.compile(fullgraph=True)``, inductor; batches padded to their buckets before the graph).
Each is split into forward with loss and backward (medians of each apart).

The batches are ``--batches`` consecutive pairs of ``configs/streampetr_tiny.yaml``'s synthetic set (``--root``),
cycled; every bucket they reach is compiled before timing (compile seconds per graph printed), and the memory bank is
warmed by one eager step first so that the compiled step never meets the empty-memory branch, and every batch runs
twice before timing (the batches are reused: the second call finds the ragged masks cached by the first, which dynamo
guards; a trainer's fresh batch never has them). Medians over
``--repeat`` steps, one thread by default (``--threads``).

Run: ``drivetrain bench streampetr_static [--root data/synth-tiny] [--repeat 10] [--dropout 0] [--save]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml

from drivetrain.data.sources import frames
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.streampetr import StreamPETR
from drivetrain.models.streampetr.static import pad_targets
from drivetrain.profile import BenchResult, Row, add_bench_arguments, device_name, emit, setup_bench

ROOT = Path(__file__).resolve().parents[1]
EAGER, STATIC, COMPILED = "eager", "static eager", "static compiled"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=10, warmup=2)
    parser.add_argument("--root", default=str(ROOT / "data" / "synth-tiny"), help="synthetic set (data/synth-tiny)")
    parser.add_argument("--batches", type=int, default=4, help="consecutive batch pairs, cycled (default: 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--dropout", type=float, default=None, help="replace the config's decoder dropout (0.1)")
    opts = parser.parse_args(argv)
    device = setup_bench(opts)
    if device.type != "cpu":
        raise SystemExit("--device: this benchmark times the static step on the CPU; on CUDA use bench train --compare")
    torch.manual_seed(opts.seed)
    torch.set_num_threads(opts.threads)
    args = yaml.safe_load((ROOT / "configs" / "streampetr_tiny.yaml").read_text())["model"]["args"]
    if opts.dropout is not None:
        args["dropout"] = opts.dropout
    ds = frames(str(Path(opts.root) / "drivetrain_index.npz"), split="mini_train")
    batches = [ds.collate([ds[2 * i], ds[2 * i + 1]]) for i in range(opts.batches)]

    def model_of(static: bool) -> StreamPETR:
        torch.manual_seed(opts.seed)
        return StreamPETR(**{**args, "static_targets": static}).train()

    def timed(model: StreamPETR, step, feed: list, repeat: int) -> tuple[list[float], list[float]]:
        forward, backward = [], []
        for i in range(repeat):
            batch = feed[i % len(feed)]
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            loss = step(batch)
            middle = time.perf_counter()
            loss.backward()
            forward.append(1e3 * (middle - start))
            backward.append(1e3 * (time.perf_counter() - middle))
        return forward, backward

    samples: dict[str, tuple[list[float], list[float]]] = {}
    compile_seconds: list[float] = []
    for name in (EAGER, STATIC, COMPILED):
        model = model_of(name != EAGER)
        feed = [pad_targets(b, model.args.max_targets) for b in batches] if name != EAGER else batches

        def step(b, model=model):
            return weighted_total(model.loss(model(b), b), model.loss_weights)

        with torch.no_grad():
            model(feed[0])  # the memory bank past its first (empty) frame
        if name == COMPILED:
            torch._dynamo.reset()
            step = torch.compile(step, fullgraph=True)
            seen = set()
            for b in feed:  # every bucket compiled before timing
                shape = (b.gt_boxes.max_size, b.gt_boxes_2d.max_size)
                if shape in seen:
                    continue
                seen.add(shape)
                start = time.perf_counter()
                step(b).backward()
                compile_seconds.append(round(time.perf_counter() - start, 1))
                print(f"compiled bucket {shape}: {compile_seconds[-1]} s", flush=True)
        for _ in range(opts.warmup):  # every batch (its second call finds its ragged masks cached: a guard)
            timed(model, step, feed, len(feed))
        samples[name] = timed(model, step, feed, opts.repeat)
    totals = {name: [f + b for f, b in zip(*pair, strict=True)] for name, pair in samples.items()}
    config = {"config": "configs/streampetr_tiny.yaml", "dropout": args["dropout"], "batches": opts.batches,
              "threads": opts.threads, "repeat": opts.repeat, "warmup": opts.warmup, "seed": opts.seed,
              "G": [b.gt_boxes.max_size for b in batches],
              "G_2d": [b.gt_boxes_2d.max_size for b in batches]}  # fmt: skip
    result = BenchResult("streampetr_static", device_name(device), config)
    for part, index in (("step (forward + loss + backward)", None), ("forward + loss", 0), ("backward", 1)):
        pick = (lambda name: totals[name]) if index is None else (lambda name, i=index: samples[name][i])
        result.add(Row.from_samples(part, pick(EAGER), pick(COMPILED), baseline=EAGER,
                                    variants={n: statistics.median(pick(n)) for n in (EAGER, STATIC, COMPILED)},
                                    variants_max={n: max(pick(n)) for n in (EAGER, STATIC, COMPILED)}))  # fmt: skip
    result.extra["compile_s"] = compile_seconds
    result.notes.append(
        f"reference = {EAGER} (the batched path), batched = {COMPILED} (model.args.static_targets, padded before the "
        f"graph, torch.compile fullgraph, inductor); {STATIC}: the padded step without compiling. No optimizer step."
    )
    emit(result, opts, chart=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
