"""Recording the tensor copies a piece of code makes: every ``Tensor.to`` that moved data to another device and
every ``copy_`` between devices, with its source and its ``non_blocking`` flag. A ``TorchFunctionMode`` sees the
calls on any device, so a copy to ``"meta"`` on a CPU-only machine counts exactly as one to a GPU would."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


@dataclass
class Copy:
    """One recorded copy: its source tensor, the result, and whether it was issued non-blocking."""

    source: torch.Tensor
    result: torch.Tensor
    non_blocking: bool


class CopyRecorder(TorchFunctionMode):
    """``with CopyRecorder() as copies: ...`` then ``copies.calls``: the copies between devices, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Copy] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.Tensor.to and isinstance(out, torch.Tensor) and out.device != args[0].device:
            flag = kwargs.get("non_blocking", any(a is True for a in args[1:]))  # .to(device, non_blocking) too
            self.calls.append(Copy(args[0], out, bool(flag)))
        elif func is torch.Tensor.copy_ and args[0].device != args[1].device:
            flag = kwargs.get("non_blocking", len(args) > 2 and args[2])
            self.calls.append(Copy(args[1], args[0], bool(flag)))
        return out

    def sources(self) -> list[int]:
        """``id`` of each copy's source tensor, in order (a tensor copied twice appears twice)."""
        return [id(call.source) for call in self.calls]
