"""The camera part of the training augmentation (``data.augment.camera``), for a whole :class:`~drivetrain.batch.Batch`
at once on whatever device it is on — and the same augmentation per sample on the CPU, as the original pipelines
run it in the loader workers (the reference; ``data.augment_on=worker``).

StreamPETR's train pipeline, in its order (``projects/configs/StreamPETR/*.py``): ``ResizeCropFlipRotImage``
(image resize/crop/flip, intrinsics and ``lidar2img``, 2D boxes, centres and depths, the invisible-box filter),
``GlobalRotScaleTransImage`` with ``reverse_angle=True`` (boxes, ``lidar2img``, ego pose; rotation ±0.3925 rad,
scale 0.95–1.05, no translation), ``NormalizeMultiviewImage``; optionally PETR's
``PhotoMetricDistortionMultiViewImage`` (see :mod:`.photometric`; off in StreamPETR's recipe). The pieces live in
:mod:`.image_ops`, :mod:`.bev` (shared with the lidar path) and :mod:`.photometric`; this module draws
their parameters together and applies them to a batch:

- :func:`sample_params` draws a :class:`CameraAugParams` for a batch from a CPU ``torch.Generator`` (a few
  numbers per sample and camera); :func:`apply` is deterministic, so the same parameters replay exactly;
- :func:`reference_apply` does the same per sample and camera with the originals' code (PIL, NumPy, OpenCV,
  mmdet3d's box ops), on a CPU batch;
- :func:`augment_seeds` seeds each sample's generator from the run seed, the epoch and the sample's place in the
  epoch's global order, read off the batch's sampler position, which the checkpoint holds; the trainer's stage
  (:class:`~.stage.Augmentation`, camera and lidar alike) draws each sample's parameters from its own generator —
  so a resumed run draws what the uninterrupted one drew, also on another number of ranks, and the worker, device
  and DALI paths draw the *same* parameters for the same batch (switching ``augment_on`` changes where the work
  runs, not what the model sees).

The BEV step moves what the lidar frame carries: boxes (centres, sizes, yaw, velocities) and points through
:func:`~.bev.apply_bev_aug`, and ``lidar2img``, ``ego_pose``, ``ego_pose_inv`` and ``lidar2ego`` through
its matrix (:func:`~.image_ops.bev_aug_cameras`); 2D depths stay as loaded, as in the original. Evaluation uses
the test-time parameters (scale ``max(fH/H, fW/W)``, centred bottom crop, no flip, no BEV step):
``sample_params(..., training=False)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
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
from drivetrain.pipeline.augment.image_ops import (
    ImageAugConfig,
    ImageAugParams,
    bev_aug_cameras,
    filter_invisible,
    ida_matrix,
    reference_filter_invisible,
    reference_img_transform,
    reference_transform_boxes_2d,
    resize_crop_flip,
    sample_image_params,
    transform_boxes_2d,
    update_cameras,
)
from drivetrain.pipeline.augment.photometric import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    PhotometricConfig,
    PhotometricParams,
    normalize,
    photometric_distort,
    reference_normalize,
    reference_photometric,
    sample_photometric_params,
)
from drivetrain.ragged import RaggedBatch
from drivetrain.seeding import mix_seed

__all__ = [
    "CameraAugConfig",
    "CameraAugParams",
    "apply",
    "augment_seeds",
    "camera_bev_from_dict",
    "cat_params",
    "draw_params",
    "reference_apply",
    "reference_geometry",
    "sample_params",
    "sample_params_each",
]

_DEFAULT_BEV = BevAugConfig()  # the camera section's BEV step when neither it nor the model's recipe sets one
_SALT = 0xCA3  # keeps the augmentation seeds apart from the loader's (seed, rank, epoch, step) seeds
_GLOBAL_SALT = 0xCA4  # seeds by a sample's place in the epoch's global order (augment_seeds)


@dataclass(frozen=True)
class CameraAugConfig:
    """``data.augment.camera``: the camera augmentation. A model's published recipe is an instance of this in its
    folder (e.g. ``drivetrain.models.streampetr.recipe.CAMERA_AUG``, StreamPETR's nuScenes 704×256 recipe), which
    :meth:`from_dict` takes as the base a config's fields override.

    Attributes:
        image: ``ida_aug_conf`` (:class:`~.image_ops.ImageAugConfig`).
        bev: the BEV step (None: off; default: a step whose draws are all neutral, which a recipe gives its ranges).
            Flips and an object range filter are refused: the original's ``GlobalRotScaleTransImage`` has neither,
            and dropping 3D boxes would orphan their 2D boxes.
        photometric: PETR's photometric distortion (None: off).
        normalize: normalise with ``mean``/``std`` (RGB, 0–255); the model then uses the images as they are.
        filter_invisible: drop 2D boxes hidden behind nearer ones (training only).
    """

    image: ImageAugConfig
    bev: BevAugConfig | None = field(default_factory=BevAugConfig)
    photometric: PhotometricConfig | None = None
    normalize: bool = True
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    filter_invisible: bool = True

    def __post_init__(self) -> None:
        _check_bev(self.bev)
        for name in ("mean", "std"):
            value = tuple(float(v) for v in getattr(self, name))
            if len(value) != 3 or (name == "std" and min(value) <= 0):
                raise ValueError(f"data.augment.camera.{name}: expected 3 numbers (std > 0), got {getattr(self, name)}")
            object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls, values: dict[str, Any], base: CameraAugConfig | None = None) -> CameraAugConfig:
        """From the YAML mapping ``data.augment.camera`` (nested ``image``, ``bev``, ``photometric`` mappings), each
        given field replacing ``base``'s (the model's recipe): ``image`` and ``bev`` field by field (a ``bev``
        mapping over the base's step, or over the identity when the base has none); ``photometric: {}`` turns on
        PETR's defaults. Without a base every field not given is the type's default (``image.source_size`` and
        ``image.final_size`` must then be given)."""
        bev = camera_bev_from_dict(values, base)  # first: the section's keys, then its BEV step
        args = {f.name: getattr(base, f.name) for f in fields(cls)} if base is not None else {}
        args.update(values)
        args["bev"] = bev
        if values.get("image") is not None:
            try:
                image = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(values["image"]).items()}
                args["image"] = replace(base.image, **image) if base is not None else ImageAugConfig(**image)
            except (TypeError, ValueError) as err:
                raise ValueError(f"data.augment.camera.image: {err}") from None
        elif "image" not in args:
            raise ValueError("data.augment.camera.image: required (source_size and final_size at least)")
        if values.get("photometric") is not None:
            try:
                args["photometric"] = PhotometricConfig(**dict(values["photometric"]))
            except (TypeError, ValueError) as err:
                raise ValueError(f"data.augment.camera.photometric: {err}") from None
        return cls(**args)


def camera_bev_from_dict(values: dict[str, Any], base: CameraAugConfig | None = None) -> BevAugConfig | None:
    """The BEV step of the camera section ``values`` (a mapping over ``base``'s step, or over the default step),
    checked as :class:`CameraAugConfig` checks it — after the section's keys, ahead of its other fields, so that a
    config learns first what no camera recipe can hold."""
    if not isinstance(values, dict):
        raise ValueError(f"data.augment.camera: expected a mapping, got {type(values).__name__}")
    known = {f.name for f in fields(CameraAugConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"data.augment.camera: unknown field(s) {unknown}; known: {sorted(known)}")
    below = base.bev if base is not None else _DEFAULT_BEV
    if "bev" not in values:
        bev = below
    elif values["bev"] is None:
        bev = None
    else:
        bev = bev_config_from_dict(values["bev"], "data.augment.camera.bev", base=below or _DEFAULT_BEV)
    _check_bev(bev)
    return bev


def _check_bev(bev: BevAugConfig | None) -> None:
    if bev is None:
        return
    if bev.flip_horizontal or bev.flip_vertical:
        raise ValueError("data.augment.camera.bev: the camera recipe has no BEV flips (set both probabilities to 0)")
    if bev.object_range is not None:
        raise ValueError("data.augment.camera.bev.object_range: must be null (a dropped 3D box orphans its 2D boxes)")


@dataclass(frozen=True)
class CameraAugParams:
    """One batch's draws (CPU tensors); pass them to :func:`apply` or :func:`reference_apply` to replay.

    Attributes:
        image: per sample resize, crop, flip, rotation.
        bev: per sample BEV rotation/scale (None: no BEV step, e.g. at test time).
        photometric: per camera image distortion (None: off).
        training: training draws (the invisible-box filter runs) or test-time parameters.
    """

    image: ImageAugParams
    bev: BevAugParams | None
    photometric: PhotometricParams | None
    training: bool = True

    def select(self, b: int) -> CameraAugParams:
        """Sample ``b``'s draws as the parameters of a batch of one."""

        def one(params: Any) -> Any:
            if params is None:
                return None
            return type(params)(*(getattr(params, f.name)[b : b + 1] for f in fields(params)))

        return CameraAugParams(one(self.image), one(self.bev), one(self.photometric), self.training)


def augment_seeds(seed: int, rank: int, position: dict[str, Any], batch_size: int) -> list[int]:
    """The seeds of a batch's samples' augmentation: the run seed, the epoch and each sample's place in the epoch's
    global order, read off the sampler position after the batch — so a sample draws the same on any number of ranks
    and with any split of the global batch (elastic resume, :mod:`drivetrain.engine.resume`).

    The place of sample ``j`` of rank ``r``'s batch: for the engine's ``ShuffledBatches`` (a position with
    ``sample``, the rows all ranks consumed, ``batch_size`` and ``world_size``) its row of the epoch's permutation,
    ``sample − B·R + j·R + r``; for a ``SequenceSampler`` (a position with ``streams``) its frame of the epoch's walk,
    ``(step − 1)·streams + r·B + j``. A sampler whose position says neither gets seeds from the rank, the epoch, the
    batch's ``step`` and ``j`` (per rank: the same on a resume on the same ranks only).

    Args:
        seed: the run seed.
        rank: this process's rank.
        position: the sampler state after the batch (ints ``epoch``, ``step`` and the keys above).
        batch_size: the batch's samples (the first ``batch_size`` places, when a batch dropped unreadable ones).

    Returns:
        One seed per sample, in batch order.
    """
    epoch = int(position["epoch"])
    if "sample" in position:
        per_rank, ranks = int(position["batch_size"]), int(position["world_size"])
        first = int(position["sample"]) - per_rank * ranks + rank
        places = [first + j * ranks for j in range(batch_size)]
    elif "streams" in position:
        first = (int(position["step"]) - 1) * int(position["streams"]) + rank * int(position["batch_size"])
        places = [first + j for j in range(batch_size)]
    else:
        return [mix_seed(_SALT, seed, rank, epoch, int(position["step"]), j) for j in range(batch_size)]
    return [mix_seed(_GLOBAL_SALT, seed, epoch, place) for place in places]


def cat_params(parts: list[Any]) -> Any:
    """Parameters of batches (a dataclass of per-sample tensors, nested dataclasses, None and flags) joined into one
    batch's: tensors concatenated along their first (sample) dim, the rest taken from the first part."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if dataclasses.is_dataclass(first):
        return type(first)(*(cat_params([getattr(p, f.name) for p in parts]) for f in fields(first)))
    return first


def sample_params(
    batch: Batch, config: CameraAugConfig, generator: torch.Generator | None = None, *, training: bool = True
) -> CameraAugParams:
    """Draw the augmentation of ``batch`` (its sizes only) from a CPU ``generator`` (fixed order: image, BEV,
    photometric); ``training=False`` gives the test-time parameters and draws nothing."""
    _check_batch(batch, config)
    num, cameras = batch.images.shape[:2]
    length = batch.points.max_size if batch.points is not None else 0
    return draw_params(num, cameras, config, generator, training=training, points=length)


def sample_params_each(batch: Batch, config: CameraAugConfig, generators: list[torch.Generator]) -> CameraAugParams:
    """:func:`sample_params` with sample ``b``'s training draws from ``generators[b]`` alone (each drawn as a batch
    of one), so a sample's parameters do not depend on its batch-mates — its BEV shuffle keys' first ``n`` values
    neither (a CPU generator's ``rand`` of ``P ≥ n`` values starts with those of ``n``)."""
    _check_batch(batch, config)
    if len(generators) != batch.images.shape[0]:
        raise ValueError(f"generators: {len(generators)} for a batch of {batch.images.shape[0]}")
    cameras = batch.images.shape[1]
    length = batch.points.max_size if batch.points is not None else 0
    return cat_params([draw_params(1, cameras, config, g, points=length) for g in generators])


def draw_params(
    batch_size: int,
    cameras: int,
    config: CameraAugConfig,
    generator: torch.Generator | None = None,
    *,
    training: bool = True,
    points: int = 0,
) -> CameraAugParams:
    """:func:`sample_params` from the sizes alone: ``batch_size`` samples, ``cameras`` per sample, ``points`` the
    padded point count (the BEV step's shuffle keys; 0 without points) — for loaders that see one sample."""
    image = sample_image_params(batch_size, config.image, generator, training=training)
    if not training:
        return CameraAugParams(image, None, None, training=False)
    bev = None
    if config.bev is not None:
        if generator is None:
            raise ValueError("generator: training draws need a torch.Generator")
        bev = draw_bev_params(batch_size, points, config.bev, generator)
    photometric = None
    if config.photometric is not None:
        photometric = sample_photometric_params(batch_size, cameras, config.photometric, generator)
    return CameraAugParams(image, bev, photometric)


def apply(batch: Batch, params: CameraAugParams, config: CameraAugConfig) -> Batch:
    """``batch`` augmented on its device, every sample and camera at once (no host sync).

    Returns:
        A new Batch: images float32 ``(B, N, 3, fH, fW)`` (normalised when ``config.normalize``), camera
        matrices, 2D annotations (ragged, padded lengths kept), and after the BEV step boxes, points and the
        lidar-frame matrices; ``image_size`` is ``final_size``.
    """
    _check_batch(batch, config)
    device = batch.images.device
    final = config.image.final_size
    images = resize_crop_flip(batch.images, params.image, final)  # (B, N, 3, fH, fW)
    if params.photometric is not None:
        images = photometric_distort(images, params.photometric.to(device))
    if config.normalize:
        images = normalize(images, config.mean, config.std)
    ida = ida_matrix(params.image, final).to(device, non_blocking=True)  # (B, 3, 3) float64
    intrinsics, lidar2img = update_cameras(batch.intrinsics, batch.lidar2img, ida)
    others = {"gt_labels_2d": batch.gt_labels_2d, "gt_index_2d": batch.gt_index_2d, "depths_2d": batch.depths_2d}
    boxes_2d, centers_2d, others = transform_boxes_2d(batch.gt_boxes_2d, batch.centers_2d, others, ida, final)
    if config.filter_invisible and params.training:
        depths = others.pop("depths_2d")
        boxes_2d, centers_2d, depths, others = filter_invisible(boxes_2d, centers_2d, depths, others, final)
        others["depths_2d"] = depths
    changes: dict[str, Any] = {
        "images": images, "intrinsics": intrinsics, "lidar2img": lidar2img, "gt_boxes_2d": boxes_2d,
        "centers_2d": centers_2d, **others, "image_size": tuple(final), "images_normalized": config.normalize,
    }  # fmt: skip
    if params.bev is not None and config.bev is not None:
        bev = BevAugParams(*(getattr(params.bev, f.name).to(device, non_blocking=True) for f in fields(params.bev)))
        points = batch.points
        if points is None:
            points = RaggedBatch.from_dense(torch.zeros(batch.batch_size, 0, 3, device=device))
        points, boxes, labels = apply_bev_aug(points, batch.gt_boxes, batch.gt_labels, bev, config.bev)
        lidar2img, ego_pose, ego_pose_inv = bev_aug_cameras(lidar2img, batch.ego_pose, batch.ego_pose_inv, bev.matrix)
        m_inv = torch.linalg.inv_ex(bev.matrix.double()).inverse  # (B, 4, 4); inv_ex: no host-read check
        lidar2ego = (batch.lidar2ego.double() @ m_inv).to(batch.lidar2ego.dtype)
        changes.update(
            lidar2img=lidar2img, ego_pose=ego_pose, ego_pose_inv=ego_pose_inv, lidar2ego=lidar2ego,
            gt_boxes=boxes, gt_labels=labels, points=points if batch.points is not None else None,
        )  # fmt: skip
    return dataclasses.replace(batch, **changes)


def reference_apply(batch: Batch, params: CameraAugParams, config: CameraAugConfig) -> Batch:
    """The same augmentation per sample and camera with the originals' code, on a CPU batch (the worker path).

    Per camera: ``_img_transform`` with PIL (:func:`~.image_ops.reference_img_transform`), the photometric
    distortion with OpenCV, ``imnormalize``; the rest is :func:`reference_geometry`.
    """
    _check_batch(batch, config)
    if bool((params.image.rotate != 0).any()):
        raise ValueError(
            "data.augment.camera.image.rot_lim: the original pipeline supports no rotation (asserts (0, 0))"
        )
    final = config.image.final_size
    num, cameras = batch.images.shape[:2]
    images = np.zeros((num, cameras, 3, final[1], final[0]), dtype=np.float32)
    for b in range(num):
        resize, crop = float(params.image.scale[b]), tuple(params.image.crop[b].tolist())
        flip = bool(params.image.flip[b])
        for n in range(cameras):
            img = reference_img_transform(batch.images[b, n].permute(1, 2, 0).numpy(), resize, crop, flip, final)
            if params.photometric is not None:
                img = reference_photometric(img, params.photometric.image(b, n))
            if config.normalize:
                img = reference_normalize(img, config.mean, config.std)
            images[b, n] = img.transpose(2, 0, 1)
    out = reference_geometry(batch, params, config)
    return dataclasses.replace(out, images=torch.from_numpy(images), images_normalized=config.normalize)


def reference_geometry(batch: Batch, params: CameraAugParams, config: CameraAugConfig) -> Batch:
    """Everything of :func:`reference_apply` but the pixels (``batch.images`` is not read and may be None).

    Per camera ``_bboxes_transform`` and ``_filter_invisible`` in NumPy; per sample the intrinsics and
    ``lidar2img`` through the float32 ``ida_mat`` as ``ResizeCropFlipRotImage.__call__`` does,
    ``GlobalRotScaleTransImage`` (``_rotate_bev_along_z``, ``_scale_xyz``, ``_trans_xyz`` on the matrices with
    ``reverse_angle=True``) and mmdet3d's box ops (:func:`~.bev.reference_bev_aug`).
    """
    if tuple(batch.image_size) != tuple(config.image.source_size):
        raise ValueError(
            f"data.augment.camera.image.source_size: is {tuple(config.image.source_size)}, but the images are "
            f"{batch.image_size[0]}×{batch.image_size[1]}"
        )
    final = config.image.final_size
    num, cameras = batch.intrinsics.shape[:2]
    intrinsics, lidar2img = batch.intrinsics.clone(), batch.lidar2img.clone()
    annotations: dict[str, list[list[torch.Tensor]]] = {
        k: [] for k in ("boxes", "centers", "labels", "index", "depths")
    }
    source = {
        "boxes": batch.gt_boxes_2d.to_list(), "centers": batch.centers_2d.to_list(),
        "labels": batch.gt_labels_2d.to_list(), "index": batch.gt_index_2d.to_list(),
        "depths": batch.depths_2d.to_list(),
    }  # fmt: skip
    for b in range(num):
        resize, crop = float(params.image.scale[b]), tuple(params.image.crop[b].tolist())
        flip = bool(params.image.flip[b])
        ida_mat = ida_matrix(params.select(b).image, final)[0].float()  # the original builds it in float32
        ida4 = torch.eye(4)
        ida4[:3, :3] = ida_mat
        for key in annotations:
            annotations[key].append([])
        for n in range(cameras):
            intrinsics[b, n] = (ida_mat @ batch.intrinsics[b, n].float()).to(intrinsics.dtype)
            lidar2img[b, n] = (ida4 @ batch.lidar2img[b, n].float()).to(lidar2img.dtype)
            box, centre = source["boxes"][b][n].numpy().copy(), source["centers"][b][n].numpy().copy()
            extra = {k: source[k][b][n].numpy().copy() for k in ("labels", "index", "depths")}
            if len(box) != 0:
                box, centre, extra = reference_transform_boxes_2d(box, centre, extra, resize, crop, flip, final)
            if len(box) != 0 and config.filter_invisible and params.training:
                depths = extra.pop("depths")
                box, centre, depths, extra = reference_filter_invisible(box, centre, depths, extra, final)
                extra["depths"] = depths
            for key, value in (("boxes", box), ("centers", centre), *extra.items()):
                annotations[key][b].append(torch.from_numpy(np.ascontiguousarray(value)))
    changes: dict[str, Any] = {
        "intrinsics": intrinsics, "lidar2img": lidar2img,
        "gt_boxes_2d": RaggedBatch.from_list(annotations["boxes"]),
        "centers_2d": RaggedBatch.from_list(annotations["centers"]),
        "gt_labels_2d": RaggedBatch.from_list(annotations["labels"]),
        "gt_index_2d": RaggedBatch.from_list(annotations["index"]),
        "depths_2d": RaggedBatch.from_list(annotations["depths"]),
        "image_size": tuple(final),
    }  # fmt: skip
    if params.bev is not None and config.bev is not None:
        changes.update(_reference_bev(batch, params.bev, config.bev, changes["lidar2img"]))
    return dataclasses.replace(batch, **changes)


def _reference_bev(batch: Batch, params: BevAugParams, config: BevAugConfig, lidar2img: torch.Tensor) -> dict[str, Any]:
    """``GlobalRotScaleTransImage.__call__`` (``reverse_angle=True``) per sample on the matrices, in float32 torch
    as the original, and mmdet3d's box (and point) ops for the boxes. The original draws ``rot_angle`` and
    rotates the boxes by ``−rot_angle``; our ``angle`` is the boxes' rotation, so ``rot_angle = −angle``."""
    lidar2img = lidar2img.clone()
    ego_pose, ego_pose_inv, lidar2ego = batch.ego_pose.clone(), batch.ego_pose_inv.clone(), batch.lidar2ego.clone()
    points_out, boxes_out, labels_out = [], [], []
    point_list = batch.points.to_list() if batch.points is not None else [torch.zeros(0, 3)] * batch.batch_size
    for b, (points, boxes, labels) in enumerate(
        zip(point_list, batch.gt_boxes.to_list(), batch.gt_labels.to_list(), strict=True)
    ):
        one = params.sample(b)
        rot_angle = -float(one.angle)
        rot_cos, rot_sin = np.cos(rot_angle), np.sin(rot_angle)
        rot_mat = torch.tensor(
            [[rot_cos, rot_sin, 0, 0], [-rot_sin, rot_cos, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.float32
        )  # the original's torch.tensor of 0-dim tensors: the default dtype
        s = float(one.scale)
        scale_mat = torch.tensor([[s, 0, 0, 0], [0, s, 0, 0], [0, 0, s, 0], [0, 0, 0, 1]], dtype=torch.float32)
        trans_mat = torch.eye(4)
        trans_mat[:3, -1] = one.translation.float()
        for mat in (rot_mat, scale_mat, trans_mat):  # _rotate_bev_along_z, _scale_xyz, _trans_xyz in turn
            mat_inv = torch.inverse(mat)
            ego_pose[b] = ego_pose[b].float() @ mat_inv
            ego_pose_inv[b] = mat @ ego_pose_inv[b].float()
            lidar2ego[b] = lidar2ego[b].float() @ mat_inv  # not in the original (it carries no lidar2ego)
            for view in range(lidar2img.shape[1]):
                lidar2img[b, view] = lidar2img[b, view].float() @ mat_inv
        pts, box, lab = reference_bev_aug(points, boxes, labels, one, config)
        points_out.append(pts)
        boxes_out.append(box)
        labels_out.append(lab)
    out = {
        "lidar2img": lidar2img, "ego_pose": ego_pose, "ego_pose_inv": ego_pose_inv, "lidar2ego": lidar2ego,
        "gt_boxes": RaggedBatch.from_list(boxes_out), "gt_labels": RaggedBatch.from_list(labels_out),
    }  # fmt: skip
    if batch.points is not None:
        out["points"] = RaggedBatch.from_list(points_out)
    return out


def _check_batch(batch: Batch, config: CameraAugConfig) -> None:
    if batch.images is None:
        raise ValueError("batch.images: the camera augmentation needs the images (the dataset loads none)")
    if getattr(batch, "images_normalized", False) or batch.images.dtype != torch.uint8:
        raise ValueError("batch.images: expected the loaded uint8 images; this batch is augmented already")
    if tuple(batch.image_size) != tuple(config.image.source_size):
        raise ValueError(
            f"data.augment.camera.image.source_size: is {tuple(config.image.source_size)}, but the images are "
            f"{batch.image_size[0]}×{batch.image_size[1]}"
        )
