"""Build the pieces of a run from its config: model, dataset, AdamW with parameter groups and its learning-rate
schedule, speed switches.

``model.name`` and ``data.name`` are short names looked up in :mod:`drivetrain.engine.registry` (each
model's spec; ``synthetic``, ``frames``, ``smoke``; plus installed plugins).
A model is built through its spec (:meth:`~drivetrain.detector.spec.ModelSpec.build_model`): a builder whose spec
declares typed ``args`` gets the one instance the config holds since it was loaded (``registry.check_args``); any
other builder (a plugin's without typed args, a dataset's) gets ``args`` as keyword arguments — the fields of the
dataclass it declares, else the mapping as written, checked against its signature and plain scalar annotations
here. A model builder returns an ``nn.Module`` following the model protocol
(:class:`drivetrain.engine.protocol.Model`: ``forward(batch)``, ``loss(outputs, batch) -> {name: scalar}``), a
dataset builder a map-style ``Dataset``. A config never names code: a name the
registry does not hold is a ConfigError before anything is imported or called.

**Loss-term weights.** The weight of each loss term in a run: the model's declared weights, overridden by
``model.loss_weights``.

A model that declares ``loss_weights`` (:class:`~drivetrain.engine.protocol.WeightedLoss`) has them resolved once
with the config's overrides, a name it does not declare being a one-line :class:`ConfigError` when the run is built.
A model that declares none weighs its terms 1 unless the config names them; the config's names are then checked
against the terms of the first step. Terms are named by base name: ``loss_cls`` also weighs ``d3.loss_cls``
(:func:`~drivetrain.losses.term_weights.base_name`).

**Solver warm-up.** The GPU assignment solver's kernels, compiled between training steps rather than inside one.

A model that knows the number of queries its matchings solve (:class:`~drivetrain.engine.protocol.MatchedQueries`)
has the solver compiled for them before the first step (:func:`warm_known_shapes`); a matching it cannot size in
advance is solved by SciPy in the step that first meets it and compiled after that step
(:func:`warm_met_shapes`). Each compilation is one line in the run's log; without the GPU backend nothing happens.

**Learning-rate schedules** as pure functions of the optimizer step.

``lr_factor(cfg, step, total)`` is the multiplier of the peak learning rate at ``step`` (the number of
optimizer updates applied so far, so a skipped fp16 step does not move it). Nothing is stored: resuming at
step ``s`` gives the same learning rate as an uninterrupted run at ``s``.

Example:
    >>> cfg = ScheduleConfig(kind="warmup_cosine", warmup_steps=10)
    >>> [round(lr_factor(cfg, s, 100), 3) for s in (0, 5, 10, 55, 100)]
    [0.091, 0.545, 1.0, 0.5, 0.0]

**The compiled step** (``speed.compile_step``): the training forward and loss of a model with the
:class:`~drivetrain.engine.protocol.StaticStep` capability as one compiled graph per shape bucket (issue 46).

:func:`build_step_graph` checks the model (one ConfigError line naming ``speed.compile_step`` and the model when it
lacks the capability) and wraps ``model.step_loss`` in ``torch.compile(fullgraph=True, dynamic=False,
backend=speed.compile_step_backend)`` (with inductor, ``fallback_random`` on: the graph's random draws — dropout, a
model's noise — are torch's eager ones, in the eager step's order, where inductor's per-element generator was measured
far slower on a CPU for a camera detector's dropout, docs/engine.md; and on a CPU ``cpp_wrapper``: the graph's
kernels called from generated C++ rather than Python, which saved ~11 % of that step, at about twice the compile
time). Before the first step :meth:`StepGraph.compile_all` runs every bucket of
``model.step_buckets`` once, forward and backward, on an empty batch at that bucket, each from no gradient (under
CUDA graphs the gradients of one bucket's backward are outputs in the pool, freed when the next begins); one line
per bucket with its seconds, then their total (:attr:`StepGraph.compile_seconds`); then it puts back what that run
touched: every buffer (BatchNorm statistics and counters), the gradients (None) and the RNG states — so a run
compiled before its first step, resumed or not, trains exactly as without the warm-up (the resume test compares
2 + 2 steps with 4 straight).

Each step then asks the model for its batch's bucket (``model.step_shapes``: at most one host read, the model's
``# sync:``), pads the batch (``model.step_inputs``) and calls the compiled function. When the batch stream hands out
final batches on the host (:func:`~drivetrain.engine.batches.hands_out_host_batches`: augmentation in the loader,
``data.augment_on=worker``, or none, and no prefetcher; or any CPU run) and the model has
:class:`~drivetrain.engine.protocol.HostShapes`, the bucket is chosen from that host batch before the copy
(``model.step_shapes_on_host``: host work, no device read). When the augmentation runs on a GPU and the model has
:class:`~drivetrain.engine.protocol.AugmentedHostShapes`, the prefetcher bounds each batch's bucket on the host from
the batch before the augmentation and its parameters, on a helper thread (:attr:`StepGraph.handed_shapes`): no device
read either. Either way the graph guards on the device that the bucket holds the batch. Every bucket raises dynamo's
``recompile_limit`` (8 graphs of one function by default) to the buckets' count while the step compiles and runs.

With ``speed.compile_step_mode: reduce-overhead`` (inductor on a CUDA device) inductor's cudagraph trees replay each
bucket's forward and backward graphs as CUDA graphs, all of them in one memory pool: the warm-up above runs each bucket
once (cudagraph trees' eager warm-up), a bucket's first step records its graphs, every later step of that bucket
replays them. A replay reads its inputs at fixed addresses (cudagraph trees copy the padded batch in; parameters and
buffers stay where they are) and writes its outputs into the pool, where the next replay overwrites them: each step
calls ``torch.compiler.cudagraph_mark_step_begin()`` first and clones the loss terms it returns (they are logged after
the update). The gradients the backward leaves in ``.grad`` live in the pool too: the optimizer uses them and
``zero_grad(set_to_none=True)`` drops them before the next replay, which is why gradient accumulation
(``train.accumulation`` > 1) is a ConfigError in this mode. On a CPU run the mode is a ConfigError (nothing to replay).
:attr:`StepGraph.compiles_in_steps` counts the graphs dynamo compiled inside steps (its ``unique_graphs`` counter):
0 when every bucket was compiled before step 1; the trainer logs a line when it is not.

Under DDP the strategy wraps :meth:`StepGraph.module` (:class:`StepModule`), so that every step and the warm-up run
through DDP's forward, which prepares the gradient all-reduce (docs/engine.md); FSDP and DeepSpeed are a ConfigError
(:class:`~drivetrain.engine.config.TrainConfig`).
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import time
import types
import typing
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from drivetrain.detector.spec import keywords
from drivetrain.engine import registry
from drivetrain.engine.config import ConfigError, DataConfig, ModelConfig, OptimConfig, ScheduleConfig, SpeedConfig
from drivetrain.engine.metrics import MetricsLogger
from drivetrain.engine.protocol import (
    HostShapes,
    MapDataset,
    MatchedQueries,
    StaticStep,
    StepCompileOptions,
    WeightedLoss,
    missing_members,
)
from drivetrain.losses.term_weights import base_name, resolve_weights
from drivetrain.match import warm_gpu_solver, warm_pending
from drivetrain.profile.costmodel import host_work
from drivetrain.safeio.reads import human_bytes

__all__ = [
    "StepGraph",
    "StepModule",
    "TermWeights",
    "apply_speed",
    "build_dataset",
    "build_model",
    "build_optimizer",
    "build_step_graph",
    "dynamo_graphs",
    "lr_factor",
    "one_cycle",
    "step_compile_options",
    "warm_known_shapes",
    "warm_met_shapes",
    "warmup_constant",
    "warmup_cosine",
]


def _call(section: str, name: str, args: dict[str, Any], command: dict[str, Any] | None = None) -> Any:
    """Build ``name`` from the config's ``args`` (checked) and the ``command``'s own keyword arguments."""
    fn = registry.lookup(section, name)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builder without an inspectable signature checks its own arguments
        params = {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for key in args:
            if key not in params:
                raise ConfigError(f"{section}.args.{key}: unknown argument of {name}; known: {', '.join(params)}")
    _check_arg_types(section, fn, args)
    return _built(section, name, lambda: fn(**args, **(command or {})), args)


def _built(section: str, name: str, build: Callable[[], Any], args: dict[str, Any]) -> Any:
    """``build()``, its failures one line: a ConfigError naming ``SECTION.args`` and the builder for a bad argument
    (TypeError, ValueError), or the sizes that did not fit in memory; any other error (a bug) is seen whole."""
    try:
        return build()
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{section}.args: {name}: {_first_line(err)}") from None
    except (RuntimeError, MemoryError) as err:
        asked = _cannot_allocate(err)
        if asked is None:  # not a size problem: a bug, to be seen whole
            raise
        sizes = _size_args(args)
        raise ConfigError(f"{section}.args: {name} cannot be built with these sizes ({sizes}): {asked}") from None


def _first_line(err: BaseException) -> str:
    """The first line of ``err``'s message (torch's may go on with a C++ stack), or its repr when it has none."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else repr(err)


_NO_MEMORY = re.compile(r"can't allocate memory|cannot allocate memory|out of memory|failed to allocate", re.IGNORECASE)
_ASKED = re.compile(r"tried to allocate (\d+ bytes|[\d.]+ [KMGTPE]iB)", re.IGNORECASE)  # the CPU's, CUDA's wording


def _cannot_allocate(err: BaseException) -> str | None:
    """What an allocation failure asked for ("cannot allocate 3274.2 TiB at once"), or None when ``err`` is not one
    (a ``MemoryError``, torch's ``OutOfMemoryError``, or a ``RuntimeError`` from an allocator saying so)."""
    message = str(err)
    if not isinstance(err, MemoryError | torch.OutOfMemoryError) and not _NO_MEMORY.search(message):
        return None
    asked = _ASKED.search(message)
    if asked is None:
        return "out of memory"
    amount = asked.group(1)
    return f"cannot allocate {human_bytes(int(amount.split()[0])) if amount.endswith('bytes') else amount} at once"


def _size_args(args: dict[str, Any]) -> str:
    """The integer arguments, largest first (``width=10000000, depth=3``): the sizes that may be too large."""
    sizes = sorted(((k, v) for k, v in args.items() if isinstance(v, int) and not isinstance(v, bool)),
                   key=lambda kv: -abs(kv[1]))  # fmt: skip
    return ", ".join(f"{k}={v}" for k, v in sizes[:6]) or "no integer arguments"


_SCALARS = (bool, int, float, str)


def _check_arg_types(section: str, fn: Any, args: dict[str, Any]) -> None:
    """ConfigError for an argument whose value does not fit a plain scalar annotation (``width: int`` = "abc")."""
    try:
        hints = typing.get_type_hints(fn.__init__ if inspect.isclass(fn) else fn)
    except (NameError, TypeError, AttributeError):
        return  # unresolvable annotations: the builder checks its own arguments
    for key, value in args.items():
        hint = hints.get(key)
        # a Union/Optional lists its alternatives; any other generic (Sequence[float], tuple[int, ...]) is a
        # container, left to the builder — its arguments are element types, not alternatives
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        allowed = [t for t in (typing.get_args(hint) if union else (hint,)) if t is not None]
        if not allowed or not all(t in (*_SCALARS, type(None)) for t in allowed):
            continue  # not annotated with plain scalars (lists, tuples, ...): left to the builder
        ok = any(
            value is None if t is type(None) else isinstance(value, t) and not (t is int and isinstance(value, bool))
            for t in allowed
        ) or (float in allowed and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise ConfigError(f"{section}.args.{key}: expected {names}, got {value!r}")


def build_model(cfg: ModelConfig) -> nn.Module:
    """The model named by ``cfg``: an ``nn.Module`` with the required members of
    :class:`~drivetrain.engine.protocol.Model`; a one-line ConfigError naming the builder and what it lacks."""
    spec = registry.model_spec(cfg.name)
    if spec.args is None:  # a builder taking keyword arguments: checked against its signature
        model = _call("model", cfg.name, keywords(cfg.args))
    else:  # the instance of its typed args the config holds (checked when it loaded)
        model = _built("model", cfg.name, lambda: spec.build_model(cfg.args), keywords(cfg.args))
    missing = missing_members(model)
    if not isinstance(model, nn.Module) or missing:
        lacks = "that is not an nn.Module" if not isinstance(model, nn.Module) else f"without {' and '.join(missing)}"
        raise ConfigError(
            f"model.name: {cfg.name!r} ({registry.origin('model', cfg.name)}) builds a {type(model).__name__} {lacks}; "
            "a model is an nn.Module with forward(batch) and loss(outputs, batch) (drivetrain.engine.protocol.Model)"
        )
    return model


def build_dataset(cfg: DataConfig, *, generate: bool = False) -> torch.utils.data.Dataset:
    """The map-style dataset named by ``cfg`` (:class:`~drivetrain.engine.protocol.MapDataset`).

    Args:
        cfg: the run config's ``data`` section.
        generate: whether the builder may write a dataset that is not there yet (the ``synthetic`` set): True for
            the commands that train (``train``, ``tune loader``, the benchmarks); False, the default, for every
            command that reads a run (``eval --checkpoint``, ``viz frame --checkpoint``, ``doctor``), so a run's
            config never makes them write into the folder it names. It reaches builders that declare a
            keyword-only ``generate`` parameter; a config cannot set it (``data.args.generate`` is refused).
    """
    command: dict[str, Any] = {}
    args = keywords(cfg.args)
    if _takes_generate(registry.lookup("data", cfg.name)):
        if "generate" in args:
            raise ConfigError(
                "data.args.generate: not a data argument — the command decides whether data is generated (train "
                "does, commands reading a run never do), not a config"
            )
        command["generate"] = generate
    dataset = _call("data", cfg.name, args, command)
    if not isinstance(dataset, MapDataset):
        raise ConfigError(f"data.name: {cfg.name} must build a map-style Dataset (__getitem__ and __len__)")
    return dataset


def _takes_generate(builder: Any) -> bool:
    """Whether a data builder declares the keyword-only ``generate`` parameter (it may write its dataset)."""
    try:
        parameter = inspect.signature(builder).parameters.get("generate")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind is inspect.Parameter.KEYWORD_ONLY


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW with one group per ``cfg.groups`` entry (by module path) and one for the other parameters.

    Each param group carries ``lr_mult``; the trainer sets ``lr = cfg.lr × lr_mult × schedule(step)``.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    taken: dict[str, int] = {}
    groups = []
    for i, group in enumerate(cfg.groups):
        params = []
        for module in group.modules:
            hits = [(n, p) for n, p in named if n == module or n.startswith(module + ".")]
            if not hits:
                raise ConfigError(f"optim.groups[{i}].modules: no trainable parameter under {module!r}")
            for n, p in hits:
                if n in taken:
                    raise ConfigError(f"optim.groups[{i}].modules: {n} is already in optim.groups[{taken[n]}]")
                taken[n] = i
                params.append(p)
        wd = cfg.weight_decay if group.weight_decay is None else group.weight_decay
        groups.append({"params": params, "lr_mult": group.lr_mult, "weight_decay": wd})
    rest = [p for n, p in named if n not in taken]
    if rest:
        groups.append({"params": rest, "lr_mult": 1.0, "weight_decay": cfg.weight_decay})
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)


def _submodule(model: nn.Module, path: str, key: str) -> nn.Module:
    if path == "":
        return model
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise ConfigError(f"{key}: the model has no module {path!r}") from None


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def apply_speed(model: nn.Module, cfg: SpeedConfig) -> nn.Module:
    """Apply memory and speed switches in place: memory format, activation checkpointing, compile, cuDNN/TF32.

    ``cudnn_benchmark`` and ``tf32`` set torch's process-wide flags (``torch.backends.cudnn.benchmark``,
    ``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``) and leave them so: the process is
    the run's. With ``tf32`` false (the default) cuDNN's TF32, which torch turns on by default, is off as well, so
    convolutions run in full float32. The benchmarks start from the same settings
    (:func:`drivetrain.profile.bench.setup_bench`) and record those in effect.
    """
    if cfg.channels_last != "none":
        fmt = torch.channels_last if cfg.channels_last == "2d" else torch.channels_last_3d
        rank = 4 if cfg.channels_last == "2d" else 5
        with torch.no_grad():  # only the tensors of that rank: a model mixing 2D and 3D convolutions keeps the rest
            for param in model.parameters():
                if param.dim() == rank:
                    param.data = param.data.contiguous(memory_format=fmt)
    for path in cfg.activation_checkpointing:
        module = _submodule(model, path, "speed.activation_checkpointing")
        module.forward = _checkpointed(module.forward)  # recomputed in backward; RNG state preserved
    for path in cfg.compile:  # patch forward: nn.Module.compile() was not traced in torch 2.13 here
        module = _submodule(model, path, "speed.compile")
        module.forward = torch.compile(module.forward)
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    return model


class TermWeights:
    """The weight of every loss term of ``model`` under the config's ``overrides`` (call it with a step's terms).

    Args:
        model: the run's model.
        overrides: ``model.loss_weights``: base term name → weight.

    Raises:
        ConfigError: an override names a term the model's declared weights lack (one line naming it).
    """

    def __init__(self, model: Any, overrides: dict[str, float]) -> None:
        self.overrides = overrides
        self.declared: dict[str, float] | None = None
        if isinstance(model, WeightedLoss):
            try:
                self.declared = resolve_weights(model.loss_weights, overrides)
            except KeyError as err:
                raise ConfigError(f"model.loss_weights.{err.args[0]}") from None

    def __call__(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        """The weight of every term of ``terms`` (a step's loss terms, by name).

        Raises:
            ConfigError: for a model that declares no weights, an override naming none of the terms.
        """
        if self.declared is not None:
            return self.declared
        bases = {base_name(k) for k in terms}
        unknown = sorted(set(self.overrides) - bases)
        if unknown:
            raise ConfigError(
                f"model.loss_weights.{unknown[0]}: not a loss term of this model; its terms are {sorted(bases)}"
            )
        return {**dict.fromkeys(bases, 1.0), **self.overrides}


def warm_known_shapes(model: torch.nn.Module, device: torch.device, log: MetricsLogger) -> None:
    """Compile the solver for every query count ``model`` declares, before the first step.

    Args:
        model: the run's model (nothing happens unless it declares ``matched_queries``).
        device: the training device.
        log: the run's log (one line per warm-up that compiled something).
    """
    if isinstance(model, MatchedQueries):
        for queries in model.matched_queries:
            warm = warm_gpu_solver(queries, device=device)
            if warm.shapes:
                log.message(f"solver: {warm.describe()} before the first step")


def warm_met_shapes(step: int, log: MetricsLogger) -> None:
    """Compile the solver shapes that step ``step`` met uncompiled (and solved on the host).

    Args:
        step: the optimizer iteration just done.
        log: the run's log (one line when something compiled).
    """
    warm = warm_pending()
    if warm.shapes:
        log.message(f"solver: {warm.describe()} after step {step}")


def warmup_cosine(step: int, total: int, warmup: int, min_ratio: float = 0.0) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / (warmup + 1) if warmup else 1.0
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_constant(step: int, warmup: int) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then constant."""
    return (step + 1) / (warmup + 1) if step < warmup else 1.0


def one_cycle(step: int, total: int, pct_start: float, div_factor: float, final_div_factor: float) -> float:
    """OneCycle (cosine annealing both ways, as torch's OneCycleLR): initial 1/div → 1 → 1/(div·final_div)."""
    initial = 1.0 / div_factor
    final = initial / final_div_factor
    rise = max(float(pct_start * total) - 1.0, 1.0)
    fall_end = max(float(total) - 1.0, rise + 1.0)
    if step <= rise:
        start, end, pct = initial, 1.0, step / rise
    else:
        start, end, pct = 1.0, final, min((step - rise) / (fall_end - rise), 1.0)
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)


def lr_factor(cfg: ScheduleConfig, step: int, total: int) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` of a ``total``-step schedule."""
    total = cfg.total_steps or total
    if cfg.kind == "warmup_cosine":
        return warmup_cosine(step, total, cfg.warmup_steps, cfg.min_lr_ratio)
    if cfg.kind == "warmup_constant":
        return warmup_constant(step, cfg.warmup_steps)
    return one_cycle(step, total, cfg.pct_start, cfg.div_factor, cfg.final_div_factor)


def dynamo_graphs() -> int:
    """Graphs ``torch._dynamo`` compiled in this process so far (its ``unique_graphs`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def build_step_graph(
    model: torch.nn.Module, cfg: SpeedConfig, model_name: str, batch_size: int, device: torch.device
) -> StepGraph | None:
    """The compiled step of ``model`` when ``cfg.compile_step`` is on, else None.

    Args:
        model: the run's model.
        cfg: the run's ``speed`` section.
        model_name: ``model.name``, for the error line.
        batch_size: samples per batch (``data.batch_size``).
        device: the training device.

    Raises:
        ConfigError: the model has no static step (:class:`~drivetrain.engine.protocol.StaticStep`), or its
            buckets refuse its arguments (the model's ValueError, after ``speed.compile_step:``), or
            ``speed.compile_step_mode`` is reduce-overhead on a device other than CUDA.
    """
    if not cfg.compile_step:
        return None
    if cfg.compile_step_mode == "reduce-overhead" and device.type != "cuda":
        raise ConfigError(
            f"speed.compile_step_mode: reduce-overhead replays CUDA graphs, the run's device is {device.type}; "
            "set speed.compile_step_mode default"
        )
    if not isinstance(model, StaticStep):
        raise ConfigError(
            f"speed.compile_step: model {model_name!r} has no static training step (step_buckets, step_shapes, "
            "step_inputs, step_loss); set speed.compile_step false or compile modules with speed.compile"
        )
    try:
        return StepGraph(model, cfg.compile_step_backend, batch_size, device, cfg.compile_step_mode)
    except ValueError as err:  # the model's buckets: a line naming its argument
        raise ConfigError(f"speed.compile_step: {err}") from None


def step_compile_options(model: Any, device: torch.device, mode: str = "default") -> dict[str, Any]:
    """The inductor options a static step's graph is compiled with on ``device``: ``mode``'s, then the engine's
    (``fallback_random``: torch's eager draws in the graph; on a CPU ``cpp_wrapper``; see the module docstring), then
    the model's own (:class:`~drivetrain.engine.protocol.StepCompileOptions`: say, a layout where one of its layers
    compiles to slow kernels).

    Example:
        >>> step_compile_options(torch.nn.Linear(1, 1), torch.device("cpu"))
        {'fallback_random': True, 'cpp_wrapper': True}
    """
    from torch._inductor import list_mode_options

    options = {**list_mode_options(mode), "fallback_random": True, "cpp_wrapper": device.type == "cpu"}
    if isinstance(model, StepCompileOptions):
        options.update(model.step_compile_options(device))
    return options


class StepGraph:
    """The compiled forward + loss of a :class:`~drivetrain.engine.protocol.StaticStep` model.

    Args:
        model: the model (training mode).
        backend: ``torch.compile``'s backend (``speed.compile_step_backend``).
        batch_size: samples per batch.
        device: the training device.
        mode: ``torch.compile``'s mode (``speed.compile_step_mode``): "reduce-overhead" replays CUDA graphs.
    """

    def __init__(
        self, model: StaticStep, backend: str, batch_size: int, device: torch.device, mode: str = "default"
    ) -> None:
        self.model, self.batch_size, self.device = model, batch_size, device
        self.buckets: tuple[Hashable, ...] = tuple(model.step_buckets(batch_size))
        self.replays = mode == "reduce-overhead"  # CUDA graphs: outputs live in the pool until the next replay
        options = None  # inductor: the mode's options, eager RNG in the graph, on a CPU a C++ wrapper (see above)
        if backend == "inductor":
            options, mode = step_compile_options(model, device, mode), None
        self.options = options  # inductor's options as compiled (None: another backend)
        self.fn = torch.compile(
            model.step_loss, fullgraph=True, dynamic=False, backend=backend, mode=mode, options=options
        )
        self.compiles_in_steps = 0
        self.compile_seconds = 0.0  # all buckets' compiles before step 1 (compile_all)
        self.host_batches = False  # the batch stream hands out final host batches (the trainer sets it)
        # the bucket of the batch the stream handed out last, bounded on the host (None: none; the trainer sets it)
        self.handed_shapes: Callable[[], Hashable | None] | None = None
        # dynamo keeps at most recompile_limit graphs of one function (8 by default), then fails a fullgraph compile:
        # every bucket is one, so the step's calls raise the limit to the buckets' count
        from torch._dynamo import config as dynamo_config

        limit = max(dynamo_config.recompile_limit, len(self.buckets))
        self._limit = functools.partial(dynamo_config.patch, recompile_limit=limit)

    def module(self) -> torch.nn.Module:
        """The compiled step as a module (:class:`StepModule`), for the strategy to wrap in place of the model."""
        return StepModule(self.model, self.fn)  # type: ignore[arg-type]

    def compile_all(
        self, message: Callable[[str], None], context: Callable[[], Any], call: Callable[..., Any] | None = None
    ) -> None:
        """Compile every bucket (forward and backward) on an empty batch, then restore the buffers, gradients and
        RNG states the warm-up touched.

        Args:
            message: prints one line (rank 0's log).
            context: a fresh context manager the step's forward runs in (the run's autocast).
            call: what runs the compiled step, as in :meth:`__call__` (default the compiled function). Under DDP a
                collective: every rank compiles the same buckets in the same order, and their gradients are reduced.
        """
        call = self.fn if call is None else call
        module: torch.nn.Module = self.model  # type: ignore[assignment]
        buffers = [buffer.detach().clone() for buffer in module.buffers()]
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None  # no context on a CPU run
        began = time.perf_counter()
        try:
            for shapes in self.buckets:
                start = time.perf_counter()
                if self.replays:  # each bucket's warm-up is an iteration of its own
                    torch.compiler.cudagraph_mark_step_begin()
                with context(), self._limit():
                    terms = call(*self.model.step_inputs(None, shapes, self.batch_size, self.device))
                torch.stack([value.float().sum() for value in terms.values()]).sum().backward()
                del terms
                for param in module.parameters():  # CUDA graphs: the next bucket's iteration frees these gradients
                    param.grad = None  # (outputs of this one's backward, in the pool): none to accumulate into
                message(f"speed.compile_step: bucket {shapes} compiled in {time.perf_counter() - start:.1f} s")
            self.compile_seconds = time.perf_counter() - began
            count = f"{len(self.buckets)} bucket{'s' if len(self.buckets) != 1 else ''}"
            message(f"speed.compile_step: {count} compiled in {self.compile_seconds:.1f} s before step 1")
        finally:
            with torch.no_grad():
                for buffer, saved in zip(module.buffers(), buffers, strict=True):
                    buffer.copy_(saved)
            for param in module.parameters():
                param.grad = None
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)

    def __call__(
        self, batch: Any, call: Callable[..., Any] | None = None, loaded: Any = None
    ) -> Mapping[str, torch.Tensor]:
        """The unweighted loss terms of ``batch`` (on the device) through the compiled step of its bucket.

        Args:
            batch: the batch, on the device.
            call: what runs the compiled step on the bucket's inputs: the strategy's wrapper of :meth:`module` (DDP's
                forward, which prepares the gradient reduction around it), or by default the compiled function.
            loaded: the batch as the batch stream handed it out (before the copy), whose bucket is chosen on the host
                when :attr:`host_batches` and the model can (:class:`~drivetrain.engine.protocol.HostShapes`).
        """
        call = self.fn if call is None else call
        bound = self.handed_shapes() if self.handed_shapes is not None else None
        if bound is not None:  # bounded on the host before the device's augmentation (the prefetcher's helper)
            shapes = bound
        elif self.host_batches and loaded is not None and isinstance(self.model, HostShapes):
            with host_work():  # the loader's batch on the host: CPU work on any device, nothing read of the device
                shapes = self.model.step_shapes_on_host(loaded)
        else:
            shapes = self.model.step_shapes(batch)  # at most one host read (the model's # sync:)
        inputs = self.model.step_inputs(batch, shapes, self.batch_size, self.device)
        before = dynamo_graphs()
        if self.replays:  # a new iteration: the previous step's outputs in the pool may be overwritten from here
            torch.compiler.cudagraph_mark_step_begin()
        with self._limit():
            terms = call(*inputs)
        self.compiles_in_steps += dynamo_graphs() - before
        if self.replays:  # the next replay overwrites the outputs; the clones (a few scalars) carry the gradient
            terms = {name: value.clone() for name, value in terms.items()}
        return terms


class StepModule(torch.nn.Module):
    """The compiled step as a module, what a data-parallel wrapper wraps under ``speed.compile_step``: ``forward``
    runs the compiled ``step_loss`` on a bucket's inputs, around which DDP's forward prepares the reduction of the
    gradients its backward leaves (see docs/engine.md). Its one child is the model, so its parameters are the model's,
    in the model's order; checkpoints read the model itself.

    Args:
        model: the run's model.
        fn: the compiled ``model.step_loss`` (:attr:`StepGraph.fn`).
    """

    def __init__(self, model: torch.nn.Module, fn: Callable[..., Mapping[str, torch.Tensor]]) -> None:
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, *inputs: Any) -> Mapping[str, torch.Tensor]:
        """The unweighted loss terms of ``inputs`` (:meth:`~drivetrain.engine.protocol.StaticStep.step_inputs`)."""
        return self.fn(*inputs)
