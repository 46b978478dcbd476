"""The training augmentation: one stage for camera and lidar, drawn per batch, applied where the trainer runs it.

Configured once, as ``data.augment`` (:class:`AugmentConfig`)::

    data:
      augment:
        camera: {image: {...}, bev: {...}, photometric: null, normalize: true}   # CameraAugConfig fields
        lidar: {rot_range: [-0.3925, 0.3925], point_range: [...], object_range: [...]}   # BevAugConfig fields

A section's fields not given come from the model's published recipe (its spec's ``augment``, e.g.
``drivetrain.models.pointpillars.recipe.AUGMENT``; config loading passes it to :meth:`AugmentConfig.from_dict`),
or from the types' defaults (every step off) for a model that publishes none.

Random draws are separate from the deterministic apply (kornia's scheme; docs/design.md):

- :func:`sample_params` draws an :class:`AugmentParams` for a batch (its sizes only) from a CPU ``torch.Generator``
  in a fixed order: **the camera's draws first** (image, its BEV step, photometric: :func:`.camera.draw_params`),
  **then the lidar's** (angle, scale, translation, flips, shuffle keys: :func:`.bev.draw_bev_params`);
- :func:`apply` is pure: the whole batch at once on its device, no host sync; the same parameters replay exactly;
- :func:`reference_apply` does the same per sample on a CPU batch with the originals' code (PIL, NumPy, OpenCV,
  mmdet3d's box and point ops) — what ``data.augment_on=worker`` runs in the loader workers;
- :func:`apply_test_time` is the evaluation transform: the camera's test-time resize/crop/normalisation; the lidar has
  none (points outside the voxel grid are dropped by the voxelization, as mmdetection3d's test pipeline does);
- :class:`Augmentation` is what the trainer holds: each sample's generator is seeded from the run seed, the epoch
  and the sample's place in the epoch's global order, read off the batch's sampler position after it
  (:func:`.camera.augment_seeds`), which the checkpoint holds (:func:`sample_params_each`). So the samples (and
  ranks) draw different parameters, a resumed run draws what the uninterrupted one drew — also on another number
  of ranks or split of the global batch — and the worker, device and DALI paths draw the same parameters for the
  same batch.

What the lidar step does to a batch: points, ``gt_boxes`` and ``gt_labels`` through
:func:`~.bev.apply_bev_aug` (rotation, scale, translation, flips, range filters, shuffle); on a batch that
also carries images, ``lidar2img``, ``ego_pose``, ``ego_pose_inv`` and ``lidar2ego`` through the inverse of its
matrix, so every pixel still shows the same world point. With both sections the lidar step is the BEV step of both:
``camera.bev`` must be null (one BEV transform, not two) and ``lidar.object_range`` null (a dropped 3D box would
orphan its 2D boxes). Models receive the augmented batch and read their ground truth from it; none draws random
numbers for augmentation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

import torch

from drivetrain.batch import Batch
from drivetrain.pipeline.augment.bev import (
    BevAugConfig,
    BevAugParams,
    apply_bev_aug,
    bev_config_from_dict,
    draw_bev_params,
    reference_bev_aug,
)
from drivetrain.pipeline.augment.camera import (
    CameraAugConfig,
    CameraAugParams,
    augment_seeds,
    camera_bev_from_dict,
    cat_params,
)
from drivetrain.pipeline.augment.camera import apply as camera_apply
from drivetrain.pipeline.augment.camera import reference_apply as camera_reference_apply
from drivetrain.pipeline.augment.camera import sample_params as camera_sample_params
from drivetrain.pipeline.augment.camera import sample_params_each as camera_sample_params_each
from drivetrain.pipeline.augment.image_ops import bev_aug_cameras
from drivetrain.pipeline.transfer import PackedCopier
from drivetrain.ragged import RaggedBatch

__all__ = [
    "AugmentConfig",
    "AugmentParams",
    "Augmentation",
    "apply",
    "apply_test_time",
    "augment_seeds",
    "reference_apply",
    "sample_params",
    "sample_params_each",
]

_SECTIONS = ("camera", "lidar")


@dataclass(frozen=True)
class AugmentConfig:
    """``data.augment``: the training augmentation of every model (None: that modality is not augmented).

    Attributes:
        camera: the camera recipe (:class:`~.camera.CameraAugConfig`: images, 2D boxes, camera matrices and,
            with its ``bev`` step, boxes and points).
        lidar: the lidar recipe (:class:`~.bev.BevAugConfig`: points and boxes).
    """

    camera: CameraAugConfig | None = None
    lidar: BevAugConfig | None = None

    def __post_init__(self) -> None:
        if self.camera is not None and self.lidar is not None:
            _check_both(self.camera.bev, self.lidar)

    @property
    def active(self) -> bool:
        """Whether any modality is augmented."""
        return self.camera is not None or self.lidar is not None

    @classmethod
    def from_dict(cls, values: dict[str, Any], base: AugmentConfig | None = None) -> AugmentConfig:
        """From the YAML mapping ``data.augment`` (``camera`` and ``lidar`` sections; null or absent: off).

        Args:
            values: the mapping.
            base: the model's published recipe (its spec's ``augment``): a section given fills the fields it does
                not set from the base's section (:meth:`.camera.CameraAugConfig.from_dict`,
                :func:`.bev.bev_config_from_dict`); None, or a section the base lacks: from the types' defaults.
                The base never turns a section on: what ``values`` leaves out or sets null stays off.

        Raises:
            ValueError: naming the field (``data.augment.lidar.rot_range: ...``); a camera field at the top level
                (the spelling before the sections) says where it lives now.
        """
        if not isinstance(values, dict):
            raise ValueError(f"data.augment: expected a mapping with camera and lidar sections, got {values!r}")
        for name in values:
            if name not in _SECTIONS:
                raise ValueError(f"data.augment.{name}: {moved_augment_key(str(name))}")
        camera = values.get("camera")
        lidar = values.get("lidar")
        below = base if base is not None else cls()
        camera_bev = camera_bev_from_dict(camera, below.camera) if camera is not None else None  # its keys first
        lidar_config = None
        if lidar is not None:
            lidar_config = bev_config_from_dict(lidar, "data.augment.lidar", base=below.lidar)
            if camera is not None:
                _check_both(camera_bev, lidar_config)  # ahead of the camera's other fields
        return cls(CameraAugConfig.from_dict(camera, below.camera) if camera is not None else None, lidar_config)


def _check_both(camera_bev: BevAugConfig | None, lidar: BevAugConfig) -> None:
    """With both sections, the lidar step is the BEV step of both."""
    if camera_bev is not None:
        raise ValueError(
            "data.augment.camera.bev: must be null with data.augment.lidar (the lidar step is the BEV step "
            "of both: it moves the points, the boxes and the camera matrices)"
        )
    if lidar.object_range is not None:
        raise ValueError(
            "data.augment.lidar.object_range: must be null with data.augment.camera (a dropped 3D box "
            "orphans its 2D boxes)"
        )


def moved_augment_key(name: str) -> str:
    """The message for a key of ``data.augment`` that is not a section: where a camera field lives now."""
    if name in {f.name for f in fields(CameraAugConfig)}:
        return (
            f"the camera augmentation moved to data.augment.camera (data.augment: {{camera: {{{name}: ...}}, "
            "lidar: {...}}); move the section's fields there"
        )
    return f"unknown key; known keys: {', '.join(_SECTIONS)}"


@dataclass(frozen=True)
class AugmentParams:
    """One batch's draws (CPU tensors); pass them to :func:`apply` or :func:`reference_apply` to replay.

    Attributes:
        camera: the camera's (None: no camera section).
        lidar: the lidar's per sample (None: no lidar section, or test time).
    """

    camera: CameraAugParams | None
    lidar: BevAugParams | None


def sample_params(
    batch: Batch, config: AugmentConfig, generator: torch.Generator | None = None, *, training: bool = True
) -> AugmentParams:
    """Draw the augmentation of ``batch`` (its sizes only) from a CPU ``generator``: the camera's draws, then the
    lidar's (see the module docstring); ``training=False`` gives the test-time parameters and draws nothing.

    Args:
        batch: a collated :class:`~drivetrain.batch.Batch` (uint8 images for the camera; points for the lidar).
        config: the recipe.
        generator: a CPU ``torch.Generator`` (needed for training draws).
        training: training draws or test-time parameters.

    Returns:
        AugmentParams on the CPU; ``lidar`` holds ``shuffle_keys`` ``(B, P)`` for the batch's padded ``P``.
    """
    camera = None
    if config.camera is not None:
        camera = camera_sample_params(batch, config.camera, generator, training=training)
    lidar = None
    if config.lidar is not None and training:
        points = _points(batch)
        if generator is None:
            raise ValueError("generator: training draws need a torch.Generator")
        lidar = draw_bev_params(points.batch_shape[0], points.max_size, config.lidar, generator)
    return AugmentParams(camera, lidar)


def sample_params_each(batch: Batch, config: AugmentConfig, generators: list[torch.Generator]) -> AugmentParams:
    """:func:`sample_params`' training draws with sample ``b``'s from ``generators[b]`` alone (the camera's, then the
    lidar's, each as a batch of one; :func:`.camera.sample_params_each`), concatenated: a sample's parameters do not
    depend on its batch-mates, so it is augmented the same in any batch of any split of the global batch.

    Args:
        batch: a collated Batch (as :func:`sample_params`').
        config: the recipe.
        generators: one CPU ``torch.Generator`` per sample, in batch order.

    Returns:
        AugmentParams on the CPU (``lidar.shuffle_keys`` ``(B, P)`` for the batch's padded ``P``).
    """
    camera = camera_sample_params_each(batch, config.camera, generators) if config.camera is not None else None
    lidar = None
    if config.lidar is not None:
        points = _points(batch)
        if len(generators) != points.batch_shape[0]:
            raise ValueError(f"generators: {len(generators)} for a batch of {points.batch_shape[0]}")
        lidar = cat_params([draw_bev_params(1, points.max_size, config.lidar, g) for g in generators])
    return AugmentParams(camera, lidar)


def apply(batch: Batch, params: AugmentParams, config: AugmentConfig) -> Batch:
    """``batch`` augmented on its device, every sample at once (no host sync): the camera step, then the lidar one.

    Args:
        batch: a collated Batch on any device: uint8 images ``(B, N, 3, H, W)`` for the camera step; points
            RaggedBatch ``(B, P, C)``, ``gt_boxes`` ``(B, G, 9)``, ``gt_labels`` ``(B, G)`` for the lidar step.
        params: from :func:`sample_params` (CPU tensors; copied to the batch's device).
        config: the recipe the parameters were drawn for.

    Returns:
        A new Batch: the camera step's images, matrices and 2D annotations (:func:`.camera.apply`); the lidar
        step's points ``(B, P, C)`` (padded length kept, new sizes on the device), ``gt_boxes`` ``(B, G, D)`` and
        ``gt_labels`` ``(B, G)``, and with images the lidar-frame camera matrices.
    """
    if params.camera is not None and config.camera is not None:
        batch = camera_apply(batch, params.camera, config.camera)
    if params.lidar is not None and config.lidar is not None:
        points = _points(batch)
        lidar = _to(params.lidar, points.device)
        moved, boxes, labels = apply_bev_aug(points, batch.gt_boxes, batch.gt_labels, lidar, config.lidar)
        batch = dataclasses.replace(batch, points=moved, gt_boxes=boxes, gt_labels=labels, **_cameras(batch, lidar))
    return batch


def reference_apply(batch: Batch, params: AugmentParams, config: AugmentConfig) -> Batch:
    """The same augmentation per sample with the originals' code, on a CPU batch (the worker path): the camera's
    :func:`.camera.reference_apply`, then mmdet3d's lidar transforms sample by sample
    (:func:`~.bev.reference_bev_aug`); ragged outputs are padded to their longest sample.

    Args:
        batch: a collated CPU Batch (as :func:`apply`'s).
        params: from :func:`sample_params`.
        config: the recipe the parameters were drawn for.

    Returns:
        The augmented Batch (as :func:`apply`'s, within float32 rounding of the reference's op order).
    """
    if params.camera is not None and config.camera is not None:
        batch = camera_reference_apply(batch, params.camera, config.camera)
    if params.lidar is not None and config.lidar is not None:
        points = _points(batch)
        per_sample = zip(points.to_list(), batch.gt_boxes.to_list(), batch.gt_labels.to_list(), strict=True)
        outs = [
            reference_bev_aug(p, b, lab, params.lidar.sample(i), config.lidar)
            for i, (p, b, lab) in enumerate(per_sample)
        ]
        moved, boxes, labels = (RaggedBatch.from_list([out[k] for out in outs]) for k in range(3))
        batch = dataclasses.replace(
            batch, points=moved, gt_boxes=boxes, gt_labels=labels, **_cameras(batch, params.lidar)
        )
    return batch


def apply_test_time(batch: Batch, config: AugmentConfig) -> Batch:
    """The evaluation transform: the camera's test-time resize, crop and normalisation; nothing random, and
    nothing for the lidar.

    Args:
        batch: a collated Batch on any device.
        config: the training recipe.

    Returns:
        The Batch the model is evaluated on.
    """
    return apply(batch, sample_params(batch, config, training=False), config)


class Augmentation:
    """The trainer's augmentation stage: ``augment(batch, position)`` on the batch's device (``on="device"``, in
    the prefetcher) or per sample on the CPU (``on="worker"``, in the loader workers), each batch's generator
    each sample's generator seeded by :func:`~.camera.augment_seeds` (run seed, epoch, the sample's place in the
    epoch's global order, from the sampler position after the batch);
    :meth:`test_time` for evaluation.

    Args:
        config: the recipe.
        seed, rank: the run seed and this process's rank.
        on: ``"device"`` or ``"worker"``.
    """

    def __init__(self, config: AugmentConfig, *, seed: int = 0, rank: int = 0, on: str = "device") -> None:
        if on not in ("device", "worker"):
            raise ValueError(f"data.augment_on: expected 'device' or 'worker', got {on!r}")
        self.config, self.seed, self.rank, self.on = config, seed, rank, on

    def params(self, batch: Batch, position: dict[str, Any]) -> AugmentParams:
        """The draws of the batch taken at sampler ``position`` (the position after it): each sample's from its own
        generator, seeded by :func:`~.camera.augment_seeds` (its place in the epoch's global order)."""
        seeds = augment_seeds(self.seed, self.rank, position, batch.batch_size)
        return sample_params_each(batch, self.config, [torch.Generator().manual_seed(s) for s in seeds])

    def __call__(self, batch: Batch, position: dict[str, Any]) -> Batch:
        """The augmented batch (see the class docstring)."""
        params = self.params(batch, position)
        if self.on == "worker":
            return reference_apply(batch, params, self.config)
        return apply(batch, params, self.config)

    def test_time(self, batch: Batch) -> Batch:
        """The evaluation transform (:func:`apply_test_time`)."""
        return apply_test_time(batch, self.config)


def _points(batch: Batch) -> RaggedBatch:
    if batch.points is None:
        raise ValueError(
            "batch.points: data.augment.lidar moves lidar points, but the batch has none (load them: "
            "data.args.load_points: true)"
        )
    return batch.points


def _to(params: BevAugParams, device: torch.device) -> BevAugParams:
    """The parameters on ``device``, copied as the loader's batches are (:class:`~drivetrain.pipeline.transfer.
    PackedCopier`, on the current stream, no sync): the points' shuffle keys (``B × P`` floats, ~5 MB at nuScenes'
    size) pinned first, so that CUDA need not stage a large pageable copy through the host while the stream is busy;
    the small ones as they are. On the CPU nothing is copied."""
    return PackedCopier(device).to_device(params).get()


def _cameras(batch: Batch, params: BevAugParams) -> dict[str, torch.Tensor]:
    """With images, the lidar-frame camera matrices after the lidar step's matrix ``M``: ``lidar2img · M⁻¹``,
    ``ego_pose · M⁻¹``, ``M · ego_pose_inv``, ``lidar2ego · M⁻¹`` (float64 products, the inputs' dtypes)."""
    if batch.images is None:  # a lidar batch: no camera reads these
        return {}
    lidar2img, ego_pose, ego_pose_inv = bev_aug_cameras(
        batch.lidar2img, batch.ego_pose, batch.ego_pose_inv, params.matrix
    )
    m = params.matrix.to(batch.lidar2ego.device, torch.float64)  # (B, 4, 4)
    m_inv = torch.linalg.inv_ex(m).inverse  # (B, 4, 4): scale > 0, always invertible (no error check, no sync)
    lidar2ego = (batch.lidar2ego.double() @ m_inv).to(batch.lidar2ego.dtype)  # (B, 4, 4)
    return {"lidar2img": lidar2img, "ego_pose": ego_pose, "ego_pose_inv": ego_pose_inv, "lidar2ego": lidar2ego}
