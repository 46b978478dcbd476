"""torchrun process groups: joining one, this rank's device, the collectives the engine uses, leaving.

Launch with ``torchrun`` (it sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR/PORT``); a plain
``python`` / ``drivetrain train`` run is one process. How the model is wrapped, its gradients synchronised
and its state gathered is each strategy's business: :mod:`drivetrain.engine.strategy`.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from drivetrain.engine.config import ConfigError, TrainConfig
from drivetrain.engine.elastic_store import attempt_store, uses_agent_store

__all__ = ["DistContext", "setup", "teardown"]


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
        """True on rank 0."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every rank (a no-op without a process group)."""
        if self.initialized:
            dist.barrier()

    def gather_to_main(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (small, picklable by torch.distributed) on every rank, in rank order."""
        if not self.initialized:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_from_main(self, obj: Any) -> Any:
        """Rank 0's ``obj`` (small, picklable by torch.distributed) on every rank (``obj`` as is without a group)."""
        if not self.initialized:
            return obj
        out = [obj]
        dist.broadcast_object_list(out, src=0)
        return out[0]

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum of ``t`` over ranks, reduced in place and returned (``t`` as is without a group)."""
        if self.initialized:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise mean of ``t`` over ranks (``t`` as is without a group).

        ``t`` itself is overwritten with the sum over ranks; the mean is a new tensor.
        """
        if self.initialized:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t = t / self.world_size
        return t


def setup(cfg: TrainConfig) -> DistContext:
    """Join the torchrun process group (if launched by torchrun) and pick this rank's device.

    Under torchrun's agent store (c10d or static rendezvous) the group starts in a namespace of this restart
    attempt (:func:`drivetrain.engine.elastic_store.attempt_store`), so that ``torchrun --max-restarts K`` restarts
    work without ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``; otherwise from ``env://``.
    """
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
            "run `torchrun --nproc_per_node N --no-python drivetrain train ...`"
        )
    want = cfg.train.device
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda was asked for but no CUDA device is available")
    if use_cuda and local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"train.device: this process is LOCAL_RANK={local_rank} but {torch.cuda.device_count()} CUDA device(s) "
            "are visible; start at most one process per GPU (torchrun --nproc_per_node) or set train.device=cpu"
        )
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    initialized = False
    if strategy != "none":
        backend = cfg.distributed.backend
        if backend == "auto":
            backend = "nccl" if use_cuda else "gloo"
        if not dist.is_initialized():
            kwargs: dict[str, Any] = {"backend": backend, "timeout": _dt.timedelta(seconds=cfg.distributed.timeout_s)}
            if use_cuda:
                kwargs["device_id"] = device
            if uses_agent_store():  # torchrun's agent store outlives a restart: start in this attempt's own keys
                kwargs.update(store=attempt_store(rank, world, kwargs["timeout"]), rank=rank, world_size=world)
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
