"""Ranks agree, or nobody commits: at start every rank proves it sees rank 0's run folder and resumed the same state.

Every rank decides alone what it starts from — rank 0 checks the run folder, every rank finds the checkpoint
``--resume`` names in its own view of ``run.out_dir`` — and a rank whose folder is not rank 0's (each node with a
folder of its own at that path) or holds a stale copy would train from another state, diverge without a word and
commit checkpoints of the mix. So before the first collective of the run and before anything is written into the
run folder, :func:`agree_on_start` compares what every rank saw:

1. **The folder.** Rank 0 creates a token file ``.drivetrain-start-<random hex>`` in its ``run.out_dir`` (and the
   folder, when it is new) and sends its name to every rank (one broadcast); each rank looks for it in its own
   ``run.out_dir`` (for up to :data:`SEE_WAIT_S`: a network file system may show a new file late).
2. **One gather** of every rank's view: whether it sees the token, the ConfigError line it met while starting (if
   any), the checkpoint it resumed (its directory name and :meth:`~drivetrain.engine.checkpoint.Checkpointer.identity`,
   the digest of its ``COMMITTED`` marker, which records the state's size and SHA-256) and the digest of its config
   (without the :data:`NODE_LOCAL` keys, such as ``data.num_workers``, that a node may set for itself).

Rank 0 then removes the token (and the folder it created for it, when the start stops; a token that a start killed
in between leaves behind does not make a new folder "not empty": :func:`~drivetrain.engine.rundir.check_run_dir`).
Any difference is one :class:`RanksDisagree` line (a :class:`~drivetrain.engine.config.ConfigError`: ``drivetrain
train`` exits with status 2), the same on every rank, naming the first cause in this order: a rank that does not see
rank 0's folder, a rank that could not start (its own line; a line every rank met is given as is), ranks that resumed
different checkpoints (a node with a stale or unshared copy of ``checkpoints/``), ranks with different configs. Every
rank leaves at the same point, so none is left waiting in a collective, and nothing of the run was written.

The check costs a broadcast, a gather and a file made and removed; a rank that does not see the token waits
:data:`SEE_WAIT_S` before it says so.

A process alone (no process group, or a group of one) skips all of it: its start errors are raised as they come.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

import yaml

from drivetrain.engine.checkpoint import Checkpointer, CheckpointError
from drivetrain.engine.config import ConfigError, TrainConfig, config_to_dict
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.rundir import START_TOKEN

__all__ = ["NODE_LOCAL", "SEE_WAIT_S", "RanksDisagree", "agree_on_start", "disagreement"]

# Keys a node may set for itself (they change neither what is learned nor when the ranks meet in a collective).
NODE_LOCAL = ("run.threads", "data.num_workers", "data.pin_memory", "data.persistent_workers", "data.prefetch_factor")
# How long a rank looks for rank 0's token before it counts as unseen (a shared file system may show it late).
SEE_WAIT_S = 2.0


class RanksDisagree(ConfigError):
    """The ranks of a run did not start from the same run folder, checkpoint and config (one line, every rank)."""


def agree_on_start(
    ctx: DistContext, out_dir: Path, cfg: TrainConfig, resumed: Path | None, error: ConfigError | None
) -> None:
    """Check, on every rank of the group at once, that every rank starts from the same run folder and state.

    Collective (a broadcast and one gather): every rank calls it once, before the run's first other collective
    and before anything is written into ``out_dir`` (the module docstring says what is compared).

    Args:
        ctx: this process's place in the group.
        out_dir: the run folder, as this rank sees it (``run.out_dir``).
        cfg: this rank's configuration (compared by digest).
        resumed: the checkpoint directory this rank resumes; None when it starts from step 0.
        error: the ConfigError this rank met while deciding what to start from (it took part all the same).

    Raises:
        ConfigError: ``error`` itself, in a process alone.
        RanksDisagree: any difference between the ranks, or any rank's ``error`` (the same line on every rank).
    """
    if not ctx.initialized or ctx.world_size == 1:
        if error is not None:
            raise error
        return
    created: list[Path] = []
    token: Path | None = None
    if ctx.is_main and error is None:  # a folder rank 0 refused gets nothing written into it
        try:
            token, created = _write_token(out_dir)
        except OSError as err:
            error = ConfigError(f"run.out_dir: cannot write into {out_dir} ({err.strerror or err})")
    try:
        name = ctx.broadcast_from_main(None if token is None else token.name)
        views = ctx.gather_to_main(_view(ctx, out_dir, cfg, resumed, error, name))
    finally:
        if token is not None:  # every rank has looked (or the group is gone): the token goes either way
            with contextlib.suppress(OSError):
                token.unlink()
    line = disagreement(views, str(out_dir))
    if line is not None:
        _remove_folders(created)  # made for the token only: the run does not start
        raise RanksDisagree(line)


def disagreement(views: list[dict[str, Any]], out_dir: str) -> str | None:
    """The line that says why the ranks' ``views`` (in rank order, as :func:`agree_on_start` gathers them)
    disagree, or None when every rank may start; causes in the module docstring's order."""
    main = views[0]
    if main["error"] is None:
        for view in views[1:]:
            if not view["sees_folder"]:
                return (
                    f"run.out_dir: {_who(view)} does not see the run folder run.out_dir={out_dir} that {_who(main)} "
                    f"writes ({main['folder']} on rank 0, {view['folder']} on rank {view['rank']}): each node has a "
                    "folder of its own there; run.out_dir must be one folder shared by every node; nothing was written"
                )
    failed = [view for view in views if view["error"] is not None]
    if failed:
        if len(failed) == len(views) and len({view["error"] for view in views}) == 1:
            return failed[0]["error"]
        return f"{_who(failed[0])}: {failed[0]['error']}"
    resumed = _groups(views, "resumed")
    if len(resumed) > 1:
        ckpts = "; ".join(f"{_ranks(group)}: {_checkpoint(group[0]['resumed'])}" for group in resumed)
        return (
            f"--resume: the ranks resumed different checkpoints ({ckpts}); a node has a stale or unshared copy of "
            "them: run.out_dir (and a --resume DIR) must be one folder shared by every node; nothing was written"
        )
    configs = _groups(views, "config")
    if len(configs) > 1:
        return (
            f"the ranks run different configs ({'; '.join(_ranks(group) for group in configs)}, one config each); "
            "every node must run the same command with the same config files; nothing was written"
        )
    return None


def _view(
    ctx: DistContext, out_dir: Path, cfg: TrainConfig, resumed: Path | None, error: ConfigError | None,
    token: str | None,
) -> dict[str, Any]:  # fmt: skip
    """What this rank saw (``token``: the name of rank 0's token, None when it wrote none), as plain values."""
    identity = None
    if resumed is not None and error is None:
        try:
            identity = (resumed.name, Checkpointer.identity(resumed))
        except CheckpointError as err:  # its marker went away after the load: this rank cannot start
            error = ConfigError(f"--resume: {err}")
    return {
        "rank": ctx.rank,
        "host": socket.gethostname(),
        "folder": str(Path(os.path.abspath(out_dir))),
        "sees_folder": ctx.is_main or (token is not None and _sees(out_dir / token)),
        "error": None if error is None else str(error),
        "resumed": identity,
        "config": _config_digest(cfg),
    }


def _config_digest(cfg: TrainConfig) -> str:
    """SHA-256 of ``cfg`` without its :data:`NODE_LOCAL` keys."""
    data = config_to_dict(cfg)
    for key in NODE_LOCAL:
        section, name = key.split(".")
        data.get(section, {}).pop(name, None)
    return hashlib.sha256(yaml.safe_dump(data, sort_keys=True).encode()).hexdigest()


def _sees(token: Path) -> bool:
    """Whether ``token`` is (or shows up within :data:`SEE_WAIT_S`) a file in this rank's view."""
    deadline = time.monotonic() + SEE_WAIT_S
    while not token.is_file():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _write_token(out_dir: Path) -> tuple[Path, list[Path]]:
    """Create ``out_dir`` (as needed) and a new token file in it; returns the token and the folders created
    (innermost last). Raises OSError (what was made is removed)."""
    created = []
    folder = Path(out_dir)
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        created.append(folder)
        folder = folder.parent
    created.reverse()
    try:
        for folder in created:
            folder.mkdir()
        token = Path(out_dir) / f"{START_TOKEN}{secrets.token_hex(8)}"
        with open(token, "x") as f:  # a new name: never anyone else's file
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    except OSError:
        _remove_folders(created)
        raise
    return token, created


def _remove_folders(created: list[Path]) -> None:
    """Delete the folders :func:`_write_token` made (innermost first), each only while it is empty."""
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _groups(views: list[dict[str, Any]], key: str) -> list[list[dict[str, Any]]]:
    """``views`` grouped by ``view[key]``, in order of each group's lowest rank."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for view in views:
        groups.setdefault(view[key], []).append(view)
    return list(groups.values())


def _who(view: dict[str, Any]) -> str:
    return f"rank {view['rank']} (host {view['host']})"


def _ranks(group: list[dict[str, Any]]) -> str:
    more = len(group) - 1
    return _who(group[0]) + (f" and {more} more rank{'s' if more > 1 else ''}" if more else "")


def _checkpoint(identity: tuple[str, str] | None) -> str:
    if identity is None:
        return "none (step 0)"
    name, digest = identity
    return f"{name} (COMMITTED digest {digest[:12]})"
