"""Run under ``torchrun --nproc_per_node 2``: the compiled step (``speed.compile_step``) under DDP, for
test_engine_step_graph_ddp.py.

Usage: ``torchrun ... tests/engine_step_graph_worker.py OUT_ROOT INDEX [SCENARIO ...]``. Each scenario trains
PointPillars tiny on the frame index INDEX (2 gloo ranks on the CPU, 2 micro-batches a step: the first under
``no_sync``) in the same process group and writes its run directory under OUT_ROOT, and each rank's final parameters
to ``OUT_ROOT/params-<scenario>-rank<r>.pt``. Scenarios: ``compiled`` (4 steps), ``eager`` (its first step without
the compiled step), ``resumed`` (the compiled run stopped after 2 steps and resumed to 4), ``static``
(``distributed.static_graph``), ``unused`` (``distributed.find_unused_parameters``), ``windowed`` (the windowed
assignment); default the first three.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from drivetrain.engine import Trainer, load_config
from helpers.engine import ON_CPU, ROOT

CONFIG = ROOT / "configs" / "pointpillars_tiny.yaml"
# The dense assignment at one ground-truth bucket: one graph to compile (as test_engine_step_graph.py).
STEP_GRAPH = ["speed.compile_step=true", "speed.compile_step_backend=aot_eager"]
SCENARIOS = {
    "compiled": STEP_GRAPH,
    "eager": ["train.steps=1"],  # the first step and a checkpoint: what the compiled runs are compared with
    "resumed": STEP_GRAPH,
    "static": [*STEP_GRAPH, "distributed.static_graph=true"],
    "unused": [*STEP_GRAPH, "distributed.find_unused_parameters=true"],
    # the windowed assignment (PointPillars' default): the pairs of the ground-truth bucket and the overflow bucket (2)
    "windowed": [*STEP_GRAPH, "model.args.window=true"],
}


def step_overrides(out: Path, index: str, *extra: str) -> list[str]:
    """PointPillars tiny on the test set's frames under DDP on the CPU: one frame per rank and micro-batch."""
    return [
        f"run.out_dir={out}", "run.threads=1", "run.deterministic=true", "log.progress=false",
        "log.tensorboard=false", "log.every=1", "data.name=frames",
        f"data.args={{index: {index}, split: mini_train, load_images: false, load_points: true, num_sweeps: 1, "
        "use_dim: [0, 1, 2, 4]}", "data.batch_size=1", "train.accumulation=2", "model.args.max_voxels=2000",
        "model.args.step_voxels=2000",
        "model.args.window=false", "model.args.max_targets=64", "train.steps=4", "checkpoint.every=2",
        "eval.every=0", "eval.at_start=false", "distributed.strategy=ddp", *ON_CPU, *extra,
    ]  # fmt: skip


def save_params(trainer: Trainer, path: Path) -> None:
    """This rank's parameters after training, by name (the underlying model's names)."""
    torch.save({name: p.detach().clone() for name, p in trainer.model.named_parameters()}, path)


def main(root: Path, index: str, scenarios: list[str]) -> None:
    for name in scenarios:
        argv = step_overrides(root / name, index, *SCENARIOS[name])
        if name == "resumed":
            Trainer(load_config(CONFIG, [*argv, "train.steps=2"])).fit()
            trainer = Trainer(load_config(CONFIG, argv), resume="auto")
            assert trainer.state.iteration == 2, trainer.state
        else:
            trainer = Trainer(load_config(CONFIG, argv))
        trainer.fit()
        save_params(trainer, root / f"params-{name}-rank{trainer.ctx.rank}.pt")
    trainer.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:] or ["compiled", "eager", "resumed"])
