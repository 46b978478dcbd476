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

Run: ``python benchmarks/streampetr_static.py --root data/synth-tiny [--repeat 10] [--save results/x.json]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import yaml

from drivetrain.data.sources import frames
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.streampetr import StreamPETR
from drivetrain.models.streampetr.static import pad_targets

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(ROOT / "data" / "synth-tiny"))
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=None, help="replace the config's decoder dropout (0.1)")
    parser.add_argument("--save", default=None)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    args = yaml.safe_load((ROOT / "configs" / "streampetr_tiny.yaml").read_text())["model"]["args"]
    if opts.dropout is not None:
        args["dropout"] = opts.dropout
    ds = frames(str(Path(opts.root) / "drivetrain_index.npz"), split="mini_train")
    batches = [ds.collate([ds[2 * i], ds[2 * i + 1]]) for i in range(opts.batches)]
    report: dict = {"device": f"cpu ({platform.processor() or platform.machine()}), {opts.threads} thread(s)"}
    report["dropout"] = args["dropout"]
    report["G"] = [b.gt_boxes.max_size for b in batches]
    report["G_2d"] = [b.gt_boxes_2d.max_size for b in batches]

    def model_of(static: bool) -> StreamPETR:
        torch.manual_seed(0)
        return StreamPETR(**{**args, "static_targets": static}).train()

    def timed(model: StreamPETR, step, feed: list, repeat: int | None = None) -> tuple[list[float], list[float]]:
        forward, backward = [], []
        for i in range(repeat or opts.repeat):
            batch = feed[i % len(feed)]
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            loss = step(batch)
            middle = time.perf_counter()
            loss.backward()
            forward.append(middle - start)
            backward.append(time.perf_counter() - middle)
        return forward, backward

    results = {}
    for name in ("eager", "static_eager", "static_compiled"):
        model = model_of(name != "eager")
        feed = [pad_targets(b, model.args.max_targets) for b in batches] if name != "eager" else batches

        def step(b, model=model):
            return weighted_total(model.loss(model(b), b), model.loss_weights)

        with torch.no_grad():
            model(feed[0])  # the memory bank past its first (empty) frame
        compile_seconds = []
        if name == "static_compiled":
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
        for _ in range(2):  # warm-up: every batch twice (its second call finds its ragged masks cached: a guard)
            timed(model, step, feed, len(feed))
        forward, backward = timed(model, step, feed)
        times = [f + b for f, b in zip(forward, backward, strict=True)]
        results[name] = {
            "median_s": round(statistics.median(times), 4),
            "min_s": round(min(times), 4),
            "forward_loss_median_s": round(statistics.median(forward), 4),
            "backward_median_s": round(statistics.median(backward), 4),
        }
        if compile_seconds:
            results[name]["compile_s"] = compile_seconds
        print(name, results[name], flush=True)
    report["steps"] = results
    report["speedup_compiled_vs_eager"] = round(
        results["eager"]["median_s"] / results["static_compiled"]["median_s"], 3
    )
    print(json.dumps(report, indent=1))
    if opts.save:
        Path(opts.save).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
