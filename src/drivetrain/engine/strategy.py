"""The parallelism strategies behind one small interface, so that the training step never asks which runs.

A :class:`Strategy` owns the model as the step calls it (``wrapped``: the model, or under ``speed.compile_step`` the
compiled step's :class:`~drivetrain.engine.build.StepModule`, the model its one child), the optimizer and the loss
scaler, and answers the step's five questions:

- ``sync_grads(enabled)``: a context in which backward reduces gradients across ranks only if ``enabled``
  (the last micro-batch of an accumulation);
- ``backward(loss)``;
- ``unscale_and_clip()`` → ``(grad_norm, grads_bad)`` on the device, no sync;
- ``step(apply, overflow)`` → ``(grad_norm, loss_scale, applied)``: apply the update (or skip it), move the
  loss scaler, zero the gradients; ``apply`` may be a device flag: the update is then taken at once, undoably
  (:mod:`~drivetrain.engine.undoable_update`), and ``settle(applied)`` keeps or undoes it once the host has read
  the flag;
- ``sharded_state()`` / ``load_sharded_state()``: this rank's model and optimizer state (parameters by name,
  FSDP's DTensor shards) for checkpoints written through ``torch.distributed.checkpoint``, which reshards on
  load, so a run resumes under another strategy or number of ranks;
- ``full_state()`` / ``load_full_state()``: full (unsharded) model and optimizer state dicts (single-file
  checkpoints of earlier versions; DeepSpeed); a run resumes them under any of ``none``, ``ddp`` and ``fsdp`` on
  any number of ranks (the optimizer's parameters are numbered by ``none`` and ``ddp``, named by ``fsdp``; loading
  maps one onto the other by the parameters' names).

Strategies: ``none`` (one process), ``ddp`` (``DistributedDataParallel``, optionally ``static_graph``;
non-final micro-batches under ``no_sync()``), ``fsdp`` (FSDP2 ``fully_shard`` on each unit,
``distributed.fsdp_modules``, default the direct children with parameters, and the root;
``fsdp_cpu_offload`` adds ``CPUOffloadPolicy``: parameters, gradients and optimizer state on the CPU, the
torch-native ZeRO-Offload), and ``deepspeed`` (:class:`~drivetrain.engine.deepspeed_strategy.DeepSpeedRun`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from drivetrain.engine.config import ConfigError, TrainConfig
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.precision import LossScaler, unscale_clip_
from drivetrain.engine.undoable_update import OptimizerGraph, UndoableUpdate

__all__ = ["Strategy", "build_strategy"]


class Strategy:
    """One process (``none``), and the base of the torch-native data-parallel strategies.

    Args:
        model: the engine's model.
        cfg: the run's config.
        ctx: this process's place in the process group.
        make_optimizer: builds the AdamW from the model (after it is moved, sharded or wrapped).
        step: the compiled step as a module (``speed.compile_step``), wrapped in place of the model: DDP's reducer then
            prepares in the step's forward and reduces the gradients of its compiled backward. State stays the
            model's (``full_state``, ``sharded_state``: the same names as without it).
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        ctx: DistContext,
        make_optimizer: Callable[[nn.Module], Any],
        step: nn.Module | None = None,
    ) -> None:
        self.model, self.cfg, self.ctx = model, cfg, ctx
        self.wrapped = self._wrap(model if step is None else step)
        self.optimizer = make_optimizer(model)
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.scaler = LossScaler(cfg.precision, ctx.device)
        speed = cfg.speed  # speed.compile_step: the undoable update as one compiled graph (None when off)
        self.optimizer_graph = (
            OptimizerGraph(self.optimizer, speed.compile_step_backend, speed.compile_step_mode)
            if speed.compile_step
            else None
        )
        self._update = self.optimizer_graph or UndoableUpdate(self.optimizer)

    def _wrap(self, model: nn.Module) -> nn.Module:
        return model.to(self.ctx.device)

    @contextlib.contextmanager
    def sync_grads(self, enabled: bool) -> Iterator[None]:
        """Context for one micro-batch's backward: reduce gradients across ranks only if ``enabled``.

        One process has nothing to reduce, so here it does nothing.
        """
        yield

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` (a scalar) multiplied by the loss scale."""
        self.scaler.scale_loss(loss).backward()

    def unscale_and_clip(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Unscale and clip the gradients in place: ``(grad_norm, grads_bad)`` (see ``unscale_clip_``)."""
        return unscale_clip_(self.params, self.scaler, self.cfg.optim.clip_norm)

    def step(
        self, apply: bool | torch.Tensor, overflow: torch.Tensor, grad_norm: torch.Tensor
    ) -> tuple[torch.Tensor, Any, bool | torch.Tensor]:
        """Apply the update if ``apply`` (a bool; or a () bool device flag, not read: the update is taken undoably and
        :meth:`settle` follows); back the fp16 loss scale off on ``overflow``; zero the gradients."""
        scale = self.scaler.scale.clone()
        if isinstance(apply, torch.Tensor):
            self._update.step()
        elif apply:
            self.optimizer.step()
        self.scaler.update(overflow)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, scale, apply

    def settle(self, applied: bool) -> bool:
        """After the host read of a device ``apply`` flag: keep the update taken, or undo it exactly; returns
        ``applied``."""
        self._update.settle(applied)
        return applied

    def full_state(self) -> tuple[dict, dict]:
        """Full model and optimizer state dicts on CPU (complete on rank 0)."""
        model_sd = {
            k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in self.model.state_dict().items()
        }
        return model_sd, self.optimizer.state_dict()

    def load_full_state(self, model_sd: dict, optim_sd: dict) -> None:
        """Load full state dicts (every rank passes the complete dicts read from the checkpoint; the optimizer's
        parameters keyed by number or by name, whichever strategy wrote it)."""
        self.model.load_state_dict(model_sd)
        names = _param_names(self.model, self.optimizer)
        self.optimizer.load_state_dict(_rekeyed(optim_sd, names, list(range(len(names)))))

    def sharded_state(self, *, create: bool = False) -> tuple[dict, dict]:
        """Model and optimizer state dicts of this rank's tensors, parameters named by their path
        (``get_state_dict``: DTensor shards under FSDP, no gather; the live tensors, not copies).

        Args:
            create: give an optimizer that has not stepped yet its state first (``get_state_dict`` does that with a
                step at lr 0, which counts in AdamW's ``step``: only for templates that a load overwrites). Without
                it such an optimizer's dict has no state, as ``optimizer.state_dict()`` has.
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if create or self.optimizer.state:
            return get_state_dict(self.model, self.optimizer)
        names = {id(p): name for name, p in self.model.named_parameters()}
        groups = [
            {**{k: v for k, v in group.items() if k != "params"}, "params": [names[id(p)] for p in group["params"]]}
            for group in self.optimizer.param_groups
        ]
        return get_model_state_dict(self.model), {"state": {}, "param_groups": groups}

    def load_sharded_state(self, model_sd: dict, optim_sd: dict, *, full: bool) -> None:
        """Load :meth:`sharded_state`'s dicts (``full``: whole tensors on every rank, sharded here as needed)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(
            self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
            options=StateDictOptions(full_state_dict=full),
        )  # fmt: skip
        if not optim_sd["state"]:  # saved before the first step: set_state_dict made a state; the run had none
            self.optimizer.state.clear()


class DDPStrategy(Strategy):
    """``DistributedDataParallel``; non-final micro-batches run under ``no_sync()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._first_iteration = True

    def _wrap(self, model: nn.Module) -> nn.Module:
        dcfg, device = self.cfg.distributed, self.ctx.device
        return nn.parallel.DistributedDataParallel(
            model.to(device),
            device_ids=[device.index] if device.type == "cuda" else None,
            static_graph=dcfg.static_graph,
            find_unused_parameters=dcfg.find_unused_parameters,
        )

    @contextlib.contextmanager
    def sync_grads(self, enabled: bool) -> Iterator[None]:
        # DDP static_graph records the graph on its first iteration and fails inside no_sync() there (reducer
        # assert); reducing every micro-batch of that one iteration gives the same gradients (up to rounding).
        if enabled or (self._first_iteration and self.cfg.distributed.static_graph):
            yield
        else:
            with self.wrapped.no_sync():
                yield

    def step(
        self, apply: bool | torch.Tensor, overflow: torch.Tensor, grad_norm: torch.Tensor
    ) -> tuple[torch.Tensor, Any, bool | torch.Tensor]:
        self._first_iteration = False
        return super().step(apply, overflow, grad_norm)


class FSDPStrategy(Strategy):
    """FSDP2 ``fully_shard`` (optionally with CPU offload); reduction off on non-final micro-batches."""

    def _wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        dcfg = self.cfg.distributed
        if not dcfg.fsdp_cpu_offload:
            model.to(self.ctx.device)
        pin = self.ctx.device.type == "cuda"
        offload = CPUOffloadPolicy(pin_memory=pin) if dcfg.fsdp_cpu_offload else OffloadPolicy()
        mp = MixedPrecisionPolicy()
        if self.cfg.precision.mode != "fp32":  # gather parameters in the compute dtype; reduce gradients in fp32
            dtype = torch.bfloat16 if self.cfg.precision.mode == "bf16" else torch.float16
            mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        kwargs = {"mp_policy": mp, "offload_policy": offload, "reshard_after_forward": dcfg.fsdp_reshard_after_forward}
        for unit in _fsdp_units(model, dcfg.fsdp_modules):
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        return model

    @contextlib.contextmanager
    def sync_grads(self, enabled: bool) -> Iterator[None]:
        self.wrapped.set_requires_gradient_sync(enabled)
        yield

    def full_state(self) -> tuple[dict, dict]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_state_dict(self.model, self.optimizer, options=opts)

    def load_full_state(self, model_sd: dict, optim_sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        opts = StateDictOptions(full_state_dict=True)
        names = _param_names(self.model, self.optimizer)
        optim_sd = _rekeyed(optim_sd, names, names)  # keyed by name, as get_state_dict writes it
        set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=opts)


def _param_names(model: nn.Module, optimizer: Any) -> list[str]:
    """The names of the optimizer's parameters, in its order (the order ``optimizer.state_dict()`` numbers them)."""
    names = {param: name for name, param in model.named_parameters()}
    return [names[param] for group in optimizer.param_groups for param in group["params"]]


def _rekeyed(optim_sd: dict, names: list[str], keys: list[Any]) -> dict:
    """A full optimizer state dict with its parameters keyed by ``keys`` (this optimizer's, in its order).

    ``optimizer.state_dict()`` (strategies none and ddp) numbers the parameters in the optimizer's order;
    ``get_state_dict`` (fsdp) names them. A checkpoint of one loads under the other: a number is the parameter at
    that place of ``names``, a name the parameter of that name (one ValueError line for a name this model lacks).
    """
    saved = [key for group in optim_sd["param_groups"] for key in group["params"]]
    place = {name: i for i, name in enumerate(names)}
    unknown = [key for key in saved if not (key in place if isinstance(key, str) else 0 <= key < len(names))]
    if unknown:
        raise ValueError(f"optimizer: the checkpoint holds parameter {unknown[0]!r}, which this model has not")
    new = {key: keys[place[key] if isinstance(key, str) else key] for key in saved}
    return {
        "state": {new[key]: value for key, value in optim_sd["state"].items()},
        "param_groups": [
            {**group, "params": [new[key] for key in group["params"]]} for group in optim_sd["param_groups"]
        ],
    }


def _fsdp_units(model: nn.Module, names: list[str]) -> list[nn.Module]:
    if names:
        units = []
        for name in names:
            try:
                units.append(model.get_submodule(name))
            except AttributeError:
                raise ConfigError(f"distributed.fsdp_modules: the model has no module {name!r}") from None
        return units
    return [m for m in model.children() if any(True for _ in m.parameters())]


def build_strategy(
    model: nn.Module,
    cfg: TrainConfig,
    ctx: DistContext,
    make_optimizer: Callable[[nn.Module], Any],
    step: nn.Module | None = None,
) -> Strategy:
    """The strategy ``ctx.strategy`` names, with the model moved/wrapped and the optimizer built.

    Args:
        model: the engine's model.
        cfg: the run's config.
        ctx: this process's place in the process group.
        make_optimizer: builds the AdamW from the model.
        step: the compiled step's module (``speed.compile_step``, which the config allows under ``none`` and ``ddp``),
            wrapped in place of the model.
    """
    if ctx.strategy == "deepspeed":
        from drivetrain.engine.deepspeed_strategy import DeepSpeedRun

        return DeepSpeedRun(model, cfg, ctx, make_optimizer)  # type: ignore[return-value]
    kinds: dict[str, type[Strategy]] = {"none": Strategy, "ddp": DDPStrategy, "fsdp": FSDPStrategy}
    return kinds[ctx.strategy](model, cfg, ctx, make_optimizer, step)
