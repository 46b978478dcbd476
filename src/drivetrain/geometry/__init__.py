"""The anchor delta box coder, 2D box formats, IoU/GIoU for padded batches, BEV and rotated IoU, rotated NMS,
rigid transforms and camera projection."""

from drivetrain.geometry.bev_iou import nearest_bev_iou
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
from drivetrain.geometry.delta_coder import decode_delta_xyzwlhr, direction_target, encode_delta_xyzwlhr
from drivetrain.geometry.rotated_iou import rotated_bev_iou_aligned, rotated_bev_iou_pairwise
from drivetrain.geometry.rotated_nms import (
    batched_rotated_nms,
    multiclass_rotated_nms,
    reference_multiclass_rotated_nms,
    reference_rotated_nms,
)

__all__ = [
    "batched_rotated_nms",
    "boxes_cxcywh_to_xyxy",
    "boxes_xyxy_to_cxcywh",
    "decode_delta_xyzwlhr",
    "direction_target",
    "encode_delta_xyzwlhr",
    "giou_aligned",
    "giou_pairwise",
    "iou_aligned",
    "iou_pairwise",
    "multiclass_rotated_nms",
    "nearest_bev_iou",
    "normalize_boxes",
    "reference_multiclass_rotated_nms",
    "reference_rotated_nms",
    "rotated_bev_iou_aligned",
    "rotated_bev_iou_pairwise",
    "unnormalize_boxes",
]
