"""Photometric distortion and normalisation of camera images, every camera of a batch at once.

The distortion is ``PhotoMetricDistortionMultiViewImage`` of the DETR3D / PETR / StreamPETR plugins
(``projects/mmdet3d_plugin/datasets/pipelines/transform_3d.py``; mmdet 2.x's ``PhotoMetricDistortion`` per
image): on float images, each step with probability 0.5 and its own draw per camera image —

1. brightness: ``x += δ``, ``δ ~ U(−32, 32)``;
2. contrast first (``mode == 1``, probability 0.5): ``x *= α``, ``α ~ U(0.5, 1.5)``;
3. to HSV (OpenCV's float formula: ``H`` in degrees, ``S = (V − min)/(|V| + ε)``, ``V = max``);
4. saturation: ``S *= U(0.5, 1.5)``;  5. hue: ``H += U(−18, 18)``, wrapped once into ``[0, 360]``;
6. back from HSV;  7. contrast last (``mode == 0``);  8. a random permutation of the channels.

There is no clipping between the steps (the original has none). StreamPETR's published recipe does not use the
distortion; it is off unless configured. Two differences from the original, named: our images are RGB where
mmcv's are BGR, so the HSV conversion reads RGB (the same hue for the same colour) and the channel permutation
acts on RGB order (the same distribution); and the pipeline distorts the model-size image after the
resize/crop, where PETR's configs distort the full-size image first (about 5× the pixels; brightness and
contrast commute with the resize, the HSV steps are not linear, so the two orders differ slightly).

Normalisation is ``NormalizeMultiviewImage`` (mmcv's ``imnormalize``): ``(x − mean) · (1/std)``, RGB ImageNet
statistics by default, the ones the model's own normalisation uses.

:func:`sample_photometric_params` draws everything for ``(B, N)`` images from an explicit generator (a
"skipped" step is stored as its neutral value: ``δ = 0``, ``α = 1``, identity permutation, which leave the
numbers bit-identical); :func:`photometric_distort` applies them to the whole batch;
:func:`reference_photometric` is the original's per-image code on NumPy and OpenCV, given the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from drivetrain.constants import constant
from drivetrain.pipeline._config import finite_numbers

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PhotometricConfig",
    "PhotometricParams",
    "hsv_to_rgb",
    "normalize",
    "photometric_distort",
    "reference_normalize",
    "reference_photometric",
    "rgb_to_hsv",
    "sample_photometric_params",
]

IMAGENET_MEAN = (123.675, 116.28, 103.53)  # RGB, 0–255
IMAGENET_STD = (58.395, 57.12, 57.375)
_EPS32 = float(np.finfo(np.float32).eps)  # OpenCV's FLT_EPSILON


@dataclass(frozen=True)
class PhotometricConfig:
    """``PhotoMetricDistortionMultiViewImage``'s arguments (its defaults)."""

    brightness_delta: float = 32.0
    contrast_range: tuple[float, float] = (0.5, 1.5)
    saturation_range: tuple[float, float] = (0.5, 1.5)
    hue_delta: float = 18.0

    def __post_init__(self) -> None:
        for name in ("contrast_range", "saturation_range"):
            lo, hi = finite_numbers(self, name, 2)
            if not 0 <= lo <= hi:
                raise ValueError(f"{name}: expected 0 ≤ lo ≤ hi, got {(lo, hi)}")
        for name in ("brightness_delta", "hue_delta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"{name}: expected a finite number ≥ 0, got {value!r}")


@dataclass(frozen=True)
class PhotometricParams:
    """Per camera image draws, ``(B, N)`` leading dims; neutral values where a step is skipped.

    Attributes:
        brightness: float32 ``(B, N)`` δ added (0: skipped).
        contrast: float32 ``(B, N)`` α (1: skipped).
        contrast_first: bool ``(B, N)`` the original's ``mode == 1``.
        saturation: float32 ``(B, N)`` factor on S (1: skipped).
        hue: float32 ``(B, N)`` degrees added to H (0: skipped).
        channels: int64 ``(B, N, 3)`` the output's channels taken from these input channels (identity: skipped).
    """

    brightness: torch.Tensor
    contrast: torch.Tensor
    contrast_first: torch.Tensor
    saturation: torch.Tensor
    hue: torch.Tensor
    channels: torch.Tensor

    def to(self, device: torch.device | str) -> PhotometricParams:
        """The same draws on ``device`` (non-blocking copies)."""
        return PhotometricParams(*(getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)))

    def image(self, b: int, n: int) -> dict[str, float | bool | list[int]]:
        """Camera ``n`` of sample ``b`` as Python values, for the reference."""
        return {f.name: getattr(self, f.name)[b, n].tolist() for f in fields(self)}


def sample_photometric_params(
    batch_size: int, cameras: int, config: PhotometricConfig, generator: torch.Generator | None = None
) -> PhotometricParams:
    """Draw the distortion of ``batch_size × cameras`` images on the CPU (fixed draw order, see the code)."""
    shape = (batch_size, cameras)
    # columns: brightness on, δ, mode, contrast on, α, saturation on, factor, hue on, hue δ, swap on
    u = torch.rand((*shape, 10), generator=generator)  # (B, N, 10)
    order = torch.rand((*shape, 3), generator=generator).argsort(-1)  # (B, N, 3): a uniform permutation

    def drawn(on: int, value: int, lo: float, hi: float, neutral: float) -> torch.Tensor:
        return torch.where(u[..., on] < 0.5, lo + (hi - lo) * u[..., value], neutral)  # (B, N)

    delta = config.brightness_delta
    brightness = drawn(0, 1, -delta, delta, 0.0)
    contrast_first = u[..., 2] < 0.5
    contrast = drawn(3, 4, *config.contrast_range, 1.0)
    saturation = drawn(5, 6, *config.saturation_range, 1.0)
    hue = drawn(7, 8, -config.hue_delta, config.hue_delta, 0.0)
    channels = torch.where((u[..., 9] < 0.5)[..., None], order, torch.arange(3).expand(*shape, 3))  # (B, N, 3)
    return PhotometricParams(brightness, contrast, contrast_first, saturation, hue, channels)


def rgb_to_hsv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OpenCV's float ``RGB2HSV`` on channel dim −3: ``(H in [0, 360), S, V)``, each ``(..., h, w)``."""
    r, g, b = x.unbind(-3)
    v = torch.maximum(torch.maximum(r, g), b)
    vmin = torch.minimum(torch.minimum(r, g), b)
    diff = v - vmin
    s = diff / (v.abs() + _EPS32)
    scale = 60.0 / (diff + _EPS32)
    h = torch.where(v == r, (g - b) * scale, torch.where(v == g, (b - r) * scale + 120.0, (r - g) * scale + 240.0))
    h = torch.where(h < 0, h + 360.0, h)
    return h, s, v


# Per 60° sector, the rows of (v, v·(1 − s), v·(1 − s·f), v·(1 − s·(1 − f))) that are its (r, g, b): OpenCV's
# sector_data, reordered from its (b, g, r)
_SECTOR_PICK = (0, 3, 1, 2, 0, 1, 1, 0, 3, 1, 2, 0, 3, 1, 0, 0, 1, 2)


def hsv_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """OpenCV's float ``HSV2RGB`` (sectors of 60°): ``(..., 3, h, w)``."""
    h6 = h * (6.0 / 360.0)
    h6 = h6 - 6.0 * torch.floor(h6 / 6.0)  # into [0, 6)
    sector = torch.floor(h6)
    frac = h6 - sector
    bad = (sector < 0) | (sector >= 6)
    sector = torch.where(bad, 0.0, sector).long()
    frac = torch.where(bad, 0.0, frac)
    tab = torch.stack([v, v * (1 - s), v * (1 - s * frac), v * (1 - s * (1 - frac))], 0)  # (4, ...)
    # OpenCV's sector_data gives (b, g, r) rows of tab per sector; here (r, g, b)
    pick = constant(_SECTOR_PICK, dtype=torch.int64, device=h.device).view(6, 3)  # copied to the device once
    rgb = pick[sector]  # (..., 3)
    out = torch.gather(tab, 0, rgb.movedim(-1, 0))  # (3, ...)
    return out.movedim(0, -3)


def photometric_distort(images: torch.Tensor, params: PhotometricParams) -> torch.Tensor:
    """Distort float images ``(B, N, 3, H, W)`` with per-image parameters on their device (see the module)."""

    def per_image(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=images.device, dtype=images.dtype)[..., None, None, None]  # (B, N, 1, 1, 1)

    x = images + per_image(params.brightness)
    first = params.contrast_first.to(images.device)[..., None, None, None]
    alpha = per_image(params.contrast)
    x = torch.where(first, x * alpha, x)
    h, s, v = rgb_to_hsv(x)  # (B, N, H, W) each
    s = s * per_image(params.saturation)[..., 0]
    h = h + per_image(params.hue)[..., 0]
    h = torch.where(h > 360, h - 360, h)
    h = torch.where(h < 0, h + 360, h)
    x = hsv_to_rgb(h, s, v)  # (B, N, 3, H, W)
    x = torch.where(first, x, x * alpha)
    index = params.channels.to(images.device)[..., None, None].expand_as(x)  # (B, N, 3, H, W)
    return torch.gather(x, 2, index)


def reference_photometric(image: np.ndarray, draws: dict[str, float | bool | list[int]]) -> np.ndarray:
    """One float32 ``(H, W, 3)`` RGB image through the original's ``__call__`` body with OpenCV, given the draws
    (:meth:`PhotometricParams.image`); a neutral draw stands for a skipped step."""
    try:
        import cv2
    except ImportError:
        raise ImportError(
            "the worker-side photometric distortion uses OpenCV, as mmcv does: pip install opencv-python-headless"
        ) from None
    img = image.astype(np.float32).copy()
    img += np.float32(draws["brightness"])
    if draws["contrast_first"]:
        img *= np.float32(draws["contrast"])
    img = cv2.cvtColor(img, cv2.COLOR_RGB2HSV)
    img[..., 1] *= np.float32(draws["saturation"])
    img[..., 0] += np.float32(draws["hue"])
    img[..., 0][img[..., 0] > 360] -= 360
    img[..., 0][img[..., 0] < 0] += 360
    img = cv2.cvtColor(img, cv2.COLOR_HSV2RGB)
    if not draws["contrast_first"]:
        img *= np.float32(draws["contrast"])
    return np.ascontiguousarray(img[..., draws["channels"]])


def normalize(
    images: torch.Tensor, mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD
) -> torch.Tensor:
    """``(x − mean) · (1/std)`` per channel of float images ``(..., 3, H, W)``."""
    m = constant(mean, dtype=images.dtype, device=images.device).view(3, 1, 1)  # copied to the device once
    inv = constant([1 / s for s in std], dtype=images.dtype, device=images.device).view(3, 1, 1)  # 1/s rounded once
    return (images - m) * inv


def reference_normalize(image: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """mmcv's ``imnormalize`` of one float32 ``(H, W, 3)`` image (``to_rgb=False``: ours is RGB already)."""
    mean_arr = np.float64(np.array(mean).reshape(1, -1))
    stdinv = 1 / np.float64(np.array(std).reshape(1, -1))
    img = (image.astype(np.float64) - mean_arr).astype(np.float32)  # cv2.subtract(img, mean, img)
    return (img.astype(np.float64) * stdinv).astype(np.float32)  # cv2.multiply(img, stdinv, img)
