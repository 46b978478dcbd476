"""torchrun process groups, DDP and FSDP2 wrapping, gradient-sync control and full state dicts.

Launch with ``torchrun`` (it sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR/PORT``); a plain
``python`` / ``drivetrain train`` run is one process. Strategies:

- ``ddp``: ``DistributedDataParallel`` (optionally ``static_graph``); non-final micro-batches of an
  accumulation run under ``no_sync()`` (no all-reduce).
- ``fsdp``: FSDP2 ``fully_shard`` on each unit (``distributed.fsdp_modules``, default the direct children
  with parameters) and on the root; ``fsdp_cpu_offload`` adds ``CPUOffloadPolicy`` (parameters, gradients
  and optimizer state live on the CPU; the optimizer step runs there): the torch-native ZeRO-Offload.
  Gradient reduction is disabled on non-final micro-batches with ``set_requires_gradient_sync(False)``.

- ``deepspeed``: the model is moved to the device here; :mod:`drivetrain.engine.deepspeed_strategy` wraps
  it together with the optimizer. Only the last micro-batch is the accumulation boundary.

Checkpoints hold full (unsharded) state dicts gathered to rank 0, so a run can resume under any strategy
with the same number of ranks.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from drivetrain.engine.config import ConfigError, TrainConfig

__all__ = ["DistContext", "full_state", "grad_sync", "load_full_state", "setup", "teardown", "wrap_model"]


@dataclass(frozen=True)
class DistContext:
    """Where this process runs: rank, world size, local rank, device; ``initialized`` if a group exists."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    strategy: str
    initialized: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.initialized:
            dist.barrier()

    def gather_to_main(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (small, picklable by torch.distributed) on every rank, in rank order."""
        if not self.initialized:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        if self.initialized:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        if self.initialized:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t = t / self.world_size
        return t


def setup(cfg: TrainConfig) -> DistContext:
    """Join the torchrun process group (if launched by torchrun) and pick this rank's device."""
    strategy = cfg.distributed.strategy
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if strategy == "none" and world > 1:
        raise ConfigError(
            f"distributed.strategy: launched with WORLD_SIZE={world} but the strategy is 'none'; "
            "set ddp, fsdp or deepspeed"
        )
    if strategy != "none" and "RANK" not in os.environ:
        raise ConfigError(
            f"distributed.strategy: {strategy!r} needs a torchrun launch (RANK/WORLD_SIZE are not set); "
            "run `torchrun --nproc_per_node N -m drivetrain.cli.main train ...`"
        )
    want = cfg.train.device
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda was asked for but no CUDA device is available")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    initialized = False
    if strategy != "none":
        backend = cfg.distributed.backend
        if backend == "auto":
            backend = "nccl" if use_cuda else "gloo"
        if not dist.is_initialized():
            kwargs: dict[str, Any] = {"backend": backend, "timeout": _dt.timedelta(minutes=30)}
            if use_cuda:
                kwargs["device_id"] = device
            dist.init_process_group(**kwargs)
        initialized = True
    return DistContext(rank, world, local_rank, device, strategy, initialized)


def teardown(ctx: DistContext) -> None:
    """Leave the process group once every rank is done.

    gloo's worker threads can hold the last reference to a finished collective whose tensors are Python
    objects; freeing them takes the GIL. Destroying the group joins those threads from the main thread, which
    holds the GIL: a deadlock (seen at exit of a DDP run on a loaded 2-core machine, rank 1 stuck in
    ``~ProcessGroupGloo`` → ``thread::join`` while its worker waited in ``gil_scoped_acquire``). A barrier and
    a short sleep, which releases the GIL, let the workers finish first. Callers drop their DDP wrappers
    (whose reducers hold the group) before this, so the group dies here and not at a later garbage collection.
    """
    if ctx.initialized and dist.is_initialized():
        dist.barrier()
        time.sleep(0.05)
        dist.destroy_process_group()


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


def wrap_model(model: nn.Module, cfg: TrainConfig, ctx: DistContext) -> nn.Module:
    """Move ``model`` to the device and wrap it for the strategy; returns what to call for forward.

    For FSDP the model is sharded in place (the returned module is ``model`` itself); build the optimizer
    from ``model.parameters()`` after this call.
    """
    dcfg = cfg.distributed
    if ctx.strategy == "fsdp":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        if not dcfg.fsdp_cpu_offload:
            model.to(ctx.device)
        offload = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda") if dcfg.fsdp_cpu_offload else OffloadPolicy()
        mp = MixedPrecisionPolicy()
        if cfg.precision.mode != "fp32":  # gather parameters in the compute dtype; reduce gradients in fp32
            dtype = torch.bfloat16 if cfg.precision.mode == "bf16" else torch.float16
            mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        kwargs = {"mp_policy": mp, "offload_policy": offload, "reshard_after_forward": dcfg.fsdp_reshard_after_forward}
        for unit in _fsdp_units(model, dcfg.fsdp_modules):
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        return model
    model.to(ctx.device)
    if ctx.strategy == "ddp":
        return nn.parallel.DistributedDataParallel(
            model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            static_graph=dcfg.static_graph,
            find_unused_parameters=dcfg.find_unused_parameters,
        )
    return model


@contextlib.contextmanager
def grad_sync(wrapped: nn.Module, ctx: DistContext, enabled: bool) -> Iterator[None]:
    """Within this context, backward reduces gradients across ranks only if ``enabled`` (final micro-batch)."""
    if ctx.strategy == "ddp" and not enabled:
        with wrapped.no_sync():
            yield
    elif ctx.strategy == "fsdp":
        wrapped.set_requires_gradient_sync(enabled)
        yield
    elif ctx.strategy == "deepspeed":  # ``wrapped`` is the DeepSpeed engine
        wrapped.set_gradient_accumulation_boundary(enabled)
        yield
    else:
        yield


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext) -> tuple[dict, dict]:
    """Full model and optimizer state dicts on CPU (complete on rank 0; other ranks may get empty dicts)."""
    if ctx.strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_state_dict(model, optimizer, options=opts)
    model_sd = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}
    return model_sd, optimizer.state_dict()


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict, ctx: DistContext
) -> None:
    """Load full state dicts (every rank passes the complete dicts it read from the checkpoint)."""
    if ctx.strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        opts = StateDictOptions(full_state_dict=True)
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=opts)
        return
    model.load_state_dict(model_sd)
    optimizer.load_state_dict(optim_sd)
