"""An optimizer update taken before the host knows whether to keep it, and undone exactly if not.

The trainer decides whether an iteration's update counts (finite gradients and losses on every rank, agreed on the
device) without the step waiting for the host: the update runs at once, and the iteration's one host read, after
it, says whether to keep it. :class:`UndoableUpdate` brackets the optimizer's own step — the same arithmetic as an
unconditional ``optimizer.step()``, so a kept update is bit-identical to it:

- :meth:`UndoableUpdate.step`: copy every parameter with a gradient and its optimizer-state tensors (a DTensor's
  local shard) into buffers kept between steps (``torch._foreach_copy_``: a few multi-tensor kernels per device and
  dtype on CUDA), then ``optimizer.step()``. No host read.
- :meth:`UndoableUpdate.settle`: after the read, for an update not to keep: copy every value back (exactly, also
  over the NaNs a non-finite gradient made) and drop the state a parameter's first update created (the optimizer then
  has no state for it, as if it never stepped). Skips are rare: the common step pays only the copy.

The cost: one copy of the parameters and their optimizer state (AdamW: parameter, two moments, the step counter)
kept between steps, and one copy of them per step.

:class:`OptimizerGraph` (``speed.compile_step``) is the same update as one compiled graph: the copies and AdamW's step,
with a tensor learning rate the trainer writes in place, step counters on the device and AdamW's initial state made
up front, compiled before the first step; its optimizer's ``state_dict()`` keeps the eager form, so checkpoints load
with the graph on or off.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import time
import types
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["OptimizerGraph", "UndoableUpdate"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2), the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``target.copy_(source)`` for each pair, one ``_foreach_copy_`` per device and dtype."""
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[torch.Tensor]]] = defaultdict(
        lambda: ([], [])
    )
    for target, source in zip(targets, sources, strict=True):
        group = groups[target.device, target.dtype]
        group[0].append(target)
        group[1].append(source)
    for group_targets, group_sources in groups.values():
        torch._foreach_copy_(group_targets, group_sources)


class UndoableUpdate:
    """``optimizer.step()`` that :meth:`settle` can undo exactly (see the module).

    Args:
        optimizer: a ``torch.optim`` optimizer whose step changes only its parameters and its ``state`` tensors.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._buffers: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # id(tensor) → (the tensor, its buffer)
        self._saved: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])  # the tensors, their copies
        self._fresh: list[torch.Tensor] = []  # parameters whose state this update created

    @torch.no_grad()
    def step(self) -> None:
        """Copy what ``optimizer.step()`` changes, then run it."""
        state = self.optimizer.state
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        self._fresh = [p for p in params if not state.get(p)]  # .get: no empty entry in the defaultdict
        tensors = [t for p in params for t in (p, *state.get(p, {}).values()) if isinstance(t, torch.Tensor)]
        kept, locals_, buffers = {}, [], []
        for t in tensors:  # a buffer per tensor, kept between steps; a new tensor (or reshaped) gets a new one
            local = _local(t)
            owner, buffer = self._buffers.get(id(t), (None, None))
            if owner is None or owner() is not t or buffer.shape != local.shape or buffer.dtype != local.dtype:
                buffer = self._new_buffer(local)
            kept[id(t)] = (weakref.ref(t), buffer)
            locals_.append(local)
            buffers.append(buffer)
        self._buffers = kept  # gone tensors' buffers are dropped
        self._saved = (locals_, buffers)
        self._apply(buffers, locals_)

    def _apply(self, buffers: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
        """Copy ``sources`` into ``buffers``, then ``optimizer.step()``."""
        _copy_all(buffers, sources)
        self.optimizer.step()

    def _new_buffer(self, local: torch.Tensor) -> torch.Tensor:
        """A buffer for a copy of ``local``, kept between steps."""
        return torch.empty_like(local)

    @torch.no_grad()
    def settle(self, keep: bool) -> None:
        """After the host read: undo the last :meth:`step` exactly unless ``keep``."""
        if not keep:
            _copy_all(*self._saved)
            for p in self._fresh:
                del self.optimizer.state[p]
        self._saved, self._fresh = ([], []), []


def _compiled_graphs() -> int:
    """Graphs ``torch._dynamo`` compiled in this process so far (its ``unique_graphs`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


_INSTANCES = itertools.count()  # OptimizerGraphs made in this process (each compiles a code object of its own)


def _copy_and_step(graph: OptimizerGraph, buffers: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """The compiled update: the copies of :meth:`UndoableUpdate.step`, then the optimizer's own step (called under
    ``no_grad``, without the wrapper that runs its hooks and breaks the graph around it)."""
    _copy_all(buffers, sources)
    graph._raw_step(graph.optimizer)


class OptimizerGraph(UndoableUpdate):
    """The undoable update as one compiled graph: the copy of parameters and optimizer state and AdamW's step
    (``speed.compile_step``; see the module).

    The optimizer is put in graph form here and after every ``load_state_dict``: each group's ``lr`` a 0-dim tensor on
    its parameters' device (the trainer writes the schedule's value into it with ``fill_`` before each step, so a
    changing learning rate is an input of the graph, never a constant baked into it), the step counters float32
    tensors on that device, and on a device with capturable optimizers (CUDA) ``capturable`` and ``foreach`` on. On a
    CPU the group stays ``capturable=False`` (torch refuses it outside a graph there; inside the graph dynamo traces
    the capturable code whatever the flag) with ``foreach=False`` (a tensor ``lr`` needs one or the other). Every
    parameter gets AdamW's initial state (step 0, zero moments: what its first step would create, the same
    arithmetic), so the graph never meets a first step. ``state_dict()`` gives the eager form (``lr`` a float, step
    counters on the CPU, the flags as built): a checkpoint reads the same with the graph on or off, and loads into
    either.

    Args:
        optimizer: the run's ``torch.optim.AdamW`` (one device).
        backend: ``torch.compile``'s backend (``speed.compile_step_backend``).
        mode: ``torch.compile``'s mode (``speed.compile_step_mode``): "reduce-overhead" replays a CUDA graph.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, backend: str, mode: str = "default") -> None:
        super().__init__(optimizer)
        self.replays = mode == "reduce-overhead"
        self.compiles_in_steps = 0  # graphs dynamo compiled inside steps (0 once compile_all ran)
        self._compiled = False
        self._eager_flags = [(g.get("capturable", False), g.get("foreach")) for g in optimizer.param_groups]
        self._raw_step = inspect.unwrap(type(optimizer).step)  # without the hooks' wrapper and its graph breaks
        self._graph_form()
        optimizer.register_state_dict_post_hook(self._eager_form)
        optimizer.register_load_state_dict_post_hook(lambda _: self._graph_form())
        # a code object of its own: dynamo keeps at most recompile_limit graphs per code object, and each update's
        # graph guards on its own optimizer's tensors (a process building many runs would otherwise run out)
        name = f"optimizer_update_{next(_INSTANCES)}"
        own = types.FunctionType(_copy_and_step.__code__.replace(co_name=name), _copy_and_step.__globals__, name)
        self._fn = torch.compile(types.MethodType(own, self), fullgraph=True, dynamic=False, backend=backend, mode=mode)

    def _graph_form(self) -> None:
        """Tensor ``lr``, device step counters, the flags, and AdamW's initial state for every parameter."""
        state = self.optimizer.state
        for group in self.optimizer.param_groups:
            if not group["params"]:
                continue
            device = group["params"][0].device
            capturable = device.type in ("cuda", "xpu")
            group["capturable"], group["foreach"] = capturable, capturable
            lr = group["lr"]
            if not (isinstance(lr, torch.Tensor) and lr.device == device and lr.dtype == torch.float32):
                value = float(lr)  # sync: only when loaded (a tensor lr in a checkpoint), never in a step
                group["lr"] = torch.tensor(value, dtype=torch.float32, device=device)
            for p in group["params"]:
                if state.get(p):
                    state[p]["step"] = state[p]["step"].to(device=p.device, dtype=torch.float32)
                else:  # AdamW's first step would create exactly this
                    state[p].update(
                        step=torch.zeros((), dtype=torch.float32, device=p.device),
                        exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                        exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format),
                    )
                # CUDA graphs: the update writes the state in place, and cudagraph trees replay only a graph whose
                # mutated inputs are static. The graph first meets the state in the copies' sources, as plain
                # inputs (dynamo's own marking of an optimizer's state comes later, too late): mark them here
                for value in state[p].values():
                    if isinstance(value, torch.Tensor):
                        torch._dynamo.mark_static_address(value, guard=True)

    def _eager_form(self, _: torch.optim.Optimizer, state_dict: dict) -> dict:
        """``state_dict()`` as the eager optimizer writes it: float ``lr``, CPU step counters, the flags as built."""
        for group, (capturable, foreach) in zip(state_dict["param_groups"], self._eager_flags, strict=True):
            lr = group["lr"]
            group["lr"] = float(lr) if isinstance(lr, torch.Tensor) else lr  # sync: at a checkpoint, not in a step
            group["capturable"], group["foreach"] = capturable, foreach
        state_dict["state"] = {  # new dicts: the optimizer's own state entries are shared with this one
            key: {**value, "step": value["step"].to("cpu", torch.float32)} if "step" in value else value
            for key, value in state_dict["state"].items()
        }
        return state_dict

    def _new_buffer(self, local: torch.Tensor) -> torch.Tensor:
        buffer = torch.empty_like(local)
        torch._dynamo.mark_static_address(buffer, guard=True)  # CUDA graphs: an input written in place stays put
        return buffer

    def _apply(self, buffers: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
        optimizer = self.optimizer
        if _dispatch_mode_active():  # a counter of ops or syncs: torch.compile runs eagerly under one anyway
            with _tensor_step_arithmetic(optimizer):
                super()._apply(buffers, sources)  # the graph's ops, one by one, through optimizer.step()
            return
        for hook in (*_global_step_pre_hooks(), *optimizer._optimizer_step_pre_hooks.values()):
            hook(optimizer, (), {})  # before the graph (an asynchronous save's gate), not traced into it
        before = _compiled_graphs()
        # CUDA graphs: no cudagraph_mark_step_begin here — the update is part of the step's iteration, after the
        # backward, whose gradients it reads where they are (in the pool, until zero_grad drops them)
        self._fn(buffers, sources)
        if self._compiled:
            self.compiles_in_steps += _compiled_graphs() - before
        for hook in (*optimizer._optimizer_step_post_hooks.values(), *_global_step_post_hooks()):
            hook(optimizer, (), {})

    def compile_all(self, message: Callable[[str], None]) -> None:
        """Compile the update before the first step: one update of zero gradients, taken and undone, with the RNG
        states put back (so a run trains exactly as without the warm-up); one line with its seconds.

        Every parameter of the optimizer gets a gradient here: a step in which one has none compiles again (counted
        in :attr:`compiles_in_steps`).

        Args:
            message: prints one line (rank 0's log).
        """
        start = time.perf_counter()
        self._graph_form()  # a checkpoint loaded since may lack some parameters' state
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        cpu_rng = torch.get_rng_state()
        cuda = any(p.is_cuda for p in params)
        cuda_rng = torch.cuda.get_rng_state_all() if cuda else None
        try:
            for p in params:
                p.grad = torch.zeros_like(p)
            if self.replays:  # an iteration of its own (cudagraph trees' eager warm-up of the update)
                torch.compiler.cudagraph_mark_step_begin()
            self.step()
            self.settle(False)  # every parameter and state value back, bit for bit
        finally:
            for p in params:
                p.grad = None
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
        self._compiled = True
        message(f"speed.compile_step: optimizer update compiled in {time.perf_counter() - start:.1f} s")


@contextlib.contextmanager
def _tensor_step_arithmetic(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """For an eager step in graph form: a group that is not ``capturable`` (a CPU's) takes AdamW's tensor arithmetic of
    the step counters, as the graph does, instead of reading each counter on the host — through ``differentiable``,
    which selects that arithmetic (torch's capturable code without its device check) and changes nothing else here
    (the step runs under ``no_grad``)."""
    groups = [group for group in optimizer.param_groups if not group["capturable"]]
    for group in groups:
        group["differentiable"] = True
    try:
        yield
    finally:
        for group in groups:
            group["differentiable"] = False


def _dispatch_mode_active() -> bool:
    """Whether a Python dispatch mode is active (under which dynamo compiles nothing and runs frames eagerly)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode() is not None


def _global_step_pre_hooks() -> list[Callable[..., Any]]:
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    return list(_global_optimizer_pre_hooks.values())


def _global_step_post_hooks() -> list[Callable[..., Any]]:
    from torch.optim.optimizer import _global_optimizer_post_hooks

    return list(_global_optimizer_post_hooks.values())
