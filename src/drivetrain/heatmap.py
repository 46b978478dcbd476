"""Gaussian heatmaps: radius rules and batched drawing of every box of every image at once.

A box with integer centre ``(x, y)`` and radius ``r`` contributes ``exp(-(dx² + dy²) / (2σ²))`` with
``σ = (2r + 1) / 6`` on the ``(2r + 1)²`` window around its centre (clipped to the heatmap), values below
``float32 eps`` set to 0 (as mmdet3d's ``gaussian_2d``). Overlaps merge with ``max``, also with what the
heatmap already holds. Boxes whose centre cell lies outside the heatmap are not drawn.

:func:`draw_gaussians` computes every window of every box with tensor ops and merges them with one
``scatter_reduce(amax)``: no loop over boxes, no host sync. :func:`reference_draw_gaussians` is the
per-box loop of the original code.
"""

from __future__ import annotations

import math

import torch

from drivetrain.ragged import RaggedBatch

__all__ = [
    "draw_gaussians",
    "focal_head_radius",
    "gaussian_radius",
    "reference_draw_gaussians",
]

_EPS32 = float(torch.finfo(torch.float32).eps)


def focal_head_radius(centres: torch.Tensor, boxes_xyxy: torch.Tensor, stride: float) -> torch.Tensor:
    """StreamPETR focal-head radius: ``max(1, ceil(min(l, t, r, b) / stride))``, int64.

    Args:
        centres: ``(..., 2)`` pixel centres (projected 3D centres); boxes_xyxy: ``(..., 4)`` pixel boxes.
        stride: feature stride (16).

    Returns:
        int64 ``(...)``.
    """
    x, y = centres[..., 0], centres[..., 1]
    edges = torch.stack(
        [x - boxes_xyxy[..., 0], y - boxes_xyxy[..., 1], boxes_xyxy[..., 2] - x, boxes_xyxy[..., 3] - y]
    )
    return torch.ceil(edges.min(dim=0).values / stride).clamp(min=1).long()  # (...)


def gaussian_radius(height: torch.Tensor, width: torch.Tensor, min_overlap: float = 0.7) -> torch.Tensor:
    """CenterNet's radius: the largest corner shift keeping IoU ≥ ``min_overlap`` (three cases, the min).

    Follows the original CenterNet / mmdet3d (CenterPoint) formula, including its ``(b + sqrt(Δ)) / 2``
    roots. Elementwise over ``height`` and ``width`` (any shape, float).
    """
    h, w = torch.as_tensor(height, dtype=torch.float32), torch.as_tensor(width, dtype=torch.float32)
    b1 = h + w
    c1 = w * h * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + torch.sqrt(b1**2 - 4 * c1)) / 2
    b2 = 2 * (h + w)
    c2 = (1 - min_overlap) * w * h
    r2 = (b2 + torch.sqrt(b2**2 - 16 * c2)) / 2
    a3 = 4 * min_overlap
    b3 = -2 * min_overlap * (h + w)
    c3 = (min_overlap - 1) * w * h
    r3 = (b3 + torch.sqrt(b3**2 - 4 * a3 * c3)) / 2
    return torch.minimum(torch.minimum(r1, r2), r3)


def _gaussian(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor, diameter_to_sigma: float) -> torch.Tensor:
    sigma = (2 * radius + 1).float() / diameter_to_sigma
    value = torch.exp(-(dx * dx + dy * dy).float() / (2 * sigma * sigma))
    return value.masked_fill(value < _EPS32, 0.0)  # the peak is 1, so this is mmdet3d's eps · max


def draw_gaussians(
    heatmap: torch.Tensor,
    centres: RaggedBatch,
    radii: RaggedBatch,
    labels: RaggedBatch | None = None,
    *,
    max_radius: int | None = None,
    diameter_to_sigma: float = 6.0,
) -> torch.Tensor:
    """Draw all boxes of all images into a copy of ``heatmap`` (max-merge), without a loop or a sync.

    Args:
        heatmap: ``(*batch, H, W)``, or ``(*batch, C, H, W)`` when ``labels`` is given.
        centres: int RaggedBatch ``(*batch, G, 2)`` of ``(x, y)`` heatmap cells.
        radii: int RaggedBatch ``(*batch, G)``, same sizes.
        labels: optional int RaggedBatch ``(*batch, G)``: the channel each box is drawn into.
        max_radius: an upper bound of the radii (host int). Given, only a ``(2R+1)²`` window per box is
            evaluated (memory ``O(G R²)``); None evaluates every cell per box (memory ``O(G H W)``). A box
            whose radius exceeds the bound keeps its Gaussian (σ from its radius) but only the bound's window.
        diameter_to_sigma: ``σ = (2r + 1) / diameter_to_sigma``.

    Returns:
        Heatmap of ``heatmap``'s shape, float32.
    """
    nb = centres.num_batch_dims
    batch = tuple(centres.batch_shape)
    has_classes = labels is not None
    expected_dims = nb + (3 if has_classes else 2)
    if heatmap.dim() != expected_dims or tuple(heatmap.shape[:nb]) != batch:
        raise ValueError(
            f"heatmap: expected shape (*{batch}, {'C, ' if has_classes else ''}H, W), got {tuple(heatmap.shape)}"
        )
    if tuple(radii.batch_shape) != batch or radii.max_size != centres.max_size:
        raise ValueError("radii: must have the batch shape and padded length of centres")
    height, width = heatmap.shape[-2:]
    channels = heatmap.shape[nb] if has_classes else 1
    valid = centres.mask  # (*batch, G)
    cx, cy = centres.tensor[..., 0].long(), centres.tensor[..., 1].long()  # (*batch, G)
    radius = radii.tensor.long()  # (*batch, G)
    channel = labels.tensor.long().clamp(0, channels - 1) if has_classes else torch.zeros_like(cx)  # (*batch, G)
    device = heatmap.device
    if max_radius is None:
        ys = torch.arange(height, device=device).view(height, 1)  # (H, 1)
        xs = torch.arange(width, device=device).view(1, width)  # (1, W)
        dy = ys - cy[..., None, None]  # (*batch, G, H, 1)
        dx = xs - cx[..., None, None]  # (*batch, G, 1, W)
        y, x = dy + cy[..., None, None], dx + cx[..., None, None]
    else:
        offsets = torch.arange(-max_radius, max_radius + 1, device=device)  # (K,)
        dy = offsets.view(-1, 1).expand(-1, offsets.numel())  # (K, K)
        dx = offsets.view(1, -1).expand(offsets.numel(), -1)  # (K, K)
        y = dy + cy[..., None, None]  # (*batch, G, K, K)
        x = dx + cx[..., None, None]  # (*batch, G, K, K)
    r = radius[..., None, None]  # (*batch, G, 1, 1)
    inside = (dy.abs() <= r) & (dx.abs() <= r) & (y >= 0) & (y < height) & (x >= 0) & (x < width)
    centre_inside = valid & (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height)  # (*batch, G)
    inside = inside & centre_inside[..., None, None]  # (*batch, G, ·, ·)
    value = _gaussian(dx, dy, r, diameter_to_sigma)  # (*batch, G, ·, ·)
    num_images = math.prod(batch)
    image = torch.arange(num_images, device=device).view(*batch, 1, 1, 1)  # (*batch, 1, 1, 1)
    cell = ((image * channels + channel[..., None, None]) * height + y) * width + x  # (*batch, G, ·, ·)
    dump = num_images * channels * height * width
    cell = torch.where(inside, cell, dump).expand(value.shape)  # (*batch, G, ·, ·)
    flat = torch.cat([heatmap.float().reshape(-1), heatmap.new_zeros(1, dtype=torch.float32)])  # (cells + 1,)
    flat = flat.scatter_reduce(0, cell.reshape(-1), value.reshape(-1), reduce="amax", include_self=True)
    return flat[:dump].view(heatmap.shape)


def reference_draw_gaussians(
    heatmap: torch.Tensor,
    centres: list[torch.Tensor],
    radii: list[torch.Tensor],
    labels: list[torch.Tensor] | None = None,
    diameter_to_sigma: float = 6.0,
) -> torch.Tensor:
    """The per-box loop of the original code, over flattened images.

    Args:
        heatmap: ``(I, H, W)`` or ``(I, C, H, W)``; centres: per image ``(G_i, 2)``; radii: per image
            ``(G_i,)``; labels: per image ``(G_i,)`` (with a class dim).

    Returns:
        A float32 copy of ``heatmap`` with every box drawn.
    """
    out = heatmap.float().clone()
    height, width = out.shape[-2:]
    for i, (image_centres, image_radii) in enumerate(zip(centres, radii, strict=True)):
        for g in range(image_centres.shape[0]):
            x, y, r = int(image_centres[g, 0]), int(image_centres[g, 1]), int(image_radii[g])
            target = out[i, int(labels[i][g])] if labels is not None else out[i]
            offsets = torch.arange(-r, r + 1, device=out.device)
            gaussian = _gaussian(offsets.view(1, -1), offsets.view(-1, 1), torch.tensor(r), diameter_to_sigma)
            left, right = min(x, r), min(width - x, r + 1)
            top, bottom = min(y, r), min(height - y, r + 1)
            if not (0 <= x < width and 0 <= y < height):
                continue
            window = target[y - top : y + bottom, x - left : x + right]
            patch = gaussian[r - top : r + bottom, r - left : r + right]
            torch.maximum(window, patch, out=window)
    return out
