"""StreamPETR's denoising (DN) queries: noised ground-truth centres as extra decoder queries, and the
self-attention mask that keeps them from leaking the answer to the matching queries.

Every ground truth of the batch (``T = Σ_b M_b`` in all) is repeated in ``groups`` groups. Its centre ``c``
(gravity centre, metres) moves by ``r ⊙ (dx, dy, dz) / 2 · noise_scale`` with ``r ~ U(−1, 1)³`` (one draw
of shape ``(groups·T, 3)``, group-major, the samples' ground truths concatenated within a group), is
normalised by ``pc_range`` and clamped to ``[0, 1]``; its label becomes background (``num_classes``) where
``‖r‖₂ > split``. With ``S = max_b M_b`` the batch gets ``P = groups·S`` DN queries per sample: ground truth
``i`` of sample ``b`` in group ``g`` is row ``g·S + i``; rows with ``i ≥ M_b`` are padding (reference point
0, background). The decoder's self-attention runs over ``P + num_query + num_propagated`` query rows and
``P + num_query + memory_len`` key columns; the mask blocks the DN columns for every matching and propagated
row, and, for a DN row of group ``g``, the DN columns of every other group. Everything else is visible
(matching, propagated and memory columns, and the padding rows of a DN row's own group).

:func:`reference_make_dn_queries` mirrors ``StreamPETRHead.prepare_for_dn`` of StreamPETR
(``projects/mmdet3d_plugin/models/dense_heads/streampetr_head.py``): the concatenated ground truths, the
per-sample index lists and the loop over groups for the mask. :func:`make_dn_queries` builds the same
tensors at once, with a single host sync (``S`` and ``T`` are shapes). :func:`make_static_dn_queries` (the static
path, :mod:`.static`) takes ``S'``, the bucket the ground truth is padded to, as rows per group, with no host
read: the rows past ``S`` are padding that no other query sees and that sees only itself. Deviations of both, each for a
stated reason:

- the gravity centre is the box code's ``z`` already (our boxes carry it), not read from an mmdet3d box;
- they return the DN part only (the caller prepends it to the learned reference points) and a
  ``background`` flag per DN query instead of ``mask_dict``: :class:`~.loss_3d.StreamPETRLoss`
  reads the targets from the ground truth at row ``g·S + i`` itself;
- ``groups`` is used as given: the original computes ``min(scalar, num_query // max_b M_b)`` and never uses
  it (and that line divides by zero when the batch has no ground truth);
- no ground truth in the batch, or ``groups = 0``, gives ``P = 0`` and ``attn_mask = None``: the original
  raises ``ZeroDivisionError`` on the first, and its all-False mask on the second blocks nothing;
- ``noise_scale`` must be positive: the original skips normalisation and clamping when it is 0 and would
  feed centres in metres to the decoder; ``noise_trans`` (0 in the published configs) is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from drivetrain.constants import constant
from drivetrain.ragged import RaggedBatch

__all__ = ["DNQueries", "make_dn_queries", "make_static_dn_queries", "padded_noise", "reference_make_dn_queries"]


@dataclass(frozen=True)
class DNQueries:
    """The DN queries of a batch (see the module docstring).

    Attributes:
        reference: ``(B, P, 3)`` float32 reference points in ``[0, 1]``; padding rows are 0.
        background: ``(B, P)`` bool: the noise left the ``split`` ball, or the row is padding (``i ≥ M_b``).
        labels: ``(B, P)`` int64 noised labels, ``num_classes`` where ``background``.
        groups: number of DN groups.
        single_pad: ``S = max_b M_b``, rows per group; ``P = groups·S``.
        attn_mask: ``(P + num_query + num_propagated, P + num_query + memory_len)`` bool, True = may not
            attend (``nn.MultiheadAttention``'s convention); None when ``P == 0``.
    """

    reference: torch.Tensor
    background: torch.Tensor
    labels: torch.Tensor
    groups: int
    single_pad: int
    attn_mask: torch.Tensor | None


def make_dn_queries(
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    *,
    groups: int,
    noise_scale: float,
    split: float,
    pc_range: tuple[float, ...],
    num_classes: int,
    num_query: int,
    num_propagated: int,
    memory_len: int,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> DNQueries:
    """DN queries and attention mask of the whole batch at once; one host sync (reads ``S`` and ``T``).

    Args:
        gt_boxes: RaggedBatch ``(B, G, 9)`` float32 ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)``, metres.
        gt_labels: RaggedBatch ``(B, G)`` int64 class indices in ``[0, num_classes)``, sizes as ``gt_boxes``.
        groups: DN groups (the original's ``scalar``, 10); 0 disables DN.
        noise_scale: centre noise in half box sizes (1.0); must be positive.
        split: noise radius beyond which the label becomes background (0.75).
        pc_range: ``(x_min, y_min, z_min, x_max, y_max, z_max)`` metres the centres are normalised by.
        num_classes: ``C``; the background label.
        num_query: learned (matching) queries (644).
        num_propagated: queries propagated from the memory, after the matching ones (256).
        memory_len: memory entries, the key columns after the matching ones (1024; includes the propagated).
        noise: ``(groups·T, 3)`` float32 ``r`` in the original's row order, or None to draw it.
        generator: draws ``r`` when ``noise`` is None (on ``gt_boxes``' device).

    Returns:
        :class:`DNQueries` with ``P = groups·S`` rows per sample.

    Example:
        >>> dn = make_dn_queries(gt_boxes, gt_labels, groups=10, noise_scale=1.0, split=0.75,
        ...                      pc_range=PC_RANGE, num_classes=10, num_query=644, num_propagated=256,
        ...                      memory_len=1024)
        >>> reference = torch.cat([dn.reference, learned.expand(B, -1, -1)], dim=1)  # (B, P + Q, 3)
    """
    _check(gt_boxes, gt_labels, groups, noise_scale, split, pc_range, num_query, num_propagated, memory_len)
    boxes, sizes = gt_boxes.tensor.float(), gt_boxes.sizes  # (B, G, 9), (B,)
    batch, device = boxes.shape[0], boxes.device
    # sync: P = groups·S and the draw's groups·T rows are shapes (the original reads them on the host too)
    total, single_pad = torch.stack([sizes.sum(), sizes.max()]).tolist()
    noise = _noise(noise, groups * total, boxes, generator)  # (groups·T, 3)
    if groups == 0 or total == 0:
        return _empty(batch, groups, single_pad, device)
    s, p = single_pad, groups * single_pad
    index = torch.arange(s, device=device)  # (S,)
    exists = (index < sizes.unsqueeze(1)).unsqueeze(1)  # (B, 1, S)
    first = (sizes.cumsum(0) - sizes).view(batch, 1, 1)  # (B, 1, 1): sample b's first row among the T
    group = torch.arange(groups, device=device).view(1, groups, 1)  # (1, groups, 1)
    rows = torch.where(exists, group * total + first + index, 0)  # (B, groups, S): row of r; padding reads 0
    r = noise[rows]  # (B, groups, S, 3)
    centre, half = boxes[:, None, :s, :3], boxes[:, None, :s, 3:6] / 2  # (B, 1, S, 3), (B, 1, S, 3)
    noised = centre + (r * half) * noise_scale  # (B, groups, S, 3) metres
    low = constant(pc_range[:3], dtype=torch.float32, device=device)  # (3,)
    high = constant(pc_range[3:], dtype=torch.float32, device=device)  # (3,)
    normalised = ((noised - low) / (high - low)).clamp(min=0.0, max=1.0)  # (B, groups, S, 3)
    reference = torch.where(exists.unsqueeze(-1), normalised, 0.0).reshape(batch, p, 3)  # (B, P, 3)
    outside = torch.norm(noise, 2, 1) > split  # (groups·T,)
    background = (outside[rows] | ~exists).reshape(batch, p)  # (B, P)
    gt_label = gt_labels.tensor[:, :s].long().unsqueeze(1).expand(batch, groups, s).reshape(batch, p)  # (B, P)
    labels = torch.where(background, num_classes, gt_label)  # (B, P)
    rows_n, cols_n = p + num_query + num_propagated, p + num_query + memory_len
    position = torch.arange(max(rows_n, cols_n), device=device)  # (K,)
    group_of = torch.div(position, s, rounding_mode="floor").clamp(max=groups)  # (K,): `groups` = not DN
    row, col = group_of[:rows_n], group_of[:cols_n]  # (P+Q+Np,), (P+Q+M,)
    attn_mask = (col < groups).unsqueeze(0) & (row.unsqueeze(1) != col.unsqueeze(0))  # (P+Q+Np, P+Q+M)
    return DNQueries(reference, background, labels, groups, single_pad, attn_mask)


def make_static_dn_queries(
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    *,
    groups: int,
    noise_scale: float,
    split: float,
    pc_range: tuple[float, ...],
    num_classes: int,
    num_query: int,
    num_propagated: int,
    memory_len: int,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> DNQueries:
    """DN queries of a batch padded to a bucket (:mod:`.static`): ``S'`` = the padded length of ``gt_boxes`` rows
    per group, no host read.

    Row ``g·S' + i`` of sample ``b`` denoises ground truth ``i`` while ``i < M_b``; the rows with
    ``M_b ≤ i < S`` (``S = max_b M_b``, a device value) are the eager layout's padding and stay visible to their
    group as there; the rows with ``i ≥ S`` are the bucket's padding: no query may attend to them and each
    attends to itself only (a row that sees nothing would give NaN), and they are background past every sample's
    count, so the loss leaves them out. The queries and mask of every real row are those of
    :func:`make_dn_queries` given the same ``r`` (:func:`padded_noise`).

    Args:
        gt_boxes: RaggedBatch ``(B, S', 9)`` as :func:`make_dn_queries`', padded to the bucket ``S'``
            (:func:`~.static.pad_targets`).
        gt_labels: RaggedBatch ``(B, S')``, sizes as ``gt_boxes``.
        groups: DN groups; 0 disables DN.
        noise_scale: centre noise in half box sizes; must be positive.
        split: noise radius beyond which the label becomes background.
        pc_range: ``(x_min, y_min, z_min, x_max, y_max, z_max)`` metres the centres are normalised by.
        num_classes: ``C``; the background label.
        num_query: learned (matching) queries.
        num_propagated: queries propagated from the memory, after the matching ones.
        memory_len: memory entries, the key columns after the matching ones.
        noise: ``(B, groups, S', 3)`` float32 ``r`` in this layout, or None to draw it.
        generator: draws ``r`` when ``noise`` is None.

    Returns:
        :class:`DNQueries` with ``P' = groups·S'`` rows per sample and ``single_pad = S'``.
    """
    _check(gt_boxes, gt_labels, groups, noise_scale, split, pc_range, num_query, num_propagated, memory_len)
    boxes, sizes = gt_boxes.tensor.float(), gt_boxes.sizes  # (B, S', 9), (B,)
    batch, s, device = boxes.shape[0], boxes.shape[1], boxes.device
    if groups == 0 or s == 0:
        return _empty(batch, groups, s, device)
    p = groups * s
    if noise is None:
        noise = torch.rand((batch, groups, s, 3), generator=generator, dtype=torch.float32, device=device) * 2 - 1.0
    elif tuple(noise.shape) != (batch, groups, s, 3):
        raise ValueError(f"noise: expected (B, groups, S', 3) = {(batch, groups, s, 3)}, got {tuple(noise.shape)}")
    noise = noise.to(device=device, dtype=torch.float32)  # (B, groups, S', 3)
    index = torch.arange(s, device=device)  # (S',)
    exists = (index < sizes.unsqueeze(1)).unsqueeze(1)  # (B, 1, S')
    centre, half = boxes[:, None, :, :3], boxes[:, None, :, 3:6] / 2  # (B, 1, S', 3), (B, 1, S', 3)
    noised = centre + (noise * half) * noise_scale  # (B, groups, S', 3) metres
    low = constant(pc_range[:3], dtype=torch.float32, device=device)  # (3,)
    high = constant(pc_range[3:], dtype=torch.float32, device=device)  # (3,)
    normalised = ((noised - low) / (high - low)).clamp(min=0.0, max=1.0)  # (B, groups, S', 3)
    reference = torch.where(exists.unsqueeze(-1), normalised, 0.0).reshape(batch, p, 3)  # (B, P', 3)
    outside = torch.norm(noise, 2, -1) > split  # (B, groups, S')
    background = (outside | ~exists).reshape(batch, p)  # (B, P')
    gt_label = gt_labels.tensor[:, :s].long().unsqueeze(1).expand(batch, groups, s).reshape(batch, p)  # (B, P')
    labels = torch.where(background, num_classes, gt_label)  # (B, P')
    rows_n, cols_n = p + num_query + num_propagated, p + num_query + memory_len
    position = torch.arange(max(rows_n, cols_n), device=device)  # (K,)
    group_of = torch.div(position, s, rounding_mode="floor").clamp(max=groups)  # (K,): `groups` = not DN
    padding = (position < p) & (position % s >= sizes.max())  # (K,): the bucket's rows, past S
    row, col = group_of[:rows_n], group_of[:cols_n]  # (P'+Q+Np,), (P'+Q+M,)
    blocked = (col < groups).unsqueeze(0) & (row.unsqueeze(1) != col.unsqueeze(0))  # the eager mask
    blocked = blocked | padding[:cols_n].unsqueeze(0) | padding[:rows_n].unsqueeze(1)  # (P'+Q+Np, P'+Q+M)
    itself = position[:rows_n].unsqueeze(1) == position[:cols_n].unsqueeze(0)  # (P'+Q+Np, P'+Q+M)
    attn_mask = blocked & ~(itself & padding[:rows_n].unsqueeze(1))  # a padding row sees itself only
    return DNQueries(reference, background, labels, groups, s, attn_mask)


def padded_noise(noise: torch.Tensor, sizes: list[int], groups: int, length: int) -> torch.Tensor:
    """An eager draw ``r`` ``(groups·T, 3)`` (:func:`make_dn_queries`' row order) at the static layout
    ``(B, groups, length, 3)`` of :func:`make_static_dn_queries`, zeros in the padding rows: the same noise for
    both paths (the equality tests).

    Args:
        noise: ``(groups·T, 3)``, ``T = Σ sizes``.
        sizes: ``M_b`` per sample (host ints).
        groups: DN groups.
        length: ``S'``, the bucket (≥ every size).
    """
    total = sum(sizes)
    if tuple(noise.shape) != (groups * total, 3) or max(sizes, default=0) > length:
        raise ValueError(f"noise: expected ({groups * total}, 3) for sizes {sizes} within {length}")
    out = noise.new_zeros(len(sizes), groups, length, 3)  # (B, groups, S', 3)
    first = 0
    for b, m in enumerate(sizes):
        for g in range(groups):
            out[b, g, :m] = noise[g * total + first : g * total + first + m]
        first += m
    return out


def reference_make_dn_queries(
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    *,
    groups: int,
    noise_scale: float,
    split: float,
    pc_range: tuple[float, ...],
    num_classes: int,
    num_query: int,
    num_propagated: int,
    memory_len: int,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> DNQueries:
    """The original's ``prepare_for_dn``, step by step (arguments and result as :func:`make_dn_queries`)."""
    _check(gt_boxes, gt_labels, groups, noise_scale, split, pc_range, num_query, num_propagated, memory_len)
    device, batch = gt_boxes.device, gt_boxes.batch_shape[0]
    known_num = gt_boxes.sizes.tolist()
    targets = [gt_boxes.tensor[b, :m].float() for b, m in enumerate(known_num)]  # [(M_b, 9)]
    labels = torch.cat([gt_labels.tensor[b, :m].long() for b, m in enumerate(known_num)])  # (T,)
    boxes = torch.cat(targets)  # (T, 9)
    batch_idx = torch.cat([torch.full((m,), b, device=device) for b, m in enumerate(known_num)])  # (T,)
    known_labels = labels.repeat(groups, 1).view(-1)  # (groups·T,)
    known_bid = batch_idx.repeat(groups, 1).view(-1)  # (groups·T,)
    known_boxes = boxes.repeat(groups, 1)  # (groups·T, 9)
    rand = _noise(noise, known_boxes.shape[0], known_boxes, generator)  # (groups·T, 3)
    single_pad = max(known_num)
    if groups == 0 or single_pad == 0:
        return _empty(batch, groups, single_pad, device)
    centre = known_boxes[:, :3] + (rand * (known_boxes[:, 3:6] / 2)) * noise_scale  # (groups·T, 3)
    pc = torch.tensor(pc_range, dtype=torch.float32, device=device)  # (6,)
    centre = ((centre - pc[0:3]) / (pc[3:6] - pc[0:3])).clamp(min=0.0, max=1.0)  # (groups·T, 3)
    outside = torch.norm(rand, 2, 1) > split  # (groups·T,)
    known_labels[outside] = num_classes
    pad_size = single_pad * groups
    map_known = torch.cat([torch.arange(m) for m in known_num])  # (T,): index within the sample
    map_known = torch.cat([map_known + single_pad * g for g in range(groups)]).to(device)  # (groups·T,)
    reference = torch.zeros(batch, pad_size, 3, device=device)  # (B, P, 3)
    reference[(known_bid, map_known)] = centre
    out_labels = torch.full((batch, pad_size), num_classes, dtype=torch.int64, device=device)  # (B, P)
    out_labels[(known_bid, map_known)] = known_labels
    background = torch.ones(batch, pad_size, dtype=torch.bool, device=device)  # (B, P)
    background[(known_bid, map_known)] = outside
    attn_mask = torch.zeros(pad_size + num_query, pad_size + num_query, dtype=torch.bool, device=device)
    attn_mask[pad_size:, :pad_size] = True  # matching queries cannot see the DN queries
    for g in range(groups):  # a DN group cannot see the others
        attn_mask[single_pad * g : single_pad * (g + 1), single_pad * (g + 1) : pad_size] = True
        attn_mask[single_pad * g : single_pad * (g + 1), : single_pad * g] = True
    temporal = torch.zeros(
        pad_size + num_query + num_propagated, pad_size + num_query + memory_len, dtype=torch.bool, device=device
    )  # (P+Q+Np, P+Q+M)
    temporal[: attn_mask.shape[0], : attn_mask.shape[1]] = attn_mask
    temporal[pad_size:, :pad_size] = True  # nor can the propagated ones
    return DNQueries(reference, background, out_labels, groups, single_pad, temporal)


def _check(
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    groups: int,
    noise_scale: float,
    split: float,
    pc_range: tuple[float, ...],
    num_query: int,
    num_propagated: int,
    memory_len: int,
) -> None:
    if gt_boxes.num_batch_dims != 1 or gt_boxes.tensor.dim() != 3 or gt_boxes.tensor.shape[-1] < 6:
        raise ValueError(f"gt_boxes: expected a RaggedBatch (B, G, 9), got {tuple(gt_boxes.shape)}")
    if gt_labels.num_batch_dims != 1 or gt_labels.tensor.dim() != 2 or gt_labels.batch_shape != gt_boxes.batch_shape:
        raise ValueError(
            f"gt_labels: expected a RaggedBatch (B, G) with B = {gt_boxes.batch_shape[0]} as gt_boxes, got "
            f"{tuple(gt_labels.shape)}"
        )
    if gt_boxes.batch_shape[0] == 0:
        raise ValueError("gt_boxes: the batch has no samples")
    if groups < 0 or not noise_scale > 0 or not split > 0:
        raise ValueError(f"need groups ≥ 0, noise_scale > 0, split > 0; got {groups}, {noise_scale}, {split}")
    if len(pc_range) != 6 or not all(hi > lo for lo, hi in zip(pc_range[:3], pc_range[3:], strict=True)):
        raise ValueError(f"pc_range: expected (x_min, y_min, z_min, x_max, y_max, z_max), got {pc_range}")
    if num_query < 0 or not 0 <= num_propagated <= memory_len:
        raise ValueError(
            f"need num_query ≥ 0 and 0 ≤ num_propagated ≤ memory_len; got {num_query}, {num_propagated}, {memory_len}"
        )


def _noise(
    noise: torch.Tensor | None, rows: int, like: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """The given ``r`` after a shape check, or a fresh ``U(−1, 1)`` draw ``(rows, 3)`` on ``like``'s device."""
    if noise is None:
        return torch.rand((rows, 3), generator=generator, dtype=torch.float32, device=like.device) * 2 - 1.0
    if tuple(noise.shape) != (rows, 3):
        raise ValueError(f"noise: expected (groups·T, 3) = ({rows}, 3), got {tuple(noise.shape)}")
    return noise.to(device=like.device, dtype=torch.float32)


def _empty(batch: int, groups: int, single_pad: int, device: torch.device) -> DNQueries:
    """No DN queries (``P = 0``): empty tensors and no mask."""
    return DNQueries(
        reference=torch.zeros(batch, 0, 3, device=device),
        background=torch.zeros(batch, 0, dtype=torch.bool, device=device),
        labels=torch.zeros(batch, 0, dtype=torch.int64, device=device),
        groups=groups,
        single_pad=single_pad,
        attn_mask=None,
    )
