"""``speed.compile_step``: the training forward and loss of a model with the
:class:`~drivetrain.engine.protocol.StaticStep` capability as one compiled graph per shape bucket (issue 46).

:func:`build_step_graph` checks the model (one ConfigError line naming ``speed.compile_step`` and the model when it
lacks the capability) and wraps ``model.step_loss`` in ``torch.compile(fullgraph=True, dynamic=False,
backend=speed.compile_step_backend)``. Before the first step :meth:`StepGraph.compile_all` runs every bucket of
``model.step_buckets`` once, forward and backward, on an empty batch at that bucket (one line per bucket with its
seconds), then puts back what that run touched: every buffer (BatchNorm statistics and counters), the gradients
(None) and the RNG states — so a run compiled before its first step, resumed or not, trains exactly as without the
warm-up (the resume test compares 2 + 2 steps with 4 straight).

Each step then asks the model for its batch's bucket (``model.step_shapes``: at most one host read, the model's
``# sync:``), pads the batch (``model.step_inputs``) and calls the compiled function.
:attr:`StepGraph.compiles_in_steps` counts the graphs dynamo compiled inside steps (its ``unique_graphs`` counter):
0 when every bucket was compiled before step 1; the trainer logs a line when it is not.

One process only for now: the compiled step calls the model around the data-parallel wrapper, whose forward prepares
DDP's gradient all-reduce, so ``distributed.strategy`` other than ``none`` is a ConfigError
(:class:`~drivetrain.engine.config.TrainConfig`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from drivetrain.engine.config import ConfigError, SpeedConfig
from drivetrain.engine.protocol import StaticStep

__all__ = ["StepGraph", "build_step_graph", "dynamo_graphs"]


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
            buckets refuse its arguments (the model's ValueError, after ``speed.compile_step:``).
    """
    if not cfg.compile_step:
        return None
    if not isinstance(model, StaticStep):
        raise ConfigError(
            f"speed.compile_step: model {model_name!r} has no static training step (step_buckets, step_shapes, "
            "step_inputs, step_loss); set speed.compile_step false or compile modules with speed.compile"
        )
    try:
        return StepGraph(model, cfg.compile_step_backend, batch_size, device)
    except ValueError as err:  # the model's buckets: a line naming its argument
        raise ConfigError(f"speed.compile_step: {err}") from None


class StepGraph:
    """The compiled forward + loss of a :class:`~drivetrain.engine.protocol.StaticStep` model.

    Args:
        model: the model (training mode).
        backend: ``torch.compile``'s backend (``speed.compile_step_backend``).
        batch_size: samples per batch.
        device: the training device.
    """

    def __init__(self, model: StaticStep, backend: str, batch_size: int, device: torch.device) -> None:
        self.model, self.batch_size, self.device = model, batch_size, device
        self.buckets: tuple[Hashable, ...] = tuple(model.step_buckets(batch_size))
        self.fn = torch.compile(model.step_loss, fullgraph=True, dynamic=False, backend=backend)
        self.compiles_in_steps = 0

    def compile_all(self, message: Callable[[str], None], context: Callable[[], Any]) -> None:
        """Compile every bucket (forward and backward) on an empty batch, then restore the buffers, gradients and
        RNG states the warm-up touched.

        Args:
            message: prints one line (rank 0's log).
            context: a fresh context manager the step's forward runs in (the run's autocast).
        """
        module: torch.nn.Module = self.model  # type: ignore[assignment]
        buffers = [buffer.detach().clone() for buffer in module.buffers()]
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None  # no context on a CPU run
        try:
            for shapes in self.buckets:
                start = time.perf_counter()
                with context():
                    terms = self.fn(*self.model.step_inputs(None, shapes, self.batch_size, self.device))
                torch.stack([value.float().sum() for value in terms.values()]).sum().backward()
                message(f"speed.compile_step: bucket {shapes} compiled in {time.perf_counter() - start:.1f} s")
        finally:
            with torch.no_grad():
                for buffer, saved in zip(module.buffers(), buffers, strict=True):
                    buffer.copy_(saved)
            for param in module.parameters():
                param.grad = None
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)

    def __call__(self, batch: Any) -> Mapping[str, torch.Tensor]:
        """The unweighted loss terms of ``batch`` (on the device) through the compiled step of its bucket."""
        shapes = self.model.step_shapes(batch)  # at most one host read (the model's # sync:)
        before = dynamo_graphs()
        terms = self.fn(*self.model.step_inputs(batch, shapes, self.batch_size, self.device))
        self.compiles_in_steps += dynamo_graphs() - before
        return terms
