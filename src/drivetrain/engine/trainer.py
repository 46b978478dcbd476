"""The training loop: any model following the protocol, from one :class:`TrainConfig`.

One optimizer iteration (:meth:`Trainer._iteration`, read top to bottom): for each of ``train.accumulation``
micro-batches fetch → forward (autocast) → loss (fp32) → scaled backward (gradient all-reduce only on the last);
then unscale → clip → the decision on the device (skip on non-finite gradients, stop signals:
:mod:`~drivetrain.engine.step_outcome`) → schedule → step, taken undoably (:mod:`~drivetrain.engine.undoable_update`)
→ loss-scale update → zero_grad → the one host read, after the update, which keeps the update or undoes it exactly →
log. The learning rate is a pure function of the number of applied updates, known on the host after every read, so a
skipped step moves neither the optimizer's step counter nor the schedule.

A checkpoint (every ``checkpoint.every`` iterations, at the end, and on SIGTERM/SIGINT) holds the state of
:attr:`Trainer.components` — model, optimizer, loss scaler, loop counters, schedule, data position, every
rank's RNG states — with the world size, the config and versions (:mod:`drivetrain.engine.state`). Resuming
restores every component in that order (RNG last, after the data pipeline is built) and continues bit-for-bit
(:mod:`drivetrain.engine.resume`).

The parts the loop calls live beside it: the batches (:mod:`~drivetrain.engine.batches`), the loss-term
weights (:mod:`~drivetrain.engine.build`), evaluation during training
(:mod:`~drivetrain.engine.eval_hook`), the solver warm-up (:mod:`~drivetrain.engine.build`), stop
signals (:mod:`~drivetrain.engine.step_outcome`), unreadable data (:mod:`~drivetrain.engine.step_outcome`) and what
exists only for older runs (:mod:`~drivetrain.engine.compat`).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

import drivetrain
from drivetrain.data.errors import DataError
from drivetrain.engine.batches import (
    build_train_batches,
    close_train_batches,
    handed_shapes,
    hands_out_host_batches,
)
from drivetrain.engine.build import (
    TermWeights,
    apply_speed,
    build_dataset,
    build_model,
    build_optimizer,
    build_step_graph,
    lr_factor,
    warm_known_shapes,
    warm_met_shapes,
)
from drivetrain.engine.checkpoint import MARKER, Checkpointer, CheckpointError
from drivetrain.engine.config import ConfigError, TrainConfig, config_to_dict, with_global_batch
from drivetrain.engine.distributed import DistContext, setup, teardown
from drivetrain.engine.eval_hook import eval_frames, evaluate_step, evaluation_logged
from drivetrain.engine.metrics import MetricsLogger
from drivetrain.engine.precision import autocast, fp32_outputs
from drivetrain.engine.protocol import LossCounts, StreamMemory
from drivetrain.engine.resume import (
    Found,
    RanksDisagree,
    RunDirLock,
    agree_on_start,
    check_run_dir,
    find_resume,
    restore_found,
    set_aside_unusable,
    write_run_marker,
)
from drivetrain.engine.state import (
    FixedState,
    RngState,
    ScheduleState,
    Stateful,
    StrategyState,
    StreamState,
    TrainState,
    seed_all,
)
from drivetrain.engine.step_outcome import (
    MicroBatches,
    NonFiniteLossError,
    StopSignals,
    TrainingDataError,
    data_error_line,
    dead_worker,
    decide_on_device,
    step_record,
)
from drivetrain.engine.strategy import build_strategy
from drivetrain.losses.term_weights import weighted_total
from drivetrain.pipeline.transfer import to_device
from drivetrain.profile.timer import region, step_active
from drivetrain.safeio.files import replace_text

__all__ = ["Trainer"]

# Test hook: seconds to sleep after every optimizer iteration, so a test can signal or kill mid-run.
STEP_DELAY_ENV = "DRIVETRAIN_TEST_STEP_DELAY_S"


class Trainer:
    """Builds everything a run needs from ``cfg`` and trains with :meth:`fit`.

    ``cfg.run.out_dir`` must be new, empty or a drivetrain run (its ``.drivetrain-run`` marker, written when the
    trainer takes the directory's lock): anything else is a ConfigError before a file is written
    (:mod:`drivetrain.engine.resume`). Under torchrun every rank first proves, in one collective, that it sees rank 0's
    run folder and resumes the same checkpoint with the same config; any difference, or any rank's start error, is
    one ConfigError line on every rank before anything is written, and every rank leaves the process group
    (:mod:`drivetrain.engine.distributed`).

    Args:
        cfg: the run's configuration.
        resume: None (fresh run), ``"auto"`` (newest committed checkpoint of the run, if any) or the path
            of a checkpoint directory.
        generate_data: a data builder may make a dataset that is not there yet (the ``synthetic`` set; see
            :func:`~drivetrain.engine.build.build_dataset`); ``doctor`` profiling someone's run passes False.
    """

    def __init__(self, cfg: TrainConfig, resume: str | None = None, *, generate_data: bool = True) -> None:
        self.cfg = cfg
        self.generate_data = generate_data
        self.out_dir = Path(cfg.run.out_dir)
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        if cfg.run.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        self.ctx: DistContext = setup(cfg)
        self.device = self.ctx.device
        self._lock: RunDirLock | None = None
        try:
            self._build(resume)
        except BaseException as err:
            self._release()
            if isinstance(err, RanksDisagree):  # every rank stops here, together: leave the group as a finished run
                teardown(self.ctx)
            raise

    def _build(self, resume: str | None) -> None:
        cfg = self.cfg
        self.checkpointer = Checkpointer(self.out_dir / "checkpoints", keep=cfg.checkpoint.keep, shards="lazy")
        found, error = Found(), None
        try:  # what this rank starts from, decided alone: no collective, nothing written
            self.cfg = cfg = with_global_batch(cfg, self.ctx.world_size)  # train.accumulation on this many ranks
            if self.ctx.is_main:  # only into a new, empty or drivetrain run dir
                check_run_dir(self.out_dir)
            if resume is None and self.checkpointer.committed():
                raise ConfigError(
                    f"run.out_dir: {self.out_dir} already holds checkpoints; pass --resume auto to continue "
                    "that run or choose another run.out_dir"
                )
            if resume is not None:
                found = find_resume(resume, self.checkpointer, cfg, self.ctx.world_size)
        except ConfigError as err:
            error = err
        # The run's first collective: the same folder and checkpoint on every rank, or one line on every rank.
        agree_on_start(self.ctx, self.out_dir, cfg, found.path, error)

        seed_all(cfg.run.seed)  # model initialisation is identical on every rank
        model = build_model(cfg.model)
        if cfg.model.init_from is not None:  # a fresh run only: a resumed one restores its own weights
            from drivetrain.engine.init_from import init_model, starts_fresh

            if starts_fresh(resume, self.checkpointer):
                init_model(model, cfg.model.init_from, verbose=self.ctx.is_main)  # prints the report on rank 0
        self.model = apply_speed(model, cfg.speed)
        self.term_weights = TermWeights(self.model, cfg.model.loss_weights)  # ConfigError for an unknown term
        # speed.compile_step: forward + loss, one graph per bucket (None when off; ConfigError without the capability)
        self.step_graph = build_step_graph(self.model, cfg.speed, cfg.model.name, cfg.data.batch_size, self.device)
        self.counts_losses = isinstance(self.model, LossCounts)  # device counters logged beside the loss terms
        self.streams = isinstance(self.model, StreamMemory)  # every rank's stream state is checkpointed
        step = self.step_graph.module() if self.step_graph is not None else None  # under DDP: DDP wraps the step
        self.strategy = build_strategy(self.model, cfg, self.ctx, lambda model: build_optimizer(model, cfg.optim), step)
        self.optimizer, self.scaler = self.strategy.optimizer, self.strategy.scaler
        # speed.compile_step: the update (copy for undo + AdamW step) as one compiled graph, tensor lr (None when off)
        self.optimizer_graph = self.strategy.optimizer_graph if cfg.speed.compile_step else None
        dataset = build_dataset(cfg.data, generate=self.generate_data)
        evaluates = cfg.eval.every or cfg.eval.at_start
        self.eval_data = eval_frames(cfg, self.model, self.generate_data, warn=self.ctx.is_main) if evaluates else None
        self.data, self.augment = build_train_batches(cfg, self.model, dataset, self.ctx)
        if self.step_graph is not None:  # the bucket chosen on the host (a host batch, or a bound): no device read
            self.step_graph.host_batches = hands_out_host_batches(self.data, self.device)
            self.step_graph.handed_shapes = handed_shapes(self.data)
        self.state = TrainState()
        self.components = self._components()
        seed_all(cfg.run.seed + self.ctx.rank)  # dropout draws differ per rank (the augmentation seeds each batch)

        if self.ctx.is_main:  # one training process per run directory, from before anything is written
            self._lock = RunDirLock(self.out_dir)
            self._lock.acquire()
            write_run_marker(self.out_dir)
        restore_found(found, self.checkpointer, self.components, cfg, self.model, self.state)  # the RNG states last
        self.resumed_from, self._resume_note = found.path, found.note
        self.ctx.barrier()  # every rank has read its checkpoint before rank 0 moves any aside
        if self.ctx.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            replace_text(self.out_dir / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
            continued = self.resumed_from is not None or self._resume_note is not None
            set_aside_unusable(self.checkpointer, self.state.iteration, continued)
        self.ctx.barrier()
        self.signals = StopSignals()
        self._save_due = False  # checkpoint.every_minutes passed on some rank's clock (agreed in the step's decision)
        self._saved_clock = time.monotonic()
        self.stopped_by: str | None = None  # after fit(): the signal that stopped it ("SIGINT", "SIGTERM", ...)
        self._step_delay = float(os.environ.get(STEP_DELAY_ENV, "0") or 0)
        self.failed = False  # training raised under a process group: close() leaves it without a collective

    def _components(self) -> dict[str, Stateful]:
        """What a checkpoint holds, by name, in restore order: the RNG states last (nothing restored after them
        may draw from the global RNGs); the schedule after the loop counters it is checked against."""
        weights = StrategyState(self.strategy)  # model and optimizer: one collective full_state() for both
        return {
            "model": weights.model,
            "optimizer": weights.optimizer,
            "scaler": self.scaler,
            "train": self.state,
            "schedule": ScheduleState(self.cfg.schedule.kind, self.state),
            "data": self.data,
            **({"streams": StreamState(self.ctx, self.model, self.cfg.data.batch_size)} if self.streams else {}),
            "rng": RngState(self.ctx, self.cfg.run.seed, self.state),  # re-seeded on another number of ranks
        }

    # ------------------------------------------------------------------ the loop
    def fit(self) -> TrainState:
        """Train until ``train.steps`` iterations are done or a stop signal arrives; returns the state."""
        for _ in self.iterations():
            pass
        return self.state

    def iterations(self) -> Iterator[int]:
        """:meth:`fit` one optimizer iteration at a time: yields the iteration count after each (its evaluation and
        checkpoint done), then ends as ``fit`` does (the last checkpoint committed, the run's files closed).

        ``bench train --compare --interleave`` alternates two trainers' iterations through it. Closing the
        generator early (``close()``) leaves as an exception would: files closed, the run directory unlocked, no
        final checkpoint.
        """
        cfg = self.cfg
        if self._lock is not None:
            self._lock.acquire()
        log = MetricsLogger(
            self.out_dir,
            enabled=self.ctx.is_main,
            total=cfg.train.steps,
            start=self.state.iteration,
            tensorboard=cfg.log.tensorboard,
            progress=cfg.log.progress,
            reduce_mean=self.ctx.all_reduce_mean,
        )
        if cfg.train.global_batch is not None:
            log.message(
                f"train.global_batch {cfg.train.global_batch} = data.batch_size {cfg.data.batch_size} × "
                f"{self.ctx.world_size} rank(s) × train.accumulation {cfg.train.accumulation}"
            )
        if self.resumed_from is not None:
            log.message(f"resumed from {self.resumed_from} at step {self.state.iteration}")
        elif self._resume_note is not None:
            log.message(self._resume_note)
        warm_known_shapes(self.model, self.device, log)  # the GPU solver's kernels for the model's known Q
        reported = 0  # graphs compiled inside steps already logged (speed.compile_step)
        if self.step_graph is not None:  # every bucket of the compiled step, before the first step
            self.step_graph.compile_all(  # through the strategy's wrapper: under DDP, its forward and reduction
                log.message, lambda: autocast(cfg.precision.mode, self.device), self.strategy.wrapped
            )
        if self.optimizer_graph is not None:  # and the update, taken and undone on zero gradients
            self.optimizer_graph.compile_all(log.message)
        saved_at = self.state.iteration if self.resumed_from is not None else -1
        self._saved_clock = time.monotonic()  # checkpoint.every_minutes counts from here and from each save
        try:
            with self.signals.handling():
                path = self.resumed_from
                # the initial weights' score (the baseline of the curve), or the one a stop signal abandoned
                stop = self.evaluate(log) if self._evaluation_due() else None
                started, data_state = self.state.iteration, None
                try:
                    while stop is None and self.state.iteration < cfg.train.steps:
                        started, data_state = self.state.iteration, self.data.state_dict()  # where it starts reading
                        try:
                            stop = self._iteration(log)
                        except DataError as err:
                            raise self._data_failure(err, data_state) from None
                        warm_met_shapes(self.state.iteration, log)  # GPU solver shapes the step met uncompiled
                        if self._compiles_in_steps() > reported:
                            reported = self._compiles_in_steps()
                            log.message(f"speed.compile_step: {reported} graph(s) compiled inside steps so far")
                        if self._step_delay:
                            time.sleep(self._step_delay)
                        done = self.state.iteration
                        if done % cfg.log.every == 0:
                            log.flush()
                        if stop is None and cfg.eval.every and (done % cfg.eval.every == 0 or done == cfg.train.steps):
                            # before the checkpoint: a run killed during it evaluates again; a stop signal abandons it
                            stop = self.evaluate(log)
                        if stop or done % cfg.checkpoint.every == 0 or done == cfg.train.steps or self._save_due:
                            log.flush()
                            path = self.save()
                            saved_at = done
                        self._log_stall(log)  # a save's stall, once known (an asynchronous one's: after a step)
                        yield done
                except RuntimeError as err:  # torch reports a dead loader worker wherever the main process is
                    died = dead_worker(err)
                    if died is None:
                        raise
                    position = data_state if self.state.iteration == started else None  # mid-step: its start
                    raise self._data_failure(died, position) from None
                if stop:
                    if saved_at != self.state.iteration:  # stopped in the evaluation before the first step
                        log.flush()
                        path, saved_at = self.save(), self.state.iteration
                    self.checkpointer.wait()  # the checkpoint the message names is committed
                    self.stopped_by = stop
                    log.message(
                        f"drivetrain train: received {stop}; stopped after step {self.state.iteration} with checkpoint "
                        f"{path}; continue with --resume auto"
                    )
            if saved_at != self.state.iteration:  # e.g. resumed a finished run with the same steps
                log.flush()
                self.save()
            self.checkpointer.wait()  # an asynchronous save in flight commits before the run ends
            self._log_stall(log)
        except BaseException:
            # Perhaps this rank's failure alone (a frame only it reads, a file only rank 0 writes): the other ranks may
            # be in another collective, where one of this rank's would wait until distributed.timeout_s (gloo, NCCL) or,
            # on NCCL, pair with a collective of another size. None from here on: see close().
            self.failed = self.ctx.initialized
            raise
        finally:
            log.close(reduce=not self.failed)
            self._release()

    def _iteration(self, log: MetricsLogger) -> str | None:
        """One optimizer iteration, top to bottom; returns the name of a received stop signal (agreed across ranks)."""
        cfg, accum, t_start = self.cfg, self.cfg.train.accumulation, time.perf_counter()
        with region("step"):  # profiled regions (doctor, bench train): no-ops unless a profiler is active
            micro = MicroBatches.empty(accum, self.device)
            for i in range(accum):
                t0 = time.perf_counter()
                with region("data"):  # fetch: blocked on the loader (with the prefetcher, on its side stream)
                    batch, indices = self.data.next()
                with region("copy"):  # host → device; the prefetcher's batches are there already (a pass-through)
                    loaded, batch = batch, to_device(batch, self.device, cfg.speed.channels_last)
                micro.fetched(indices, time.perf_counter() - t0)  # its dataset indices and the wait
                with self.strategy.sync_grads(enabled=i == accum - 1):  # gradients reduced on the last one only
                    if self.step_graph is not None:  # speed.compile_step: forward and loss in one compiled graph
                        with region("forward"), autocast(cfg.precision.mode, self.device):
                            terms = dict(self.step_graph(batch, self.strategy.wrapped, loaded))
                        loss = weighted_total(terms, self.term_weights(terms)).float()
                    else:
                        with region("forward"), autocast(cfg.precision.mode, self.device):
                            outputs = self.strategy.wrapped(batch)
                        with region("loss"):  # in fp32, outside autocast
                            terms = self.model.loss(fp32_outputs(outputs), batch)
                            loss = weighted_total(terms, self.term_weights(terms)).float()
                    with region("backward"):
                        self.strategy.backward(loss / accum)
                micro.add(i, loss, terms, self.model.loss_counts if self.counts_losses else {})  # counts: optional
            with region("optimizer"):
                grad_norm, grads_bad = self.strategy.unscale_and_clip()  # unscale → clip
                pending = decide_on_device(  # skip (non-finite), stop (a signal on any rank): no host read
                    grads_bad, micro, self.signals.received, self.ctx, save_due=self._clock_due()
                )
                lr = self._set_lr(self.state.step)  # the schedule: a function of the updates applied
                overflow = grads_bad & ~micro.loss_bad.any()  # a bad loss is not an fp16 overflow
                grad_norm, scale, applied = self.strategy.step(pending.apply, overflow, grad_norm)  # + zero_grad
                try:
                    decision = pending.read(  # the iteration's one host read, after the update
                        micro, self.ctx, stop_on_nonfinite=cfg.precision.nonfinite == "stop",
                        iteration=self.state.iteration, data=self.data,
                    )  # fmt: skip
                except NonFiniteLossError:
                    if isinstance(applied, torch.Tensor):  # the run stops with the weights from before the step
                        self.strategy.settle(False)
                    raise
                if isinstance(applied, torch.Tensor):  # taken undoably: kept, or undone now
                    applied = self.strategy.settle(decision.apply)
                self._save_due = decision.save_due  # agreed across ranks: every rank saves after this step
        step_active()
        self.state.advance(applied, decision.loss_bad)
        samples, elapsed = accum * cfg.data.batch_size * self.ctx.world_size, time.perf_counter() - t_start
        log.record(*step_record(micro, grad_norm, scale, lr, elapsed, self.state, samples, self.device))  # log
        return decision.stop

    def _log_stall(self, log: MetricsLogger) -> None:
        """Write the last save's ``checkpoint/stall_s`` once it is known (:meth:`Checkpointer.pop_stall`)."""
        stall = self.checkpointer.pop_stall()
        if stall is not None:
            log.checkpoint(*stall)

    def _clock_due(self) -> bool:
        """Whether ``checkpoint.every_minutes`` passed on this rank's clock since the last save (or the start)."""
        minutes = self.cfg.checkpoint.every_minutes
        return minutes is not None and time.monotonic() - self._saved_clock >= 60 * minutes

    def _set_lr(self, step: int) -> float:
        """Set every group's lr for update ``step``; returns the base lr (lr_mult 1). A tensor lr (the compiled
        update's input) is written in place: a host-to-device write, no read."""
        base = self.cfg.optim.lr * lr_factor(self.cfg.schedule, step, self.cfg.train.steps)
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(base * group["lr_mult"])
            else:
                group["lr"] = base * group["lr_mult"]
        return base

    def _compiles_in_steps(self) -> int:
        """Graphs compiled inside steps so far by the compiled step and the compiled update (speed.compile_step)."""
        graphs = (self.step_graph, self.optimizer_graph)
        return sum(graph.compiles_in_steps for graph in graphs if graph is not None)

    def evaluate(self, log: MetricsLogger) -> str | None:
        """Evaluate the current weights on ``eval.split`` (every rank predicts its share, rank 0 scores) and log the
        metrics (:mod:`drivetrain.engine.eval_hook`); returns the stop signal that arrived meanwhile on any
        rank (the evaluation is then abandoned), or None."""
        return evaluate_step(
            self.state.iteration, self.model, self.eval_data, self.cfg, self.ctx, self.out_dir, log, self.augment,
            lambda: self.signals.received,
        )  # fmt: skip

    def _evaluation_due(self) -> bool:
        """Whether to evaluate before the first step: ``eval.at_start`` at step 0, or a run resumed at an evaluation
        step whose evaluation its metric log lacks (a stop signal abandoned it, or came during the step). Rank 0
        reads the log; every rank gets its answer."""
        cfg, step = self.cfg, self.state.iteration
        if step == 0:
            return cfg.eval.at_start
        if self.resumed_from is None or not cfg.eval.every or (step % cfg.eval.every and step != cfg.train.steps):
            return False
        missing = self.ctx.is_main and not evaluation_logged(self.out_dir, step)
        flag = torch.tensor([missing], dtype=torch.int64, device=self.device)  # (1,)
        return bool(self.ctx.all_reduce_max(flag).item())  # sync: once, before the first step

    # ------------------------------------------------------------------ checkpoints
    def _data_failure(self, err: DataError, data_state: dict[str, Any] | None) -> TrainingDataError:
        """A sample could not be read: keep the progress of the completed steps, then name the file.

        One process saves a checkpoint of the last completed step with the data position at the start of the
        failed iteration (so a resume after fixing the data continues exactly); under torchrun the other
        ranks cannot join a save, so the run stops with its last periodic checkpoint.
        """
        path = None
        if not self.ctx.initialized:
            self.checkpointer.wait()  # a save of this step in flight commits first
            done = self.checkpointer.root / Checkpointer.name(self.state.iteration)
            path = done if (done / MARKER).is_file() else self.save(data_state=data_state)
            self.checkpointer.wait()
        return TrainingDataError(data_error_line(err), path, can_skip=self.cfg.data.loader != "dali")

    def save(self, data_state: dict[str, Any] | None = None) -> Path:
        """Checkpoint the run now (collective: every rank calls it and writes its shards; rank 0 the small state);
        returns its path. With ``checkpoint.async_save`` the write goes on in the background (committed at the
        next save or :meth:`Checkpointer.wait`); ``checkpointer.pop_stall()`` says how long training was blocked.

        Args:
            data_state: the data position to record (default: after the last batch read).
        """
        if self.ctx.is_main and self._lock is not None:
            try:
                self._lock.verify()  # the run directory is still ours (its lock file may have been deleted)
            except ConfigError as err:
                raise CheckpointError(f"not saving step {self.state.iteration}: {err}") from None
        components = self.components if data_state is None else {**self.components, "data": FixedState(data_state)}
        meta = {
            "world_size": self.ctx.world_size,
            "config": config_to_dict(self.cfg),
            "versions": {
                "drivetrain": drivetrain.__version__,
                "torch": str(torch.__version__),
                "python": platform.python_version(),
            },
        }
        path = self.checkpointer.save_state(
            self.state.iteration, components, meta, write=self.ctx.is_main, asynchronous=self.cfg.checkpoint.async_save
        )
        self.ctx.barrier()
        self._saved_clock = time.monotonic()
        return path

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def close(self) -> None:
        """Release the run directory and leave the process group (if any); the trainer cannot train after it.

        After a failed :meth:`fit` under a process group (:attr:`failed`) the group is left as it is: leaving it takes
        a barrier, which ranks still training would never join. The process then exits without one
        (``drivetrain train`` with ``os._exit``), and torchrun stops the other ranks."""
        self._release()
        close_train_batches(self.data)  # a DALI pipeline's worker processes
        self.strategy.wrapped = self.model  # drop the DDP wrapper (its reducer holds the process group) first
        if not self.failed:
            teardown(self.ctx)
