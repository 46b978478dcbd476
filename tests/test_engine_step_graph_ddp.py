"""``speed.compile_step`` under DDP (2 gloo ranks, torchrun; tests/engine_step_graph_worker.py): DDP wraps the
compiled step, so its reducer all-reduces the gradients of the compiled backward — the ranks end with equal weights
on different data, the first step agrees with the eager DDP step, the checkpoint names and numbers the state as the
eager run does, and (slow set) a run stopped after 2 steps and resumed ends bit-equal to 4 straight; with
``distributed.static_graph``, ``find_unused_parameters`` and the windowed assignment (slow set) as well. The
refusals of the other strategies are tests/test_engine_step_graph.py's.

PointPillars tiny at one frame per rank and micro-batch, ``train.accumulation=2`` (the first micro-batch under
``no_sync``), the dense assignment at one ground-truth bucket, ``aot_eager`` (the graph capture and AOTAutograd's
backward without code generation)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from drivetrain.engine.config import load_config
from helpers.engine import ROOT, final_state, losses, metrics, torchrun

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

WORKER = ROOT / "tests" / "engine_step_graph_worker.py"
TINY = ROOT / "configs" / "pointpillars_tiny.yaml"
EPS = torch.finfo(torch.float32).eps
# The step's loss sums over every anchor of the step's samples (2 ranks × 2 micro-batches × 1 frame × the 64 × 64
# map × 6 anchors): the compiled step computes the same function in another float32 order (padded to the bucket),
# a relative difference ≤ n·eps on the same weights and batches (step 1).
LOSS_RTOL = 2 * 2 * 64 * 64 * 6 * EPS
# A gradient element's longest float32 sum in the step: the first convolution's weight gradient over every position
# of the 128 × 128 pillar canvas of the step's samples (the micro-batches accumulated, the ranks all-reduced); the
# grad norm (a 1-Lipschitz function of the gradient) moves by at most that relative error. 7.8e-3: far below what a
# wrong reduction gives (a sum instead of the mean doubles the norm; an unreduced rank's norm is its own gradient's).
GRAD_NORM_RTOL = 2 * 2 * 128 * 128 * EPS


def _torchrun(root: Path, index: str, *scenarios: str) -> str:
    proc = torchrun(str(WORKER), str(root), index, *scenarios, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory, synth_root, synth_index) -> tuple[Path, str]:
    """One torchrun: the compiled step 4 steps straight, the eager step (the resumed run: the slow set's own)."""
    root = tmp_path_factory.mktemp("step-graph-ddp")
    return root, _torchrun(root, str(synth_root / "drivetrain_index.npz"), "compiled", "eager")


def _params(root: Path, run: str, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(root / f"params-{run}-rank{rank}.pt", weights_only=True)


def _assert_ranks_equal(root: Path, run: str) -> None:
    """Both ranks end with bit-equal parameters, on different frames: every update used the all-reduced gradient."""
    first, second = _params(root, run, 0), _params(root, run, 1)
    assert first.keys() == second.keys()
    assert all(torch.equal(value, second[name]) for name, value in first.items()), run


def _assert_first_step_agrees(run: Path, eager: Path) -> None:
    """The first step (same weights and frames) of ``run`` against the eager DDP run ``eager``: loss and grad norm
    (the means over the ranks of their values after the all-reduce) within the derived float32 bounds."""
    (step,), (eager,) = metrics(run)[:1], metrics(eager)[:1]
    torch.testing.assert_close(step["loss"], eager["loss"], rtol=LOSS_RTOL, atol=0.0)
    torch.testing.assert_close(step["grad_norm"], eager["grad_norm"], rtol=GRAD_NORM_RTOL, atol=0.0)


def test_compile_step_is_accepted_under_ddp() -> None:
    cfg = load_config(TINY, ["speed.compile_step=true", "distributed.strategy=ddp"])
    assert cfg.speed.compile_step and cfg.distributed.strategy == "ddp"


def test_the_compiled_step_under_ddp_reduces_gradients_as_the_eager_step(ddp_runs: tuple[Path, str]) -> None:
    root, output = ddp_runs
    assert output.count("speed.compile_step: bucket ") == 1  # rank 0's line, one bucket in the compiled run
    assert "inside steps" not in output  # the warm-up through DDP's forward compiled what the steps run
    _assert_ranks_equal(root, "compiled")
    _assert_ranks_equal(root, "eager")
    _assert_first_step_agrees(root / "compiled", root / "eager")
    assert len(losses(root / "compiled")) == 4


def test_the_compiled_step_under_ddp_checkpoints_the_state_of_the_eager_run(ddp_runs: tuple[Path, str]) -> None:
    """The model's and the optimizer's state under the same names and numbers as the eager DDP run's (the
    strategy's state is the model's, not the wrapped step's)."""
    root, _ = ddp_runs
    compiled, eager = final_state(root / "compiled"), final_state(root / "eager")
    assert compiled["model"].keys() == eager["model"].keys()
    assert not any(key.startswith(("module.", "model.")) for key in compiled["model"])
    groups = [[group["params"] for group in state["optimizer"]["param_groups"]] for state in (compiled, eager)]
    assert groups[0] == groups[1]  # the parameters numbered in the model's order
    assert compiled["optimizer"]["state"].keys() == eager["optimizer"]["state"].keys()
    assert compiled["world_size"] == eager["world_size"] == 2


@pytest.mark.slow  # its own torchrun (two more trainers); one process: test_engine_step_graph.py
def test_the_compiled_step_under_ddp_resumes_exactly(ddp_runs: tuple[Path, str], synth_root, synth_index) -> None:
    """Stopped after 2 steps and resumed to 4 (the warm-up's reduction and restored state between them): the losses
    and final weights of the 4 straight steps, bit for bit, on both ranks."""
    root, _ = ddp_runs
    _torchrun(root, str(synth_root / "drivetrain_index.npz"), "resumed")
    assert losses(root / "resumed") == losses(root / "compiled")
    want, got = final_state(root / "compiled")["model"], final_state(root / "resumed")["model"]
    assert want.keys() == got.keys() and all(torch.equal(got[key], value) for key, value in want.items())
    _assert_ranks_equal(root, "resumed")
    straight = _params(root, "compiled", 1)
    assert all(torch.equal(value, straight[name]) for name, value in _params(root, "resumed", 1).items())


@pytest.mark.slow  # its own torchrun (2 windowed buckets to compile); the default DDP options: the tests above
def test_the_compiled_step_under_ddp_with_static_graph_unused_parameter_search_and_windows(
    ddp_runs: tuple[Path, str], synth_root, synth_index, tmp_path: Path
) -> None:
    """``distributed.static_graph`` (the warm-up is the iteration DDP records), ``find_unused_parameters`` (DDP
    searches the autograd graph from the step's loss terms, through the compiled backward's nodes) and the windowed
    assignment (PointPillars' default: 2 buckets; before the model
    cached its window table ahead of the graph and passed one-sample sizes with stride 1, a one-frame batch recompiled
    inside the steps until dynamo's recompile limit stopped the run): equal ranks, no graph compiled inside a step,
    and the first step of the eager DDP run."""
    root, _ = ddp_runs
    output = _torchrun(tmp_path, str(synth_root / "drivetrain_index.npz"), "static", "unused", "windowed")
    assert output.count("speed.compile_step: bucket ") == 1 + 1 + 2
    assert "inside steps" not in output
    for run in ("static", "unused", "windowed"):
        _assert_ranks_equal(tmp_path, run)
        _assert_first_step_agrees(tmp_path / run, root / "eager")
