"""torchrun process groups: joining one, this rank's device, the collectives the engine uses, leaving.

Launch with ``torchrun`` (it sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR/PORT``); a plain
``python`` / ``drivetrain train`` run is one process. How the model is wrapped, its gradients synchronised
and its state gathered is each strategy's business: :mod:`drivetrain.engine.strategy`.

**Restarts.** The process group's store when torchrun restarts the workers: a namespace of this attempt's own.

Under torchrun's elastic agent (``--rdzv-backend c10d``, the default of torch ≥ 2.5, and ``static``) the workers do
not host the store their process group starts from: the agent does, and it outlives the workers. torchrun tells
them so with ``TORCHELASTIC_USE_AGENT_STORE=True`` (set in
``torch/distributed/elastic/agent/server/local_elastic_agent.py``, ``LocalElasticAgent._start_workers``). The c10d
rendezvous creates that TCPStore server once per agent and hands it to every later round
(``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``, ``DynamicRendezvousHandler.next_rendezvous``:
``_shared_tcp_store_server`` is built only "when this is the first rendezvous"); the static rendezvous keeps its one
store too. ``init_process_group("env://")`` connects to it and uses fixed key names
(``torch/distributed/rendezvous.py``, ``_create_c10d_store``: "We create a new TCPStore for every retry so no need
to add prefix for each attempt" — which is not so for the shared server). So when torchrun restarts the workers
(``--max-restarts``, a worker died), the new workers find the dead ones' keys — gloo's per-rank addresses — under
the names they are about to write: a rank that reads a peer's key before that peer rewrites it connects to the
previous attempt's address and fails with "Connection refused", or waits in gloo's connect until its timeout.
``TORCHELASTIC_RESTART_COUNT`` cannot name the attempt: each agent counts its own restarts, and a restart for a
membership change counts none (``SimpleElasticAgent._invoke_run``), so nodes disagree on it (pytorch#135712).

:func:`attempt_store` gives the workers of one attempt a namespace no earlier attempt wrote: rank 0 publishes a
fresh random token under a fixed key; every other rank reads the key and answers under the token it read with a
fresh token of its own; rank 0 confirms each answer under the answering rank's token. A rank that read an earlier
attempt's token never gets a confirmation (that rank 0 is dead, and no earlier key can name the fresh token), so
it reads the key again until it reads the current one. The process group then runs in a ``PrefixStore`` named by
rank 0's token. This needs only that the workers of earlier attempts are gone when the new ones start, which
torchrun guarantees (it stops every worker group before the next rendezvous round completes).
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from drivetrain.engine.config import ConfigError, TrainConfig

__all__ = [
    "DistContext",
    "agree_on_attempt",
    "attempt_store",
    "exit_failed",
    "process_group_backend",
    "setup",
    "teardown",
    "uses_agent_store",
]


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
    attempt (:func:`drivetrain.engine.distributed.attempt_store`), so that ``torchrun --max-restarts K`` restarts
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
        backend = process_group_backend(cfg, use_cuda)
        if not dist.is_initialized():
            kwargs: dict[str, Any] = {"backend": backend, "timeout": _dt.timedelta(seconds=cfg.distributed.timeout_s)}
            if use_cuda:
                kwargs["device_id"] = device
            if uses_agent_store():  # torchrun's agent store outlives a restart: start in this attempt's own keys
                kwargs.update(store=attempt_store(rank, world, kwargs["timeout"]), rank=rank, world_size=world)
            dist.init_process_group(**kwargs)
        initialized = True
    return DistContext(rank, world, local_rank, device, strategy, initialized)


def process_group_backend(cfg: TrainConfig, use_cuda: bool) -> str:
    """The ``backend`` argument of ``init_process_group`` for this run: ``distributed.backend`` (``auto``: NCCL on CUDA,
    gloo on the CPU), with gloo for CPU tensors beside NCCL (``"cuda:nccl,cpu:gloo"``) under FSDP2 CPU offload.

    An NCCL group reduces CUDA tensors only ("No backend type associated with device type cpu"). Under
    ``fsdp_cpu_offload`` the gradients are DTensors whose local shards live on the CPU, so the gradient norm's
    reduction (``torch.nn.utils.get_total_norm``: a partial norm all-reduced over the mesh, pytorch#148532) and the full
    state dicts' gathers run on CPU tensors; they take the gloo half, everything on CUDA the NCCL half.

    Args:
        cfg: the run's config (``distributed``).
        use_cuda: the ranks run on CUDA devices.

    Returns:
        ``"gloo"``, ``"nccl"`` or ``"cuda:nccl,cpu:gloo"``.
    """
    dcfg = cfg.distributed
    backend = dcfg.backend if dcfg.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and dcfg.strategy == "fsdp" and dcfg.fsdp_cpu_offload:
        return "cuda:nccl,cpu:gloo"
    return backend


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


# How long a failed rank waits before it exits: longer than torchrun's --monitor-interval (0.1 s by default), so that
# torchrun, which names the first worker it sees exit as the root cause, sees a peer that failed first before it.
EXIT_DELAY_S = 1.0


def exit_failed(err: BaseException | None, code: int) -> NoReturn:
    """End this rank of a process group after a failure that may be its own alone: ``err``'s traceback (None when a
    handler printed its line), then ``os._exit(code)``, with no further collective.

    The other ranks may be in a collective this rank would never join: teardown's barrier, or the interpreter's
    teardown of the process group, would wait for them until ``distributed.timeout_s``. torchrun sees the exit and
    stops the other ranks (a gloo rank whose collective fails on the closed connection exits through here too, after
    :data:`EXIT_DELAY_S`: torchrun then names the rank that failed first as the root cause).
    """
    import sys
    import traceback

    if err is not None:
        traceback.print_exception(err)
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(EXIT_DELAY_S)
    os._exit(code)


POLL_S = 0.05  # how often a rank that has not been confirmed reads the leader key again


def uses_agent_store() -> bool:
    """True when torchrun's agent hosts the store the process group starts from (``TORCHELASTIC_USE_AGENT_STORE``)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def attempt_store(rank: int, world_size: int, timeout: _dt.timedelta) -> dist.Store:
    """A store for ``init_process_group`` that only this restart attempt's workers share.

    Connects to the agent's store at ``MASTER_ADDR:MASTER_PORT`` as a client (as torch's ``env://`` does under the
    agent) and agrees with the other ranks on a fresh namespace (the module docstring has the protocol).

    Args:
        rank: this process's global rank (``RANK``).
        world_size: the number of ranks (``WORLD_SIZE``).
        timeout: how long to wait for the store and for the other ranks.

    Returns:
        A ``PrefixStore`` over the agent's store, named by this attempt.

    Raises:
        RuntimeError: another rank did not answer within ``timeout`` (torch's store timeout error).
    """
    client = dist.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        world_size=world_size,
        is_master=False,
        timeout=timeout,
    )
    base = f"drivetrain/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}"
    token = agree_on_attempt(client, base, rank, world_size, timeout)
    return dist.PrefixStore(f"{base}/attempt-{token}/", client)


def agree_on_attempt(store: dist.Store, base: str, rank: int, world_size: int, timeout: _dt.timedelta) -> str:
    """The token that rank 0 of this attempt publishes under ``base``: every rank of the attempt returns the same one,
    never an earlier attempt's (the module docstring has the protocol).

    Args:
        store: the store every rank of every attempt shares.
        base: the key prefix of the handshake.
        rank: this rank.
        world_size: the number of ranks of this attempt.
        timeout: how long to wait for the other ranks.

    Returns:
        The attempt's token (16 hex digits).
    """
    leader = f"{base}/leader"
    mine = secrets.token_hex(8)
    if rank == 0:
        store.set(leader, mine)
        others = range(1, world_size)
        store.wait([f"{base}/{mine}/join/{r}" for r in others], timeout)
        for r in others:
            answer = store.get(f"{base}/{mine}/join/{r}").decode()
            store.set(f"{base}/{mine}/welcome/{r}/{answer}", "1")
        return mine
    deadline = time.monotonic() + timeout.total_seconds()
    read = None
    while True:
        token = store.get(leader).decode()  # blocks until the first attempt's rank 0 has written it
        if token != read:
            store.set(f"{base}/{token}/join/{rank}", mine)
            read = token
        if store.check([f"{base}/{token}/welcome/{rank}/{mine}"]):
            return token
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"rank {rank}: rank 0 of this torchrun attempt did not answer within {timeout.total_seconds():.0f} s"
            )
        time.sleep(POLL_S)
