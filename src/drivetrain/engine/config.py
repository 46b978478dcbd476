"""Typed training configuration: frozen dataclasses, YAML files and ``a.b=value`` overrides.

A run is described by one :class:`TrainConfig`. ``load_config(path, overrides)`` reads a YAML file (merged onto the
``base:`` files it starts from: :mod:`drivetrain.engine.config_files`), applies command-line overrides
(``optim.lr=3e-4``, ``speed.activation_checkpointing=[backbone]``; values are parsed as YAML), and builds the
dataclasses, checking every key and type. Unknown keys, wrong types, bad override syntax and out-of-range values
raise :class:`ConfigError` naming the key (and the file).

Example:
    >>> cfg = load_config("configs/smoke.yaml", ["train.steps=20", "precision.mode=bf16"])
    >>> cfg.optim.lr
    0.001
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from drivetrain.engine.init_from import InitFrom
from drivetrain.engine.typed import (  # from_dict re-exported
    ConfigError,  # re-exported: defined below the registry
    DataclassInstance,
    _join,
    from_dict,
)
from drivetrain.pipeline.augment.stage import AugmentConfig

__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
    "EvalConfig",
    "LogConfig",
    "ModelConfig",
    "OptimConfig",
    "ParamGroupConfig",
    "PrecisionConfig",
    "RunConfig",
    "ScheduleConfig",
    "SpeedConfig",
    "TrainConfig",
    "TrainStepsConfig",
    "apply_overrides",
    "config_diff",
    "config_to_dict",
    "from_dict",
    "load_config",
    "over_model_recipe",
    "resolved_sections",
]


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _check_finite(key: str, *values: Any) -> None:
    """ConfigError naming ``key`` for a NaN or infinite number (YAML's ``.nan``/``.inf``, ``1e400``, an integer
    past float range): no learning rate, decay, factor or weight means anything there, and an ``optim.lr`` of inf
    trained to NaN losses while the run "succeeded". ``None`` (a switch left off) and non-numbers pass (the type
    checks name those)."""
    for value in values:
        if isinstance(value, float):
            _check(math.isfinite(value), key, f"must be a finite number, got {value}")
        elif isinstance(value, int) and not isinstance(value, bool):
            past = f"an integer of {value.bit_length()} bits, past the float range"  # str() refuses > 4300 digits
            _check(abs(value) <= _FLOAT_MAX, key, f"must be a finite number, got {past}")


_FLOAT_MAX = int(sys.float_info.max)  # an int beyond it has no float: float(x) raises OverflowError


@dataclass(frozen=True)
class RunConfig:
    """Section ``run``: where the run writes, its seed, determinism and threads."""

    out_dir: str = "runs/smoke"  # run directory: config.yaml, metrics.jsonl, checkpoints/, tensorboard/
    seed: int = 0  # seeds model init (same on all ranks) and per-rank RNG (seed + rank)
    deterministic: bool = False  # torch.use_deterministic_algorithms(True) (bit-exact resume on CPU needs it)
    threads: int | None = None  # torch.set_num_threads per process; None keeps torch's default

    def __post_init__(self) -> None:
        _check(bool(self.out_dir), "run.out_dir", "must not be empty")
        _check(self.threads is None or self.threads >= 1, "run.threads", f"must be ≥ 1, got {self.threads}")


@dataclass(frozen=True)
class ModelConfig:
    """Section ``model``: the model builder, its arguments, loss-weight overrides and initial weights."""

    name: str = "smoke"  # a registered model name (drivetrain.engine.registry; `drivetrain configs` lists them)
    # the builder's keyword arguments: after loading, an instance of the dataclass its spec declares (every field,
    # defaults filled in); the mapping as written for a builder that declares none (its signature checks it)
    args: dict[str, Any] | DataclassInstance = field(default_factory=dict)
    # Overrides of the model's declared loss weights, by base term (``loss_cls`` also weighs ``d3.loss_cls``);
    # a name the model does not declare is an error.
    loss_weights: dict[str, float] = field(default_factory=dict)
    # Initial weights of a fresh run (never read on a resume): a path (a drivetrain run, checkpoint or state.pt; a
    # weights file in a format the model's spec declares) or {path, format, strict}
    # (drivetrain.engine.init_from).
    init_from: InitFrom | None = None

    def __post_init__(self) -> None:
        if self.init_from is not None and not isinstance(self.init_from, InitFrom):
            object.__setattr__(self, "init_from", InitFrom.from_dict(self.init_from))  # a path given in Python
        for name, weight in self.loss_weights.items():
            _check(
                isinstance(weight, int | float) and not isinstance(weight, bool),
                f"model.loss_weights.{name}",
                f"expected a number, got {weight!r}",
            )
            _check_finite(f"model.loss_weights.{name}", weight)
        from drivetrain.engine.registry import check_args  # model.args onto the spec's typed arguments, if declared

        object.__setattr__(self, "args", check_args("model", self.name, self.args))


@dataclass(frozen=True)
class DataConfig:
    """Section ``data``: the dataset builder and how it is batched and loaded."""

    name: str = "smoke"  # a registered dataset name (drivetrain.engine.registry): synthetic, frames, smoke, ...
    # the builder's keyword arguments: after loading, an instance of the dataclass it declares (FramesArgs,
    # SyntheticArgs: every field, defaults filled in); the mapping as written for a builder that declares none
    args: dict[str, Any] | DataclassInstance = field(default_factory=dict)
    batch_size: int = 8  # samples per micro-batch per rank
    shuffle: bool = True  # reshuffle every epoch (permutation drawn from seed and epoch only)
    num_workers: int = 0  # DataLoader worker processes
    pin_memory: bool = False  # page-locked host batches (CUDA only)
    persistent_workers: bool = False  # keep workers alive between epochs (needs num_workers > 0)
    prefetch_factor: int | None = None  # batches loaded ahead per worker (needs num_workers > 0)
    prefetch: bool = False  # CUDA: copy (and augment) batch n+1 on a side stream while n trains; CPU: no effect
    # the training augmentation, {camera: {...}, lidar: {...}} (null: none; drivetrain.pipeline.augment.stage), and
    # where it runs: "device" (the whole batch at once on the training device, in the prefetcher) or "worker" (per
    # sample in the loader workers)
    augment: AugmentConfig | None = None
    augment_on: str = "device"
    # "torch" (DataLoader) or "dali" (NVIDIA DALI: JPEG decoding and the image augmentation in DALI, on the GPU when
    # there is one; num_workers = its Python source processes; drivetrain.pipeline.dali)
    loader: str = "torch"

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, "data.batch_size", f"must be ≥ 1, got {self.batch_size}")
        _check(self.num_workers >= 0, "data.num_workers", f"must be ≥ 0, got {self.num_workers}")
        _check(
            self.num_workers > 0 or not self.persistent_workers,
            "data.persistent_workers",
            "needs data.num_workers > 0",
        )
        _check(
            self.prefetch_factor is None or (self.num_workers > 0 and self.prefetch_factor >= 1),
            "data.prefetch_factor",
            "needs data.num_workers > 0 and a value ≥ 1",
        )
        _check(self.augment_on in ("device", "worker"), "data.augment_on", f"device or worker, got {self.augment_on!r}")
        _check(self.loader in ("torch", "dali"), "data.loader", f"torch or dali, got {self.loader!r}")
        from drivetrain.engine.registry import check_args  # data.args onto the builder's typed arguments, if declared

        object.__setattr__(self, "args", check_args("data", self.name, self.args))


@dataclass(frozen=True)
class TrainStepsConfig:
    """Section ``train``: how many optimizer iterations, micro-batches per step, device."""

    steps: int = 100  # optimizer iterations (a skipped fp16 step counts as an iteration, not as an update)
    accumulation: int = 1  # micro-batches per optimizer step (derived from global_batch when that is set)
    # Samples per optimizer step over all ranks; when set, accumulation = global_batch / (data.batch_size × ranks) on
    # each start (with_global_batch), so one command continues exactly on whatever number of ranks a start gets.
    global_batch: int | None = None
    device: str = "auto"  # auto (cuda:LOCAL_RANK if available, else cpu), cpu or cuda

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "train.steps", f"must be ≥ 1, got {self.steps}")
        _check(self.accumulation >= 1, "train.accumulation", f"must be ≥ 1, got {self.accumulation}")
        _check(
            self.global_batch is None or self.global_batch >= 1,
            "train.global_batch",
            f"must be ≥ 1 or null, got {self.global_batch}",
        )
        _check(self.device in ("auto", "cpu", "cuda"), "train.device", f"auto, cpu or cuda, got {self.device!r}")


@dataclass(frozen=True)
class ParamGroupConfig:
    """One entry of ``optim.groups``: parameters under module paths with their own lr multiplier."""

    modules: list[str]  # parameters whose name starts with one of these module paths ("backbone")
    lr_mult: float = 1.0  # learning rate = optim.lr × lr_mult × schedule
    weight_decay: float | None = None  # None keeps optim.weight_decay

    def __post_init__(self) -> None:
        _check(bool(self.modules), "optim.groups[].modules", "must name at least one module")
        _check_finite("optim.groups[].lr_mult", self.lr_mult)
        _check_finite("optim.groups[].weight_decay", self.weight_decay)
        _check(self.lr_mult >= 0, "optim.groups[].lr_mult", f"must be ≥ 0, got {self.lr_mult}")
        _check(
            self.weight_decay is None or self.weight_decay >= 0,
            "optim.groups[].weight_decay",
            f"must be ≥ 0 or null, got {self.weight_decay}",
        )


@dataclass(frozen=True)
class OptimConfig:
    """Section ``optim``: AdamW hyper-parameters, parameter groups and gradient clipping."""

    lr: float = 1e-3  # peak learning rate of AdamW
    weight_decay: float = 0.01  # decoupled weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam β1, β2
    eps: float = 1e-8  # Adam ε
    clip_norm: float | None = None  # max global gradient norm; None = no clipping
    groups: list[ParamGroupConfig] = field(default_factory=list)  # extra groups; the rest use lr_mult 1

    def __post_init__(self) -> None:
        for key in ("lr", "weight_decay", "eps", "clip_norm"):
            _check_finite(f"optim.{key}", getattr(self, key))
        _check_finite("optim.betas", *self.betas)
        _check(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")
        _check(self.weight_decay >= 0, "optim.weight_decay", f"must be ≥ 0, got {self.weight_decay}")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas", "two values in [0, 1)")
        _check(self.eps > 0, "optim.eps", f"must be > 0, got {self.eps}")
        _check(self.clip_norm is None or self.clip_norm > 0, "optim.clip_norm", "must be > 0 or null")


@dataclass(frozen=True)
class ScheduleConfig:
    """Section ``schedule``: the learning-rate schedule over applied updates."""

    kind: Literal["warmup_cosine", "onecycle", "warmup_constant"] = "warmup_cosine"
    warmup_steps: int = 0  # linear warm-up from 0 (warmup_cosine, warmup_constant)
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of the peak lr
    total_steps: int | None = None  # schedule length; None = train.steps
    pct_start: float = 0.3  # onecycle: fraction of steps spent rising
    div_factor: float = 25.0  # onecycle: initial lr = lr / div_factor
    final_div_factor: float = 1e4  # onecycle: final lr = initial lr / final_div_factor

    def __post_init__(self) -> None:
        for key in ("min_lr_ratio", "pct_start", "div_factor", "final_div_factor"):
            _check_finite(f"schedule.{key}", getattr(self, key))
        _check(self.warmup_steps >= 0, "schedule.warmup_steps", f"must be ≥ 0, got {self.warmup_steps}")
        _check(0 <= self.min_lr_ratio <= 1, "schedule.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        _check(self.total_steps is None or self.total_steps >= 1, "schedule.total_steps", "must be ≥ 1 or null")
        _check(0 < self.pct_start < 1, "schedule.pct_start", f"must be in (0, 1), got {self.pct_start}")
        _check(self.div_factor > 0 and self.final_div_factor > 0, "schedule.div_factor", "factors must be > 0")


@dataclass(frozen=True)
class PrecisionConfig:
    """Section ``precision``: fp32/bf16/fp16, the dynamic loss scaler, non-finite loss policy."""

    mode: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast dtype of the forward; losses stay fp32
    init_scale: float = 65536.0  # fp16: initial loss scale (the published V100 setup used 2**32)
    growth_interval: int = 1000  # fp16: finite steps in a row before the scale grows
    growth_factor: float = 2.0  # fp16: scale × this after growth_interval finite steps
    backoff_factor: float = 0.5  # fp16: scale × this on overflow (once hysteresis is used up)
    hysteresis: int = 2  # fp16: overflows tolerated before the scale backs off
    min_scale: float = 1.0  # fp16: the scale never drops below this
    nonfinite: Literal["skip", "stop"] = "skip"  # non-finite loss: skip the step and count it, or stop

    def __post_init__(self) -> None:
        for key in ("init_scale", "growth_factor", "backoff_factor", "min_scale"):
            _check_finite(f"precision.{key}", getattr(self, key))
        _check(self.init_scale > 0, "precision.init_scale", f"must be > 0, got {self.init_scale}")
        _check(self.growth_interval >= 1, "precision.growth_interval", "must be ≥ 1")
        _check(self.growth_factor >= 1, "precision.growth_factor", "must be ≥ 1")
        _check(0 < self.backoff_factor < 1, "precision.backoff_factor", "must be in (0, 1)")
        _check(self.hysteresis >= 1, "precision.hysteresis", f"must be ≥ 1, got {self.hysteresis}")
        _check(0 < self.min_scale <= self.init_scale, "precision.min_scale", "must be in (0, init_scale]")


@dataclass(frozen=True)
class SpeedConfig:
    """Section ``speed``: memory format, activation checkpointing, compile, cuDNN and TF32 switches."""

    activation_checkpointing: list[str] = field(default_factory=list)  # module paths recomputed in backward
    channels_last: Literal["none", "2d", "3d"] = "none"  # memory format of model and 4-D/5-D float inputs
    cudnn_benchmark: bool = False  # torch.backends.cudnn.benchmark
    tf32: bool = False  # TF32 matmuls and convolutions on Ampere+ GPUs
    compile: list[str] = field(default_factory=list)  # module paths to torch.compile ("" = the whole model)
    # a frozen image encoder (model.encode, e.g. a frozen backbone) runs for batch n+1 while batch n trains:
    # on CUDA on the prefetcher's side stream (needs data.prefetch), on a CPU right after the batch is read
    encoder_overlap: bool = False
    # the training forward and loss as one graph per shape bucket (a model with the StaticStep capability), every
    # bucket compiled before step 1 (engine/build.py), and the optimizer update as one graph with a tensor lr
    # (engine/undoable_update.py OptimizerGraph); one process or DDP (which wraps the compiled step)
    compile_step: bool = False
    # torch.compile backend of compile_step: "inductor" (generated kernels, minutes per bucket on a CPU), "aot_eager"
    # (the graph with its backward, no code generation: the tests), "eager"
    compile_step_backend: str = "inductor"
    # torch.compile mode of compile_step: "reduce-overhead" replays each bucket as a CUDA graph (cudagraph trees, one
    # memory pool; inductor on a CUDA device, train.accumulation 1), "default" launches its kernels one by one
    compile_step_mode: Literal["default", "reduce-overhead"] = "default"

    def __post_init__(self) -> None:
        _check(bool(self.compile_step_backend), "speed.compile_step_backend", "must name a torch.compile backend")
        _check(
            self.compile_step_mode == "default" or self.compile_step_backend == "inductor",
            "speed.compile_step_mode",
            f"reduce-overhead needs speed.compile_step_backend inductor, got {self.compile_step_backend}",
        )
        _check(
            not (self.encoder_overlap and self.compile_step),
            "speed.encoder_overlap",
            "not with speed.compile_step: the compiled step encodes the images inside its graph",
        )


@dataclass(frozen=True)
class DistributedConfig:
    """Section ``distributed``: the data-parallel strategy (DDP, FSDP2, DeepSpeed) and its options."""

    strategy: Literal["none", "ddp", "fsdp", "deepspeed"] = "none"  # with torchrun; "none" = one process
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl on CUDA (+ gloo under fsdp_cpu_offload), gloo on CPU
    static_graph: bool = False  # DDP static_graph (same used parameters every step)
    find_unused_parameters: bool = False  # DDP find_unused_parameters
    fsdp_modules: list[str] = field(default_factory=list)  # FSDP2 units (module paths); [] = direct children
    fsdp_cpu_offload: bool = False  # FSDP2 CPUOffloadPolicy: parameters, gradients, optimizer state on CPU
    fsdp_reshard_after_forward: bool = True  # FSDP2: free gathered parameters after forward (ZeRO-3)
    deepspeed_zero_stage: int = 2  # DeepSpeed ZeRO: 1 shards optimizer state, 2 + gradients, 3 + parameters
    deepspeed_offload_optimizer: bool = False  # DeepSpeed ZeRO-Offload: optimizer state and step on the CPU
    deepspeed_offload_params: bool = False  # DeepSpeed ZeRO-3 only: parameters live on the CPU between uses
    timeout_s: float = 1800.0  # seconds a collective waits for the other ranks before the run fails with an error

    def __post_init__(self) -> None:
        _check_finite("distributed.timeout_s", self.timeout_s)  # timedelta takes no inf
        _check(self.timeout_s > 0, "distributed.timeout_s", f"must be > 0 seconds, got {self.timeout_s}")
        _check(
            self.deepspeed_zero_stage in (1, 2, 3),
            "distributed.deepspeed_zero_stage",
            f"must be 1, 2 or 3, got {self.deepspeed_zero_stage}",
        )
        _check(
            not self.deepspeed_offload_params or self.deepspeed_zero_stage == 3,
            "distributed.deepspeed_offload_params",
            f"needs distributed.deepspeed_zero_stage=3, got {self.deepspeed_zero_stage}",
        )
        _check(
            self.strategy != "deepspeed" or module_available("deepspeed"),
            "distributed.strategy",
            "'deepspeed' needs the deepspeed package, which is not installed: pip install 'drivetrain[deepspeed]'",
        )
        found = installed_version("deepspeed") if self.strategy == "deepspeed" else None
        _check(
            found is None or _release(found) >= DEEPSPEED_MIN,
            "distributed.strategy",
            f"'deepspeed' needs deepspeed >= {'.'.join(map(str, DEEPSPEED_MIN))}, found {found}: older versions "
            "apply AdamW to non-finite fp32 gradients; pip install -U 'drivetrain[deepspeed]'",
        )


@dataclass(frozen=True)
class CheckpointConfig:
    """Section ``checkpoint``: how often to save and how many checkpoints to keep."""

    every: int = 100  # optimizer iterations between checkpoints (one is always written at the end)
    keep: int = 5  # committed checkpoints kept; older ones are deleted after a new one commits
    every_minutes: float | None = None  # also save when this many minutes passed since the last save (all ranks agree)
    async_save: bool = False  # write in a background thread while training goes on (at most one save in flight)

    def __post_init__(self) -> None:
        _check(self.every >= 1, "checkpoint.every", f"must be ≥ 1, got {self.every}")
        _check(self.keep >= 1, "checkpoint.keep", f"must be ≥ 1, got {self.keep}")
        _check(
            self.every_minutes is None or self.every_minutes > 0,
            "checkpoint.every_minutes",
            f"must be > 0 (or null), got {self.every_minutes}",
        )


@dataclass(frozen=True)
class LogConfig:
    """Section ``log``: metric interval, TensorBoard and the progress bar."""

    every: int = 10  # iterations between metric flushes (the one host read of losses and counters)
    tensorboard: bool = True  # write TensorBoard scalars under <out_dir>/tensorboard
    progress: bool = True  # console progress bar with ETA (rank 0)

    def __post_init__(self) -> None:
        _check(self.every >= 1, "log.every", f"must be ≥ 1, got {self.every}")


@dataclass(frozen=True)
class EvalConfig:
    """Section ``eval``: the official metric during training (models with ``detect(batch)``, one process or DDP)."""

    every: int = 0  # optimizer iterations between evaluations, and one at the end; 0 = never while training
    at_start: bool = False  # also evaluate the initial weights before the first step (a fresh run's baseline)
    split: str = "mini_val"  # devkit split evaluated: the data builder is called again with split=<this>
    progress: bool = False  # progress bar of each evaluation (the training bar stays)

    def __post_init__(self) -> None:
        _check(self.every >= 0, "eval.every", f"must be ≥ 0, got {self.every}")


# Why speed.compile_step refuses a strategy (the compiled step runs under none, and under DDP's forward).
_COMPILE_STEP_REFUSED = {
    "fsdp": "FSDP2 gathers each unit's parameters and reduce-scatters its gradients in hooks around the unit's "
    "forward and backward, which torch.compile does not trace (a graph break the step's one graph refuses)",
    "deepspeed": "DeepSpeed's engine runs the model's forward itself, not the compiled step (not supported)",
}


@dataclass(frozen=True)
class TrainConfig:
    """A whole run: one field per YAML section, each a frozen, validated dataclass (``load_config`` builds it)."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainStepsConfig = field(default_factory=TrainStepsConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        _check(
            not self.speed.compile_step or self.distributed.strategy in ("none", "ddp"),
            "speed.compile_step",
            f"needs distributed.strategy none or ddp, got {self.distributed.strategy}: "
            + _COMPILE_STEP_REFUSED.get(self.distributed.strategy, ""),
        )
        _check(
            not (self.speed.compile_step and self.speed.compile),
            "speed.compile_step",
            "not with speed.compile: the step's one graph holds every module already",
        )
        _check(
            self.speed.compile_step_mode == "default" or self.speed.compile_step,
            "speed.compile_step_mode",
            "reduce-overhead replays the compiled step: it needs speed.compile_step true",
        )
        _check(
            self.speed.compile_step_mode == "default" or self.train.accumulation == 1,
            "speed.compile_step_mode",
            f"reduce-overhead needs train.accumulation 1, got {self.train.accumulation}: the next micro-batch's "
            "replay overwrites the gradients the previous one left in the CUDA graph pool",
        )
        _check(
            (self.eval.every == 0 and not self.eval.at_start) or self.distributed.strategy in ("none", "ddp"),
            "eval.every",
            "evaluation during training needs distributed.strategy none or ddp (whole weights on every rank); "
            "evaluate checkpoints with drivetrain eval --checkpoint",
        )
        if self.distributed.strategy == "deepspeed" and self.precision.mode == "fp16":
            p = self.precision  # DeepSpeed's loss scaler: powers of two, ×2 growth, ×0.5 back-off
            _check(
                p.init_scale >= 1 and math.log2(p.init_scale).is_integer(),
                "precision.init_scale",
                f"must be a power of two ≥ 1 with distributed.strategy=deepspeed, got {p.init_scale}",
            )
            _check(
                p.growth_factor == 2.0 and p.backoff_factor == 0.5,
                "precision.growth_factor",
                "DeepSpeed's fp16 loss scaler needs growth_factor=2 and backoff_factor=0.5",
            )
            _check(
                float(p.min_scale).is_integer(),
                "precision.min_scale",
                f"must be a whole number with distributed.strategy=deepspeed (its min_loss_scale), got {p.min_scale}",
            )


def module_available(name: str) -> bool:
    """Whether ``name`` can be imported (found without importing it)."""
    return importlib.util.find_spec(name) is not None


# The oldest DeepSpeed this engine accepts: the version its tests ran (CPU accelerator, gloo). From it on, ZeRO-1/2
# and ZeRO-3 mark a step whose global gradient norm is not finite as an overflow and skip it in every precision
# (run here under fp32 at ZeRO-1, 2, 2 with offload and 3: the steps skipped, AdamW never stepped); before it, by
# their source (0.16–0.19.6), only fp16 (and bf16 at ZeRO-1/2 with check_grad_overflow) was checked, so a NaN
# gradient reached AdamW.
DEEPSPEED_MIN = (0, 19, 8)


def installed_version(name: str) -> str | None:
    """The installed distribution ``name``'s version (its metadata, nothing imported); None when it has none."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers of ``version`` (``"0.19.8+cu124"`` → ``(0, 19, 8)``)."""
    numbers = []
    for part in version.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


# Keys that may differ between a checkpoint's config and the resuming run's (they do not change what is learned).
RESUME_MUTABLE = (
    "run.out_dir",
    "run.threads",
    "model.init_from",  # a resumed run restores its own weights and never reads it
    "train.steps",
    "train.device",
    "data.num_workers",
    "data.pin_memory",
    "data.persistent_workers",
    "data.prefetch_factor",
    "checkpoint.",
    "log.",
    "eval.",
    "speed.cudnn_benchmark",
    "speed.compile",
    "speed.compile_step",  # the same step, compiled or not
    "speed.compile_step_backend",
    "speed.compile_step_mode",
)


# ---------------------------------------------------------------------- files and overrides
def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with ``a.b=value`` overrides applied (values parsed as YAML)."""
    from drivetrain.engine.config_files import load_yaml, yaml_problem

    out = _deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected KEY=VALUE with a dotted key, e.g. optim.lr=3e-4")
        try:
            value = load_yaml(raw) if raw.strip() else ""  # bounded: an alias bomb typed here is refused too
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({yaml_problem(err)})") from None
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = child
        node[parts[-1]] = value
    return out


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read a YAML config and its ``base:`` chain (or start from the defaults when ``path`` is None), apply the
    overrides after the chain, validate; an error names the file of the chain that set the bad key
    (:mod:`drivetrain.engine.config_files`: the base rules)."""
    from drivetrain.engine.config_files import read_config_file

    source = read_config_file(path) if path is not None else None
    data = apply_overrides(source.data if source is not None else {}, list(overrides))
    try:
        return from_dict(TrainConfig, over_model_recipe(data))
    except ConfigError as err:
        raise (source.explain(err, overrides) if source is not None else err) from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested data of a config (what ``config.yaml`` and checkpoints store, YAML-safe): every field with its
    value, the typed sections' (``model.args``, ``data.args``, ``data.augment``, ``model.init_from``) included —
    nested dataclasses as mappings, tuples as lists. It loads back into the same config."""
    return _plain(cfg)


def over_model_recipe(data: dict[str, Any]) -> dict[str, Any]:
    """The plain config ``data`` with its ``data.augment`` sections spelled in full over the model's published
    recipe (its spec's ``augment``, looked up by ``model.name`` in the registry): the fields a section leaves out
    are the recipe's, as every field of the result says. A config, or a checkpoint's saved config, that sets only
    some fields thus reads as it did when the recipe was the types' defaults. ``data`` is not changed; without a
    ``data.augment`` mapping, or with a model name the registry does not know (loading then names it), it is
    returned as it is.

    Raises:
        ConfigError: a bad field, naming it (``data.augment.lidar.rot_range: ...``); a spec whose ``augment`` is
            not an :class:`~drivetrain.pipeline.augment.stage.AugmentConfig`.
    """
    from drivetrain.engine.registry import model_spec

    section = data.get("data")
    if not isinstance(section, dict) or not isinstance(section.get("augment"), dict):
        return data
    model = data.get("model")
    name = model.get("name", ModelConfig.name) if isinstance(model, dict) else ModelConfig.name
    try:
        recipe = model_spec(name).augment
    except ConfigError:
        return data
    if recipe is not None and not isinstance(recipe, AugmentConfig):
        raise ConfigError(f"model.name: {name}'s spec offers augment={recipe!r}, not an AugmentConfig")
    try:
        augment = AugmentConfig.from_dict(section["augment"], recipe)
    except (ValueError, TypeError) as err:
        message = str(err)
        raise ConfigError(message if message.startswith("data.augment") else f"data.augment: {message}") from None
    return {**data, "data": {**section, "augment": _plain(augment)}}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def with_global_batch(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """``cfg`` on ``world_size`` ranks: with ``train.global_batch`` set, ``train.accumulation`` becomes
    ``global_batch / (data.batch_size × world_size)`` (a value given for it is replaced); else ``cfg`` itself.

    This is what lets one command continue exactly on the number of ranks each start gets (torchrun
    ``--nnodes MIN:MAX``): the global batch is kept, which an elastic resume needs (``engine/resume.py``).

    Raises:
        ConfigError: the global batch is not a multiple of ``data.batch_size × world_size`` (one line naming it).
    """
    total = cfg.train.global_batch
    if total is None:
        return cfg
    per_micro_batch = cfg.data.batch_size * world_size
    if total % per_micro_batch:
        raise ConfigError(
            f"train.global_batch: {total} samples do not split into micro-batches of data.batch_size × ranks = "
            f"{cfg.data.batch_size} × {world_size}; choose a global batch that data.batch_size × every number of "
            "ranks the run may get divides (or another data.batch_size)"
        )
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, accumulation=total // per_micro_batch))


def config_diff(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, as ``key: saved → current`` (keys in RESUME_MUTABLE are ignored).

    The typed sections are compared resolved (:func:`resolved_sections`): an older run's config.yaml kept only the
    ``model.args``/``data.args`` keys and augmentation fields it set, today's holds every field, and the same values
    are no difference."""
    from drivetrain.engine.registry import canonical_name

    if not prefix:
        saved, current = resolved_sections(saved), resolved_sections(current)
    out: list[str] = []
    for name in sorted(set(saved) | set(current)):
        key = _join(prefix, name)
        if any(key == m or (m.endswith(".") and key.startswith(m)) for m in RESUME_MUTABLE):
            continue
        a, b = saved.get(name, "<absent>"), current.get(name, "<absent>")
        if key in ("model.name", "data.name") and isinstance(a, str) and isinstance(b, str):
            kind = key.split(".")[0]  # an old spelling of the same builder is the same builder
            a, b = canonical_name(kind, a), canonical_name(kind, b)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, key)
        elif a != b:
            out.append(f"{key}: {a!r} → {b!r}")
    return out


def resolved_sections(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of the plain config ``data`` with ``model.args``, ``data.args`` and ``data.augment`` resolved as
    loading resolves them (their declared dataclass, every field, as plain data); a section that does not load is
    left as it is (it then differs, as it should). ``data`` is not changed."""
    from drivetrain.engine.registry import check_args

    out = _deepcopy(data)
    with contextlib.suppress(ConfigError):
        out = over_model_recipe(out)
    for kind in ("model", "data"):
        section = out.get(kind)
        if isinstance(section, dict) and isinstance(section.get("args"), dict) and "name" in section:
            with contextlib.suppress(ConfigError):
                section["args"] = _plain(check_args(kind, section["name"], section["args"]))
    section = out.get("data")
    if isinstance(section, dict) and isinstance(section.get("augment"), dict):
        with contextlib.suppress(ValueError, TypeError):
            section["augment"] = _plain(AugmentConfig.from_dict(section["augment"]))
    return out


def _deepcopy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deepcopy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deepcopy(v) for v in data]
    return data
