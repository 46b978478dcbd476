"""Gaussian heatmaps: radius rules and batched drawing of every box of every image at once.

A box with integer centre ``(x, y)`` and radius ``r`` contributes ``exp(-(dx² + dy²) / (2σ²))`` with
``σ = (2r + 1) / 6`` on the ``(2r + 1)²`` window around its centre (clipped to the heatmap), values below
``eps · max`` set to 0 (as mmdet3d's ``gaussian_2d``; a window's smallest value is above ``e^-9``, so the cut never
fires). Overlaps merge with ``max``, also with what the
heatmap already holds. Wherever its centre cell lies, a box draws the part of its window that overlaps the
heatmap, as mmdet3d's window slicing does: StreamPETR clips projected centres to the image, so a centre on
the right or bottom border lands one cell past the map and still draws its edge row or column (radius 1:
``e^-2`` beside it, ``e^-4`` diagonally). The batched path
evaluates the Gaussian as a product of its x and y factors, which agrees with the per-box formula to
float32 rounding (≤ 1e-7 absolute).

:func:`draw_gaussians` computes every window of every box with tensor ops and merges them with one
``scatter_reduce(amax)``: no loop over boxes, no host sync. :func:`reference_draw_gaussians` is the
per-box loop of the original code, op for op (the Gaussian made on the host and copied over per box).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from drivetrain.ragged import RaggedBatch

__all__ = [
    "draw_gaussians",
    "focal_head_radius",
    "gaussian_radius",
    "reference_draw_gaussian",
    "reference_draw_gaussians",
]

_EPS32 = float(torch.finfo(torch.float32).eps)


def focal_head_radius(centres: torch.Tensor, boxes_xyxy: torch.Tensor, stride: float) -> torch.Tensor:
    """Radius by the centre's distance to the box edges: ``max(1, ceil(min(l, t, r, b) / stride))``, int64 (the
    rule StreamPETR's focal head draws its centerness heatmap with, ``FocalHead._get_heatmap_single``).

    Args:
        centres: ``(..., 2)`` pixel centres (projected 3D centres).
        boxes_xyxy: ``(..., 4)`` pixel boxes.
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
    device = heatmap.device
    cx, cy = centres.tensor[..., 0].long(), centres.tensor[..., 1].long()  # (*batch, G)
    radius = radii.tensor.long()  # (*batch, G)
    drawn = centres.mask  # (*batch, G): a window off the map draws nothing by itself (cells clipped below)
    if centres.max_size == 0:
        return heatmap.float().clone()
    # The Gaussian is separable: exp(-(dx²+dy²)/2σ²) = exp(-dx²/2σ²)·exp(-dy²/2σ²), and so is its square
    # window, so each box needs one row and one column factor and a single outer product.
    if max_radius is None:
        x_cells = torch.arange(width, device=device).expand(*cx.shape, width)  # (*batch, G, W)
        y_cells = torch.arange(height, device=device).expand(*cy.shape, height)  # (*batch, G, H)
    else:
        offsets = torch.arange(-max_radius, max_radius + 1, device=device)  # (K,)
        x_cells = cx.unsqueeze(-1) + offsets  # (*batch, G, K)
        y_cells = cy.unsqueeze(-1) + offsets  # (*batch, G, K)
    x_factor = _axis_factor(x_cells - cx.unsqueeze(-1), x_cells, width, radius, diameter_to_sigma)  # (*batch, G, X)
    y_factor = _axis_factor(y_cells - cy.unsqueeze(-1), y_cells, height, radius, diameter_to_sigma)  # (*batch, G, Y)
    y_factor = y_factor * drawn.unsqueeze(-1)  # (*batch, G, Y)
    value = y_factor.unsqueeze(-1) * x_factor.unsqueeze(-2)  # (*batch, G, Y, X)
    value = value.masked_fill(value < _EPS32, 0.0)  # the peak is 1, so this is mmdet3d's eps · max
    if max_radius is None and not has_classes:
        return torch.maximum(heatmap.float(), value.amax(dim=-3))  # (*batch, H, W)
    num_images = math.prod(batch)
    channel = labels.tensor.long().clamp(0, channels - 1) if has_classes else torch.zeros_like(cx)  # (*batch, G)
    image = torch.arange(num_images, device=device).view(*batch, 1)  # (*batch, 1)
    plane = (image * channels + channel) * height  # (*batch, G)
    rows = (plane.unsqueeze(-1) + y_cells) * width  # (*batch, G, Y)
    cell = rows.unsqueeze(-1) + x_cells.unsqueeze(-2)  # (*batch, G, Y, X)
    dump = num_images * channels * height * width
    inside = ((y_cells >= 0) & (y_cells < height)).unsqueeze(-1) & ((x_cells >= 0) & (x_cells < width)).unsqueeze(-2)
    cell = torch.where(inside, cell, dump)  # (*batch, G, Y, X): cells off the heatmap go to a dump slot
    flat = torch.cat([heatmap.float().reshape(-1), heatmap.new_zeros(1, dtype=torch.float32)])  # (cells + 1,)
    flat = flat.scatter_reduce(0, cell.reshape(-1), value.reshape(-1), reduce="amax", include_self=True)
    return flat[:dump].view(heatmap.shape)


def _axis_factor(
    offset: torch.Tensor, cells: torch.Tensor, length: int, radius: torch.Tensor, diameter_to_sigma: float
) -> torch.Tensor:
    """One axis of the separable Gaussian: ``exp(-d²/2σ²)`` inside the box's window and the map, else 0."""
    sigma = (2 * radius + 1).float() / diameter_to_sigma  # (*batch, G)
    factor = torch.exp(-(offset * offset).float() / (2 * sigma * sigma).unsqueeze(-1))  # (*batch, G, X)
    inside = (offset.abs() <= radius.unsqueeze(-1)) & (cells >= 0) & (cells < length)  # (*batch, G, X)
    return factor * inside  # (*batch, G, X)


def reference_draw_gaussian(
    heatmap: torch.Tensor, centre: torch.Tensor, radius: int, k: float = 1.0, diameter_to_sigma: float = 6.0
) -> torch.Tensor:
    """Draw one box into ``heatmap`` in place, as the original's ``draw_heatmap_gaussian`` does, op for op.

    StreamPETR's ``models/utils/misc.py`` (mmdet3d's ``core/utils/gaussian.py`` is the same): the Gaussian
    ``(2r + 1)²`` is made with NumPy on the host (float64, values below ``eps · max`` set to 0), the part of it
    over the window ``[x − min(x, r), x + min(W − x, r + 1))`` (and likewise in y) is copied to the device and
    max-merged into the window, when both are non-empty: two host reads of the centre and one blocking copy per
    box, as there (the reference's cost is the original's).

    Args:
        heatmap: ``(H, W)`` float32.
        centre: ``(2,)`` ``(x, y)`` in heatmap cells (truncated to ints).
        radius: the box's radius in cells.
        k: the peak value (the Gaussian is scaled by it).
        diameter_to_sigma: σ = (2r + 1) / this.

    Returns:
        ``heatmap``, drawn into.
    """
    diameter = 2 * radius + 1
    m = (diameter - 1.0) / 2.0
    y_grid, x_grid = np.ogrid[-m : m + 1, -m : m + 1]  # host: the original builds the Gaussian in NumPy
    sigma = diameter / diameter_to_sigma
    gaussian = np.exp(-(x_grid * x_grid + y_grid * y_grid) / (2 * sigma * sigma))  # (2r+1, 2r+1) float64
    gaussian[gaussian < np.finfo(gaussian.dtype).eps * gaussian.max()] = 0
    x, y = int(centre[0]), int(centre[1])  # sync: the original reads each centre on the host
    height, width = heatmap.shape[0:2]
    left, right = min(x, radius), min(width - x, radius + 1)
    top, bottom = min(y, radius), min(height - y, radius + 1)
    window = heatmap[y - top : y + bottom, x - left : x + right]  # (top+bottom, left+right) view
    patch = gaussian[radius - top : radius + bottom, radius - left : radius + right]
    # sync: one blocking copy of the patch per box, as the original's torch.from_numpy(...).to(device)
    patch = torch.from_numpy(np.ascontiguousarray(patch)).to(heatmap.device, torch.float32)
    if min(patch.shape) > 0 and min(window.shape) > 0:  # the window overlaps the map
        torch.maximum(window, patch * k, out=window)
    return heatmap


def reference_draw_gaussians(
    heatmap: torch.Tensor,
    centres: list[torch.Tensor],
    radii: list[torch.Tensor],
    labels: list[torch.Tensor] | None = None,
    diameter_to_sigma: float = 6.0,
) -> torch.Tensor:
    """The per-box loop of the original code, over flattened images: :func:`reference_draw_gaussian` per box.

    Mirrors mmdet3d's ``draw_heatmap_gaussian`` (``mmdet3d/core/utils/gaussian.py``, called per box by
    StreamPETR's ``FocalHead._get_heatmap_single``): the window ``[x − min(x, r), x + min(W − x, r + 1))`` and
    the matching slice of the Gaussian, drawn when both are non-empty; so a centre past the map still draws
    the part of its window that overlaps it. The radii (and labels) of an image are read in one host transfer,
    as the original reads them (``.cpu().numpy().tolist()``).

    Args:
        heatmap: ``(I, H, W)`` or ``(I, C, H, W)``.
        centres: per image ``(G_i, 2)`` feature-map coordinates.
        radii: per image ``(G_i,)`` int radii.
        labels: per image ``(G_i,)`` channels to draw into (with a class dim).
        diameter_to_sigma: σ = (2r + 1) / this.

    Returns:
        A float32 copy of ``heatmap`` with every box drawn.
    """
    out = heatmap.float().clone()  # (I, [C,] H, W)
    for i, (image_centres, image_radii) in enumerate(zip(centres, radii, strict=True)):
        if image_centres.shape[0] == 0:
            continue
        image_radii = image_radii.tolist()  # sync: one read of the image's radii
        channels = labels[i].tolist() if labels is not None else None  # sync: and of its labels
        for g, centre in enumerate(image_centres):
            target = out[i, int(channels[g])] if channels is not None else out[i]  # (H, W)
            reference_draw_gaussian(target, centre, int(image_radii[g]), 1.0, diameter_to_sigma)
    return out
