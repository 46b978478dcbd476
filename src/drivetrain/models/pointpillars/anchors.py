"""Anchors on the BEV feature grid, as mmdetection3d's ``AlignedAnchor3DRangeGenerator`` (PointPillars) and
``AlignedAnchor3DRangeGeneratorPerCls`` (SSN) lay them out.

Centres (``align_corner=False``): the range ``[lo, hi]`` of each axis is cut into ``n`` cells with
``linspace(lo, hi, n + 1)`` and every anchor sits at its cell's centre, ``c_i = linspace_i + (linspace_1 −
linspace_0) / 2``; the feature map has one depth cell, so the range's z gives ``z_bottom = z_lo + (z_hi −
z_lo) / 2`` (the configs use ``z_lo = z_hi``). The arithmetic is the original's, in float32.

Height convention: mmdetection3d LiDAR boxes, anchors included, carry the **bottom** centre z. drivetrain
boxes carry the **gravity** centre, so every anchor here has ``z = z_bottom + dz / 2`` (float32), the value
the original's box coder computes as ``z_a + h_a / 2`` before encoding.

Each anchor is 9 numbers ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)``; the velocity slots are zeros, as the
original writes zeros whatever ``custom_values`` holds.

Layouts:
    shared (:func:`grid_anchors`): ``[H, W, S, R]`` flattened, anchor ``((y·W + x)·S + s)·R + r``: the
    order of a head output ``(B, S·R·K, H, W)`` after ``permute(0, 2, 3, 1).reshape(B, -1, K)``.
    per class (:func:`per_class_anchors`): class blocks in class order, each ``[R, H_c, W_c]`` flattened
    (``(r·H_c + y)·W_c + x`` within the block), on that class's own feature map, as SSN's shape heads
    emit their outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from drivetrain.match.anchor_window import AnchorGrid

__all__ = [
    "AnchorConfig",
    "grid_anchors",
    "grid_layout",
    "num_grid_anchors",
    "num_per_class_anchors",
    "per_class_anchors",
    "per_class_layout",
]


@dataclass(frozen=True)
class AnchorConfig:
    """Anchor sizes, the range each size is spread over, and rotations.

    Args:
        ranges: per size ``(x_lo, y_lo, z_lo, x_hi, y_hi, z_hi)``; one range is shared by all sizes.
        sizes: ``(dx, dy, dz)`` per size (per class for the per-class generator).
        rotations: yaw of the anchors at every location and size (the published anchor tables, in :mod:`.recipe`,
            use ``(0, 1.57)``).
        custom_values: extra per-anchor values after yaw; only their number counts (velocity: two), since
            the original fills them with zeros; non-zero values are rejected rather than ignored.
        align_corner: put anchors on cell corners instead of cell centres (``False`` in every config).
    """

    ranges: tuple[tuple[float, ...], ...]
    sizes: tuple[tuple[float, ...], ...]
    rotations: tuple[float, ...] = (0.0, 1.57)
    custom_values: tuple[float, ...] = (0.0, 0.0)
    align_corner: bool = False

    def __post_init__(self) -> None:
        if not self.sizes or any(len(size) != 3 for size in self.sizes):
            raise ValueError(f"sizes: need one or more (dx, dy, dz) triples, got {self.sizes!r}")
        if len(self.ranges) not in (1, len(self.sizes)) or any(len(r) != 6 for r in self.ranges):
            raise ValueError(
                f"ranges: need 1 or {len(self.sizes)} (one per size) 6-tuples (x_lo, y_lo, z_lo, x_hi, y_hi, z_hi), "
                f"got {self.ranges!r}"
            )
        if not self.rotations:
            raise ValueError("rotations: need at least one rotation")
        if any(value != 0 for value in self.custom_values):
            raise ValueError(f"custom_values: the original writes zeros whatever is given; got {self.custom_values!r}")

    @property
    def num_sizes(self) -> int:
        """Sizes (S), one per range."""
        return len(self.sizes)

    @property
    def num_rotations(self) -> int:
        """Rotations (R)."""
        return len(self.rotations)

    @property
    def box_dim(self) -> int:
        """Numbers per anchor: 7 + the custom values."""
        return 7 + len(self.custom_values)

    def range_of(self, size_index: int) -> tuple[float, ...]:
        """The range that size ``size_index`` is spread over."""
        return self.ranges[size_index if len(self.ranges) > 1 else 0]


def _float32(value: float) -> float:
    """The float32 rounding of ``value``, as ``torch.tensor(range)`` stores it in the original."""
    return float(np.float32(value))


def _cell_centres(lo: float, hi: float, n: int, align_corner: bool, device: torch.device | str) -> torch.Tensor:
    """``(n,)`` float32 cell centres (or corners) of ``[lo, hi]`` cut into ``n`` cells, as the original."""
    edges = torch.linspace(_float32(lo), _float32(hi), n + 1, dtype=torch.float32, device=device)  # (n + 1,)
    if not align_corner:
        edges = edges + (edges[1] - edges[0]) / 2  # (n + 1,)
    return edges[:n]  # (n,)


def _single_range(
    cfg: AnchorConfig, size_index: int, feature_size: tuple[int, int], device: torch.device | str
) -> torch.Tensor:
    """Anchors of one (range, size) pair: ``(H, W, R, box_dim)`` float32, gravity-centre z."""
    height, width = feature_size
    lo_x, lo_y, lo_z, hi_x, hi_y, hi_z = cfg.range_of(size_index)
    xs = _cell_centres(lo_x, hi_x, width, cfg.align_corner, device)  # (W,)
    ys = _cell_centres(lo_y, hi_y, height, cfg.align_corner, device)  # (H,)
    z_bottom = _cell_centres(lo_z, hi_z, 1, cfg.align_corner, device)  # (1,)
    size = torch.tensor(cfg.sizes[size_index], dtype=torch.float32, device=device)  # (3,)
    rots = torch.tensor(cfg.rotations, dtype=torch.float32, device=device)  # (R,)
    z_centre = z_bottom + size[2] / 2  # (1,): drivetrain boxes carry the gravity centre
    shape = (height, width, len(cfg.rotations))
    columns = [
        xs[None, :, None].expand(shape),  # (H, W, R)
        ys[:, None, None].expand(shape),  # (H, W, R)
        z_centre.expand(shape),  # (H, W, R)
        *(size[k].expand(shape) for k in range(3)),  # 3 × (H, W, R)
        rots.expand(shape),  # (H, W, R)
        *(torch.zeros(shape, dtype=torch.float32, device=device) for _ in cfg.custom_values),  # (H, W, R) each
    ]
    return torch.stack(columns, dim=-1)  # (H, W, R, box_dim)


def num_grid_anchors(cfg: AnchorConfig, feature_size: tuple[int, int]) -> int:
    """Number of anchors :func:`grid_anchors` makes: ``H·W·S·R``, without building them."""
    return feature_size[0] * feature_size[1] * cfg.num_sizes * cfg.num_rotations


def grid_anchors(cfg: AnchorConfig, feature_size: tuple[int, int], device: torch.device | str = "cpu") -> torch.Tensor:
    """Anchors shared by all classes on one feature map (``AlignedAnchor3DRangeGenerator``, one level).

    Args:
        cfg: sizes, their ranges and rotations.
        feature_size: ``(H, W)`` of the head's feature map.
        device: where the anchors are built.

    Returns:
        float32 ``(H·W·S·R, box_dim)`` anchors ``(x, y, z_centre, dx, dy, dz, yaw, 0, 0)``; anchor
        ``((y·W + x)·S + s)·R + r`` sits in cell ``(y, x)`` with size ``s`` and rotation ``r``.

    Example:
        >>> cfg = AnchorConfig(ranges=((-16, -16, -1.8, 16, 16, -1.8),), sizes=((4.6, 1.95, 1.72),))
        >>> grid_anchors(cfg, (32, 32)).shape
        torch.Size([2048, 9])
    """
    per_size = [_single_range(cfg, s, feature_size, device) for s in range(cfg.num_sizes)]  # S × (H, W, R, 9)
    return torch.stack(per_size, dim=2).reshape(-1, cfg.box_dim)  # (H·W·S·R, 9)


def num_per_class_anchors(cfg: AnchorConfig, feature_sizes: tuple[tuple[int, int], ...]) -> list[int]:
    """Anchors of each class block of :func:`per_class_anchors` (``R·H_c·W_c``), without building them."""
    _check_per_class(cfg, feature_sizes)
    return [h * w * cfg.num_rotations for h, w in feature_sizes]


def per_class_anchors(
    cfg: AnchorConfig, feature_sizes: tuple[tuple[int, int], ...], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchors of one size per class, each on its class's feature map (``AlignedAnchor3DRangeGeneratorPerCls``).

    Args:
        cfg: one size and one range per class, in class order.
        feature_sizes: ``(H_c, W_c)`` per class.
        device: where the anchors are built.

    Returns:
        ``anchors``: float32 ``(A, box_dim)``, class blocks concatenated in class order, each ``[R, H_c, W_c]``
        flattened; ``classes``: int64 ``(A,)`` the class of each anchor. ``A = Σ_c R·H_c·W_c``.
    """
    _check_per_class(cfg, feature_sizes)
    blocks, classes = [], []
    for c, feature_size in enumerate(feature_sizes):
        block = _single_range(cfg, c, feature_size, device).permute(2, 0, 1, 3)  # (R, H_c, W_c, 9)
        blocks.append(block.reshape(-1, cfg.box_dim))  # (R·H_c·W_c, 9)
        classes.append(torch.full((blocks[-1].shape[0],), c, dtype=torch.int64, device=device))  # (R·H_c·W_c,)
    return torch.cat(blocks), torch.cat(classes)  # (A, 9), (A,)


def _check_per_class(cfg: AnchorConfig, feature_sizes: tuple[tuple[int, int], ...]) -> None:
    if len(feature_sizes) != cfg.num_sizes or len(cfg.ranges) != cfg.num_sizes:
        raise ValueError(
            f"feature_sizes: the per-class generator needs one feature size and one range per size; got "
            f"{len(feature_sizes)} feature sizes, {len(cfg.ranges)} ranges, {cfg.num_sizes} sizes"
        )


def _type_geometry(cfg: AnchorConfig, size_index: int, rotation: float, feature_size: tuple[int, int]) -> dict:
    """Cell origin and step, and the half extents of the nearest-BEV rectangle, of one (size, rotation) type."""
    height, width = feature_size
    lo_x, lo_y, _, hi_x, hi_y, _ = cfg.range_of(size_index)
    step_x, step_y = (hi_x - lo_x) / width, (hi_y - lo_y) / height
    shift = 0.0 if cfg.align_corner else 0.5
    dx, dy = cfg.sizes[size_index][:2]
    folded = rotation - math.floor(rotation / math.pi + 0.5) * math.pi  # limit_period(yaw, 0.5, π)
    if abs(folded) > math.pi / 4:  # the rectangle lies across the axes (nearest_bev_boxes)
        dx, dy = dy, dx
    return {
        "x0": lo_x + shift * step_x, "y0": lo_y + shift * step_y, "step_x": step_x, "step_y": step_y,
        "nx": width, "ny": height, "half_x": dx / 2, "half_y": dy / 2,
    }  # fmt: skip


def _grid(types: list[dict]) -> AnchorGrid:
    return AnchorGrid(**{key: tuple(t[key] for t in types) for key in types[0]})


def grid_layout(cfg: AnchorConfig, feature_size: tuple[int, int]) -> AnchorGrid:
    """Where :func:`grid_anchors` puts each anchor, for the windowed assignment (one type per size and rotation,
    all in group 0: class-agnostic)."""
    width = feature_size[1]
    per_cell = cfg.num_sizes * cfg.num_rotations
    types = []
    for s in range(cfg.num_sizes):
        for r, rotation in enumerate(cfg.rotations):
            geometry = _type_geometry(cfg, s, rotation, feature_size)
            types.append({**geometry, "base": s * cfg.num_rotations + r, "stride_x": per_cell,
                          "stride_y": width * per_cell, "group": 0})  # fmt: skip
    return _grid(types)


def per_class_layout(cfg: AnchorConfig, feature_sizes: tuple[tuple[int, int], ...]) -> AnchorGrid:
    """Where :func:`per_class_anchors` puts each anchor (one type per class and rotation, grouped by class)."""
    _check_per_class(cfg, feature_sizes)
    types, offset = [], 0
    for c, (height, width) in enumerate(feature_sizes):
        for r, rotation in enumerate(cfg.rotations):
            geometry = _type_geometry(cfg, c, rotation, (height, width))
            types.append({**geometry, "base": offset + r * height * width, "stride_x": 1, "stride_y": width,
                          "group": c})  # fmt: skip
        offset += cfg.num_rotations * height * width
    return _grid(types)
