"""The one random 3D box generator of the tests: lidar-frame boxes ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)``
with positive sizes, drawn from a generator (continuous values: no ties for the matchers)."""

from __future__ import annotations

import math

import torch

__all__ = ["random_boxes3d"]


def random_boxes3d(
    shape: tuple[int, ...] | int,
    gen: torch.Generator,
    *,
    dtype: torch.dtype = torch.float32,
    velocity: bool = True,
    yaw_turns: float = 0.5,
) -> torch.Tensor:
    """Boxes ``(*shape, 9)`` (``(*shape, 7)`` without velocity): centres in ±50 m (z in [−3, 1]), sizes in
    [0.2, 5.2] m, yaw in ±``yaw_turns``·2π (just inside, so a yaw never sits on the ±π seam by default),
    velocities in ±10 m/s.
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    u = torch.rand((*shape, 9), generator=gen, dtype=torch.float64)
    centre = torch.stack([u[..., 0] * 100 - 50, u[..., 1] * 100 - 50, u[..., 2] * 4 - 3], dim=-1)
    size = 0.2 + u[..., 3:6] * 5
    yaw = (u[..., 6:7] * 2 - 1) * (2 * math.pi * yaw_turns - 1e-3)
    vel = u[..., 7:9] * 20 - 10
    parts = [centre, size, yaw] + ([vel] if velocity else [])
    return torch.cat(parts, dim=-1).to(dtype)
