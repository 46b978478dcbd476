"""The losses under ``torch.compile``: what the criteria's ``compile=`` option (and the models' ``compile_loss``) do.

The batched losses run under ``torch.compile`` in one graph per call, with no graph break: the one host call of
a step, the SciPy solver, enters the graph as the custom operator ``drivetrain::solve_scipy`` (it still reads the
costs on the host once: the step's one documented sync), and the GPU solver as ``drivetrain::solve_gpu`` (no sync).
The helpers, shared by the camera and lidar criteria:

- :func:`compile_options` reads the option: False → eager; True → ``torch.compile``'s defaults (inductor); a
  mapping → its keyword arguments (``{"mode": "reduce-overhead"}``, ``{"backend": "aot_eager"}``, ...).
- :func:`compiled` gives the ``torch.compile`` wrapper of a function for those options, made once per process and
  shared by every instance (a deep copy of a criterion keeps calling it with itself as the argument).
- :func:`ragged_dynamic` (and :func:`dynamic` for plain tensors) marks the padded dim of ragged inputs (``G``,
  ground truths) dynamic, on views, so that a batch with a new largest ground-truth count runs the compiled graph
  instead of compiling another; :func:`dense` makes strided views contiguous, whose strides would otherwise carry
  the ground-truth count past the marks (the StreamPETR head's predictions are slices of one tensor that also
  holds the ``groups · G`` denoising queries).
- :func:`region`: the profiler's timed region, or nothing while dynamo traces (a timer inside a graph would
  break it; a compiled call is timed as a whole from outside).

Dynamic shapes rather than padding ``G`` to buckets: one graph serves every count, results are those of the
unpadded batch by construction, and the loss needs no knowledge of the buckets. Dynamo specialises sizes 0 and 1,
so a batch whose largest sample has at most one ground truth compiles once more (twice at most: 0 and 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from drivetrain import profile
from drivetrain.ragged import RaggedBatch

__all__ = ["compile_options", "compiled", "dense", "dynamic", "ragged_dynamic", "region"]

_COMPILED: dict[tuple[Callable[..., Any], str], Callable[..., Any]] = {}


def compile_options(value: bool | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``torch.compile`` keyword arguments of a ``compile=`` option, or None for eager.

    Args:
        value: False/None (eager), True (``torch.compile`` defaults) or a mapping of ``torch.compile`` keyword
            arguments (``fullgraph``, ``dynamic``, ``backend``, ``mode``, ``options``).

    Returns:
        A new dict (possibly empty), or None.
    """
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"compile: expected a bool or a mapping of torch.compile arguments, got {type(value).__name__}")


def compiled(fn: Callable[..., Any], options: Mapping[str, Any]) -> Callable[..., Any]:
    """``torch.compile(fn, **options)``, made once per ``(fn, options)`` in this process.

    One wrapper per function and options: a new wrapper per call would compile again, and a wrapper held by an
    instance would not follow ``copy.deepcopy`` (pass the instance as an argument of an unbound ``fn`` instead).
    """
    key = (fn, repr(sorted(options.items())))
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, **options)
    return _COMPILED[key]


def dynamic(tensor: torch.Tensor | None, dim: int) -> torch.Tensor | None:
    """``tensor`` for a compiled call that treats its ``dim`` as dynamic; the caller's tensor stays unmarked (a
    mark would follow it into any other compiled code). Sizes 0 and 1 are left static: dynamo specialises them.

    Args:
        tensor: any tensor, or None (returned as is).
        dim: the dim to mark (negative counts from the end).

    Returns:
        A marked view (no copy) of a contiguous ``tensor``; a marked contiguous copy of any other (see
        :func:`dense`); ``tensor`` itself when its ``dim`` has size 0 or 1.
    """
    if tensor is None or tensor.shape[dim] < 2:
        return tensor
    marked = tensor.view(tensor.shape) if tensor.is_contiguous() else tensor.contiguous()
    torch._dynamo.mark_dynamic(marked, dim % tensor.dim())  # a negative dim would be ignored
    return marked


def dense(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, copied to contiguous memory if it is a strided view. A view's strides and offset may hold a
    size dynamo does not see — the DN query count, for the main queries sliced out of one ``(L, B, P+Q, ·)``
    tensor — and dynamo guards them: every new count would compile again. The copy is differentiable."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def ragged_dynamic(rb: RaggedBatch) -> RaggedBatch:
    """``rb`` with its padded (ragged) dim dynamic for the next compiled call: the tensor's and, when an earlier
    op cached it, the mask's (both are graph inputs). Views, no copies; ``rb`` itself is left unmarked."""
    mask = dynamic(rb.cached_mask, -1)  # (*batch, S)
    return RaggedBatch.unchecked(dynamic(rb.tensor, rb.ragged_dim), rb.sizes, rb.ragged_dim, mask)


def region(name: str) -> AbstractContextManager[None]:
    """:func:`drivetrain.profile.region`, or a no-op while dynamo traces (the compiled call is timed outside)."""
    if torch.compiler.is_compiling():
        return nullcontext()
    return profile.region(name)
