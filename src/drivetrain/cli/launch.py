"""``drivetrain launch [TORCHRUN OPTIONS] --no-python drivetrain train ...``: torchrun with a scheduler's exit status.

torchrun (``torch.distributed.run``, run here in this process with the options given) forwards SIGTERM/SIGINT to
its workers, which finish the step, checkpoint and exit 143/130 — yet torchrun itself then returns 1, which a
scheduler reads as a failure. This launcher returns what one ``drivetrain train`` process would: 0 when the run
finished; 143 (130) when every worker on this node stopped cleanly at its checkpoint on SIGTERM (SIGINT), or the
signal came before any worker started — requeue the job, ``drivetrain train --resume auto`` continues it exactly;
anything else (1, or 2 for bad options) is a failure to look at.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

__all__ = ["STATUS_ENV", "add_parser", "launch", "record_worker_status"]

# Set by the launcher for its workers: the folder where each `drivetrain train` worker records its exit status.
STATUS_ENV = "DRIVETRAIN_LAUNCH_STATUS_DIR"
SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # set to 1 by the launcher unless the user set it
RUNNING = -1  # a worker's record while it trains (replaced by its exit status when it leaves cleanly)
CLEAN_STOPS = {128 + int(signal.SIGTERM), 128 + int(signal.SIGINT)}

EPILOG = """\
examples:
  drivetrain launch --nproc_per_node 8 --max-restarts 3 --no-python \\
      drivetrain train --config CFG distributed.strategy=ddp --resume auto
  drivetrain launch --nnodes 1:4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\
      --rdzv_id RUN_ID --max-restarts 3 --no-python drivetrain train --config CFG distributed.strategy=ddp \\
      train.global_batch=256 --resume auto

exit status (the scheduler contract, as for one `drivetrain train` process):
  0        the run finished
  143/130  SIGTERM/SIGINT stopped every worker of this node cleanly after its checkpoint (or came before any
           worker started): requeue; `drivetrain train --resume auto` continues
  other    a failure (torchrun's status: 1; 2 for bad options)
Send the signal to the launcher, which passes it to the workers through torchrun (a worker that exits 143 on a
signal torchrun did not send is restarted while --max-restarts allows). Kubernetes sends it to the container's first
process: make this launcher that process. SLURM: `#SBATCH --signal=B:TERM@120` and a `trap` that passes it on
(docs/engine.md). Give the workers time to checkpoint: terminationGracePeriodSeconds, and torchrun's
`--shutdown-timeout` (default 30 s: how long torchrun waits after passing the signal on before it kills the
workers). Every torchrun option is accepted as it is (python -m torch.distributed.run --help). The launcher sets
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 unless it is set: with torch's shared store, a node that joins a running
c10d rendezvous (--nnodes MIN:MAX) waits for a store address no agent publishes, and fails.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``launch`` subcommand on ``sub`` (for ``--help``; :func:`drivetrain.cli.main.main` hands the
    arguments after ``launch`` to :func:`launch` unparsed, torchrun's options and the worker command alike)."""
    parser = sub.add_parser(
        "launch",
        help="torchrun that exits 143/130 when every worker stopped cleanly on SIGTERM/SIGINT (scheduler contract)",
        description=__doc__.split("\n\n", 1)[1].replace("``", "`"),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("torchrun_args", nargs=argparse.REMAINDER, metavar="TORCHRUN_ARGS", help="torchrun's options")
    parser.set_defaults(run=lambda args: launch(args.torchrun_args))


def launch(argv: list[str]) -> int:
    """Run torchrun with ``argv`` in this process; return the scheduler's exit status (module docstring).

    The workers learn a fresh folder from ``DRIVETRAIN_LAUNCH_STATUS_DIR`` and record their exit status there
    (:func:`record_worker_status`); the folder is removed afterwards. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` is
    set to 1 unless it is set, so that nodes can join a running c10d rendezvous (the comment in the code says why).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    folder = Path(tempfile.mkdtemp(prefix="drivetrain-launch-"))
    os.environ[STATUS_ENV] = str(folder)
    # A node that joins a running c10d rendezvous (--nnodes MIN:MAX) never learns the address of the agents' shared
    # store: DynamicRendezvousHandler.next_rendezvous (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py)
    # publishes it only in a node's first round, so the newcomer waits for a key no one writes and fails after 60 s.
    # Without the shared store every round publishes a fresh address (rank 0's worker hosts the store).
    set_here = SHARE_STORE_ENV not in os.environ
    os.environ.setdefault(SHARE_STORE_ENV, "1")
    program, sys.argv[0] = sys.argv[0], "drivetrain launch"  # torchrun's usage and errors name this command
    try:
        try:
            torchrun_main(argv)
            return 0
        except SystemExit as err:  # torchrun's own option errors (argparse: 2)
            if err.code in (None, 0):
                return 0
            return err.code if isinstance(err.code, int) else 2
        except SignalException as err:
            print(f"drivetrain launch: torchrun stopped its workers on {err.sigval.name}", file=sys.stderr)
            if not any(folder.glob("attempt-*.json")):  # no worker had started: nothing to lose, nothing failed
                print(f"drivetrain launch: {err.sigval.name} before any worker started", file=sys.stderr)
                return 128 + int(err.sigval)
        except Exception as err:  # ChildFailedError (torchrun printed the failures) or another launch error
            if type(err).__name__ != "ChildFailedError":
                print(f"drivetrain launch: {type(err).__name__}: {err}", file=sys.stderr)
        code = clean_stop_status(folder)
        if code is None:
            return 1
        print(
            f"drivetrain launch: every worker stopped after its checkpoint ({signal.Signals(code - 128).name}); "
            f"exit {code} — continue with --resume auto",
            file=sys.stderr,
        )
        return code
    finally:
        sys.argv[0] = program
        os.environ.pop(STATUS_ENV, None)
        if set_here:
            os.environ.pop(SHARE_STORE_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


def clean_stop_status(folder: Path) -> int | None:
    """143/130 when every worker of the newest attempt recorded a clean stop on a signal, else None.

    The newest attempt is the highest ``TORCHELASTIC_RESTART_COUNT`` among the records (a worker records itself as
    running when it starts, so an attempt whose workers died early is still the newest); it must hold one record
    per local worker (``LOCAL_WORLD_SIZE``), each a clean-stop status. Mixed SIGINT/SIGTERM stops count as SIGTERM.
    """
    records = []
    for path in folder.glob("attempt-*.json"):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None
    if not records:
        return None
    newest = max(r["attempt"] for r in records)
    last = [r for r in records if r["attempt"] == newest]
    if len(last) != last[0]["local_world_size"] or any(r["status"] not in CLEAN_STOPS for r in last):
        return None
    statuses = {r["status"] for r in last}
    return statuses.pop() if len(statuses) == 1 else 128 + int(signal.SIGTERM)


def record_worker_status(status: int) -> None:
    """Record this worker's exit status (or :data:`RUNNING`) for a ``drivetrain launch`` above it (a no-op when
    there is none): ``attempt-<restart count>.local-<local rank>.json`` in ``DRIVETRAIN_LAUNCH_STATUS_DIR``."""
    folder = os.environ.get(STATUS_ENV)
    if not folder:
        return
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    record = {
        "attempt": attempt,
        "local_rank": local_rank,
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "status": status,
    }
    path = Path(folder) / f"attempt-{attempt}.local-{local_rank}.json"
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(OSError):  # a record that cannot be written only makes the launcher report a failure
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)  # the launcher never reads half a record
