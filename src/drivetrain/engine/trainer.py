"""The training loop: any model following the protocol, from one :class:`TrainConfig`.

One optimizer iteration: for each of ``train.accumulation`` micro-batches fetch → forward (autocast) →
loss (fp32) → scaled backward (gradient all-reduce only on the last); then unscale → clip → the one host
read (skip on non-finite gradients, preemption flag) → step → loss-scale update → zero_grad → record.
The learning rate is a pure function of the number of applied updates, so a skipped step moves neither
the optimizer's step counter nor the schedule.

A checkpoint (every ``checkpoint.every`` iterations, at the end, and on SIGTERM/SIGINT) holds the state of
:attr:`Trainer.components` — model, optimizer, loss scaler, loop counters, schedule, data position, every
rank's RNG states — with the world size, the config and versions (:mod:`drivetrain.engine.state`). Resuming
restores every component in that order (RNG last, after the data pipeline is built) and continues bit-for-bit.
"""

from __future__ import annotations

import inspect
import math
import os
import platform
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import yaml

import drivetrain
from drivetrain.data.errors import DataError
from drivetrain.engine.batches import BatchStream
from drivetrain.engine.build import apply_speed, build_dataset, build_model, build_optimizer
from drivetrain.engine.checkpoint import (
    CORRUPT,
    MARKER,
    SUPERSEDED,
    Checkpointer,
    CheckpointError,
    CheckpointWarning,
    check_components,
    check_format,
    checkpoint_dir,
)
from drivetrain.engine.config import ConfigError, TrainConfig, config_diff, config_to_dict, upgrade_saved_config
from drivetrain.engine.distributed import DistContext, setup, teardown
from drivetrain.engine.evaluation import EvalFrames, evaluate_model
from drivetrain.engine.metrics import MetricsLogger, peak_memory_mb
from drivetrain.engine.precision import autocast, fp32_outputs
from drivetrain.engine.protocol import Detector, FrozenEncoder, LossCounts, MatchedQueries, WeightedLoss
from drivetrain.engine.rng import seed_all
from drivetrain.engine.rundir import RunDirLock, check_run_dir, write_run_marker
from drivetrain.engine.schedule import lr_factor
from drivetrain.engine.state import FixedState, RngState, ScheduleState, Stateful, StrategyState
from drivetrain.engine.strategy import build_strategy
from drivetrain.losses.weights import base_name, resolve_weights, weighted_total
from drivetrain.match import warm_gpu_solver, warm_pending
from drivetrain.model_spec import keywords
from drivetrain.pipeline.augmentation import Augmentation
from drivetrain.pipeline.prefetch import DevicePrefetcher
from drivetrain.pipeline.transfer import to_device
from drivetrain.profile.timer import region, step_active
from drivetrain.safe_files import LinkedFolderError, real_dir, replace_text

__all__ = ["NonFiniteLossError", "TrainState", "Trainer"]

# Test hook: seconds to sleep after every optimizer iteration, so a test can signal or kill mid-run.
STEP_DELAY_ENV = "DRIVETRAIN_TEST_STEP_DELAY_S"


class NonFiniteLossError(RuntimeError):
    """The loss was NaN/inf and ``precision.nonfinite`` is ``stop``; the message names the batch."""


@dataclass
class TrainState:
    """Loop counters: ``iteration`` (optimizer iterations done, skipped ones included), ``step`` (updates
    applied; drives the schedule), ``skipped`` (iterations whose update was skipped for non-finite
    gradients), ``nonfinite_losses`` (iterations with a non-finite loss)."""

    iteration: int = 0
    step: int = 0
    skipped: int = 0
    nonfinite_losses: int = 0

    def state_dict(self) -> dict[str, int]:
        """The loop counters as a dict of ints."""
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Set the loop counters from :meth:`state_dict`'s dict."""
        for key in vars(self):
            setattr(self, key, int(state[key]))


@dataclass
class MicroBatches:
    """What the micro-batches of one iteration leave for the update and the metrics (device tensors)."""

    loss_sum: torch.Tensor  # () weighted loss summed over the micro-batches
    term_sums: dict[str, torch.Tensor]  # unweighted terms summed over the micro-batches
    loss_bad: torch.Tensor  # (accumulation,) bool: the micro-batch's loss was not finite
    indices: list[torch.Tensor] = field(default_factory=list)  # dataset indices of each micro-batch
    count_sums: dict[str, torch.Tensor] = field(default_factory=dict)  # the model's loss_counts, summed
    data_wait: float = 0.0  # seconds spent waiting for batches


@dataclass(frozen=True)
class StepDecision:
    """The step's host decisions, agreed across ranks."""

    apply: bool  # gradients and losses are finite: apply the update
    loss_bad: bool  # some rank had a non-finite loss
    stop: str | None  # the stop signal received (here or on another rank)


@runtime_checkable
class _Closing(Protocol):
    """A batch stream holding processes or files until closed (a DALI pipeline)."""

    def close(self) -> None: ...


class TrainingDataError(RuntimeError):
    """Training stopped on unreadable data; ``checkpoint`` holds the progress made (None under torchrun)."""

    def __init__(self, message: str, checkpoint: Path | None, can_skip: bool = True) -> None:
        self.message, self.checkpoint = message, checkpoint
        kept = f"; saved checkpoint {checkpoint} (fix the data, then --resume auto)" if checkpoint else ""
        skip = "set data.args.on_error=skip to skip unreadable frames (warned and counted)"
        if not can_skip:  # a DALI batch cannot drop a sample
            skip = "data.loader=torch with data.args.on_error=skip would skip unreadable frames"
        super().__init__(f"{message}; {skip}{kept}")


def _default_split(data_name: str) -> Any:
    """The ``split`` a registered data builder uses when the config names none (``"?"`` if it takes no split)."""
    from drivetrain.engine.registry import lookup

    try:
        parameter = inspect.signature(lookup("data", data_name)).parameters.get("split")
    except (TypeError, ValueError):
        return "?"
    return "?" if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


class Trainer:
    """Builds everything a run needs from ``cfg`` and trains with :meth:`fit`.

    ``cfg.run.out_dir`` must be new, empty or a drivetrain run (its ``.drivetrain-run`` marker, written when the
    trainer takes the directory's lock): anything else is a ConfigError before a file is written
    (:mod:`drivetrain.engine.rundir`).

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
        except BaseException:
            self._release()
            raise

    def _build(self, resume: str | None) -> None:
        cfg = self.cfg
        if self.ctx.is_main:  # before anything is built or written: only into a new, empty or drivetrain run dir
            check_run_dir(self.out_dir)
        self.checkpointer = Checkpointer(self.out_dir / "checkpoints", keep=cfg.checkpoint.keep)
        if resume is None and self.checkpointer.committed():
            raise ConfigError(
                f"run.out_dir: {self.out_dir} already holds checkpoints; pass --resume auto to continue "
                "that run or choose another run.out_dir"
            )

        seed_all(cfg.run.seed)  # model initialisation is identical on every rank
        model = build_model(cfg.model)
        if cfg.model.init_from is not None:  # a fresh run only: a resumed one restores its own weights
            from drivetrain.engine.init_from import init_model, starts_fresh

            if starts_fresh(resume, self.checkpointer):
                init_model(model, cfg.model.init_from, verbose=self.ctx.is_main)  # prints the report on rank 0
        self.model = apply_speed(model, cfg.speed)
        self.loss_weights: dict[str, float] | None = None
        self.counts_losses = isinstance(self.model, LossCounts)  # device counters logged beside the loss terms
        if isinstance(self.model, WeightedLoss):
            try:
                self.loss_weights = resolve_weights(self.model.loss_weights, cfg.model.loss_weights)
            except KeyError as err:
                raise ConfigError(f"model.loss_weights.{err.args[0]}") from None
        self.strategy = build_strategy(self.model, cfg, self.ctx, lambda model: build_optimizer(model, cfg.optim))
        self.optimizer, self.scaler = self.strategy.optimizer, self.strategy.scaler
        dataset = build_dataset(cfg.data, generate=self.generate_data)
        evaluates = cfg.eval.every or cfg.eval.at_start
        self.eval_data = self._build_eval_data() if evaluates and self.ctx.is_main else None
        rank, world_size = self.ctx.rank, self.ctx.world_size
        self.augment: Augmentation | None = None
        aug_cfg = cfg.data.augment
        if aug_cfg is not None and aug_cfg.active:  # camera and lidar, drawn per batch from (seed, rank, position)
            self.augment = Augmentation(aug_cfg, seed=cfg.run.seed, rank=rank, on=cfg.data.augment_on)
        in_worker = self.augment if cfg.data.augment_on == "worker" else None
        shard = {"seed": cfg.run.seed, "rank": rank, "world_size": world_size}
        if cfg.data.loader == "dali":  # decoding and the camera augmentation in DALI (drivetrain.pipeline.dali)
            self.data: Any = self._dali_stream(dataset, shard)
            on_device = self._device_transform(None)
        else:
            self.data = BatchStream(dataset, cfg.data, **shard, transform=in_worker)
            on_device = self._device_transform(self.augment if in_worker is None else None)
        if on_device is not None:  # augment / encode ahead on the device (on a side stream with data.prefetch)
            self.data = DevicePrefetcher(self.data, self.device, transform=on_device, overlap=cfg.data.prefetch)
        elif cfg.data.prefetch:  # the next batch goes to the device on a side stream (a pass-through on a CPU)
            self.data = DevicePrefetcher(self.data, self.device)
        self.state = TrainState()
        self.components = self._components()
        seed_all(cfg.run.seed + self.ctx.rank)  # dropout draws differ per rank (the augmentation seeds each batch)

        if self.ctx.is_main:  # one training process per run directory, from before anything is written
            self._lock = RunDirLock(self.out_dir)
            self._lock.acquire()
            write_run_marker(self.out_dir)
        self.resumed_from: Path | None = None
        self._resume_note: str | None = None
        if resume is not None:
            self._resume(resume)  # restores the RNG states last
        self.ctx.barrier()  # every rank has read its checkpoint before rank 0 moves any aside
        if self.ctx.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            replace_text(self.out_dir / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
            self._set_aside_unusable()
        self.ctx.barrier()
        self._stop_signal: str | None = None
        self.stopped_by: str | None = None  # after fit(): the signal that stopped it ("SIGINT", "SIGTERM", ...)
        self._step_delay = float(os.environ.get(STEP_DELAY_ENV, "0") or 0)

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
            "rng": RngState(self.ctx),
        }

    def _dali_stream(self, dataset: Any, shard: dict[str, int]) -> Any:
        """``data.loader=dali``: the DALI batch stream of ``dataset`` (errors name the setting)."""
        from drivetrain.pipeline.dali import DaliStream

        data = self.cfg.data
        if self.augment is not None and self.augment.config.lidar is not None:
            raise ConfigError("data.augment.lidar: data.loader=dali carries camera frames only; use data.loader=torch")
        try:
            return DaliStream(
                dataset, data.batch_size, shuffle=data.shuffle, **shard,
                augment=self.augment.config.camera if self.augment is not None else None, device=self.device,
                workers=data.num_workers, threads=max(1, data.num_workers), prefetch=data.prefetch_factor or 2,
            )  # fmt: skip
        except (ImportError, ValueError) as err:
            raise ConfigError(str(err)) from None

    def _device_transform(self, augment: Augmentation | None) -> Callable[[Any, dict[str, Any]], Any] | None:
        """What the prefetcher does to each batch on the device: the augmentation (camera and lidar), then (with
        ``speed.encoder_overlap``) the frozen image encoder under the run's autocast; None when neither."""
        cfg = self.cfg
        encode = None
        if cfg.speed.encoder_overlap:
            if not (isinstance(self.model, FrozenEncoder) and self.model.frozen_encoder):
                raise ConfigError(
                    f"speed.encoder_overlap: {cfg.model.name} has no frozen encoder (needs encode(batch) and "
                    "frozen_encoder, e.g. StreamPETR with model.args.freeze_backbone=true)"
                )
            if cfg.distributed.strategy in ("fsdp", "deepspeed"):
                raise ConfigError(
                    f"speed.encoder_overlap: the encoder runs outside the {cfg.distributed.strategy} forward, "
                    "whose parameters are sharded; use distributed.strategy ddp or none"
                )
            encode = self.model.encode
        if augment is None and encode is None:
            return None

        def transform(batch: Any, position: dict[str, Any]) -> Any:
            if augment is not None:
                batch = augment(batch, position)
            if encode is not None:
                with torch.no_grad(), autocast(cfg.precision.mode, self.device):
                    batch = replace(batch, encoded=encode(batch))
            return batch

        return transform

    # ------------------------------------------------------------------ the loop
    def fit(self) -> TrainState:
        """Train until ``train.steps`` iterations are done or a stop signal arrives; returns the state."""
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
        if self.resumed_from is not None:
            log.message(f"resumed from {self.resumed_from} at step {self.state.iteration}")
        elif self._resume_note is not None:
            log.message(self._resume_note)
        if isinstance(self.model, MatchedQueries):  # the GPU solver's kernels for the known Q, before the first step
            for queries in self.model.matched_queries:
                warm = warm_gpu_solver(queries, device=self.device)
                if warm.shapes:
                    log.message(f"solver: {warm.describe()} before the first step")
        saved_at = self.state.iteration if self.resumed_from is not None else -1
        try:
            with self._signals():
                if cfg.eval.at_start and self.state.iteration == 0:
                    self.evaluate(log)  # the initial weights' score, the baseline of the curve
                started, data_state = self.state.iteration, None
                try:
                    while self.state.iteration < cfg.train.steps:
                        started, data_state = self.state.iteration, self.data.state_dict()  # where it starts reading
                        try:
                            stop = self._iteration(log)
                        except DataError as err:
                            raise self._data_failure(err, data_state) from None
                        warm = warm_pending()  # GPU solver shapes the step met uncompiled: compiled between steps
                        if warm.shapes:
                            log.message(f"solver: {warm.describe()} after step {self.state.iteration}")
                        if self._step_delay:
                            time.sleep(self._step_delay)
                        done = self.state.iteration
                        if done % cfg.log.every == 0:
                            log.flush()
                        if cfg.eval.every and (done % cfg.eval.every == 0 or done == cfg.train.steps):
                            self.evaluate(log)  # before the checkpoint: a run killed during it evaluates again
                        if stop or done % cfg.checkpoint.every == 0 or done == cfg.train.steps:
                            log.flush()
                            path = self.save()
                            saved_at = done
                        if stop:
                            self.stopped_by = stop
                            log.message(
                                f"drivetrain train: received {stop}; stopped after step {done} with checkpoint {path}; "
                                "continue with --resume auto"
                            )
                            break
                except RuntimeError as err:  # torch reports a dead loader worker wherever the main process is
                    if "DataLoader worker" not in str(err):
                        raise
                    died = DataError(
                        f"a data loader worker process died ({str(err).splitlines()[0].rstrip('. ')}); killed or "
                        "out of memory — fewer data.num_workers or more memory, then --resume auto"
                    )
                    position = data_state if self.state.iteration == started else None  # mid-step: its start
                    raise self._data_failure(died, position) from None
            if saved_at != self.state.iteration:  # e.g. resumed a finished run with the same steps
                log.flush()
                self.save()
        finally:
            log.close()
            self._release()
        return self.state

    def _build_eval_data(self) -> Any:
        """The ``eval.split`` frames, from the training data builder with ``split`` replaced (rank 0 only)."""
        if not isinstance(self.model, Detector):
            raise ConfigError(f"eval.every: {self.cfg.model.name} has no detect(batch) method to evaluate with")
        args = {**keywords(self.cfg.data.args), "split": self.cfg.eval.split}
        trained_on = keywords(self.cfg.data.args).get("split", _default_split(self.cfg.data.name))
        if trained_on is None or trained_on == self.cfg.eval.split:  # None: every scene, the evaluated ones too
            warnings.warn(
                f"eval.split: {self.cfg.eval.split!r} is also what the run trains on (data.args.split={trained_on!r}): "
                "its scores measure memorisation, not detection of unseen scenes; train on another split "
                "(mini_train, train) or evaluate another (eval.split=mini_val, val)",
                RuntimeWarning,
                stacklevel=2,
            )
        with torch.random.fork_rng(devices=[]):  # building it draws nothing from the run's RNG
            frames = build_dataset(replace(self.cfg.data, args=args), generate=self.generate_data)
        if not isinstance(frames, EvalFrames):
            raise ConfigError(
                f"eval.every: data.name {self.cfg.data.name} builds no frames of an index to score (they need index, "
                "root and collate, as the frames and synthetic sources give)"
            )
        return frames

    def evaluate(self, log: MetricsLogger) -> None:
        """Evaluate the current weights on ``eval.split`` (rank 0; the others wait) and log the metrics.

        The streaming state and the RNGs are left as they were (see :mod:`drivetrain.engine.evaluation`); an
        unreadable evaluation frame or a devkit failure is reported and training goes on.
        """
        step = self.state.iteration
        if self.ctx.is_main:
            out = self.out_dir / "eval" / f"step-{step:08d}"
            try:
                real_dir(out, base=self.out_dir, create=True)  # eval/ and step-N/ real folders of the run, not links
                first: dict[str, Any] = {}

                def keep_first(frame: int, batch: Any, boxes: Any, scores: Any, labels: Any) -> None:
                    if frame == 0:
                        first.update(batch=batch.to("cpu"), boxes=boxes, scores=scores, labels=labels)

                result = evaluate_model(
                    self.model, self.eval_data, self.device, out, split=self.cfg.eval.split,
                    progress=self.cfg.eval.progress, quiet=True,
                    transform=self.augment.test_time if self.augment is not None else None, on_frame=keep_first,
                )  # fmt: skip
                if first:
                    try:
                        log.image("eval/frame-0", _frame_picture(**first), step)
                    except ImportError as err:  # a lidar frame's picture needs matplotlib
                        log.message(f"drivetrain train: no frame picture in TensorBoard ({err})")
            except (DataError, LinkedFolderError, NotADirectoryError) as err:
                log.message(f"drivetrain train: evaluation at step {step} failed, training goes on: {err}")
            else:
                summary = result.summary()
                log.evaluation(step, summary)
                scores = f"mAP {summary['mAP']:.4f}" + (f"  NDS {summary['NDS']:.4f}" if "NDS" in summary else "")
                log.message(
                    f"eval step {step} ({self.cfg.eval.split}, {result.frames} frames, {result.seconds:.0f} s): "
                    f"{scores}  → {out}"
                )
        self.ctx.barrier()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def _iteration(self, log: MetricsLogger) -> str | None:
        """One optimizer iteration; returns the name of a received stop signal (agreed across ranks)."""
        t_start = time.perf_counter()
        with region("step"):  # profiled regions (doctor, bench train): no-ops unless a profiler is active
            micro = self._forward_backward()
            with region("optimizer"):
                grad_norm, grads_bad = self.strategy.unscale_and_clip()
                decision = self._decide(grads_bad, micro)
                lr = self._set_lr(self.state.step)
                overflow = grads_bad & ~micro.loss_bad.any()  # a bad loss is not an fp16 overflow
                grad_norm, scale, applied = self.strategy.step(decision.apply, overflow, grad_norm)
        step_active()
        self._advance(applied, decision)
        self._record(log, micro, grad_norm, scale, lr, time.perf_counter() - t_start)
        return decision.stop

    def _forward_backward(self) -> MicroBatches:
        """Forward, loss and backward of each micro-batch; gradients reduced across ranks on the last one."""
        cfg, accum = self.cfg, self.cfg.train.accumulation
        out = MicroBatches(
            loss_sum=torch.zeros((), device=self.device),
            term_sums={},
            loss_bad=torch.zeros(accum, dtype=torch.bool, device=self.device),
        )
        for micro in range(accum):
            t0 = time.perf_counter()
            with region("data"):  # blocked on the loader (and, with the prefetcher, on its side stream)
                batch, indices = self.data.next()
            with region("copy"):  # host → device; the prefetcher's batches are there already (a pass-through)
                batch = to_device(batch, self.device, cfg.speed.channels_last)
            out.data_wait += time.perf_counter() - t0
            out.indices.append(indices)
            with self.strategy.sync_grads(enabled=micro == accum - 1):
                with region("forward"), autocast(cfg.precision.mode, self.device):
                    outputs = self.strategy.wrapped(batch)
                with region("loss"):
                    terms = self.model.loss(fp32_outputs(outputs), batch)  # losses in fp32, outside autocast
                    loss = weighted_total(terms, self._weights_for(terms)).float()
                with region("backward"):
                    self.strategy.backward(loss / accum)
            out.loss_sum += loss.detach()
            for name, term in terms.items():
                out.term_sums[name] = out.term_sums.get(name, 0) + term.detach().float()
            counts = self.model.loss_counts if self.counts_losses else {}  # optional: device counters
            for name, count in counts.items():
                out.count_sums[name] = out.count_sums.get(name, 0) + count
            out.loss_bad[micro] = ~torch.isfinite(loss.detach())
        return out

    def _decide(self, grads_bad: torch.Tensor, micro: MicroBatches) -> StepDecision:
        """Skip, non-finite loss and stop, agreed across ranks in one device read (the step's one sync)."""
        any_bad = micro.loss_bad.any().to(torch.int64)
        stop_flag = any_bad.new_full((), int(self._stop_signal is not None))  # a fill, not a host copy
        if self.ctx.initialized:  # every rank takes the same decisions
            any_bad, stop_flag = self.ctx.all_reduce_max(torch.stack([any_bad, stop_flag]))
        first_bad = micro.loss_bad.to(torch.int64).argmax()
        skip, loss_bad, stop, bad_micro = torch.stack(  # sync: skipping the step is a host decision
            [grads_bad.to(torch.int64), any_bad, stop_flag, first_bad]
        ).tolist()
        if loss_bad and self.cfg.precision.nonfinite == "stop":
            local_bad = bool(micro.loss_bad[bad_micro])  # sync: error path only, the run stops here
            self._raise_nonfinite(local_bad, bad_micro, micro.indices)
        stop_name = self._stop_signal or ("a stop signal (on another rank)" if stop else None)
        return StepDecision(apply=not (skip or loss_bad), loss_bad=bool(loss_bad), stop=stop_name)

    def _advance(self, applied: bool, decision: StepDecision) -> None:
        if applied:
            self.state.step += 1
        else:
            self.state.skipped += 1
            self.state.nonfinite_losses += int(decision.loss_bad)
        self.state.iteration += 1

    def _record(
        self,
        log: MetricsLogger,
        micro: MicroBatches,
        grad_norm: torch.Tensor,
        scale: torch.Tensor,
        lr: float,
        elapsed: float,
    ) -> None:
        accum = self.cfg.train.accumulation
        samples = accum * self.cfg.data.batch_size * self.ctx.world_size
        device_values = {"loss": micro.loss_sum / accum, "grad_norm": grad_norm, "loss_scale": scale}
        device_values.update({f"loss/{k}": v / accum for k, v in micro.term_sums.items()})
        device_values.update({f"count/{k}": v for k, v in micro.count_sums.items()})  # summed over micro-batches
        host_values = {
            "step": self.state.iteration,
            "opt_step": self.state.step,
            "lr": lr,
            "skipped_steps": self.state.skipped,
            "nonfinite_losses": self.state.nonfinite_losses,
            "samples_per_s": samples / elapsed if elapsed > 0 else 0.0,
            "step_time_s": elapsed,
            "data_wait_s": micro.data_wait,
            "peak_memory_mb": peak_memory_mb(self.device),
        }
        log.record(device_values, host_values)

    def _weights_for(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        """The weight of every term: declared by the model and overridden by the config (checked at build).

        A model that declares no ``loss_weights`` weighs its terms 1 unless the config names them; the config's
        names are checked against the first step's terms instead.
        """
        if self.loss_weights is not None:
            return self.loss_weights
        bases = {base_name(k) for k in terms}
        unknown = sorted(set(self.cfg.model.loss_weights) - bases)
        if unknown:
            raise ConfigError(
                f"model.loss_weights.{unknown[0]}: not a loss term of this model; its terms are {sorted(bases)}"
            )
        return {**dict.fromkeys(bases, 1.0), **self.cfg.model.loss_weights}

    def _set_lr(self, step: int) -> float:
        """Set every group's lr for update ``step``; returns the base lr (lr_mult 1)."""
        base = self.cfg.optim.lr * lr_factor(self.cfg.schedule, step, self.cfg.train.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = base * group["lr_mult"]
        return base

    def _raise_nonfinite(self, local: bool, micro: int, batch_indices: list[torch.Tensor]) -> None:
        where = (
            f"micro-batch {micro} on rank {self.ctx.rank}, epoch {self.data.state_dict()['epoch']}, "
            f"dataset indices {batch_indices[micro].tolist()}"
            if local
            else f"a micro-batch on another rank than {self.ctx.rank}"
        )
        raise NonFiniteLossError(
            f"non-finite loss at step {self.state.iteration + 1}: {where} "
            "(precision.nonfinite=stop; set it to skip to skip and count such steps)"
        )

    # ------------------------------------------------------------------ checkpoints
    def _data_failure(self, err: DataError, data_state: dict[str, Any]) -> TrainingDataError:
        """A sample could not be read: keep the progress of the completed steps, then name the file.

        One process saves a checkpoint of the last completed step with the data position at the start of the
        failed iteration (so a resume after fixing the data continues exactly); under torchrun the other
        ranks cannot join a save, so the run stops with its last periodic checkpoint.
        """
        path = None
        if not self.ctx.initialized:
            done = self.checkpointer.root / Checkpointer.name(self.state.iteration)
            path = done if (done / MARKER).is_file() else self.save(data_state=data_state)
        # From a loader worker the message carries the worker's traceback; its last line is the error itself.
        message = (str(err).strip().splitlines() or [type(err).__name__])[-1].split("DataError: ", 1)[-1]
        return TrainingDataError(message, path, can_skip=self.cfg.data.loader != "dali")

    def save(self, data_state: dict[str, Any] | None = None) -> Path:
        """Checkpoint the run now (collective: every rank calls it; rank 0 writes); returns its path.

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
        path = self.checkpointer.save_state(self.state.iteration, components, meta, write=self.ctx.is_main)
        self.ctx.barrier()
        return path

    def _resume(self, resume: str) -> None:
        if resume == "auto":
            found = self.checkpointer.load_latest()
            if found is None:
                if self.checkpointer.skipped:
                    self._resume_note = (
                        f"no usable checkpoint in {self.checkpointer.root} ({len(self.checkpointer.skipped)} "
                        f"corrupt, moved to {self.checkpointer.root / CORRUPT}); starting from step 0"
                    )
                return
            path, ckpt = found
        else:
            try:
                path = checkpoint_dir(resume)  # a checkpoint folder or its state.pt
            except CheckpointError as err:
                raise ConfigError(f"--resume: {err}") from None
            if not path.exists():
                raise ConfigError(f"--resume: {path} does not exist (pass auto, or a checkpoint directory)")
            if (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file():
                raise ConfigError(
                    f"--resume: {path} is a run directory; pass --resume auto with run.out_dir={path}, or one of "
                    f"its checkpoints ({path / 'checkpoints' / 'step-N'})"
                )
            try:
                ckpt = self.checkpointer.load(path)
            except CheckpointError as err:
                raise ConfigError(f"--resume: {err}") from None
        try:  # before anything is read from it: another format version, a missing or an extra component
            check_format(ckpt, path)
            check_components(ckpt, self.components, path)
        except CheckpointError as err:
            raise ConfigError(f"--resume: {err}") from None
        self._refuse_old_lidar_augmentation(path, ckpt)
        diff = config_diff(upgrade_saved_config(ckpt["config"]), config_to_dict(self.cfg))
        if diff:
            raise ConfigError(
                f"--resume: the config differs from the one checkpoint {path} was written with:\n  " + "\n  ".join(diff)
            )
        if ckpt["world_size"] != self.ctx.world_size:
            raise ConfigError(
                f"--resume: checkpoint {path} was written by {ckpt['world_size']} ranks, this run has "
                f"{self.ctx.world_size}; per-rank RNG and data positions need the same number"
            )
        self.checkpointer.restore(ckpt, self.components, path)  # in the mapping's order: the RNG states last
        self._warn_schedule_change(ckpt["config"]["train"]["steps"], self.state.step)
        self.resumed_from = path

    def _refuse_old_lidar_augmentation(self, path: Path, ckpt: dict[str, Any]) -> None:
        """A checkpoint whose lidar model drew its own augmentation (its generator is the model's ``_extra_state``)
        cannot continue exactly: the augmentation is drawn per batch from (run seed, rank, position) now."""
        if "_extra_state" in ckpt["model"] and type(self.model).get_extra_state is torch.nn.Module.get_extra_state:
            raise ConfigError(
                f"--resume: checkpoint {path} holds a lidar model's own augmentation generator (model.args.augment, "
                "model.args.seed); the augmentation lives in data.augment.lidar now, drawn per batch from run.seed, "
                "the rank and the batch position, so the run cannot continue exactly: start a new run (drivetrain "
                "eval --checkpoint still scores this one)"
            )

    def _warn_schedule_change(self, saved_steps: int, step: int) -> None:
        """Warn when a resume with another ``train.steps`` reshapes the schedule (its length follows it)."""
        sched, lr = self.cfg.schedule, self.cfg.optim.lr
        if saved_steps == self.cfg.train.steps or sched.total_steps is not None or sched.kind == "warmup_constant":
            return
        before, after = lr * lr_factor(sched, step, saved_steps), lr * lr_factor(sched, step, self.cfg.train.steps)
        if not math.isclose(before, after, rel_tol=1e-6):
            warnings.warn(
                f"train.steps changed from {saved_steps} to {self.cfg.train.steps}: the {sched.kind} schedule "
                f"stretches with it, so the lr at step {step} jumps from {before:.3g} to {after:.3g}; pass "
                f"schedule.total_steps={saved_steps} to keep the old schedule (the lr then stays at its final "
                "value past that step)",
                RuntimeWarning,
                stacklevel=3,
            )

    def _set_aside_unusable(self) -> None:
        """Rank 0, after a resume: move corrupt checkpoints and those of an abandoned continuation aside.

        Corrupt ones (committed, but failing to load) go to ``checkpoints/corrupt/``; committed ones newer
        than the step resumed from (``--resume DIR`` of an older checkpoint, or a start from 0 when none
        loads) to ``checkpoints/superseded/``, so that a later ``--resume auto`` cannot pick them up over this
        run's progress. Nothing is deleted.
        """
        for path, reason in self.checkpointer.skipped:
            if path.is_dir():
                target = self.checkpointer.set_aside(path, CORRUPT)
                warnings.warn(
                    f"moved corrupt checkpoint {path} to {target} ({reason})", CheckpointWarning, stacklevel=2
                )
        if self.resumed_from is None and self._resume_note is None:
            return
        for step, path in self.checkpointer.committed():
            if step > self.state.iteration:
                target = self.checkpointer.set_aside(path, SUPERSEDED)
                warnings.warn(
                    f"moved checkpoint {path} to {target}: it is newer than step {self.state.iteration}, which "
                    "this run continues from",
                    CheckpointWarning,
                    stacklevel=2,
                )

    # ------------------------------------------------------------------ signals
    @contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT set a flag; the loop finishes the step, checkpoints and returns."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            self._stop_signal = signal.Signals(signum).name

        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def close(self) -> None:
        """Release the run directory and leave the process group (if any); the trainer cannot train after it."""
        self._release()
        stream = self.data.stream if isinstance(self.data, DevicePrefetcher) else self.data
        if isinstance(stream, _Closing):  # a DALI pipeline's worker processes
            stream.close()
        self.strategy.wrapped = self.model  # drop the DDP wrapper (its reducer holds the process group) first
        teardown(self.ctx)


def _frame_picture(batch: Any, boxes: Any, scores: Any, labels: Any, threshold: float = 0.3) -> Any:
    """The first evaluation frame for TensorBoard: its cameras with ground truth (thick) and the detections
    scoring at least ``threshold`` (thin) projected, or, for a lidar frame, its bird's-eye view."""
    import numpy as np

    keep = scores >= threshold
    gt, gt_labels = batch.gt_boxes.to_list()[0].numpy(), batch.gt_labels.to_list()[0].numpy()
    if batch.images is not None:
        from drivetrain.viz.camera import camera_grid

        images = batch.images[0].permute(0, 2, 3, 1).numpy()
        return camera_grid(images, batch.lidar2img[0].numpy(), gt, gt_labels, boxes[keep], labels[keep])
    from drivetrain.viz.lidar import bev_array

    points = batch.points.to_list()[0].numpy() if batch.points is not None else np.zeros((0, 3))
    return bev_array(points, gt, boxes[keep], scores[keep])
