"""Box encodings, 2D box formats, IoU/GIoU for padded batches, rigid transforms and camera projection."""

from drivetrain.geometry.boxes2d import (
    boxes_cxcywh_to_xyxy,
    boxes_xyxy_to_cxcywh,
    giou_aligned,
    giou_pairwise,
    iou_aligned,
    iou_pairwise,
    normalize_boxes,
    unnormalize_boxes,
)
from drivetrain.geometry.boxes3d import CODE_WEIGHTS, decode_boxes_streampetr, encode_boxes_streampetr

__all__ = [
    "CODE_WEIGHTS",
    "boxes_cxcywh_to_xyxy",
    "boxes_xyxy_to_cxcywh",
    "decode_boxes_streampetr",
    "encode_boxes_streampetr",
    "giou_aligned",
    "giou_pairwise",
    "iou_aligned",
    "iou_pairwise",
    "normalize_boxes",
    "unnormalize_boxes",
]
