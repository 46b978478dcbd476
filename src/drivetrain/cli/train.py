"""``drivetrain train --config FILE [key=value ...]``: train a model with the engine.

Overrides are dotted keys of the config with YAML values (``optim.lr=3e-4``,
``speed.activation_checkpointing=[backbone]``). ``--resume auto`` continues from the newest committed
checkpoint of the run directory (``run.out_dir``); ``--resume DIR`` from a given checkpoint directory.
SIGTERM/SIGINT finish the current step, write a checkpoint and exit with the signal's conventional status
(143 for SIGTERM, 130 for SIGINT), so a ``train && eval`` chain stops and a scheduler can requeue the job. Under
``torchrun`` every rank runs this same command; ``drivetrain launch`` in place of ``torchrun`` returns that status
for the node (torchrun returns 1), and ``--resume auto`` lets torchrun's restarts continue the run.
"""

from __future__ import annotations

import argparse
import os
import sys

EPILOG = """\
examples:
  drivetrain train --config configs/smoke.yaml
  drivetrain train --config configs/smoke.yaml precision.mode=bf16 train.accumulation=4 run.out_dir=runs/bf16
  drivetrain train --config configs/smoke.yaml --resume auto        # after a preemption
  drivetrain train --config configs/ssn_tiny.yaml --print-config    # the config resolved; trains nothing
  torchrun --nproc_per_node 2 --no-python drivetrain train --config configs/smoke.yaml distributed.strategy=ddp
  drivetrain launch --nproc_per_node 2 --max-restarts 3 --no-python drivetrain train --config configs/smoke.yaml \
      distributed.strategy=ddp --resume auto                       # restarts, and 143 for a scheduler

the run directory (run.out_dir) holds config.yaml (resolved), metrics.jsonl (one JSON object per step),
checkpoints/step-00000040/ (atomic, the newest checkpoint.keep kept; corrupt ones moved to
checkpoints/corrupt/) and tensorboard/.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``train`` subcommand on ``sub``."""
    parser = sub.add_parser(
        "train",
        help="train a model from a YAML config (mixed precision, accumulation, exact resume, DDP/FSDP)",
        description=__doc__.split("\n\n", 1)[1].replace("``", "`"),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="YAML config, e.g. configs/smoke.yaml")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the config resolved (its base chain merged, the overrides applied, defaults filled in) as YAML "
        "and exit: nothing is trained or written",
    )
    parser.add_argument(
        "--resume",
        metavar="auto|DIR",
        default=None,
        help="auto: newest committed checkpoint of run.out_dir (a fresh start if there is none); "
        "DIR: that checkpoint directory",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. optim.lr=3e-4")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Train from ``args.config`` with ``args.overrides`` and ``args.resume``; return the exit code.

    0 when done, 2 on a config error, 1 on a non-finite loss, data or checkpoint error or a file of the run that
    cannot be written (a full disk, an exceeded quota, a read-only file system: one line naming the file; the
    committed checkpoints are kept), 130 / 143 when SIGINT / SIGTERM stopped it (after its checkpoint, or before
    the first step). A run in a process group leaves with ``os._exit`` instead of returning (a failed one at once,
    with status 1 and no collective: the failure may be this rank's alone). With ``--print-config``:
    the resolved config printed, 0 (2 on a config error), nothing trained or written.
    """
    if args.print_config:
        from drivetrain.cli.configs import print_resolved

        return print_resolved(args.config, args.overrides, "train")
    from drivetrain.cli.launch import RUNNING, record_worker_status

    record_worker_status(RUNNING)  # for a `drivetrain launch` above this worker (a no-op without one)
    from drivetrain.engine import (
        CheckpointError,
        ConfigError,
        NonFiniteLossError,
        Trainer,
        TrainingDataError,
        load_config,
    )
    from drivetrain.engine.metrics import RunWriteError

    cfg = None
    try:
        cfg = load_config(args.config, args.overrides)
        trainer = Trainer(cfg, resume=args.resume)
    except ConfigError as err:
        print(f"drivetrain train: config error: {err}", file=sys.stderr)
        return 2
    except CheckpointError as err:  # moving unusable checkpoints aside was refused (a linked checkpoints/corrupt)
        print(f"drivetrain train: checkpoint error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("drivetrain train: interrupted while starting; no step was run", file=sys.stderr)
        record_worker_status(130)
        return 130
    except Exception as err:  # only a write without room is reported here; the rest is re-raised
        if not _report_no_room(err, cfg):
            raise
        return 1
    try:
        state = trainer.fit()
    except NonFiniteLossError as err:
        print(f"drivetrain train: {err}", file=sys.stderr)
        return 1
    except TrainingDataError as err:
        print(f"drivetrain train: data error: {err}", file=sys.stderr)
        return 1
    except CheckpointError as err:
        print(f"drivetrain train: checkpoint error: {err}", file=sys.stderr)
        return 1
    except RunWriteError as err:
        print(f"drivetrain train: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # as above
        if not _report_no_room(err, cfg):
            raise
        return 1
    finally:
        trainer.close()
        if trainer.failed:  # under torchrun, perhaps this rank alone: no collective, no teardown (Trainer.close)
            _leave_failed(sys.exc_info()[1])
    if trainer.ctx.is_main:
        print(
            f"drivetrain train: {state.iteration}/{cfg.train.steps} steps ({state.step} updates, "
            f"{state.skipped} skipped) in {cfg.run.out_dir}"
        )
    code = stop_status(trainer.stopped_by)
    record_worker_status(code)
    if trainer.ctx.initialized:
        # Everything is written and every rank passed the last barrier. Leave without the interpreter's
        # teardown, whose destructors of torch.distributed objects can deadlock on the GIL (see
        # drivetrain.engine.distributed.teardown).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _leave_failed(err: BaseException | None) -> None:
    """End a rank whose training failed under a process group, now: status 1 (``err``'s traceback first when no
    handler printed its line), with no collective (:func:`~drivetrain.engine.distributed.exit_failed`)."""
    from drivetrain.cli.launch import record_worker_status
    from drivetrain.engine.distributed import exit_failed

    record_worker_status(1)
    exit_failed(err, 1)


def _report_no_room(err: BaseException, cfg: object) -> bool:
    """Print the one line of a write that failed for lack of room (a full disk, an exceeded quota, a read-only file
    system) anywhere in the run (the config copy, the lock file, evaluation outputs, ...): the file when the error
    names one, else the run directory. Returns False, printing nothing, for any other error."""
    from pathlib import Path

    from drivetrain.engine.checkpoint import no_room
    from drivetrain.engine.metrics import write_failure

    room = no_room(err)
    if room is None:
        return False
    where = room.filename or getattr(getattr(cfg, "run", None), "out_dir", None) or "the run directory"
    print(f"drivetrain train: {write_failure(Path(where), room)}", file=sys.stderr)
    return True


def stop_status(signal_name: str | None) -> int:
    """The exit status of a run stopped by ``signal_name`` after its checkpoint: 128 + the signal's number (130 for
    SIGINT, 143 for SIGTERM), as a shell reports a process the signal ended, so ``train && eval`` chains and
    schedulers see the interruption; 0 for a run that finished. A stop another rank received counts as SIGTERM."""
    import signal

    if signal_name is None:
        return 0
    try:
        return 128 + int(signal.Signals[signal_name])
    except KeyError:
        return 128 + int(signal.SIGTERM)
