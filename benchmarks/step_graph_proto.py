"""The whole training step in one graph, measured against the eager step and the network-only compile (issue 46).

One process, the same four batches of the tiny synthetic set, the modes interleaved round by round (so that a
loaded machine slows them alike): ``eager`` (the model's forward + loss), ``netc`` (``speed.compile=['']``: the
model's forward compiled), ``static_eager`` (:mod:`drivetrain.models.pointpillars.static`, padded and bucketed,
eager) and ``static_compiled`` (the same under ``torch.compile(fullgraph=True)``, backward by AOTAutograd), both
with the dense assignment; ``window_eager`` and ``window_compiled`` the same with the static windowed assignment
(``--pairs`` slots per window) and the loss on its pairs; each
step is forward + loss, backward, clipping and AdamW, split into those three parts. Every mode is warmed on the
four batches first (its compile seconds); graphs compiled during the timed rounds are counted.

Run: ``OMP_NUM_THREADS=1 python benchmarks/step_graph_proto.py --config configs/pointpillars_tiny.yaml
--shape 16832,2624,21504,64 [--rounds 16] [--modes eager,netc,static_eager,static_compiled] [--json FILE]``
(``--shape``: ``P_b,V_b,R_b,G_b``, one bucket that holds all four batches).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from drivetrain.data.collate import collate
from drivetrain.engine.build import build_dataset, build_model, build_optimizer
from drivetrain.engine.config import load_config
from drivetrain.models.pointpillars.static import Buckets, StaticPillarStep, StaticShapes
from drivetrain.profile.allocator import retain_freed_memory


def _total(model: torch.nn.Module, terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """The weighted loss of the model's terms (its recipe's weights)."""
    return sum(model.criterion.weights[name] * value for name, value in terms.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--shape", required=True, help="P_b,V_b,R_b,G_b")
    parser.add_argument("--pairs", type=int, default=0, help="pair slots per window (the window modes)")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--modes", default="eager,netc,static_eager,static_compiled")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    retain_freed_memory()
    dense = StaticShapes(*[int(v) for v in args.shape.split(",")])
    windowed = StaticShapes(*[int(v) for v in args.shape.split(",")], args.pairs)
    modes = args.modes.split(",")
    cfg = load_config(args.config, args.overrides)
    torch.manual_seed(cfg.run.seed)
    dataset = build_dataset(cfg.data, generate=True)
    base = build_model(cfg.model).train()
    batches = [collate([dataset[2 * i], dataset[2 * i + 1]]) for i in range(4)]
    runs = {}
    for mode in modes:
        model = copy.deepcopy(base)
        if mode == "netc":
            model.forward = torch.compile(model.forward)
        step = None
        if mode.startswith(("static", "window")):
            options = {} if mode.endswith("compiled") else None
            buckets = Buckets.for_grid(model.grid, 1 << 15)
            step = StaticPillarStep(model, buckets, options, windowed=mode.startswith("window"))
            print(mode, "buckets of the batches:", [step.shapes(b) for b in batches], flush=True)
        runs[mode] = (model, build_optimizer(model, cfg.optim), step)

    def one(mode: str, batch) -> tuple[float, float, float]:
        model, opt, step = runs[mode]
        t0 = time.perf_counter()
        if step is None:
            loss = _total(model, model.loss(model(batch), batch))
        else:
            loss = _total(model, step(batch, windowed if step.windowed else dense))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3

    warm = {}
    for mode in modes:
        t0 = time.perf_counter()
        for batch in batches:
            one(mode, batch)
        warm[mode] = round(time.perf_counter() - t0, 1)
        print(f"warm-up {mode}: {warm[mode]} s", flush=True)
    graphs = counters["stats"]["unique_graphs"]
    parts = {m: [] for m in modes}
    for i in range(args.rounds):
        for mode in modes:
            parts[mode].append(one(mode, batches[i % len(batches)]))

    def med(rows, k=None):
        return round(statistics.median(sum(r) if k is None else r[k] for r in rows), 1)

    result = {
        "config": args.config,
        "shape": vars(windowed),
        "rounds": args.rounds,
        "device": f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s)",
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
        "warmup_s": warm,
        "step_ms": {m: med(r) for m, r in parts.items()},
        "forward_loss_ms": {m: med(r, 0) for m, r in parts.items()},
        "backward_ms": {m: med(r, 1) for m, r in parts.items()},
        "optimizer_ms": {m: med(r, 2) for m, r in parts.items()},
        "graphs_compiled_in_timed_rounds": counters["stats"]["unique_graphs"] - graphs,
    }
    print(json.dumps(result, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
