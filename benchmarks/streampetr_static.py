"""StreamPETR tiny's training step (forward with targets, both losses, backward; no optimizer step) several ways on the
same batches, interleaved step by step: the eager batched path, the static path (``model.args.static_targets``)
eager, and the compiled step the trainer runs with ``speed.compile_step`` (``model.step_loss`` on
``model.step_inputs``: the batch padded to its bucket, the memory bank passed in and written back in place;
``torch.compile(fullgraph=True, dynamic=False)``, inductor with the options the trainer compiles it with on a CPU,
``engine.build.step_compile_options``: ``fallback_random``, the graph's dropout and denoising noise drawn by torch's
eager generator; ``cpp_wrapper``; and the model's own, layout optimisation off); with
``--inductor-random`` also that step with inductor's own generated random numbers. Each is split into forward with
loss and backward (medians of each apart).

The variants run round-robin, one step each per round, so that a shared machine's load falls on all of them alike (a
sequential A-then-B comparison on a CPU shared with other jobs measures the load as much as the step). The batches
are ``--batches`` consecutive pairs of ``configs/streampetr_tiny.yaml``'s synthetic set (``--root``), cycled; every
bucket of the compiled step (``--step-targets``, default the config's ``model.args.step_targets``: 32, 40, 48, 64;
the set's frames hold 21–44 boxes) is compiled before timing (compile seconds per variant printed). Medians over
``--repeat`` rounds, one thread by default (``--threads``).

With ``--inductor-layout`` also that step with inductor's default layout optimisation (channels-last convolutions),
which the model asks to turn off on a CPU (``StreamPETR.step_compile_options``).

Run: ``drivetrain bench streampetr_static [--root data/synth-tiny] [--repeat 10] [--dropout 0] [--inductor-random]
[--inductor-layout] [--save]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml

from drivetrain.data.sources import frames
from drivetrain.engine.build import step_compile_options
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.streampetr import StreamPETR
from drivetrain.models.streampetr.static import pad_targets
from drivetrain.profile import BenchResult, Row, add_bench_arguments, device_name, emit, setup_bench

ROOT = Path(__file__).resolve().parents[1]
EAGER, STATIC, COMPILED, INDUCTOR_RNG = "eager", "static eager", "static compiled", "static compiled, inductor RNG"
INDUCTOR_LAYOUT = "static compiled, inductor layout"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=10, warmup=2)
    parser.add_argument("--root", default=str(ROOT / "data" / "synth-tiny"), help="synthetic set (data/synth-tiny)")
    parser.add_argument("--batches", type=int, default=4, help="consecutive batch pairs, cycled (default: 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--dropout", type=float, default=None, help="replace the config's decoder dropout (0.1)")
    parser.add_argument("--step-targets", default=None, help="the compiled step's G buckets, e.g. 32,64 (default: "
                        "the config's model.args.step_targets)")  # fmt: skip
    parser.add_argument("--inductor-random", action="store_true", help="also the step with inductor's own RNG")
    parser.add_argument("--inductor-layout", action="store_true", help="also the step with inductor's default "
                        "layout optimisation (the model asks for it off on a CPU)")  # fmt: skip
    opts = parser.parse_args(argv)
    device = setup_bench(opts)
    if device.type != "cpu":
        raise SystemExit("--device: this benchmark times the static step on the CPU; on CUDA use bench train --compare")
    torch.manual_seed(opts.seed)
    torch.set_num_threads(opts.threads)
    config = yaml.safe_load((ROOT / "configs" / "streampetr_tiny.yaml").read_text())["model"]["args"]
    chosen = opts.step_targets.split(",") if opts.step_targets else config.get("step_targets", ())
    args = {**config, "step_targets": tuple(int(g) for g in chosen)}
    if opts.dropout is not None:
        args["dropout"] = opts.dropout
    ds = frames(str(Path(opts.root) / "drivetrain_index.npz"), split="mini_train")
    batches = [ds.collate([ds[2 * i], ds[2 * i + 1]]) for i in range(opts.batches)]
    names = [EAGER, STATIC, COMPILED] + ([INDUCTOR_RNG] if opts.inductor_random else [])
    names += [INDUCTOR_LAYOUT] if opts.inductor_layout else []

    def model_of(static: bool) -> StreamPETR:
        torch.manual_seed(opts.seed)
        return StreamPETR(**{**args, "static_targets": static}).train()

    steps, compile_seconds = {}, {}
    # dynamo keeps 8 graphs of one function by default (then a fullgraph compile fails): every compiled variant here
    # compiles each bucket of the same step_loss
    limit = 2 * len(names) * len(args["step_targets"])
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
    for name in names:
        model = model_of(name != EAGER)
        if name in (EAGER, STATIC):

            def step(b, model=model, pad=name == STATIC):
                b = pad_targets(b, model.args.max_targets) if pad else b
                return weighted_total(model.loss(model(b), b), model.loss_weights)

            with torch.no_grad():
                model(batches[0])  # the memory bank past its first (empty) frame, as the compiled ones below
        else:
            options = {**step_compile_options(model, device), "fallback_random": name != INDUCTOR_RNG}  # as StepGraph
            if name == INDUCTOR_LAYOUT:
                options.pop("layout_optimization", None)  # inductor's default: channels-last convolutions
            fn = torch.compile(model.step_loss, fullgraph=True, dynamic=False, backend="inductor", options=options)

            def step(b, model=model, fn=fn):
                inputs = model.step_inputs(b, model.step_shapes(b), b.batch_size, device)
                return weighted_total(fn(*inputs), model.loss_weights)

            start = time.perf_counter()
            for shapes in model.step_buckets(len(batches[0].sample_tokens)):  # every bucket, as the trainer does
                terms = fn(*model.step_inputs(None, shapes, len(batches[0].sample_tokens), device))
                weighted_total(terms, model.loss_weights).backward()
            compile_seconds[name] = round(time.perf_counter() - start, 1)
            print(f"{name}: {len(model.step_buckets(2))} bucket(s) compiled in {compile_seconds[name]} s", flush=True)
            model.zero_grad(set_to_none=True)
            step(batches[0])  # the memory bank past its first (empty) frame
        steps[name] = (model, step)

    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in names}
    for i in range(opts.warmup * len(batches) + opts.repeat):  # round-robin: one step of each variant per round
        batch = batches[i % len(batches)]
        for name in names:
            model, step = steps[name]
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            loss = step(batch)
            middle = time.perf_counter()
            loss.backward()
            if i >= opts.warmup * len(batches):
                samples[name][0].append(1e3 * (middle - start))
                samples[name][1].append(1e3 * (time.perf_counter() - middle))
    totals = {name: [f + b for f, b in zip(*pair, strict=True)] for name, pair in samples.items()}
    config = {"config": "configs/streampetr_tiny.yaml", "dropout": args["dropout"], "batches": opts.batches,
              "threads": opts.threads, "repeat": opts.repeat, "warmup": opts.warmup, "seed": opts.seed,
              "step_targets": list(args["step_targets"]), "interleaved": True,
              "G": [b.gt_boxes.max_size for b in batches],
              "G_2d": [b.gt_boxes_2d.max_size for b in batches]}  # fmt: skip
    result = BenchResult("streampetr-static", device_name(device), config)
    for part, index in (("step (forward + loss + backward)", None), ("forward + loss", 0), ("backward", 1)):
        pick = (lambda name: totals[name]) if index is None else (lambda name, i=index: samples[name][i])
        result.add(Row.from_samples(part, pick(EAGER), pick(COMPILED), baseline=EAGER,
                                    variants={n: statistics.median(pick(n)) for n in names},
                                    variants_max={n: max(pick(n)) for n in names}))  # fmt: skip
    result.extra["compile_s"] = compile_seconds
    result.notes.append(
        f"reference = {EAGER} (the batched path), batched = {COMPILED} (model.step_loss on model.step_inputs, what "
        f"speed.compile_step runs: torch.compile fullgraph, inductor, step_compile_options: "
        f"{step_compile_options(steps[COMPILED][0], device)}); {STATIC}: the "
        "padded step without compiling"
        + (f"; {INDUCTOR_RNG}: without fallback_random" if opts.inductor_random else "")
        + (f"; {INDUCTOR_LAYOUT}: with inductor's default layout_optimization" if opts.inductor_layout else "")
        + ". Variants interleaved step by step. No optimizer step."
    )
    emit(result, opts, chart=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
