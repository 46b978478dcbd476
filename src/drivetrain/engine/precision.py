"""Mixed precision: autocast contexts, a sync-free dynamic loss scaler with hysteresis, unscale + clip.

- fp32: no autocast, scale 1.
- bf16: ``torch.autocast(dtype=bfloat16)`` for the forward, scale 1 (bf16 has fp32's exponent range).
- fp16: ``torch.autocast(dtype=float16)`` and dynamic loss scaling (:class:`LossScaler`).

Losses are computed outside autocast on fp32 copies of the outputs (:func:`fp32_outputs`); normalisation
layers follow autocast's fp32 policy. All scaler state lives on the device and is updated with
``torch.where``: nothing here reads a value on the host, except :func:`unscale_clip_` for gradients kept on the host
(FSDP CPU offload), whose fp16 unscaling needs the scale there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

from drivetrain.engine.config import PrecisionConfig

__all__ = ["LossScaler", "autocast", "fp32_outputs", "unscale_clip_"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(mode: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward's autocast context for precision ``mode`` (a no-op for fp32)."""
    if mode == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[mode])


def fp32_outputs(outputs: Any) -> Any:
    """``outputs`` with every floating tensor (in dicts, lists, tuples) cast to float32 for the loss."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float() if outputs.is_floating_point() else outputs
    if isinstance(outputs, dict):
        return {k: fp32_outputs(v) for k, v in outputs.items()}
    if isinstance(outputs, list | tuple):
        return type(outputs)(fp32_outputs(v) for v in outputs)
    return outputs


class LossScaler:
    """Dynamic loss scaling for fp16 with growth interval, hysteresis and a minimum scale.

    On an overflow (non-finite gradients) the hysteresis counter drops by one; once it is used up the scale
    is multiplied by ``backoff_factor`` (not below ``min_scale``). After ``growth_interval`` finite steps in
    a row the scale is multiplied by ``growth_factor`` and the hysteresis is refilled. Disabled (scale 1,
    never updated) for fp32 and bf16.

    Args:
        cfg: the precision config.
        device: where the scale and counters live.
        enabled: scale fp16 losses (default); False when another component (DeepSpeed) scales them.
    """

    def __init__(self, cfg: PrecisionConfig, device: torch.device, enabled: bool = True) -> None:
        self.cfg = cfg
        self.enabled = enabled and cfg.mode == "fp16"
        self.scale = torch.tensor(cfg.init_scale if self.enabled else 1.0, dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int64, device=device)
        self.hysteresis_left = torch.full((), cfg.hysteresis, dtype=torch.int64, device=device)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss × scale`` (the loss itself when disabled)."""
        return loss * self.scale if self.enabled else loss

    def update(self, found_inf: torch.Tensor) -> None:
        """Advance the scale after a step; ``found_inf`` is a bool scalar tensor on the scaler's device."""
        if not self.enabled:
            return
        cfg = self.cfg
        back_off = found_inf & (self.hysteresis_left <= 1)
        grow = ~found_inf & (self.growth_tracker + 1 >= cfg.growth_interval)
        new_scale = torch.where(back_off, (self.scale * cfg.backoff_factor).clamp(min=cfg.min_scale), self.scale)
        self.scale.copy_(torch.where(grow, new_scale * cfg.growth_factor, new_scale))
        self.hysteresis_left.copy_(
            torch.where(
                grow, cfg.hysteresis, torch.where(found_inf & ~back_off, self.hysteresis_left - 1, self.hysteresis_left)
            )
        )
        self.growth_tracker.copy_(torch.where(found_inf | grow, 0, self.growth_tracker + 1))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """CPU copies of the scaler state: ``scale``, ``growth_tracker`` and ``hysteresis_left``."""
        return {
            "scale": self.scale.detach().cpu().clone(),
            "growth_tracker": self.growth_tracker.detach().cpu().clone(),
            "hysteresis_left": self.hysteresis_left.detach().cpu().clone(),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``scale``, ``growth_tracker`` and ``hysteresis_left`` from ``state`` into the device tensors."""
        self.scale.copy_(state["scale"])
        self.growth_tracker.copy_(state["growth_tracker"])
        self.hysteresis_left.copy_(state["hysteresis_left"])


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2 gradients), the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def unscale_clip_(
    params: Iterable[torch.nn.Parameter], scaler: LossScaler, max_norm: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unscale gradients in place, measure their global norm and clip to ``max_norm``; no host sync, except one read
    of the scale when fp16 gradients live on the host (FSDP CPU offload: the host multiplies them).

    Returns:
        ``(grad_norm, found_inf)``: float32 and bool scalars on the device. The norm is of the unscaled
        gradients, before clipping, over all ranks for sharded (FSDP) gradients; ``found_inf`` is True when
        it is not finite (some gradient is inf/NaN).
    """
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params]
    if not grads:
        zero = scaler.scale.new_zeros(())
        return zero, zero.bool()
    if scaler.enabled:
        inv = scaler.scale.double().reciprocal().float()
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for g in grads:
            local = _local(g)
            by_device.setdefault(local.device, []).append(local)
        for device, group in by_device.items():  # FSDP CPU offload keeps gradients on the host
            # sync: the host multiplies offloaded gradients by the scale, so it waits for it; a non-blocking copy
            # to the host would land in pinned memory after the multiplication read it
            torch._foreach_mul_(group, inv.to(device, non_blocking=device.type != "cpu"))
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    norm = norm.to(scaler.scale.device, torch.float32)
    return norm, ~torch.isfinite(norm)
