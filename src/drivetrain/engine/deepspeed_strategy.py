"""DeepSpeed ZeRO (stages 1–3, optimizer and parameter offload) as the engine's ``deepspeed`` strategy.

DeepSpeed wraps the engine's own model and optimizer (``deepspeed.initialize(model=..., optimizer=...)``):

- **Optimizer.** The engine's ``torch.optim.AdamW`` with its param groups (``lr_mult``, per-group weight
  decay) is passed as DeepSpeed's client optimizer; ZeRO swaps each group's parameters for this rank's flat
  fp32 partition and keeps the other group keys, so the trainer sets ``group["lr"]`` from the pure-function
  schedule every step exactly as under DDP. With ``offload_optimizer`` DeepSpeed would insist on its
  ``DeepSpeedCPUAdam`` (a compiled op); ``zero_force_ds_cpu_optimizer: false`` lets torch's AdamW run the
  step on the CPU partitions instead: the same arithmetic as the other strategies, slower than the
  vectorised C++ kernel on large models.
- **Accumulation.** ``gradient_accumulation_steps = train.accumulation``; the trainer divides the loss by it
  (``backward(..., scale_wrt_gas=False)``), marks only the last micro-batch as the accumulation boundary
  (``set_gradient_accumulation_boundary`` in ``distributed.grad_sync``) and calls :meth:`DeepSpeedRun.step`
  once per iteration.
- **Clipping, finiteness, precision.** ``gradient_clipping = optim.clip_norm``; DeepSpeed measures the global
  norm (before clipping). From 0.19.8 on (``engine.config.DEEPSPEED_MIN``, required) it skips the step and clears
  the gradients when that norm is not finite, at every ZeRO stage and in every precision (bf16 at ZeRO-1/2 with
  ``check_grad_overflow``, set here); older versions, by their source (0.16–0.19.6), checked fp16 only, so a NaN
  gradient reached AdamW. A non-finite loss is turned into NaN gradients (:meth:`DeepSpeedRun.backward`) so that
  the same check skips that step.
  ``precision.mode`` bf16/fp16 map to DeepSpeed's ``bf16`` / ``fp16`` sections (fp16: its dynamic loss
  scale from ``init_scale``, ``growth_interval``, ``hysteresis``, ``min_scale``); fp32 uses neither.
- **Buffers** are broadcast from rank 0 before every training forward, as under DDP.
- **Checkpoints** stay the engine's own format: :meth:`DeepSpeedRun.full_state` gathers the fp32 master
  weights and AdamW moments of every parameter (``deepspeed.utils.safe_get_full_*``, collective) into
  the state dicts a 1-process run writes; :meth:`DeepSpeedRun.load_full_state` scatters them back.

DeepSpeed must be imported after ``DS_ACCELERATOR`` is set (``cpu`` for CPU runs); :func:`import_deepspeed`
does that.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from drivetrain.engine.config import ConfigError, TrainConfig
from drivetrain.engine.precision import LossScaler

__all__ = ["DeepSpeedRun", "deepspeed_config", "import_deepspeed"]

_ADAMW_STATE = ("exp_avg", "exp_avg_sq")


def import_deepspeed(device: torch.device) -> Any:
    """Import DeepSpeed for ``device`` (sets ``DS_ACCELERATOR=cpu`` first on the CPU); quiet its INFO logs."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        from deepspeed.accelerator import get_accelerator
    except ImportError as err:
        raise ConfigError(
            f"distributed.strategy: 'deepspeed' needs the deepspeed package ({err}); "
            "pip install 'drivetrain[deepspeed]'"
        ) from None
    accelerator = get_accelerator().device_name()
    if accelerator != device.type:
        raise ConfigError(
            f"train.device: the run uses {device.type} but DeepSpeed's accelerator is {accelerator!r} "
            "(set DS_ACCELERATOR to match, before anything imports deepspeed)"
        )
    deepspeed.utils.logger.setLevel(logging.WARNING)
    return deepspeed


def deepspeed_config(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config dict of a run (batch sizes, accumulation, clipping, ZeRO, precision)."""
    dcfg, pcfg = cfg.distributed, cfg.precision
    zero: dict[str, Any] = {"stage": dcfg.deepspeed_zero_stage}
    if dcfg.deepspeed_offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if dcfg.deepspeed_offload_params:
        zero["offload_param"] = {"device": "cpu"}
    out: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.data.batch_size,
        "gradient_accumulation_steps": cfg.train.accumulation,
        "train_batch_size": cfg.data.batch_size * cfg.train.accumulation * world_size,
        "gradient_clipping": cfg.optim.clip_norm or 0.0,
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,  # the engine's torch AdamW runs the offloaded step (see above)
        "steps_per_print": 2**62,  # the engine logs; DeepSpeed's own progress lines stay off
        "wall_clock_breakdown": False,
    }
    if pcfg.mode == "bf16":  # ZeRO-1/2 skip non-finite gradients under bf16 only with check_grad_overflow (from 0.17.1;
        out["bf16"] = {"enabled": True, "check_grad_overflow": True}  # off by default before 0.19.3, ignored before)
    elif pcfg.mode == "fp16":
        out["fp16"] = {
            "enabled": True,
            "initial_scale_power": round(math.log2(pcfg.init_scale)),
            "loss_scale_window": pcfg.growth_interval,
            "hysteresis": pcfg.hysteresis,
            "min_loss_scale": int(pcfg.min_scale),  # an integer in DeepSpeed's schema (0.17.1 on; checked whole)
        }
    return out


def _broadcast_buffers(module: nn.Module, args: Any) -> None:
    """Give every rank rank 0's buffers before a training forward, as DDP does (``broadcast_buffers``).

    DeepSpeed broadcasts buffers only once, at initialisation; a buffer updated in forward (running
    statistics, a streaming memory) would then drift apart per rank while checkpoints hold rank 0's.
    """
    if module.training:
        for buffer in module.buffers():
            torch.distributed.broadcast(buffer, src=0)


class DeepSpeedRun:
    """A model and the engine's AdamW under ``deepspeed.initialize``: the engine's ``deepspeed`` strategy
    (the interface of :class:`drivetrain.engine.strategy.Strategy`).

    Args:
        model: the engine's model (moved to this rank's device; DeepSpeed keeps it as ``engine.module``).
        cfg: the run's config.
        ctx: this process's place in the process group.
        make_optimizer: builds the engine's AdamW (param groups with ``lr_mult``) from ``model``.
    """

    def __init__(self, model: nn.Module, cfg: TrainConfig, ctx: Any, make_optimizer: Any) -> None:
        device = ctx.device
        model.to(device)
        optimizer = make_optimizer(model)
        deepspeed = import_deepspeed(device)
        self._utils = deepspeed.utils
        self._gathered = deepspeed.zero.GatheredParameters
        backend = cfg.distributed.backend if cfg.distributed.backend != "auto" else None
        deepspeed.init_distributed(dist_backend=backend or ("nccl" if device.type == "cuda" else "gloo"))
        # The optimizer's layout before ZeRO replaces each group's parameters by a flat partition.
        self._template = optimizer.state_dict()["param_groups"]
        self._group_params = [list(group["params"]) for group in optimizer.param_groups]
        names = {p: n for n, p in model.named_parameters()}
        self._param_names = [names[p] for params in self._group_params for p in params]
        self.engine, self.ds_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=deepspeed_config(cfg, ctx.world_size)
        )
        self.model, self.device = model, device
        self.wrapped = self.engine
        self.optimizer = optimizer  # param_groups now hold flat fp32 partitions; the trainer sets lr here
        self.params = self._params()
        self.scaler = LossScaler(cfg.precision, device, enabled=False)  # DeepSpeed scales fp16 losses itself
        self._create_adamw_state()
        model.register_forward_pre_hook(_broadcast_buffers)

    # ------------------------------------------------------------------ the step
    @contextlib.contextmanager
    def sync_grads(self, enabled: bool) -> Iterator[None]:
        """Only the last micro-batch is DeepSpeed's gradient-accumulation boundary."""
        self.engine.set_gradient_accumulation_boundary(enabled)
        yield

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss`` (already divided by the accumulation); a non-finite loss gives NaN gradients,
        so DeepSpeed's finiteness check skips the step as the engine does for other strategies."""
        poison = torch.where(torch.isfinite(loss.detach()), 1.0, float("nan"))  # () float32
        self.engine.backward(loss * poison, scale_wrt_gas=False)

    def unscale_and_clip(self) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSpeed unscales, clips and checks the gradients inside its step: nothing to do here."""
        return torch.full((), float("nan"), device=self.device), torch.zeros((), dtype=torch.bool, device=self.device)

    def step(self, apply: bool, overflow: torch.Tensor, grad_norm: torch.Tensor) -> tuple[torch.Tensor, Any, bool]:
        """Clip, check and apply the update, zero the gradients. DeepSpeed decides the skip itself (a non-finite
        loss made the gradients NaN), so ``apply`` and ``overflow`` are the engine's view only.

        Returns:
            ``(grad_norm, loss_scale, applied)``: the global gradient norm before clipping (float32 scalar,
            inf when the step was skipped), the loss scale the micro-batches used and whether the update
            was applied (False when DeepSpeed found non-finite gradients).
        """
        scale = float(getattr(self.ds_optimizer, "loss_scale", 1.0))  # sync: fp16 only, a tensor DeepSpeed keeps
        self.engine.step()  # sync: DeepSpeed reads the gradients' finiteness on the host to skip a step
        norm = self.engine.get_global_grad_norm()
        norm = torch.as_tensor(float("nan") if norm is None else norm).detach().to(self.device, torch.float32)
        return norm, torch.tensor(scale, device=self.device), self.engine.was_step_applied()

    # ------------------------------------------------------------------ full state dicts
    def _params(self) -> list[nn.Parameter]:
        return [p for params in self._group_params for p in params]

    def full_state(self) -> tuple[dict, dict]:
        """Full model (fp32 master weights) and AdamW state dicts on CPU, on every rank (collective).

        The layout is that of ``model.state_dict()`` and ``torch.optim.AdamW.state_dict()`` in a 1-process run (the
        parameters keyed by number, where the other strategies' checkpoints key them by name: a DeepSpeed checkpoint
        resumes only under DeepSpeed, :mod:`drivetrain.engine.resume`).
        """
        with self._gathered(list(self.model.parameters())):  # stage 3: full values of frozen params, buffers
            current = self.model.state_dict()
            model_sd = {k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in current.items()}
        steps = [s["step"] for s in self.optimizer.state.values() if s["step"] > 0]
        state: dict[int, dict[str, torch.Tensor]] = {}
        for index, (name, param) in enumerate(zip(self._param_names, self._params(), strict=True)):
            model_sd[name] = self._utils.safe_get_full_fp32_param(param).detach().cpu().clone()
            if steps:
                state[index] = {"step": steps[0].detach().cpu().clone()}
                for key in _ADAMW_STATE:
                    value = self._utils.safe_get_full_optimizer_state(param, key)
                    state[index][key] = value.detach().cpu().clone()
        return model_sd, {"state": state, "param_groups": self._current_groups()}

    def _current_groups(self) -> list[dict[str, Any]]:
        out = []
        for template, group in zip(self._template, self.optimizer.param_groups, strict=True):
            out.append({k: (group[k] if k != "params" else v) for k, v in template.items()})
        return out

    def load_full_state(self, model_sd: dict, optim_sd: dict) -> None:
        """Load full state dicts (every rank passes the complete dicts): model, fp32 masters, AdamW state."""
        with self._gathered(list(self.model.parameters()), modifier_rank=0):
            self.model.load_state_dict(model_sd)
        for state in self.optimizer.state.values():
            state["step"].fill_(optim_sd["state"][0]["step"] if optim_sd["state"] else 0)
        for index, (name, param) in enumerate(zip(self._param_names, self._params(), strict=True)):
            self._utils.safe_set_full_fp32_param(param, model_sd[name])
            for key in _ADAMW_STATE if optim_sd["state"] else ():
                self._utils.safe_set_full_optimizer_state(param, optim_sd["state"][index][key], key)
        for group, saved in zip(self.optimizer.param_groups, optim_sd["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})

    def _create_adamw_state(self) -> None:
        """AdamW state, as its first step would create it, for every flat partition; linked to each parameter.

        ZeRO 1/2 link per-parameter views of the optimizer state after the first step of the first param
        group, when the other groups have no state yet (DeepSpeed 0.19.8): their moments could then never be
        gathered. Creating the state up front links every group; AdamW uses existing state as it finds it.
        """
        for group in self.optimizer.param_groups:
            for flat in group["params"]:
                self.optimizer.state[flat] = {
                    "step": torch.zeros((), dtype=torch.float32),
                    "exp_avg": torch.zeros_like(flat, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(flat, memory_format=torch.preserve_format),
                }
        link = getattr(self.ds_optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:  # ZeRO 1/2; ZeRO 3 reads optimizer.state[flat partition] directly
            self.ds_optimizer._hp_optimizer_states_linked = False
            link()
