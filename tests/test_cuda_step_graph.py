"""``speed.compile_step_mode: reduce-overhead`` on CUDA (:mod:`drivetrain.engine.build`): PointPillars' compiled step
replayed as CUDA graphs (inductor's cudagraph trees) equals the eager step over batches that cross buckets, records
each bucket's graphs once, reuses one memory pool, and resumes exactly (2 + 2 steps = 4); StreamPETR's step, whose
memory bank the graph writes in place, is replayed too.

The runs use PointPillars tiny with the dense assignment (``window=false``) and one voxel bucket at ``max_voxels``
(``step_voxels=8000``, no voxel ladder): ``max_targets=128`` gives two buckets,
ground truth 64 and 128. The synthetic batches all fall in the first, so the spy below widens every other batch's
padded ground truth past 64 columns (the padding is not ground truth: its sizes are unchanged, the loss is the same)
and the steps alternate between the two buckets. Inductor compiles each bucket (tens of seconds on a GPU): the steps
run once, shared by the tests of one module-scoped fixture; marked ``heavy`` with the other trainer runs on CUDA."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
import torch

from drivetrain.engine.config import load_config
from drivetrain.engine.precision import fp32_outputs
from drivetrain.engine.trainer import Trainer
from drivetrain.ragged.padded import RaggedBatch
from helpers.engine import final_state, losses

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.compiles,
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "pointpillars_tiny.yaml"
QUIET = ["run.threads=1", "log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.at_start=false"]
GRAPHED = ["speed.compile_step=true", "speed.compile_step_backend=inductor", "speed.compile_step_mode=reduce-overhead",
           "model.args.window=false", "model.args.step_voxels=8000", "train.device=cuda",
           "run.deterministic=true"]  # fmt: skip
STEPS = 6  # buckets 64, 128, 64, 128, 64, 128: each recorded at its first step, replayed at the next two


def _argv(out: Path, synth_root: Path, *extra: str) -> list[str]:
    data = {"index": str(synth_root / "drivetrain_index.npz"), "split": "mini_train", "load_images": False,
            "load_points": True, "num_sweeps": 1, "use_dim": [0, 1, 2, 4]}  # fmt: skip
    return [f"run.out_dir={out}", *QUIET, "data.name=frames", f"data.args={json.dumps(data)}", "data.batch_size=2",
            *extra]  # fmt: skip


def _wider(ragged: RaggedBatch, width: int) -> RaggedBatch:
    """``ragged`` padded to ``width`` along its ragged dim (dim 1), sizes unchanged."""
    tensor = ragged.tensor
    pad = tensor.new_zeros((tensor.shape[0], width - tensor.shape[1], *tensor.shape[2:]))
    return RaggedBatch(torch.cat([tensor, pad], 1), ragged.sizes)


def _recorded_graphs() -> int:
    """CUDA graphs inductor's cudagraph trees recorded on this device so far (the nodes of its trees)."""
    from torch._inductor.cudagraph_trees import get_manager

    manager = get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    if manager is None:
        return 0
    nodes, count = list(manager.get_roots()), 0
    while nodes:
        node = nodes.pop()
        count += 1
        nodes.extend(child for children in node.children.values() for child in children)
    return count


def _graph_pools() -> dict[tuple[int, int], int]:
    """Bytes reserved per private memory pool (the CUDA graphs'; the default pool is ``(0, 0)``)."""
    pools: dict[tuple[int, int], int] = {}
    for segment in torch.cuda.memory_snapshot():
        pool = tuple(segment.get("segment_pool_id", (0, 0)))
        if pool != (0, 0):
            pools[pool] = pools.get(pool, 0) + segment["total_size"]
    return pools


class _Spy:
    """The trainer's compiled step, watched: per step its bucket, the eager terms of the same batch at the same
    weights (buffers and RNG put back after), the graphed terms, the CUDA graphs recorded and the pools' bytes at its
    start."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer, self.graph = trainer, trainer.step_graph
        self.steps: list[dict] = []

    def __getattr__(self, name: str):
        return getattr(self.graph, name)

    def __call__(self, batch, call=None, loaded=None):  # the trainer's call; ``loaded`` unused: see the fixture
        if len(self.steps) % 2:  # every other batch in the ground-truth bucket 128
            batch = dataclasses.replace(
                batch, gt_boxes=_wider(batch.gt_boxes, 65), gt_labels=_wider(batch.gt_labels, 65)
            )
        model = self.trainer.model
        record = {"bucket": model.step_shapes(batch), "recorded": _recorded_graphs(), "pools": _graph_pools()}
        buffers = [buffer.detach().clone() for buffer in model.buffers()]
        rng = torch.cuda.get_rng_state()
        with torch.no_grad():
            eager = model.loss(fp32_outputs(model(batch)), batch)
            record["eager"] = {name: value.detach().clone() for name, value in eager.items()}
            for buffer, saved in zip(model.buffers(), buffers, strict=True):
                buffer.copy_(saved)
        torch.cuda.set_rng_state(rng)
        terms = self.graph(batch, call)
        record["graphed"] = {name: value.detach().clone() for name, value in terms.items()}
        self.steps.append(record)
        return terms


@pytest.fixture(scope="module")
def graphed(synth_root, synth_index, tmp_path_factory):
    """The spy's steps, and the recordings, pools and cudagraph skips before and after the run (other tests of the
    session may have used the device: the tests read what changed)."""
    from torch._dynamo.utils import counters

    out = tmp_path_factory.mktemp("graphed")
    cfg = load_config(TINY, _argv(out, synth_root, f"train.steps={STEPS}", "checkpoint.every=100",
                                  "model.args.max_targets=128", *GRAPHED))  # fmt: skip
    start = {"pools": _graph_pools(), "skips": counters["inductor"]["cudagraph_skips"]}
    deterministic = torch.are_deterministic_algorithms_enabled()  # the run sets it; module scope: put it back here
    trainer = Trainer(cfg)
    # the spy widens the device batch: its bucket must come from it, not from the host batch before it (the
    # prefetcher's bound of the device augmentation, or the loader's batch), which is not widened
    trainer.step_graph.handed_shapes, trainer.step_graph.host_batches = None, False
    spy = _Spy(trainer)
    trainer.step_graph = spy
    try:
        trainer.fit()
        trainer.close()
        torch.cuda.synchronize()
    finally:
        torch.use_deterministic_algorithms(deterministic)
    end = {"recorded": _recorded_graphs(), "pools": _graph_pools(), "skips": counters["inductor"]["cudagraph_skips"]}
    return spy, start, end


def _growth(spy: _Spy, end: dict) -> list[int]:
    """CUDA graphs recorded during each step (its forward and backward: from its start to the next one's)."""
    recorded = [step["recorded"] for step in spy.steps] + [end["recorded"]]
    return [after - before for before, after in itertools.pairwise(recorded)]


def test_the_replayed_step_equals_the_eager_step_across_buckets(graphed):
    spy, _, _ = graphed
    assert [step["bucket"].targets for step in spy.steps] == [64, 128] * (STEPS // 2)
    # float32 summation over the loss's B·A anchors (2 samples × a 64 × 64 map × 6 anchors), as on the CPU
    rtol = 2 * 64 * 64 * 6 * torch.finfo(torch.float32).eps
    for step in spy.steps:
        assert step["graphed"].keys() == step["eager"].keys()
        total = sum(value.float() for value in step["eager"].values())
        torch.testing.assert_close(sum(value.float() for value in step["graphed"].values()), total, rtol=rtol, atol=0)


def test_each_bucket_is_compiled_before_step_one_and_recorded_once(graphed):
    spy, start, end = graphed
    assert spy.graph.replays and spy.graph.compiles_in_steps == 0
    assert end["skips"] == start["skips"]  # nothing in the step kept it off the CUDA graphs
    growth = _growth(spy, end)
    for bucket in (64, 128):  # recorded at one of its three steps (the first, once warm), replayed at the others
        mine = [grew for step, grew in zip(spy.steps, growth, strict=True) if step["bucket"].targets == bucket]
        assert sum(grew > 0 for grew in mine) == 1, (bucket, growth)


def test_the_replays_reuse_one_memory_pool(graphed):
    spy, start, end = graphed
    grown = {pool for pool, size in end["pools"].items() if size > start["pools"].get(pool, 0)}
    assert len(grown) == 1, (start["pools"], end["pools"])  # every bucket's graphs in one private pool
    last = max(i for i, grew in enumerate(_growth(spy, end)) if grew)  # the last step that recorded
    pools = [step["pools"] for step in spy.steps] + [end["pools"]]
    assert all(later == pools[last + 1] for later in pools[last + 1 :]), pools  # replays reserve nothing more


def test_the_replayed_step_resumes_exactly(synth_root, synth_index, tmp_path, capfd):
    from drivetrain.cli.main import main

    straight, split = tmp_path / "straight", tmp_path / "split"
    one_bucket = ["model.args.max_targets=64", "checkpoint.every=2", *GRAPHED]

    def train(out: Path, steps: int, *extra: str) -> str:
        capfd.readouterr()
        assert main(["train", "--config", str(TINY), *_argv(out, synth_root, f"train.steps={steps}", *one_bucket),
                     *extra]) == 0  # fmt: skip
        return capfd.readouterr().err

    logs = train(straight, 4) + train(split, 2) + train(split, 4, "--resume", "auto")
    assert "inside steps" not in logs
    assert losses(split) == losses(straight)
    want, got = final_state(straight)["model"], final_state(split)["model"]
    assert all(torch.equal(got[key], value) for key, value in want.items())


def test_streampetrs_step_is_replayed_with_its_memory_bank_written_in_place(synth_root, synth_index, tmp_path, capfd):
    """StreamPETR's compiled step writes its memory bank's tensors in place, inputs marked static
    (``_static_address``): nothing keeps the step off the CUDA graphs (cudagraph trees skip a graph that mutates any
    other input), nothing compiles inside the 4 steps, and the bank the run ends with holds the last frames."""
    from torch._dynamo.utils import counters

    from drivetrain.cli.main import main
    from helpers.streampetr import SMALL

    args = {**SMALL, "static_targets": True, "step_images": [6, 90, 160], "step_targets": [64]}
    data = {"index": str(synth_root / "drivetrain_index.npz"), "split": "mini_train"}
    skips = counters["inductor"]["cudagraph_skips"]
    capfd.readouterr()
    argv = ["train", "--config", str(ROOT / "configs" / "streampetr_tiny.yaml"), f"run.out_dir={tmp_path}", *QUIET,
            "data.name=frames", f"data.args={json.dumps(data)}", f"model.args={json.dumps(args)}",
            "data.batch_size=2", "train.steps=4", *GRAPHED[:3], "train.device=cuda",
            "run.deterministic=true"]  # fmt: skip
    assert main(argv) == 0
    err = capfd.readouterr().err
    assert "inside steps" not in err and counters["inductor"]["cudagraph_skips"] == skips, err
    assert all(torch.isfinite(torch.tensor(loss)) for loss in losses(tmp_path))
    memory = final_state(tmp_path)["model"]["memory._extra_state"]
    assert memory["embedding"].abs().sum() > 0
