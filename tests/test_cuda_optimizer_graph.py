"""``speed.compile_step``'s compiled update on CUDA (:class:`~drivetrain.engine.undoable_update.OptimizerGraph`,
inductor, ``mode="reduce-overhead"``): it agrees with torch's eager AdamW on the GPU within float32 rounding, a learning
rate changing every step neither compiles nor records again (the lr is a device tensor the graph reads), the update
replays as a CUDA graph (cudagraph trees skip nothing: parameters, state, lr and the undo buffers are static inputs),
an undone update is exact over the replays, and 2 + 2 steps through a checkpoint's state dict are 4 bit for bit.

The model and gradients are those of ``tests/test_engine_optimizer_graph.py`` (whose float32 bound, derived there,
holds for any order of the update's operations), on the GPU."""

from __future__ import annotations

import copy

import pytest
import torch

from drivetrain.engine.undoable_update import OptimizerGraph, UndoableUpdate
from test_engine_optimizer_graph import (
    LR,
    _adamw,
    _adamw_tolerance,
    _bits,
    _gradients,
    _model,
    _same,
    _saved,
    _set_lr,
)

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.compiles,
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")


def _on_gpu() -> torch.nn.Module:
    return _model().to(CUDA)


def _graphed(model: torch.nn.Module) -> tuple[torch.optim.AdamW, OptimizerGraph]:
    optimizer = _adamw(model)
    graph = OptimizerGraph(optimizer, "inductor", "reduce-overhead")
    graph.compile_all(lambda line: None)
    return optimizer, graph


def _give(model: torch.nn.Module, grads: list[torch.Tensor], scale: float = 1.0) -> None:
    for p, g in zip([p for p in model.parameters() if p.requires_grad], grads, strict=True):
        p.grad = (g * scale).to(CUDA)


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


def _train(model, optimizer, update, grads, lrs, recorded: list[int] | None = None) -> None:
    for lr, step_grads in zip(lrs, grads, strict=True):
        torch.compiler.cudagraph_mark_step_begin()  # a new iteration, as the trainer's compiled step begins one
        _set_lr(optimizer, lr)
        _give(model, step_grads)
        update.step()
        update.settle(True)
        optimizer.zero_grad(set_to_none=True)
        if recorded is not None:
            recorded.append(_recorded_graphs())


def test_the_replayed_update_matches_eager_adamw_and_records_once_across_lr_changes():
    from torch._dynamo.utils import counters

    steps = 10
    skips = counters["inductor"]["cudagraph_skips"]
    model = _on_gpu()
    twin = copy.deepcopy(model)
    optimizer, graph = _graphed(model)
    eager_optimizer = _adamw(twin)  # eager AdamW on CUDA: foreach, a float lr, CPU step counters
    grads = _gradients(_model(), torch.Generator().manual_seed(1), steps)
    lrs = [LR * (t + 1) / steps for t in range(steps)]
    start, recorded = _recorded_graphs(), []
    _train(model, optimizer, graph, grads, lrs, recorded)
    _train(twin, eager_optimizer, UndoableUpdate(eager_optimizer), grads, lrs)
    assert graph.compiles_in_steps == 0  # ten learning rates, one graph
    assert counters["inductor"]["cudagraph_skips"] == skips  # nothing kept the update off the CUDA graphs
    growth = [after - before for before, after in zip([start, *recorded], recorded, strict=False)]
    assert growth[0] > 0 and not any(growth[1:]), growth  # recorded at the first step, replayed at the nine others
    p_max = max(p.abs().max().item() for m in (_model(), twin) for p in m.parameters())
    tol = _adamw_tolerance(steps, max(lrs), p_max)
    for got, want in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=tol)


def test_an_undone_replayed_update_leaves_every_value_as_it_was():
    model = _on_gpu()
    optimizer, graph = _graphed(model)
    grads = _gradients(_model(), torch.Generator().manual_seed(2), 3)
    _train(model, optimizer, graph, grads[:2], [LR, LR])  # recorded, then replayed
    before = _bits(model, optimizer)
    torch.compiler.cudagraph_mark_step_begin()
    _give(model, grads[2], scale=float("nan"))
    graph.step()
    assert any(p.isnan().any() for p in model.parameters() if p.requires_grad)
    graph.settle(False)
    assert _same(_bits(model, optimizer), before)


def test_the_replayed_update_resumes_exactly_from_its_state_dict():
    grads = _gradients(_model(), torch.Generator().manual_seed(4), 4)
    lrs = [LR, LR / 2, LR / 3, LR / 4]
    straight = _on_gpu()
    straight_optimizer, straight_graph = _graphed(straight)
    _train(straight, straight_optimizer, straight_graph, grads, lrs)

    first = _on_gpu()
    first_optimizer, first_graph = _graphed(first)
    _train(first, first_optimizer, first_graph, grads[:2], lrs[:2])
    model_sd, optim_sd = _saved(first.state_dict()), _saved(first_optimizer.state_dict())
    assert all(s["step"].device.type == "cpu" for s in optim_sd["state"].values())  # the eager form

    resumed = _on_gpu()
    resumed.load_state_dict(model_sd)
    resumed_optimizer = _adamw(resumed)
    resumed_graph = OptimizerGraph(resumed_optimizer, "inductor", "reduce-overhead")
    resumed_optimizer.load_state_dict(optim_sd)
    group = resumed_optimizer.param_groups[0]
    assert group["lr"].device.type == "cuda" and group["capturable"]  # the graph form, on the device
    assert all(s["step"].device.type == "cuda" for s in resumed_optimizer.state.values())
    resumed_graph.compile_all(lambda line: None)
    _train(resumed, resumed_optimizer, resumed_graph, grads[2:], lrs[2:])
    assert _same(_bits(resumed, resumed_optimizer), _bits(straight, straight_optimizer))
    assert resumed_graph.compiles_in_steps == 0
