"""Camera image augmentation on the batch's device: per-sample resize + crop + flip + rotation as ONE affine warp
per image, with the camera matrices updated by the same 3×3 image matrix (the first part of issue 14 item 3).

The recipe is StreamPETR's ``ResizeCropFlipRotImage`` (``projects/mmdet3d_plugin/datasets/pipelines/
transform_3d.py``): per sample (the same for its cameras) a scale ``s ~ U(resize_lim)``, the crop
``(crop_w, crop_h, crop_w + fW, crop_h + fH)`` with ``crop_h = int((1 − U(bot_pct_lim))·int(H·s)) − fH`` and
``crop_w = int(U(0, max(0, int(W·s) − fW)))``, a flip with probability 0.5 and a rotation ``U(rot_lim)`` degrees;
at test time ``s = max(fH/H, fW/W)``, the crop centred horizontally, no flip or rotation. ``_img_transform``'s
matrix (``ida``): ``A = s·I``, ``b = −crop``; a flip maps ``A ← F·A``, ``b ← F·b + (fW, 0)`` with ``F = diag(−1,
1)``; a rotation by ``r`` about the crop centre ``c``: ``A ← R·A``, ``b ← R·b + c − R·c`` with ``R = [[cos r, sin r],
[−sin r, cos r]]``. Intrinsics become ``ida · K``, and ``lidar2img = K₄ · lidar2cam`` becomes ``ida₄ · lidar2img``.

The pixels (:func:`resize_crop_flip`) follow the original's ``_img_transform`` op by op: each sample's cameras are
resized to ``(int(W·s), int(H·s))`` with an antialiased bicubic filter (``F.interpolate(antialias=True)``, PIL's
kernel with ``a = −0.5``, which PIL's default ``Image.resize`` filter is), rows then columns, each pass rounded and
clamped to integers as PIL's uint8 passes are, cropped with zero fill outside the resized image (PIL's ``crop``),
and mirrored. So the pixels follow the scale ``int(W·s)/W`` while the matrices use ``s``, exactly as in the original
(at most one output pixel apart at the far edge). The original asserts ``rot_lim == (0, 0)``; a rotation here is a
bilinear :func:`warp_images` of the cropped image about its centre, the matrix's rotation. :func:`warp_images`
resamples through any image matrix in one ``grid_sample``; it is not antialiased, so it is the rotation step and a
tool, not the resize.

2D annotations (``_bboxes_transform``): boxes and projected centres are scaled, shifted by the crop, clipped to
the output image and flipped; boxes narrower or lower than ``min_size`` (2 px) after clipping are dropped with
their labels, centres, depths and 3D indices. :func:`transform_boxes_2d` does every sample and camera at once on
ragged batches without a host sync (boxes through the ida matrix: their corners' bounds, which for the
original's rotation-free recipe are its formulas); :func:`reference_transform_boxes_2d` is the original's numpy
code per image.

BEV augmentation of a camera batch (StreamPETR's ``GlobalRotScaleTransImage`` with ``reverse_angle``): boxes move
with :func:`~drivetrain.pipeline.augment.bev.apply_bev_aug` (one module shared with the lidar path) and the
matrices that map the lidar frame follow its per-sample matrix ``M``: ``lidar2img' = lidar2img · M⁻¹``,
``ego_pose' = ego_pose · M⁻¹``, ``ego_pose_inv' = M · ego_pose_inv`` (:func:`bev_aug_cameras`), so every image
pixel still shows the same point of the world.

The invisible-box filter (``_filter_invisible``): per image, the boxes are sorted far to near by depth (stable)
and painted in that order on an ``fH × fW`` map of box numbers over integer pixel spans ``[ceil(x1), floor(x2))
× [ceil(y1), floor(y2))``; the boxes whose number is left anywhere on the map are kept, far to near (number 0,
the farthest, is also what an unpainted pixel holds, so it stays whenever a pixel is unpainted).
:func:`filter_invisible` computes the same map for every image at once on the grid of cells cut by the boxes'
edges (at most ``2G + 1`` per axis instead of ``fH × fW`` pixels); :func:`reference_filter_invisible` is the
original's per-image numpy code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from drivetrain.constants import constant
from drivetrain.ragged import RaggedBatch, select

__all__ = [
    "MIN_BOX_SIZE",
    "ImageAugConfig",
    "ImageAugParams",
    "bev_aug_cameras",
    "filter_invisible",
    "ida_matrix",
    "reference_filter_invisible",
    "reference_img_transform",
    "reference_transform_boxes_2d",
    "resize_crop_flip",
    "sample_image_params",
    "transform_boxes_2d",
    "update_cameras",
    "warp_images",
]

MIN_BOX_SIZE = 2.0  # pixels: ResizeCropFlipRotImage.min_size


@dataclass(frozen=True)
class ImageAugConfig:
    """The image step's settings, as StreamPETR's ``ida_aug_conf`` names them. The sizes are the data's and the
    model's; the other fields default to no augmentation (scale 1, no bottom cut, rotation or flip): a model's
    published values live in its recipe (e.g. ``drivetrain.models.streampetr.recipe.CAMERA_AUG``).

    Attributes:
        source_size: ``(W, H)`` of the loaded images.
        final_size: ``(fW, fH)`` of the model's input.
        resize_lim: range of the scale ``s`` in training.
        bot_pct_lim: range of the fraction cut from the bottom.
        rot_lim: rotation range in degrees.
        rand_flip: flip half of the samples in training.
    """

    source_size: tuple[int, int]
    final_size: tuple[int, int]
    resize_lim: tuple[float, float] = (1.0, 1.0)
    bot_pct_lim: tuple[float, float] = (0.0, 0.0)
    rot_lim: tuple[float, float] = (0.0, 0.0)
    rand_flip: bool = False

    def __post_init__(self) -> None:
        for name in ("source_size", "final_size"):
            if len(getattr(self, name)) != 2 or min(getattr(self, name)) < 1:
                raise ValueError(f"{name}: expected (W, H) ≥ 1, got {getattr(self, name)}")
        if not 0 < self.resize_lim[0] <= self.resize_lim[1]:
            raise ValueError(f"resize_lim: expected 0 < lo ≤ hi, got {self.resize_lim}")
        if not 0 <= self.bot_pct_lim[0] <= self.bot_pct_lim[1] < 1:
            raise ValueError(f"bot_pct_lim: expected 0 ≤ lo ≤ hi < 1, got {self.bot_pct_lim}")


@dataclass(frozen=True)
class ImageAugParams:
    """Per-sample image augmentation (the same for every camera of a sample); pass it again to replay.

    Attributes:
        scale: float64 ``(B,)`` the resize factor ``s``.
        crop: int64 ``(B, 2)`` ``(crop_w, crop_h)``, the crop's top-left corner in the resized image.
        flip: bool ``(B,)``.
        rotate: float64 ``(B,)`` degrees.
    """

    scale: torch.Tensor
    crop: torch.Tensor
    flip: torch.Tensor
    rotate: torch.Tensor


def sample_image_params(
    batch_size: int, config: ImageAugConfig, generator: torch.Generator | None = None, *, training: bool = True
) -> ImageAugParams:
    """Draw ``_sample_augmentation`` for each sample (on the CPU: a few numbers per sample, then replayable).

    Args:
        batch_size: B.
        config: the recipe.
        generator: CPU generator the draws come from (training).
        training: False gives the original's test-time parameters (no randomness).
    """
    (width, height), (final_w, final_h) = config.source_size, config.final_size
    if not training:
        s = max(final_h / height, final_w / width)
        new_w, new_h = int(width * s), int(height * s)
        crop_h = int((1 - sum(config.bot_pct_lim) / 2) * new_h) - final_h
        crop_w = int(max(0, new_w - final_w) / 2)
        return ImageAugParams(
            torch.full((batch_size,), s, dtype=torch.float64),
            torch.tensor([[crop_w, crop_h]] * batch_size, dtype=torch.int64).reshape(batch_size, 2),
            torch.zeros(batch_size, dtype=torch.bool),
            torch.zeros(batch_size, dtype=torch.float64),
        )
    u = torch.rand(batch_size, 5, generator=generator, dtype=torch.float64)  # (B, 5)
    lo, hi = config.resize_lim
    scale = lo + (hi - lo) * u[:, 0]  # (B,)
    crops, flips = [], []
    for b in range(batch_size):  # integer truncations as the original's int(); B numbers on the host
        s = float(scale[b])
        new_w, new_h = int(width * s), int(height * s)
        bot = config.bot_pct_lim[0] + (config.bot_pct_lim[1] - config.bot_pct_lim[0]) * float(u[b, 1])
        crops.append([int(float(u[b, 2]) * max(0, new_w - final_w)), int((1 - bot) * new_h) - final_h])
        flips.append(config.rand_flip and bool(u[b, 3] < 0.5))
    rot_lo, rot_hi = config.rot_lim
    return ImageAugParams(
        scale,
        torch.tensor(crops, dtype=torch.int64).reshape(batch_size, 2),
        torch.tensor(flips, dtype=torch.bool).reshape(batch_size),
        rot_lo + (rot_hi - rot_lo) * u[:, 4],
    )


def ida_matrix(params: ImageAugParams, final_size: tuple[int, int]) -> torch.Tensor:
    """float64 ``(B, 3, 3)``: the original's ``ida_mat`` (image point of the resized, cropped, flipped and rotated
    image as a function of the source image point; continuous coordinates as the camera matrices use)."""
    final_w, final_h = final_size
    num = params.scale.shape[0]
    a = params.scale[:, None, None] * torch.eye(2, dtype=torch.float64)  # (B, 2, 2)
    t = -params.crop.to(torch.float64)  # (B, 2)
    flip_a = torch.diag(torch.tensor([-1.0, 1.0], dtype=torch.float64))  # (2, 2)
    flipped_t = t @ flip_a.T + torch.tensor([float(final_w), 0.0], dtype=torch.float64)  # (B, 2)
    a = torch.where(params.flip[:, None, None], flip_a @ a, a)  # (B, 2, 2)
    t = torch.where(params.flip[:, None], flipped_t, t)  # (B, 2)
    angle = params.rotate * (math.pi / 180)  # (B,)
    cos, sin = torch.cos(angle), torch.sin(angle)  # (B,)
    rot = torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)  # (B, 2, 2)
    centre = torch.tensor([final_w / 2, final_h / 2], dtype=torch.float64).expand(num, 2)  # (B, 2)
    a = rot @ a  # (B, 2, 2)
    t = (rot @ t.unsqueeze(-1)).squeeze(-1) + centre - (rot @ centre.unsqueeze(-1)).squeeze(-1)  # (B, 2)
    out = torch.eye(3, dtype=torch.float64).repeat(num, 1, 1)  # (B, 3, 3)
    out[:, :2, :2], out[:, :2, 2] = a, t
    return out


def warp_images(images: torch.Tensor, ida: torch.Tensor, final_size: tuple[int, int]) -> torch.Tensor:
    """Resample every camera image through its sample's ``ida`` in one ``grid_sample`` (bilinear, zeros outside).

    Args:
        images: ``(B, N, 3, H, W)`` uint8 or float images on any device.
        ida: ``(B, 3, 3)`` image matrices (:func:`ida_matrix`).
        final_size: ``(fW, fH)`` of the output.

    Returns:
        float32 ``(B, N, 3, fH, fW)`` in the input's value range.
    """
    b, n, c, h, w = images.shape
    final_w, final_h = final_size
    # inv_ex: no singularity check, whose host read of the info flags would sync a device ``ida`` (an affine
    # augmentation matrix is invertible by construction)
    inverse = torch.linalg.inv_ex(ida).inverse.to(images.device)  # (B, 3, 3): output point → source point
    ys, xs = torch.meshgrid(
        torch.arange(final_h, dtype=torch.float64, device=images.device) + 0.5,
        torch.arange(final_w, dtype=torch.float64, device=images.device) + 0.5,
        indexing="ij",
    )  # (fH, fW) output pixel centres
    out_points = torch.stack([xs, ys, torch.ones_like(xs)], dim=-1)  # (fH, fW, 3)
    src = torch.einsum("bij,hwj->bhwi", inverse, out_points)[..., :2]  # (B, fH, fW, 2) source coordinates
    grid = torch.stack([src[..., 0] / w * 2 - 1, src[..., 1] / h * 2 - 1], dim=-1)  # align_corners=False
    grid = grid.to(torch.float32).repeat_interleave(n, dim=0)  # (B·N, fH, fW, 2)
    flat = images.reshape(b * n, c, h, w).to(torch.float32)  # (B·N, 3, H, W)
    warped = F.grid_sample(flat, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return warped.reshape(b, n, c, final_h, final_w)


def resize_crop_flip(images: torch.Tensor, params: ImageAugParams, final_size: tuple[int, int]) -> torch.Tensor:
    """The original's image op for every sample: antialiased bicubic resize, crop, flip (and rotation).

    One resize per sample (its cameras together: each sample has its own resized size; see
    :func:`_resize_to_levels`); the parameters are host tensors, so the loop reads no device memory.

    Args:
        images: ``(B, N, 3, H, W)`` uint8 or float images (0–255) on any device.
        params: :func:`sample_image_params`' draws (CPU tensors).
        final_size: ``(fW, fH)`` of the output.

    Returns:
        float32 ``(B, N, 3, fH, fW)`` holding integers in [0, 255] (PIL's uint8 values), zeros outside the
        resized image.
    """
    b, n, c, h, w = images.shape
    final_w, final_h = final_size
    out = torch.zeros((b, n, c, final_h, final_w), dtype=torch.float32, device=images.device)
    scales, crops = params.scale.tolist(), params.crop.tolist()
    flips, rotations = params.flip.tolist(), params.rotate.tolist()
    for i in range(b):
        new_w, new_h = int(w * scales[i]), int(h * scales[i])
        resized = _resize_to_levels(images[i], (new_h, new_w))  # (N, 3, new_h, new_w)
        crop_w, crop_h = crops[i]
        x0, y0 = max(crop_w, 0), max(crop_h, 0)
        x1, y1 = min(crop_w + final_w, new_w), min(crop_h + final_h, new_h)
        if x1 > x0 and y1 > y0:  # PIL's crop fills what lies outside the image with zeros
            out[i, :, :, y0 - crop_h : y1 - crop_h, x0 - crop_w : x1 - crop_w] = resized[:, :, y0:y1, x0:x1]
        if flips[i]:
            out[i] = out[i].flip(-1)
        if rotations[i] != 0:  # about the crop centre, as the matrix rotates (the original asserts no rotation)
            only = ImageAugParams(
                torch.ones(1, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.int64),
                torch.zeros(1, dtype=torch.bool), params.rotate[i : i + 1],
            )  # fmt: skip
            out[i] = warp_images(out[i : i + 1], ida_matrix(only, final_size), final_size)[0]
    return out


def _resize_to_levels(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """PIL's uint8 ``Image.resize`` (antialiased bicubic, ``a = −0.5``) of a stack of images, in its two passes.

    PIL resamples the rows first, stores that pass as a uint8 image (rounded half up and clamped to [0, 255]),
    then resamples its columns and rounds and clamps again; a pass whose size is unchanged is skipped. ATen's
    CPU kernels for uint8 images do the same with int16 fixed-point weights. The float path (every other dtype
    and device: CUDA has float kernels only) runs the two passes as two ``F.interpolate`` calls — the unchanged
    axis's weights are exactly (0, 1, 0, 0) — and rounds and clamps after each, so it is the same code on the
    CPU and on CUDA. Rounding only once at the end would pass the first pass's overshoot beyond [0, 255] at
    sharp edges (up to 1/8 of the step) into the second pass: many levels apart from PIL's.

    Args:
        images: ``(N, 3, H, W)`` uint8, or float holding 0–255, on any device.
        size: ``(new_h, new_w)``.

    Returns:
        float32 ``(N, 3, new_h, new_w)`` holding integers in [0, 255]. The float path differs from the integer
        kernels by at most 2 levels (tests/test_pipeline_augment_camera.py derives the bound), from their weights'
        rounding to int16.
    """
    if images.dtype == torch.uint8 and images.device.type == "cpu":  # ATen's integer kernels (CPU only)
        return F.interpolate(images, size=size, mode="bicubic", antialias=True).float()
    out = images.float()  # (N, 3, H, W)
    height, width = out.shape[-2:]
    new_h, new_w = size
    if new_w != width:  # the rows first, as PIL
        out = F.interpolate(out, size=(height, new_w), mode="bicubic", antialias=True)  # (N, 3, H, new_w)
        out = out.add_(0.5).floor_().clamp_(0, 255)  # PIL's uint8 intermediate image: rounded half up, clamped
    if new_h != height:
        out = F.interpolate(out, size=(new_h, new_w), mode="bicubic", antialias=True)  # (N, 3, new_h, new_w)
        out = out.add_(0.5).floor_().clamp_(0, 255)
    if new_w == width and new_h == height:  # no pass: the copy PIL returns (in levels)
        out = out.add(0.5).floor_().clamp_(0, 255)
    return out


def reference_img_transform(
    image: np.ndarray, resize: float, crop: tuple[int, int], flip: bool, final_size: tuple[int, int]
) -> np.ndarray:
    """One camera image through ``ResizeCropFlipRotImage._img_transform`` with PIL, as the original runs it.

    Args:
        image: uint8 ``(H, W, 3)``.
        resize: the scale ``s``; the image is resized to ``(int(W·s), int(H·s))``.
        crop: ``(crop_w, crop_h)``; the crop box is ``(crop_w, crop_h, crop_w + fW, crop_h + fH)``.
        flip: mirror left–right.
        final_size: ``(fW, fH)``.

    Returns:
        float32 ``(fH, fW, 3)``.
    """
    from PIL import Image

    height, width = image.shape[:2]
    final_w, final_h = final_size
    img = Image.fromarray(np.uint8(image))
    img = img.resize((int(width * resize), int(height * resize)))
    img = img.crop((crop[0], crop[1], crop[0] + final_w, crop[1] + final_h))
    if flip:
        img = img.transpose(method=Image.FLIP_LEFT_RIGHT)
    return np.array(img).astype(np.float32)


def update_cameras(
    intrinsics: torch.Tensor, lidar2img: torch.Tensor, ida: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The camera matrices of the augmented images: ``K' = ida · K`` and ``lidar2img' = ida₄ · lidar2img``.

    Args:
        intrinsics: ``(B, N, 3, 3)``.
        lidar2img: ``(B, N, 4, 4)`` (``K₄ · lidar2cam``).
        ida: ``(B, 3, 3)``.

    Returns:
        ``(intrinsics', lidar2img')`` in the inputs' dtypes.
    """
    ida = ida.to(device=intrinsics.device)
    ida4 = torch.eye(4, dtype=ida.dtype, device=ida.device).repeat(ida.shape[0], 1, 1)  # (B, 4, 4)
    ida4[:, :3, :3] = ida
    new_k = (ida[:, None] @ intrinsics.to(ida.dtype)).to(intrinsics.dtype)  # (B, N, 3, 3)
    new_l2i = (ida4[:, None] @ lidar2img.to(ida.dtype)).to(lidar2img.dtype)  # (B, N, 4, 4)
    return new_k, new_l2i


def transform_boxes_2d(
    boxes: RaggedBatch,
    centers: RaggedBatch,
    others: dict[str, RaggedBatch],
    ida: torch.Tensor,
    final_size: tuple[int, int],
    min_size: float = MIN_BOX_SIZE,
) -> tuple[RaggedBatch, RaggedBatch, dict[str, RaggedBatch]]:
    """The 2D annotations of augmented images, every sample and camera at once (no host sync).

    Args:
        boxes: RaggedBatch ``(B, N, G, 4)`` pixel ``(x1, y1, x2, y2)`` of the source images.
        centers: RaggedBatch ``(B, N, G, 2)`` projected 3D centres, same sizes.
        others: per-box RaggedBatches ``(B, N, G)`` filtered alike (labels, depths, 3D indices).
        ida: ``(B, 3, 3)`` image matrices (:func:`ida_matrix`).
        final_size: ``(fW, fH)``.
        min_size: boxes narrower or lower than this after clipping are dropped.

    Returns:
        ``(boxes, centers, others)`` with the kept boxes first in their order, padded lengths unchanged.
    """
    final_w, final_h = final_size
    a = ida[:, None, None, :2, :2].to(boxes.tensor)  # (B, 1, 1, 2, 2)
    t = ida[:, None, None, :2, 2].to(boxes.tensor)  # (B, 1, 1, 2)
    x1, y1, x2, y2 = boxes.tensor.unbind(-1)  # (B, N, G) each
    corners = torch.stack([torch.stack(c, -1) for c in ((x1, y1), (x2, y1), (x1, y2), (x2, y2))], -2)  # (..., 4, 2)
    moved = (a.unsqueeze(-3) @ corners.unsqueeze(-1)).squeeze(-1) + t.unsqueeze(-2)  # (B, N, G, 4, 2)
    lo = moved.amin(-2)  # (B, N, G, 2)
    hi = moved.amax(-2)  # (B, N, G, 2)
    limit = constant((final_w, final_h), dtype=lo.dtype, device=lo.device)  # (2,), copied to the device once
    lo = torch.minimum(lo.clamp(min=0), limit)
    hi = torch.minimum(hi.clamp(min=0), limit)
    new_boxes = torch.cat([lo, hi], -1)  # (B, N, G, 4)
    keep = boxes.mask & ((hi - lo) >= min_size).all(-1)  # (B, N, G)
    c = (a @ centers.tensor.unsqueeze(-1)).squeeze(-1) + t  # (B, N, G, 2)
    c = torch.minimum(c.clamp(min=0), limit)
    kept = {name: select(rb.tensor, keep, trim=False) for name, rb in others.items()}
    return select(new_boxes, keep, trim=False), select(c, keep, trim=False), kept


def reference_transform_boxes_2d(
    bboxes: np.ndarray,
    centers2d: np.ndarray,
    others: dict[str, np.ndarray],
    resize: float,
    crop: tuple[int, int],
    flip: bool,
    final_size: tuple[int, int],
    min_size: float = MIN_BOX_SIZE,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One image's ``ResizeCropFlipRotImage._bboxes_transform`` as the original writes it (no rotation)."""
    final_w, final_h = final_size
    bboxes = bboxes * resize
    bboxes[:, 0] = bboxes[:, 0] - crop[0]
    bboxes[:, 1] = bboxes[:, 1] - crop[1]
    bboxes[:, 2] = bboxes[:, 2] - crop[0]
    bboxes[:, 3] = bboxes[:, 3] - crop[1]
    bboxes[:, 0] = np.clip(bboxes[:, 0], 0, final_w)
    bboxes[:, 2] = np.clip(bboxes[:, 2], 0, final_w)
    bboxes[:, 1] = np.clip(bboxes[:, 1], 0, final_h)
    bboxes[:, 3] = np.clip(bboxes[:, 3], 0, final_h)
    keep = ((bboxes[:, 2] - bboxes[:, 0]) >= min_size) & ((bboxes[:, 3] - bboxes[:, 1]) >= min_size)
    if flip:
        x0 = bboxes[:, 0].copy()
        x1 = bboxes[:, 2].copy()
        bboxes[:, 2] = final_w - x0
        bboxes[:, 0] = final_w - x1
    centers2d = centers2d * resize
    centers2d[:, 0] = centers2d[:, 0] - crop[0]
    centers2d[:, 1] = centers2d[:, 1] - crop[1]
    centers2d[:, 0] = np.clip(centers2d[:, 0], 0, final_w)
    centers2d[:, 1] = np.clip(centers2d[:, 1], 0, final_h)
    if flip:
        centers2d[:, 0] = final_w - centers2d[:, 0]
    return bboxes[keep], centers2d[keep], {name: value[keep] for name, value in others.items()}


def bev_aug_cameras(
    lidar2img: torch.Tensor, ego_pose: torch.Tensor, ego_pose_inv: torch.Tensor, matrix: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The lidar-frame matrices of a camera batch after a BEV augmentation with per-sample matrix ``matrix``.

    Args:
        lidar2img: ``(B, N, 4, 4)``.
        ego_pose: ``(B, 4, 4)`` lidar → global.
        ego_pose_inv: ``(B, 4, 4)`` global → lidar.
        matrix: ``(B, 4, 4)`` the augmentation (``BevAugParams.matrix``: augmented = matrix · lidar point).

    Returns:
        ``(lidar2img · M⁻¹, ego_pose · M⁻¹, M · ego_pose_inv)`` in the inputs' dtypes.
    """
    m = matrix.to(device=lidar2img.device, dtype=torch.float64)  # (B, 4, 4)
    m_inv = torch.linalg.inv_ex(m).inverse  # (B, 4, 4): a rigid-and-scale matrix; inv_ex: no host-read check
    new_l2i = (lidar2img.to(torch.float64) @ m_inv[:, None]).to(lidar2img.dtype)  # (B, N, 4, 4)
    new_pose = (ego_pose.to(torch.float64) @ m_inv).to(ego_pose.dtype)  # (B, 4, 4)
    new_pose_inv = (m @ ego_pose_inv.to(torch.float64)).to(ego_pose_inv.dtype)  # (B, 4, 4)
    return new_l2i, new_pose, new_pose_inv


def filter_invisible(
    boxes: RaggedBatch,
    centers: RaggedBatch,
    depths: RaggedBatch,
    others: dict[str, RaggedBatch],
    final_size: tuple[int, int],
    chunk: int = 32,
) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch, dict[str, RaggedBatch]]:
    """Drop the 2D boxes that nearer boxes hide completely, in every image at once (no host sync).

    Args:
        boxes: RaggedBatch ``(B, N, G, 4)`` output-image ``(x1, y1, x2, y2)`` within ``[0, fW] × [0, fH]``.
        centers: RaggedBatch ``(B, N, G, 2)``.
        depths: RaggedBatch ``(B, N, G)`` metres.
        others: per-box RaggedBatches ``(B, N, G)`` filtered alike (labels, 3D indices).
        final_size: ``(fW, fH)``.
        chunk: boxes painted per step (bounds the ``(B·N, chunk, cells_y, cells_x)`` coverage tensor).

    Returns:
        ``(boxes, centers, depths, others)``: each image's visible boxes first, far to near (the original's
        order), padded lengths unchanged.
    """
    final_w, final_h = final_size
    lead = boxes.batch_shape  # (B, N)
    length = boxes.max_size
    if length == 0:
        return boxes, centers, depths, others
    images = lead.numel()
    valid = boxes.mask.reshape(images, length)  # (I, G)
    depth = depths.tensor.reshape(images, length)  # (I, G)
    key = torch.where(valid, -depth, torch.full_like(depth, float("inf")))  # padding sorts last
    order = torch.sort(key, dim=1, stable=True).indices  # (I, G): far to near

    def reorder(t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(images, length, *t.shape[len(lead) + 1 :])
        index = order.reshape(images, length, *([1] * (flat.dim() - 2))).expand_as(flat)
        return flat.gather(1, index)

    box = reorder(boxes.tensor)  # (I, G, 4)
    valid = reorder(valid)  # (I, G): valid boxes first, still
    u1, v1 = torch.ceil(box[..., 0]), torch.ceil(box[..., 1])  # (I, G)
    u2, v2 = torch.floor(box[..., 2]), torch.floor(box[..., 3])  # (I, G)
    zero = torch.zeros_like(u1)
    u1, v1, u2, v2 = (torch.where(valid, x, zero) for x in (u1, v1, u2, v2))  # padding paints nothing

    def cells(lo: torch.Tensor, hi: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        edges = torch.cat([torch.zeros_like(lo[:, :1]), torch.full_like(lo[:, :1], size), lo, hi], 1)
        edges = torch.sort(edges, dim=1).values  # (I, 2G + 2)
        return edges[:, :-1], edges[:, 1:]  # (I, 2G + 1) each: cell [start, end)

    x_start, x_end = cells(u1, u2, final_w)
    y_start, y_end = cells(v1, v2, final_h)
    top = torch.zeros((images, y_start.shape[1], x_start.shape[1]), dtype=torch.int64, device=box.device)
    for first in range(0, length, chunk):  # host loop over the padded length: no device read
        last = min(first + chunk, length)
        cols = (x_start[:, None, :] >= u1[:, first:last, None]) & (x_end[:, None, :] <= u2[:, first:last, None])
        rows = (y_start[:, None, :] >= v1[:, first:last, None]) & (y_end[:, None, :] <= v2[:, first:last, None])
        cover = rows[:, :, :, None] & cols[:, :, None, :]  # (I, g, Cy, Cx): a cell lies wholly in or out of a box
        number = torch.arange(first + 1, last + 1, device=box.device).view(1, -1, 1, 1)  # painted later wins
        top = torch.maximum(top, (cover * number).amax(1))  # (I, Cy, Cx): 1 + the box on top, 0 unpainted
    has_pixels = (y_end > y_start)[:, :, None] & (x_end > x_start)[:, None, :]  # (I, Cy, Cx)
    on_map = (top - 1).clamp(min=0)  # (I, Cy, Cx): the map value (0 where unpainted, as the original's zeros)
    seen = torch.zeros((images, length), dtype=torch.int64, device=box.device)
    seen = seen.scatter_reduce(1, on_map.flatten(1), has_pixels.flatten(1).long(), "amax")  # (I, G)
    keep = (seen > 0) & valid  # (I, G)

    out = []
    for rb in (boxes, centers, depths, *others.values()):
        kept = select(reorder(rb.tensor), keep, trim=False)  # (I, G, ...) ragged
        out.append(RaggedBatch.unchecked(kept.tensor.reshape(rb.tensor.shape), kept.sizes.reshape(lead), rb.ragged_dim))
    return out[0], out[1], out[2], dict(zip(others, out[3:], strict=True))


def reference_filter_invisible(
    bboxes: np.ndarray, centers2d: np.ndarray, depths: np.ndarray, others: dict[str, np.ndarray],
    final_size: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """One image's ``ResizeCropFlipRotImage._filter_invisible`` as the original writes it (labels → ``others``)."""
    final_w, final_h = final_size
    indices_maps = np.zeros((final_h, final_w))
    tmp_bboxes = np.zeros_like(bboxes)
    tmp_bboxes[:, :2] = np.ceil(bboxes[:, :2])
    tmp_bboxes[:, 2:] = np.floor(bboxes[:, 2:])
    tmp_bboxes = tmp_bboxes.astype(np.int64)
    sort_idx = np.argsort(-depths, axis=0, kind="stable")
    tmp_bboxes = tmp_bboxes[sort_idx]
    bboxes, depths, centers2d = bboxes[sort_idx], depths[sort_idx], centers2d[sort_idx]
    others = {name: value[sort_idx] for name, value in others.items()}
    for i in range(bboxes.shape[0]):
        u1, v1, u2, v2 = tmp_bboxes[i]
        indices_maps[v1:v2, u1:u2] = i
    indices_res = np.unique(indices_maps).astype(np.int64)
    others = {name: value[indices_res] for name, value in others.items()}
    return bboxes[indices_res], centers2d[indices_res], depths[indices_res], others
