"""Learning-rate schedules as pure functions of the optimizer step.

``lr_factor(cfg, step, total)`` is the multiplier of the peak learning rate at ``step`` (the number of
optimizer updates applied so far, so a skipped fp16 step does not move it). Nothing is stored: resuming at
step ``s`` gives the same learning rate as an uninterrupted run at ``s``.

Example:
    >>> cfg = ScheduleConfig(kind="warmup_cosine", warmup_steps=10)
    >>> [round(lr_factor(cfg, s, 100), 3) for s in (0, 5, 10, 55, 100)]
    [0.091, 0.545, 1.0, 0.5, 0.0]
"""

from __future__ import annotations

import math

from drivetrain.engine.config import ScheduleConfig

__all__ = ["lr_factor", "one_cycle", "warmup_constant", "warmup_cosine"]


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
