"""BEV augmentation of lidar points and 3D boxes: per-sample random parameters, one batched apply, no host sync.

The lidar train pipeline of mmdetection3d's nuScenes PointPillars and SSN configs, in its order:

1. ``GlobalRotScaleTrans``: rotate about +z by ``θ ~ U(rot_range)``, scale by ``s ~ U(scale_range)``, then
   translate by ``t ~ N(0, translation_std²)`` (points, box centres; box yaw gets ``+θ``, box sizes and
   velocities ``×s``, velocities rotate with the boxes and are not translated).
2. ``RandomFlip3D``: horizontal flip (``y → −y``, ``yaw → −yaw``, ``vy → −vy``) with ``flip_horizontal``, then
   vertical flip (``x → −x``, ``yaw → π − yaw``, ``vx → −vx``) with ``flip_vertical`` (SSN uses 0.5).
3. ``PointsRangeFilter``: keep points with ``min < xyz < max`` (strict, per axis).
4. ``ObjectRangeFilter``: keep boxes whose BEV centre has ``min < xy < max`` (strict), then wrap every yaw into
   ``[−π, π)`` (mmdet3d's ``limit_yaw(offset=0.5, period=2π)``).
5. ``PointShuffle``: permute each sample's remaining points.

(The PointPillars config also runs ``ObjectNameFilter`` before the shuffle; keeping only known classes is a
label-set question and stays out of this module.)

Conventions. Boxes are ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)`` in the lidar frame (x forward, y left,
z up; ``yaw`` about +z); a box without velocity ``(…, yaw)`` is accepted too. mmdet3d rotates by the *row-vector*
matrix of ``rotation_3d_in_axis(axis=2)``, ``rot_mat_T = [[c, s, 0], [−s, c, 0], [0, 0, 1]]`` applied as
``p @ rot_mat_T``, i.e. ``x' = c·x − s·y``, ``y' = s·x + c·y``: a positive angle turns counter-clockwise seen
from above ((10, 0) → (0, 10) for θ = π/2), and the yaw grows by θ. mmdet3d's LiDAR boxes store the *bottom*
centre ``z_b = z − dz/2``; ours store the centre. That changes nothing here: the rotation keeps ``z``, the
translation adds ``t_z`` to either, and scaling maps ``z_b → s·z_b`` and ``dz → s·dz``, hence
``z_b + dz/2 → s·(z_b + dz/2)``: the centre scales by ``s`` just like the bottom centre.

Random draws are separate from the apply (as kornia does): :func:`sample_bev_params` draws a
:class:`BevAugParams` from an explicit ``torch.Generator`` on the points' device; :func:`apply_bev_aug` is a pure
function of the batch and the parameters, so passing the same parameters again replays the augmentation
exactly. Per-sample "flip with probability p" is a ``(B,)`` bool mask used in ``torch.where``. The params carry
the per-sample ``(B, 4, 4)`` matrix ``M`` (column vectors: ``[p'; 1] = M [p; 1]``) of the whole rigid/scale/flip
chain; the apply moves points, box centres and velocities with it, so a later GPU camera-augmentation module
can absorb this one by updating its camera matrices from the same ``M`` (``lidar2img' = lidar2img · M⁻¹``).

Range filters compact the kept entries to the front of each sample in their original order and return new
sizes computed on the device; the padded lengths stay the inputs' (known on the host), so nothing syncs.
:func:`reference_bev_aug` is the per-sample path, written step by step after the mmdet3d transforms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from drivetrain.pipeline._config import finite_numbers
from drivetrain.ragged import RaggedBatch, select

__all__ = [
    "BevAugConfig",
    "BevAugParams",
    "BevBounds",
    "apply_bev_aug",
    "bev_aug_bounds",
    "bev_config_from_dict",
    "draw_bev_params",
    "make_bev_params",
    "matmul_roundoff",
    "reference_bev_aug",
    "sample_bev_params",
]

_YAW_OFFSET, _YAW_PERIOD = 0.5, 2 * np.pi  # ObjectRangeFilter: limit_yaw(offset=0.5, period=2 * np.pi)


def _f32(values: tuple[float, ...]) -> tuple[float, ...]:
    """mmdet3d stores ranges as ``np.float32``; comparing float32 data against these exact values matches it."""
    return tuple(float(np.float32(v)) for v in values)


def _limit_period(val: torch.Tensor, offset: float, period: float) -> torch.Tensor:
    """mmdet3d's ``limit_period``: ``val − floor(val / period + offset) · period`` (elementwise, same order)."""
    return val - torch.floor(val / period + offset) * period


@dataclass(frozen=True)
class BevAugConfig:
    """BEV augmentation settings; the defaults turn every step off (the identity), a model's published values
    live in its recipe (e.g. ``drivetrain.models.pointpillars.recipe.LIDAR_AUG``, mmdet3d's nuScenes PointPillars
    train pipeline).

    Each step is off at its default: ``rot_range=(0, 0)``, ``scale_range=(1, 1)``, ``translation_std=(0, 0, 0)``,
    a flip probability of 0, ``point_range=None``, ``object_range=None`` (which also skips ``limit_yaw``, as it
    belongs to ``ObjectRangeFilter``), ``shuffle=False``.
    """

    rot_range: tuple[float, float] = (0.0, 0.0)  # θ ~ U(lo, hi), radians about +z
    scale_range: tuple[float, float] = (1.0, 1.0)  # s ~ U(lo, hi), lo > 0
    translation_std: tuple[float, float, float] = (0.0, 0.0, 0.0)  # t ~ N(0, std²) per axis, metres
    flip_horizontal: float = 0.0  # probability of y → −y (RandomFlip3D flip_ratio_bev_horizontal)
    flip_vertical: float = 0.0  # probability of x → −x (flip_ratio_bev_vertical)
    # PointsRangeFilter (x_min, y_min, z_min, x_max, y_max, z_max), strict; None keeps every point
    point_range: tuple[float, float, float, float, float, float] | None = None
    # ObjectRangeFilter on the BEV centre (x_min, y_min, x_max, y_max), strict, then limit_yaw; None skips both
    object_range: tuple[float, float, float, float] | None = None
    shuffle: bool = False  # PointShuffle: permute each sample's kept points

    def __post_init__(self) -> None:
        lo, hi = finite_numbers(self, "rot_range", 2)
        if lo > hi:
            raise ValueError(f"rot_range: lower bound {lo} exceeds upper bound {hi}")
        lo, hi = finite_numbers(self, "scale_range", 2)
        if not 0 < lo <= hi:
            raise ValueError(f"scale_range: needs 0 < lo <= hi, got {(lo, hi)}")
        if any(std < 0 for std in finite_numbers(self, "translation_std", 3)):
            raise ValueError(f"translation_std: must be >= 0, got {self.translation_std}")
        for name in ("flip_horizontal", "flip_vertical"):
            p = getattr(self, name)
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
                raise ValueError(f"{name}: probability must be in [0, 1], got {p!r}")
        for name, length in (("point_range", 6), ("object_range", 4)):
            if getattr(self, name) is not None:
                bounds = finite_numbers(self, name, length)
                half = length // 2
                if not all(a < b for a, b in zip(bounds[:half], bounds[half:], strict=True)):
                    raise ValueError(f"{name}: every minimum must be below its maximum, got {bounds}")
        if not isinstance(self.shuffle, bool):
            raise ValueError(f"shuffle: expected a bool, got {self.shuffle!r}")


@dataclass(frozen=True)
class BevAugParams:
    """Per-sample augmentation parameters, on the batch's device; pass them again to replay.

    Build them with :func:`sample_bev_params` (random) or :func:`make_bev_params` (given values), which also
    computes ``matrix`` from the other fields. A single sample's parameters (:meth:`sample`) hold the same
    fields without the leading ``B``.

    Attributes:
        angle: float32 ``(B,)`` rotation about +z, radians (counter-clockwise, mmdet3d's convention).
        scale: float32 ``(B,)`` scale factor.
        translation: float32 ``(B, 3)`` translation, applied after rotation and scaling, before the flips.
        flip_h: bool ``(B,)`` horizontal flip (``y → −y``).
        flip_v: bool ``(B,)`` vertical flip (``x → −x``), applied after the horizontal one.
        matrix: float32 ``(B, 4, 4)`` the whole chain for column vectors: ``[p'; 1] = matrix @ [p; 1]``.
        shuffle_keys: float32 ``(B, P)`` keys in [0, 1): the kept points of sample b are reordered by
            ``argsort(shuffle_keys[b, :num_kept], stable=True)``; all zeros (the identity) when not shuffling.
    """

    angle: torch.Tensor
    scale: torch.Tensor
    translation: torch.Tensor
    flip_h: torch.Tensor
    flip_v: torch.Tensor
    matrix: torch.Tensor
    shuffle_keys: torch.Tensor

    def sample(self, index: int) -> BevAugParams:
        """Sample ``index``'s parameters (every field indexed at its first dim), for the reference path."""
        return BevAugParams(*(getattr(self, f.name)[index] for f in fields(self)))


def make_bev_params(
    angle: torch.Tensor,
    scale: torch.Tensor,
    translation: torch.Tensor,
    flip_h: torch.Tensor,
    flip_v: torch.Tensor,
    shuffle_keys: torch.Tensor,
) -> BevAugParams:
    """Parameters from given per-sample values, with their transform matrix.

    Args:
        angle: float ``(B,)`` radians.
        scale: float ``(B,)``.
        translation: float ``(B, 3)``.
        flip_h: bool ``(B,)``.
        flip_v: bool ``(B,)``.
        shuffle_keys: float ``(B, P)``.

    Returns:
        BevAugParams with float32 values and ``matrix`` ``(B, 4, 4)`` =
        ``F_v · F_h · (T + S·R)`` in homogeneous form, ``R = rot_mat_Tᵀ`` of mmdet3d.

    Example:
        >>> p = make_bev_params(torch.zeros(2), torch.ones(2), torch.zeros(2, 3),
        ...                     torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool), torch.zeros(2, 7))
        >>> p.matrix.shape
        torch.Size([2, 4, 4])
    """
    b = angle.shape[0] if angle.dim() == 1 else -1
    expected = {"angle": (b,), "scale": (b,), "translation": (b, 3), "flip_h": (b,), "flip_v": (b,)}
    given = {"angle": angle, "scale": scale, "translation": translation, "flip_h": flip_h, "flip_v": flip_v}
    for name, tensor in given.items():
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(f"{name}: expected shape {expected[name]}, got {tuple(tensor.shape)}")
    if flip_h.dtype != torch.bool or flip_v.dtype != torch.bool:
        raise ValueError(f"flip_h, flip_v: must be bool, got {flip_h.dtype} and {flip_v.dtype}")
    if shuffle_keys.dim() != 2 or shuffle_keys.shape[0] != b:
        raise ValueError(f"shuffle_keys: expected shape ({b}, P), got {tuple(shuffle_keys.shape)}")
    angle, scale = angle.float(), scale.float()  # (B,), (B,)
    translation, shuffle_keys = translation.float(), shuffle_keys.float()  # (B, 3), (B, P)
    cos, sin = torch.cos(angle), torch.sin(angle)  # (B,), (B,)
    sign_x = 1 - 2 * flip_v.float()  # (B,): the vertical flip negates x
    sign_y = 1 - 2 * flip_h.float()  # (B,): the horizontal flip negates y
    zero, one = torch.zeros_like(angle), torch.ones_like(angle)  # (B,), (B,)
    rows = (
        (sign_x * scale * cos, -sign_x * scale * sin, zero, sign_x * translation[:, 0]),
        (sign_y * scale * sin, sign_y * scale * cos, zero, sign_y * translation[:, 1]),
        (zero, zero, scale, translation[:, 2]),
        (zero, zero, zero, one),
    )
    matrix = torch.stack([torch.stack(row, dim=-1) for row in rows], dim=-2)  # (B, 4, 4)
    return BevAugParams(angle, scale, translation, flip_h, flip_v, matrix, shuffle_keys)


def sample_bev_params(points: RaggedBatch, config: BevAugConfig, generator: torch.Generator) -> BevAugParams:
    """Draw every sample's parameters on the points' device; the draws depend only on ``generator``.

    Draw order (fixed, whatever the config turns off, so one setting never shifts another's draws): angle
    ``U(rot_range)`` ``(B,)``, scale ``U(scale_range)`` ``(B,)``, translation ``N(0, std²)`` ``(B, 3)``, horizontal
    then vertical flip ``U(0, 1) < p`` ``(B,)`` each, and last the shuffle keys ``U(0, 1)`` ``(B, P)``, drawn
    only when ``config.shuffle`` (zeros otherwise).

    Args:
        points: RaggedBatch ``(B, P, C)``; only its batch size, padded length and device are used.
        config: the ranges and probabilities.
        generator: a ``torch.Generator`` on ``points.device``.

    Returns:
        BevAugParams on ``points.device``.
    """
    _check_points(points)
    return draw_bev_params(points.batch_shape[0], points.max_size, config, generator, device=points.device)


def draw_bev_params(
    batch_size: int,
    num_points: int,
    config: BevAugConfig,
    generator: torch.Generator,
    *,
    device: torch.device | str = "cpu",
) -> BevAugParams:
    """:func:`sample_bev_params` from the sizes alone: ``batch_size`` samples, ``num_points`` the padded point
    count P (the shuffle keys' length; 0 without points), drawn on ``device`` (the generator's)."""
    device = torch.device(device)
    if generator.device.type != device.type or generator.device.index not in (None, device.index):
        raise ValueError(f"generator: is on {generator.device} but points are on {device}; use one device")
    num, length = batch_size, num_points

    def uniform(bounds: tuple[float, ...], shape: tuple[int, ...]) -> torch.Tensor:
        u = torch.rand(shape, generator=generator, device=device)  # (*shape,)
        return bounds[0] + (bounds[1] - bounds[0]) * u  # (*shape,)

    angle = uniform(config.rot_range, (num,))  # (B,)
    scale = uniform(config.scale_range, (num,))  # (B,)
    normal = torch.randn((num, 3), generator=generator, device=device)  # (B, 3)
    std = torch.stack([normal.new_full((), s) for s in config.translation_std])  # (3,): no host copy
    translation = normal * std  # (B, 3)
    flip_h = torch.rand((num,), generator=generator, device=device) < config.flip_horizontal  # (B,)
    flip_v = torch.rand((num,), generator=generator, device=device) < config.flip_vertical  # (B,)
    if config.shuffle:
        keys = torch.rand((num, length), generator=generator, device=device)  # (B, P)
    else:
        keys = torch.zeros((num, length), device=device)  # (B, P): the identity permutation
    return make_bev_params(angle, scale, translation, flip_h, flip_v, keys)


def bev_config_from_dict(values: dict[str, Any], key: str, base: BevAugConfig | None = None) -> BevAugConfig:
    """A :class:`BevAugConfig` from a YAML mapping, each given field replacing ``base``'s (default: the identity).

    Args:
        values: field → value (ranges as lists; ``null`` turns a range filter off).
        key: where the mapping sits in the run config (``data.augment.lidar``), for the error messages.
        base: the config whose fields the mapping overrides (a model's recipe; None: :class:`BevAugConfig`'s
            defaults, every step off).

    Raises:
        ValueError: ``{key}.{field}: ...`` for a bad value, ``{key}: unknown field(s)`` for a name that is none.
    """
    if not isinstance(values, dict):
        raise ValueError(f"{key}: expected a mapping of BevAugConfig fields, got {type(values).__name__}")
    known = [f.name for f in fields(BevAugConfig)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{key}: unknown field(s) {unknown}; known: {known}")
    try:
        return replace(base or BevAugConfig(), **values)
    except (TypeError, ValueError) as err:  # the messages start with the field's name
        raise ValueError(f"{key}.{err}") from None


def apply_bev_aug(
    points: RaggedBatch, boxes: RaggedBatch, labels: RaggedBatch, params: BevAugParams, config: BevAugConfig
) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
    """Augment every sample at once: transform, flip, range-filter and shuffle, without a host sync.

    Points, box centres and velocities move with ``params.matrix``; yaw gets ``+angle`` and the flips'
    sign changes in mmdet3d's order (bit-identical to the reference); sizes scale by ``params.scale``.

    Args:
        points: RaggedBatch ``(B, P, C)``, ``C ≥ 3``, ``x, y, z`` first (the other channels are carried).
        boxes: float RaggedBatch ``(B, G, D)``, ``D = 9`` ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)`` or 7.
        labels: int RaggedBatch ``(B, G)`` with the sizes of ``boxes`` (not checked: that needs a device read).
        params: from :func:`sample_bev_params` or :func:`make_bev_params`; ``shuffle_keys`` ``(B, P)``.
        config: which filters run, their ranges, and whether to shuffle.

    Returns:
        ``(points, boxes, labels)``: RaggedBatches with the inputs' shapes and dtypes; kept entries first in
        each sample (filters keep the input order, then the shuffle reorders the points), new sizes on the
        device. Padding is 0 after a filter or shuffle and unspecified otherwise.

    Example:
        >>> params = sample_bev_params(batch.points, config, generator)
        >>> points, gt_boxes, gt_labels = apply_bev_aug(batch.points, batch.gt_boxes, batch.gt_labels, params, config)
    """
    _check_inputs(points, boxes, labels, params, config)
    dtype = points.dtype
    matrix = params.matrix.to(dtype)  # (B, 4, 4)
    linear_t = matrix[:, :3, :3].transpose(1, 2)  # (B, 3, 3): row-vector form, like mmdet3d's rot_mat_T
    shift = matrix[:, :3, 3].unsqueeze(1)  # (B, 1, 3)
    pts = points.tensor  # (B, P, C)
    xyz = torch.baddbmm(shift, pts[..., :3], linear_t)  # (B, P, 3)
    pts = torch.cat([xyz, pts[..., 3:]], dim=-1)  # (B, P, C)

    box = _moved_boxes(boxes.tensor, params, linear_t, shift)  # (B, G, D)

    keep = points.mask  # (B, P)
    if config.point_range is not None:
        lo, hi = _f32(config.point_range[:3]), _f32(config.point_range[3:])
        for axis in range(3):
            keep = keep & (xyz[..., axis] > lo[axis]) & (xyz[..., axis] < hi[axis])  # (B, P)
    if config.shuffle:
        out_points = _compact_shuffled(pts, keep, params.shuffle_keys)  # (B, P, C) ragged
    elif config.point_range is not None:
        out_points = select(pts, keep, trim=False)  # (B, P, C) ragged, input order
    else:
        out_points = points.with_tensor(pts)  # (B, P, C) ragged, input sizes

    if config.object_range is None:
        return out_points, boxes.with_tensor(box), labels
    x_min, y_min, x_max, y_max = _f32(config.object_range)
    cx, cy = box[..., 0], box[..., 1]  # (B, G), (B, G)
    keep_box = boxes.mask & (cx > x_min) & (cy > y_min) & (cx < x_max) & (cy < y_max)  # (B, G)
    yaw = _limit_period(box[..., 6], _YAW_OFFSET, _YAW_PERIOD)  # (B, G)
    box = torch.cat([box[..., :6], yaw.unsqueeze(-1), box[..., 7:]], dim=-1)  # (B, G, D)
    return out_points, select(box, keep_box, trim=False), select(labels.tensor, keep_box, trim=False)


def _moved_boxes(box: torch.Tensor, params: BevAugParams, linear_t: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Boxes ``(B, G, D)`` after the rotation, scaling, translation and flips (no filter): centres and velocities by
    the matrix, sizes by the scale, yaw as mmdet3d's ops."""
    centre = torch.baddbmm(shift.to(box.dtype), box[..., :3], linear_t.to(box.dtype))  # (B, G, 3)
    dims = box[..., 3:6] * params.scale.to(box.dtype)[:, None, None]  # (B, G, 3)
    yaw = box[..., 6] + params.angle.to(box.dtype)[:, None]  # (B, G)
    yaw = torch.where(params.flip_h[:, None], -yaw, yaw)  # (B, G)
    yaw = torch.where(params.flip_v[:, None], -yaw + np.pi, yaw)  # (B, G): same op as mmdet3d's flip
    parts = [centre, dims, yaw.unsqueeze(-1)]
    if box.shape[-1] == 9:  # velocity rotates, scales and flips with the box, without the translation
        parts.append(torch.bmm(box[..., 7:9], linear_t[:, :2, :2].to(box.dtype)))  # (B, G, 2)
    return torch.cat(parts, dim=-1)  # (B, G, D)


@dataclass(frozen=True)
class BevBounds:
    """The host's replay of :func:`apply_bev_aug`'s geometry on the batch before it, with how far the device's own
    result may lie from it (:func:`bev_aug_bounds`): what a caller needs to bound the augmented batch's counts on the
    host, without reading the device.

    Attributes:
        xyz: float32 ``(B, P, 3)`` the moved points as the host computes them.
        point_error: float64 ``(B, P, 3)``: the device's coordinate lies within this of ``xyz``.
        points_kept: bool ``(B, P)``: the point may survive the point-range filter on the device (a superset).
        boxes: ``(B, G, D)`` the moved boxes, before the object-range filter (sizes, yaw as the device has them).
        box_error: float64 ``(B, G)``: the device's box centre lies within this of ``boxes``' in x and y.
        boxes_kept: bool ``(B, G)``: the box may survive the object-range filter on the device (a superset).
    """

    xyz: torch.Tensor
    point_error: torch.Tensor
    points_kept: torch.Tensor
    boxes: torch.Tensor
    box_error: torch.Tensor
    boxes_kept: torch.Tensor


def matmul_roundoff(device: torch.device) -> float:
    """The unit roundoff of a float32 matrix product on ``device`` as torch's settings allow it: ``2⁻²⁴`` (IEEE
    float32), ``2⁻¹¹`` (TF32 inputs: CUDA's ``allow_tf32`` or a ``"high"`` matmul precision), ``2⁻⁸`` (bfloat16
    inputs: ``"medium"``)."""
    precision = torch.get_float32_matmul_precision()
    if precision == "medium":
        return 2.0**-8
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    return 2.0**-11 if precision == "high" or tf32 else 2.0**-24


def bev_aug_bounds(
    points: RaggedBatch, boxes: RaggedBatch, params: BevAugParams, config: BevAugConfig, roundoff: float
) -> BevBounds:
    """Replay :func:`apply_bev_aug`'s geometry on the host and bound how far the device's result may be from it.

    The points and box centres move by one ``baddbmm`` (three products and the shift, any summation order), whose
    float result on either side lies within ``γ₄·m`` of the exact one, ``m = |shift| + Σ|p_j|·|L_jk|`` and ``γ₄ =
    4u/(1 − 4u)`` for the device's unit roundoff ``u`` (:func:`matmul_roundoff`): the two results differ by at most
    ``2γ₄·m``, which this widens by four float32 ulps of the coordinate (the rounding of the host's own bound
    arithmetic). Sizes, yaw and flips are elementwise IEEE operations, the same bits on either side. A point may pass
    the strict point-range filter on the device when its host coordinate is within the bound of passing it; a box
    the object-range filter likewise. Nothing is shuffled or compacted: counts do not depend on the order.

    Args:
        points: the batch's points before the augmentation (host tensors), RaggedBatch ``(B, P, C)``.
        boxes: its ``gt_boxes`` ``(B, G, D)``.
        params: the parameters the device applies (:func:`sample_bev_params` / :func:`draw_bev_params`).
        config: the recipe.
        roundoff: the device's unit roundoff of a float32 matrix product.

    Returns:
        :class:`BevBounds`.
    """
    matrix = params.matrix.to(points.dtype)  # (B, 4, 4)
    linear_t = matrix[:, :3, :3].transpose(1, 2)  # (B, 3, 3): as apply_bev_aug
    shift = matrix[:, :3, 3].unsqueeze(1)  # (B, 1, 3)
    gamma = 4 * roundoff / (1 - 4 * roundoff)
    ulp = 4 * torch.finfo(torch.float32).eps

    def moved(xyz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.baddbmm(shift.to(xyz.dtype), xyz, linear_t.to(xyz.dtype))  # (B, N, 3)
        size = torch.baddbmm(shift.double().abs(), xyz.double().abs(), linear_t.double().abs())  # (B, N, 3)
        return out, 2 * gamma * size + ulp * out.double().abs()  # (B, N, 3), (B, N, 3)

    xyz, point_error = moved(points.tensor[..., :3])  # (B, P, 3) each
    kept = points.mask  # (B, P)
    if config.point_range is not None:
        lo, hi = _f32(config.point_range[:3]), _f32(config.point_range[3:])
        wide = xyz.double()
        for axis in range(3):
            near = point_error[..., axis]
            kept = kept & (wide[..., axis] + near > lo[axis]) & (wide[..., axis] - near < hi[axis])  # (B, P)
    box = boxes.tensor  # (B, G, D)
    centre_error = moved(box[..., :3])[1]  # (B, G, 3)
    moved_boxes = _moved_boxes(box, params, linear_t, shift)  # (B, G, D): centres by the same baddbmm
    box_error = centre_error[..., :2].amax(dim=-1)  # (B, G)
    boxes_kept = boxes.mask  # (B, G)
    if config.object_range is not None:
        x_min, y_min, x_max, y_max = _f32(config.object_range)
        cx, cy = moved_boxes[..., 0].double(), moved_boxes[..., 1].double()  # (B, G) each
        boxes_kept = boxes_kept & (cx + box_error > x_min) & (cy + box_error > y_min)  # (B, G)
        boxes_kept = boxes_kept & (cx - box_error < x_max) & (cy - box_error < y_max)  # (B, G)
        yaw = _limit_period(moved_boxes[..., 6], _YAW_OFFSET, _YAW_PERIOD)  # (B, G)
        moved_boxes = torch.cat([moved_boxes[..., :6], yaw.unsqueeze(-1), moved_boxes[..., 7:]], dim=-1)
    return BevBounds(xyz, point_error, kept, moved_boxes, box_error, boxes_kept)


def _compact_shuffled(pts: torch.Tensor, keep: torch.Tensor, keys: torch.Tensor) -> RaggedBatch:
    """Range filter and shuffle in one sort: kept points in ``argsort(keys[b, :num_kept])`` order, then padding.

    Kept point ``i`` has rank ``r`` among the kept ones (its place after a stable compaction) and sort key
    ``keys[b, r]``; dropped points and padding sort last with key +inf. A stable sort breaks ties by position,
    which follows the rank, as the reference's stable ``argsort`` of the compacted keys does.
    """
    rank = keep.cumsum(dim=-1) - 1  # (B, P): place of each kept point after compaction
    sort_key = torch.gather(keys, 1, rank.clamp(min=0))  # (B, P)
    sort_key = sort_key.masked_fill(~keep, math.inf)  # (B, P)
    order = torch.argsort(sort_key, dim=1, stable=True)  # (B, P)
    out = torch.take_along_dim(pts, order.unsqueeze(-1), dim=1)  # (B, P, C)
    sizes = keep.sum(dim=-1)  # (B,)
    valid = torch.arange(pts.shape[1], device=pts.device) < sizes.unsqueeze(-1)  # (B, P)
    out = out.masked_fill(~valid.unsqueeze(-1), 0)  # (B, P, C): padding 0, as select gives it
    return RaggedBatch(out, sizes, validate=False)  # (B, P, C) ragged


def reference_bev_aug(
    points: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, params: BevAugParams, config: BevAugConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sample, step by step as mmdetection3d (v1.4) computes it; the parameters are given, not drawn.

    Mirrors, in order: ``GlobalRotScaleTrans.transform`` (``_rot_bbox_points`` → ``LiDARInstance3DBoxes.rotate``
    with ``rotation_3d_in_axis(axis=2)`` and ``BasePoints.rotate``; ``_scale_bbox_points`` →
    ``BaseInstance3DBoxes.scale``, ``BasePoints.scale``; ``_trans_bbox_points`` → ``translate``), then
    ``RandomFlip3D.transform`` (horizontal, then vertical: ``LiDARInstance3DBoxes.flip``, ``LiDARPoints.flip``),
    ``PointsRangeFilter`` (``BasePoints.in_range_3d``), ``ObjectRangeFilter`` (``in_range_bev`` then
    ``limit_yaw(offset=0.5, period=2π)``) and ``PointShuffle``; all in
    ``mmdet3d/datasets/transforms/transforms_3d.py`` and ``mmdet3d/structures/``. The one deviation: the random
    values come from ``params`` (the angle, scale, translation, flips, and the shuffle order
    ``argsort(shuffle_keys[:num_kept])`` in place of ``torch.randperm``). Boxes keep their centre ``z`` (see the
    module docstring for why mmdet3d's bottom-centre ops give the same numbers). Box centres are rotated with
    ``@ rot_mat_T`` where ``rotation_3d_in_axis`` uses an einsum of the same products (rounding may differ by
    an ulp).

    Args:
        points: ``(P, C)``, ``x, y, z`` first.
        boxes: ``(M, 9)`` or ``(M, 7)``.
        labels: ``(M,)``.
        params: one sample's parameters, ``BevAugParams.sample(b)`` (``shuffle_keys`` ``(P',)``, ``P' ≥ P``).
        config: the same config as the batched path.

    Returns:
        ``(points (P_kept, C), boxes (M_kept, D), labels (M_kept,))``.
    """
    points, boxes, labels = points.clone(), boxes.clone(), labels.clone()  # (P, C), (M, D), (M,)
    angle = params.angle.to(boxes.dtype)  # ()
    # GlobalRotScaleTrans._rot_bbox_points: rotation_3d_in_axis's transposed matrix about z, used as p @ rot_mat_T
    rot_sin, rot_cos = torch.sin(angle), torch.cos(angle)  # (), ()
    zero, one = torch.zeros_like(rot_cos), torch.ones_like(rot_cos)  # (), ()
    rot_mat_T = torch.stack(
        [torch.stack([rot_cos, rot_sin, zero]), torch.stack([-rot_sin, rot_cos, zero]), torch.stack([zero, zero, one])]
    )  # (3, 3)
    if len(boxes) != 0:  # LiDARInstance3DBoxes.rotate(angle, points)
        boxes[:, 0:3] = boxes[:, 0:3] @ rot_mat_T  # (M, 3)
        boxes[:, 6] += angle  # (M,)
        if boxes.shape[1] == 9:
            boxes[:, 7:9] = boxes[:, 7:9] @ rot_mat_T[:2, :2]  # (M, 2)
    points[:, :3] = points[:, :3] @ rot_mat_T.to(points.dtype)  # (P, 3): BasePoints.rotate
    # GlobalRotScaleTrans._scale_bbox_points: BasePoints.scale, BaseInstance3DBoxes.scale (sizes and velocity)
    scale = params.scale  # ()
    points[:, :3] *= scale.to(points.dtype)  # (P, 3)
    if len(boxes) != 0:
        boxes[:, :6] *= scale.to(boxes.dtype)  # (M, 6)
        boxes[:, 7:] *= scale.to(boxes.dtype)  # (M, D - 7): velocity
    # GlobalRotScaleTrans._trans_bbox_points: BasePoints.translate, BaseInstance3DBoxes.translate
    points[:, :3] += params.translation.to(points.dtype)  # (P, 3)
    boxes[:, :3] += params.translation.to(boxes.dtype)  # (M, 3)
    # RandomFlip3D.transform: horizontal first, then vertical. LiDARInstance3DBoxes.flip negates the columns
    # 1::7 (y, vy) or 0::7 (x, vx) of a 9-column box.
    if bool(params.flip_h):
        boxes[:, 1::7] = -boxes[:, 1::7]  # (M, 2)
        boxes[:, 6] = -boxes[:, 6]  # (M,)
        points[:, 1] = -points[:, 1]  # (P,)
    if bool(params.flip_v):
        boxes[:, 0::7] = -boxes[:, 0::7]  # (M, 2)
        boxes[:, 6] = -boxes[:, 6] + np.pi  # (M,)
        points[:, 0] = -points[:, 0]  # (P,)
    # PointsRangeFilter: BasePoints.in_range_3d (strict)
    if config.point_range is not None:
        r = _f32(config.point_range)
        in_range = (
            (points[:, 0] > r[0])
            & (points[:, 1] > r[1])
            & (points[:, 2] > r[2])
            & (points[:, 0] < r[3])
            & (points[:, 1] < r[4])
            & (points[:, 2] < r[5])
        )  # (P,)
        points = points[in_range]  # (P_kept, C)
    # ObjectRangeFilter: BaseInstance3DBoxes.in_range_bev on bev = (x, y, dx, dy, yaw), then limit_yaw
    if config.object_range is not None:
        r = _f32(config.object_range)
        in_range = (boxes[:, 0] > r[0]) & (boxes[:, 1] > r[1]) & (boxes[:, 0] < r[2]) & (boxes[:, 1] < r[3])  # (M,)
        boxes, labels = boxes[in_range], labels[in_range]  # (M_kept, D), (M_kept,)
        boxes[:, 6] = _limit_period(boxes[:, 6], _YAW_OFFSET, _YAW_PERIOD)  # (M_kept,)
    # PointShuffle: BasePoints.shuffle, with the permutation taken from the keys
    if config.shuffle:
        order = torch.argsort(params.shuffle_keys[: len(points)], stable=True)  # (P_kept,)
        points = points[order]  # (P_kept, C)
    return points, boxes, labels


def _check_points(points: RaggedBatch) -> None:
    if not isinstance(points, RaggedBatch):
        raise TypeError(f"points: expected a RaggedBatch, got {type(points).__name__}")
    if points.num_batch_dims != 1 or points.tensor.dim() != 3 or points.ragged_dim != 1 or points.shape[-1] < 3:
        raise ValueError(f"points: expected a RaggedBatch (B, P, C) with C >= 3, ragged in P; got {points!r}")
    if not points.dtype.is_floating_point:
        raise ValueError(f"points: must be floating point, got {points.dtype}")


def _check_inputs(
    points: RaggedBatch, boxes: RaggedBatch, labels: RaggedBatch, params: BevAugParams, config: BevAugConfig
) -> None:
    """Shape, dtype and device checks from tensor metadata only (no value is read)."""
    _check_points(points)
    num, length = points.batch_shape[0], points.max_size
    if not isinstance(boxes, RaggedBatch) or boxes.tensor.dim() != 3 or boxes.ragged_dim != 1:
        raise ValueError(f"boxes: expected a RaggedBatch (B, G, D) ragged in G, got {boxes!r}")
    if boxes.shape[0] != num or boxes.shape[-1] not in (7, 9) or not boxes.dtype.is_floating_point:
        raise ValueError(f"boxes: expected float ({num}, G, 9) or ({num}, G, 7), got {boxes!r}")
    if not isinstance(labels, RaggedBatch) or tuple(labels.shape) != tuple(boxes.shape[:2]):
        raise ValueError(f"labels: expected a RaggedBatch of shape {tuple(boxes.shape[:2])}, got {labels!r}")
    for name, rb in (("boxes", boxes), ("labels", labels)):
        if rb.device != points.device:
            raise ValueError(f"{name}: is on {rb.device} but points are on {points.device}")
    expected = {"angle": (num,), "scale": (num,), "translation": (num, 3), "flip_h": (num,), "flip_v": (num,)}
    expected["matrix"] = (num, 4, 4)
    if config.shuffle:
        expected["shuffle_keys"] = (num, length)
    for name, shape in expected.items():
        tensor = getattr(params, name)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"params.{name}: expected shape {shape} for these points, got {tuple(tensor.shape)}")
        if tensor.device != points.device:
            raise ValueError(f"params.{name}: is on {tensor.device} but points are on {points.device}")
    if params.flip_h.dtype != torch.bool or params.flip_v.dtype != torch.bool:
        raise ValueError("params.flip_h, params.flip_v: must be bool")
