"""``speed.compile_step``'s compiled update (:class:`~drivetrain.engine.undoable_update.OptimizerGraph`): the copy for
the undo and AdamW's step as one graph, compiled before the first step without changing anything, with a tensor
learning rate that changes without compiling again; it agrees with torch's eager AdamW within float32 rounding,
undoes a non-finite update exactly, leaves the fp16 loss scaler and clipping as they were, and its state dict is the
eager one's (a checkpoint loads either way, 2 + 2 steps = 4 bit for bit).

The graphs use ``torch.compile``'s ``aot_eager`` backend (the same capture, no code generation). The gradients are
drawn independently of the weights, so the two optimizers compared see the same gradients at every step and differ
only by the rounding of the update's arithmetic (:func:`_adamw_tolerance`)."""

from __future__ import annotations

import copy
import io
import math

import torch

from drivetrain.engine.config import PrecisionConfig
from drivetrain.engine.precision import LossScaler, unscale_clip_
from drivetrain.engine.undoable_update import OptimizerGraph, UndoableUpdate

BACKEND = "aot_eager"
LR, WEIGHT_DECAY = 1e-2, 0.1
UNIT = torch.finfo(torch.float32).eps / 2  # float32 unit roundoff


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model[2].bias.requires_grad_(False)  # a parameter the optimizer does not hold
    return model


def _adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """As ``build_optimizer`` makes it: a float lr and an ``lr_mult`` per group."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW([{"params": params, "lr_mult": 1.0}], lr=LR, weight_decay=WEIGHT_DECAY)


def _graph(model: torch.nn.Module) -> tuple[torch.optim.AdamW, OptimizerGraph]:
    optimizer = _adamw(model)
    graph = OptimizerGraph(optimizer, BACKEND)
    graph.compile_all(lambda line: None)
    return optimizer, graph


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The trainer's ``_set_lr``: a tensor lr is written in place, a float one replaced."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def _gradients(model: torch.nn.Module, gen: torch.Generator, steps: int) -> list[list[torch.Tensor]]:
    """Per step, a gradient for every trainable parameter, in [-1, 1] (drawn once: both optimizers get the same)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [[torch.rand(p.shape, generator=gen) * 2 - 1 for p in params] for _ in range(steps)]


def _give(model: torch.nn.Module, grads: list[torch.Tensor], scale: float | torch.Tensor = 1.0) -> None:
    for p, g in zip([p for p in model.parameters() if p.requires_grad], grads, strict=True):
        p.grad = g * scale


def _bits(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    state = [v for s in optimizer.state.values() for v in s.values()]
    return [t.detach().clone().reshape(-1).view(torch.uint8) for t in [*model.parameters(), *state]]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _adamw_tolerance(steps: int, lr_max: float, p_max: float) -> float:
    """How far two float32 evaluations of ``steps`` AdamW updates (lr ≤ ``lr_max``, β = (0.9, 0.999), weights ≤
    ``p_max``) of the same gradients may end apart, element by element.

    Each evaluation rounds every operation (u = eps/2, relative), in its own order. With G the largest |gradient| an
    element saw, the moments after t steps are off by at most 3t·u·G (m̂, three rounded operations a step, a convex
    combination that does not amplify them) and 3t·u relatively (v̂); v̂ ≥ β₂^(t−1)·G²/t ≥ 0.99·G²/t for t ≤ 10,
    since 1 − β₂^t ≤ t(1 − β₂). So m̂/(√v̂ + ε) is off by at most √t·u·(4.5t + 4) (the last 2u: the division and
    ε's add), and lr times it by that plus u. The weights' own rounding (the decay multiply, its factor 1 − lr·λ, the
    add) adds 3u·|p| per step. Summed over the steps, for each of the two evaluations (their difference: twice):
    2u·(N·√N·(4.5N + 5)·lr_max + 3N·p_max).
    """
    return 2 * UNIT * (steps * math.sqrt(steps) * (4.5 * steps + 5) * lr_max + 3 * steps * p_max)


def _p_max(trained: torch.nn.Module) -> float:
    """The largest |weight| of the run, before or after (each update moves a weight by less than 2·lr)."""
    return max(p.abs().max().item() for m in (_model(), trained) for p in m.parameters())


def test_the_update_is_one_graph_compiled_before_the_first_step_without_changing_anything():
    from torch._dynamo.utils import counters

    model = _model()
    optimizer = _adamw(model)
    graph = OptimizerGraph(optimizer, BACKEND)
    before, rng = _bits(model, optimizer), torch.get_rng_state()
    graphs = counters["stats"]["unique_graphs"]
    lines: list[str] = []
    graph.compile_all(lines.append)
    assert counters["stats"]["unique_graphs"] - graphs == 1  # copy + step: one graph (fullgraph), no break
    assert len(lines) == 1 and lines[0].startswith("speed.compile_step: optimizer update compiled in ")
    assert _same(_bits(model, optimizer), before)  # parameters and the initial state (zeros, step 0) untouched
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    group = optimizer.param_groups[0]
    assert isinstance(group["lr"], torch.Tensor) and group["lr"].dim() == 0  # an input of the graph, not a constant


def test_the_compiled_update_matches_eager_adamw_and_a_changing_lr_compiles_nothing():
    steps = 10
    model = _model()
    twin = copy.deepcopy(model)
    optimizer, graph = _graph(model)
    eager_optimizer = _adamw(twin)
    eager = UndoableUpdate(eager_optimizer)  # the eager path: bit for bit torch's AdamW (test_engine_undoable_update)
    grads = _gradients(model, torch.Generator().manual_seed(1), steps)
    lrs = [LR * (t + 1) / steps for t in range(steps)]  # a new value every step, as a warm-up schedule
    for lr, step_grads in zip(lrs, grads, strict=True):
        _set_lr(optimizer, lr)
        _set_lr(eager_optimizer, lr)
        for m, update in ((model, graph), (twin, eager)):
            _give(m, step_grads)
            update.step()
            update.settle(True)
    assert graph.compiles_in_steps == 0  # ten learning rates, one graph
    tol = _adamw_tolerance(steps, max(lrs), _p_max(twin))
    for got, want in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=tol)
    for p, q in zip(optimizer.state, eager_optimizer.state, strict=True):  # the same number of updates counted
        assert optimizer.state[p]["step"].item() == eager_optimizer.state[q]["step"].item() == steps


def test_an_undone_compiled_update_leaves_every_value_as_it_was():
    model = _model()
    optimizer, graph = _graph(model)
    grads = _gradients(model, torch.Generator().manual_seed(2), 2)
    _give(model, grads[0])
    graph.step()
    graph.settle(True)
    before = _bits(model, optimizer)
    _give(model, grads[1], scale=float("nan"))  # NaN gradients: the update writes NaNs everywhere
    graph.step()
    assert any(p.isnan().any() for p in model.parameters() if p.requires_grad)
    graph.settle(False)
    assert _same(_bits(model, optimizer), before)
    assert all(s["step"].item() == 1 for s in optimizer.state.values())
    assert graph.compiles_in_steps == 0


def test_the_fp16_scaler_and_clipping_around_the_compiled_update_are_unchanged():
    """The loss scaler and clipping stay outside the graph: the same overflow decisions, the same scales bit for bit,
    and weights within the update's rounding of the eager run's."""
    steps, overflow_at = 8, {2, 5}
    cfg = PrecisionConfig(mode="fp16", init_scale=1024.0, growth_interval=2, hysteresis=1)
    model = _model()
    twin = copy.deepcopy(model)
    _, graph = _graph(model)
    eager = UndoableUpdate(_adamw(twin))
    runs = [(model, graph, LossScaler(cfg, torch.device("cpu"))), (twin, eager, LossScaler(cfg, torch.device("cpu")))]
    grads = _gradients(model, torch.Generator().manual_seed(3), steps)
    seen: list[list[tuple[bool, float, float]]] = [[], []]
    for t, step_grads in enumerate(grads):
        if t in overflow_at:  # an fp16 overflow in the backward
            step_grads = [g.clone() for g in step_grads]
            step_grads[0][0, 0] = float("inf")
        for i, (m, update, scaler) in enumerate(runs):
            _give(m, step_grads, scale=scaler.scale)
            norm, found_inf = unscale_clip_([p for p in m.parameters() if p.requires_grad], scaler, 0.5)
            update.step()
            scaler.update(found_inf)
            update.settle(not bool(found_inf))
            seen[i].append((bool(found_inf), norm.item(), scaler.scale.item()))
    assert seen[0] == seen[1]  # skips, gradient norms and scales: identical
    assert [s[0] for s in seen[0]] == [t in overflow_at for t in range(steps)]
    # growth every 2 finite steps in a row, back off at each overflow (hysteresis 1)
    assert [s[2] for s in seen[0]] == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 1024.0, 1024.0, 2048.0]
    tol = _adamw_tolerance(steps - len(overflow_at), LR, _p_max(twin))
    for got, want in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=tol)


def _saved(state_dict: dict) -> dict:
    """``state_dict`` through ``torch.save`` and ``torch.load(weights_only=True)``, as a checkpoint keeps it."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _train(model: torch.nn.Module, optimizer, update, grads: list[list[torch.Tensor]], lrs: list[float]) -> None:
    for lr, step_grads in zip(lrs, grads, strict=True):
        _set_lr(optimizer, lr)
        _give(model, step_grads)
        update.step()
        update.settle(True)
    optimizer.zero_grad(set_to_none=True)


def test_the_compiled_update_resumes_exactly_from_its_state_dict():
    """2 + 2 steps through a checkpoint's state dict = 4 straight, bit for bit; the dict is the eager form."""
    grads = _gradients(_model(), torch.Generator().manual_seed(4), 4)
    lrs = [LR, LR / 2, LR / 3, LR / 4]
    straight = _model()
    straight_optimizer, straight_graph = _graph(straight)
    _train(straight, straight_optimizer, straight_graph, grads, lrs)

    first = _model()
    first_optimizer, first_graph = _graph(first)
    _train(first, first_optimizer, first_graph, grads[:2], lrs[:2])
    model_sd, optim_sd = _saved(first.state_dict()), _saved(first_optimizer.state_dict())
    for group in optim_sd["param_groups"]:  # what the eager optimizer writes: a float lr, its flags
        assert isinstance(group["lr"], float) and group["capturable"] is False
    assert all(s["step"].device.type == "cpu" and s["step"].dtype == torch.float32 for s in optim_sd["state"].values())

    resumed = _model()
    resumed.load_state_dict(model_sd)
    resumed_optimizer = _adamw(resumed)
    resumed_graph = OptimizerGraph(resumed_optimizer, BACKEND)
    resumed_optimizer.load_state_dict(optim_sd)
    assert isinstance(resumed_optimizer.param_groups[0]["lr"], torch.Tensor)  # back in graph form after the load
    resumed_graph.compile_all(lambda line: None)
    _train(resumed, resumed_optimizer, resumed_graph, grads[2:], lrs[2:])
    assert _same(_bits(resumed, resumed_optimizer), _bits(straight, straight_optimizer))
    assert resumed_graph.compiles_in_steps == 0


def test_a_checkpoint_loads_across_the_switch_both_ways():
    """An eager optimizer's state dict loads into the compiled update and the compiled one's into the eager AdamW;
    either then trains on, within the update's rounding of a run that never switched."""
    steps = 4
    grads = _gradients(_model(), torch.Generator().manual_seed(5), steps)
    lrs = [LR] * steps
    reference = _model()
    reference_optimizer = _adamw(reference)
    _train(reference, reference_optimizer, UndoableUpdate(reference_optimizer), grads, lrs)
    tol = _adamw_tolerance(steps, LR, _p_max(reference))

    eager = _model()
    eager_optimizer = _adamw(eager)
    _train(eager, eager_optimizer, UndoableUpdate(eager_optimizer), grads[:2], lrs[:2])
    on = _model()
    on.load_state_dict(_saved(eager.state_dict()))
    on_optimizer = _adamw(on)
    on_graph = OptimizerGraph(on_optimizer, BACKEND)
    on_optimizer.load_state_dict(_saved(eager_optimizer.state_dict()))
    on_graph.compile_all(lambda line: None)
    _train(on, on_optimizer, on_graph, grads[2:], lrs[2:])
    assert on_graph.compiles_in_steps == 0

    compiled = _model()
    compiled_optimizer, compiled_graph = _graph(compiled)
    _train(compiled, compiled_optimizer, compiled_graph, grads[:2], lrs[:2])
    off = _model()
    off.load_state_dict(_saved(compiled.state_dict()))
    off_optimizer = _adamw(off)
    off_optimizer.load_state_dict(_saved(compiled_optimizer.state_dict()))
    assert isinstance(off_optimizer.param_groups[0]["lr"], float) and not off_optimizer.param_groups[0]["capturable"]
    _train(off, off_optimizer, UndoableUpdate(off_optimizer), grads[2:], lrs[2:])  # eager AdamW steps on a CPU

    for m in (on, off):
        for got, want in zip(m.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=tol)
    steps_on = [s["step"].item() for s in on_optimizer.state.values()]
    steps_off = [s["step"].item() for s in off_optimizer.state.values()]
    assert steps_on == steps_off == [float(steps)] * 3


def test_the_update_reads_nothing_on_the_host_even_where_it_runs_eagerly():
    """Under an op or sync counter (a dispatch mode, as the benchmarks count one step) torch.compile runs eagerly: the
    update stands in with the graph's own arithmetic of the step counters, which reads none of them on the host (a
    CPU's eager AdamW reads each one)."""
    from helpers.nosync import no_host_sync

    model = _model()
    _, graph = _graph(model)
    twin = copy.deepcopy(model)
    twin_optimizer, twin_graph = _graph(twin)
    grads = _gradients(model, torch.Generator().manual_seed(6), 2)
    for step_grads in grads:
        _give(model, step_grads)
        graph.step()
        graph.settle(True)
        _give(twin, step_grads)
        with no_host_sync():  # raises at a read
            twin_graph.step()
        twin_graph.settle(True)
    tol = _adamw_tolerance(len(grads), LR, _p_max(model))  # the graph's arithmetic, in another order
    for got, want in zip(twin.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=tol)
    assert [s["step"].item() for s in twin_optimizer.state.values()] == [2.0] * 3


def _graph_inputs(optimizer: torch.optim.AdamW, load: dict | None = None) -> tuple[list[torch.Tensor], list]:
    """The tensors the update's graph takes as inputs (dynamo's example inputs), and the optimizer's state tensors."""
    seen: list[list[torch.Tensor]] = []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> object:
        seen.append([x for x in inputs if isinstance(x, torch.Tensor)])
        return gm.forward

    graph = OptimizerGraph(optimizer, backend)
    if load is not None:
        optimizer.load_state_dict(load)
    graph.compile_all(lambda line: None)
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return seen[-1], state


def test_the_update_graph_takes_the_optimizer_state_as_static_not_as_inputs():
    """The update writes AdamW's state (step, moments) in place; cudagraph trees replay only a graph whose mutated
    inputs are static, and the graph meets the state first among the undo copy's sources: without marking them
    static in advance the 9 state tensors were plain inputs of the graph (CUDA: "skipping cudagraphs due to mutated
    inputs"). Also after a checkpoint's state is loaded (new tensors)."""
    model = _model()
    optimizer = _adamw(model)
    inputs, state = _graph_inputs(optimizer)
    assert len(state) == 9  # 3 parameters × (step, exp_avg, exp_avg_sq)
    assert not {t.data_ptr() for t in state} & {x.data_ptr() for x in inputs}
    params = [p for p in model.parameters() if p.requires_grad]
    assert {p.data_ptr() for p in params} <= {x.data_ptr() for x in inputs}  # the check can see an input
    inputs, state = _graph_inputs(_adamw(_model()), load=optimizer.state_dict())  # a checkpoint's (eager form)
    assert len(state) == 9 and not {t.data_ptr() for t in state} & {x.data_ptr() for x in inputs}
