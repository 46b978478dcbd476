"""An optimizer update taken before the host knows whether to keep it, and undone exactly if not.

The trainer decides whether an iteration's update counts (finite gradients and losses on every rank, agreed on the
device) without the step waiting for the host: the update runs at once, and the iteration's one host read, after
it, says whether to keep it. :class:`UndoableUpdate` brackets the optimizer's own step — the same arithmetic as an
unconditional ``optimizer.step()``, so a kept update is bit-identical to it:

- :meth:`UndoableUpdate.step`: copy every parameter with a gradient and its optimizer-state tensors (a DTensor's
  local shard) into buffers kept between steps (``torch._foreach_copy_``: a few multi-tensor kernels per device and
  dtype on CUDA), then ``optimizer.step()``. No host read.
- :meth:`UndoableUpdate.settle`: after the read, for an update not to keep: copy every value back (exactly, also
  over the NaNs a non-finite gradient made) and drop the state a parameter's first update created (the optimizer then
  has no state for it, as if it never stepped). Skips are rare: the common step pays only the copy.

The cost: one copy of the parameters and their optimizer state (AdamW: parameter, two moments, the step counter)
kept between steps, and one copy of them per step.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import torch

__all__ = ["UndoableUpdate"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2), the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``target.copy_(source)`` for each pair, one ``_foreach_copy_`` per device and dtype."""
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[torch.Tensor]]] = defaultdict(
        lambda: ([], [])
    )
    for target, source in zip(targets, sources, strict=True):
        group = groups[target.device, target.dtype]
        group[0].append(target)
        group[1].append(source)
    for group_targets, group_sources in groups.values():
        torch._foreach_copy_(group_targets, group_sources)


class UndoableUpdate:
    """``optimizer.step()`` that :meth:`settle` can undo exactly (see the module).

    Args:
        optimizer: a ``torch.optim`` optimizer whose step changes only its parameters and its ``state`` tensors.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._buffers: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # id(tensor) → (the tensor, its buffer)
        self._saved: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])  # the tensors, their copies
        self._fresh: list[torch.Tensor] = []  # parameters whose state this update created

    @torch.no_grad()
    def step(self) -> None:
        """Copy what ``optimizer.step()`` changes, then run it."""
        state = self.optimizer.state
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        self._fresh = [p for p in params if not state.get(p)]  # .get: no empty entry in the defaultdict
        tensors = [t for p in params for t in (p, *state.get(p, {}).values()) if isinstance(t, torch.Tensor)]
        kept, locals_, buffers = {}, [], []
        for t in tensors:  # a buffer per tensor, kept between steps; a new tensor (or reshaped) gets a new one
            local = _local(t)
            owner, buffer = self._buffers.get(id(t), (None, None))
            if owner is None or owner() is not t or buffer.shape != local.shape or buffer.dtype != local.dtype:
                buffer = torch.empty_like(local)
            kept[id(t)] = (weakref.ref(t), buffer)
            locals_.append(local)
            buffers.append(buffer)
        self._buffers = kept  # gone tensors' buffers are dropped
        _copy_all(buffers, locals_)
        self._saved = (locals_, buffers)
        self.optimizer.step()

    @torch.no_grad()
    def settle(self, keep: bool) -> None:
        """After the host read: undo the last :meth:`step` exactly unless ``keep``."""
        if not keep:
            _copy_all(*self._saved)
            for p in self._fresh:
                del self.optimizer.state[p]
        self._saved, self._fresh = ([], []), []
