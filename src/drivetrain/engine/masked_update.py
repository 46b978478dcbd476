"""An optimizer update that a device flag may cancel: decided on the device, settled on the host after the step.

The trainer decides whether an iteration's update is applied (finite gradients and losses on every rank) on the
device, so that nothing in the step waits for the host. :class:`MaskedUpdate` runs the optimizer's own step — the
same arithmetic as an unconditional ``optimizer.step()`` — between a copy of what it changes and a put-back where the
flag says skip:

- :meth:`MaskedUpdate.step`: copy every parameter with a gradient and its optimizer-state tensors on the flag's
  device into persistent buffers, ``optimizer.step()``, then ``torch.where(apply, new, copy)`` into each tensor. A
  selection, not arithmetic: an applied update is bit-identical to ``optimizer.step()``, a skipped one leaves every
  value exactly as it was (also when the update made NaNs). No host read.
- :meth:`MaskedUpdate.settle`: after the step's one host read, what the device could not put back: state tensors on
  another device than the flag (AdamW's step counters stay on the CPU beside CUDA parameters; FSDP's CPU offload),
  and the state a parameter's first update created (the optimizer then has no state for it, as if it never stepped).

The cost: one copy of the parameters and their optimizer state (AdamW: three tensors per parameter) kept between
steps, and a copy and a selection per tensor per step.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["MaskedUpdate"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2), the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


class MaskedUpdate:
    """``optimizer.step()`` cancelled on the device where a () bool flag is False (see the module).

    Args:
        optimizer: a ``torch.optim`` optimizer whose step changes only its parameters and its ``state`` tensors.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._buffers: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # id(tensor) → (the tensor, its copy)
        self._elsewhere: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tensor, its copy): put back on the host
        self._fresh: list[torch.Tensor] = []  # parameters whose state this update created

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` copied into its persistent buffer."""
        owner, buffer = self._buffers.get(id(t), (None, None))
        if owner is None or owner() is not t:  # a new tensor (or a dead one's id reused): a buffer of its own
            buffer = torch.empty_like(t)
            self._buffers[id(t)] = (weakref.ref(t), buffer)
        return buffer.copy_(t)

    @torch.no_grad()
    def step(self, apply: torch.Tensor) -> None:
        """Run ``optimizer.step()`` and keep its result only where ``apply`` (a () bool tensor) is True."""
        state = self.optimizer.state
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        self._fresh = [p for p in params if not state.get(p)]  # .get: no empty entry in the defaultdict
        here, self._elsewhere = [], []
        for p in params:
            tensors = [p, *(v for v in state.get(p, {}).values() if isinstance(v, torch.Tensor))]
            for t in map(_local, tensors):
                (here if t.device == apply.device else self._elsewhere).append((t, self._copy(t)))
        self.optimizer.step()
        for t, saved in here:
            torch.where(apply, t, saved, out=t)

    def settle(self, applied: bool) -> None:
        """After the host read of the flag :meth:`step` got: put back what the device could not if not ``applied``."""
        if not applied:
            for t, saved in self._elsewhere:
                t.copy_(saved)
            for p in self._fresh:
                del self.optimizer.state[p]
        self._elsewhere, self._fresh = [], []
