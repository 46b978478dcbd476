"""The process group's store when torchrun restarts the workers: a namespace of this attempt's own.

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

import torch.distributed as dist

__all__ = ["agree_on_attempt", "attempt_store", "uses_agent_store"]

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
