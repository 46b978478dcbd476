"""The published constants of StreamPETR: classes and their order, image normalisation, the detection, position
and decoding ranges, code weights, loss weights and matching costs of the 3D head (the 2D focal head's, which the
2D focal detector shares, are in :mod:`drivetrain.losses.focal_head`).

Each is cited from the published config of the StreamPETR repository (``exiawsh/StreamPETR`` at commit 95f6470),
``projects/configs/StreamPETR/stream_petr_r50_flash_704_bs2_seq_24e.py``. The 3D head's loss
(:class:`~.loss_3d.StreamPETRLoss`) and the generic Hungarian assigners of :mod:`drivetrain.match.assigners` take
these as required arguments and default to none of them; :mod:`.loss` builds them from this module, for
:class:`~.detector.StreamPETR` and users' own training code. The train pipeline's camera
augmentation (:data:`CAMERA_AUG`, :data:`AUGMENT`) is here too: the spec offers it as the model's recipe, which the
``data.augment`` sections of a config fill the fields they leave out from. This module holds data only.
"""

from __future__ import annotations

from drivetrain.pipeline.augment.bev import BevAugConfig
from drivetrain.pipeline.augment.camera import CameraAugConfig
from drivetrain.pipeline.augment.image_ops import ImageAugConfig
from drivetrain.pipeline.augment.stage import AugmentConfig

__all__ = [
    "AUGMENT",
    "BEV_AUG",
    "CAMERA_AUG",
    "CLASSES",
    "CODE_WEIGHTS",
    "DN_SPLIT",
    "IMAGE_AUG",
    "LOSS_WEIGHTS",
    "MATCH_COSTS",
    "MAX_NUM",
    "MEAN",
    "PC_RANGE",
    "POSITION_RANGE",
    "POST_CENTER_RANGE",
    "SIZE_DIVISOR",
    "STD",
    "STRIDE",
]

# ------------------------------------------------------------------------------------------------ classes
CLASSES = (
    "car", "truck", "construction_vehicle", "bus", "trailer",
    "barrier", "motorcycle", "bicycle", "pedestrian", "traffic_cone",
)  # fmt: skip
"""The config's ``class_names``: the nuScenes devkit's order, which is that of drivetrain's nuScenes labels, so the
model's class channels index the dataset's labels directly."""

# ------------------------------------------------------------------------------------------------- images
MEAN = (123.675, 116.28, 103.53)
"""``img_norm_cfg.mean``: ImageNet statistics in 0..255 RGB (``to_rgb=True``)."""

STD = (58.395, 57.12, 57.375)
"""``img_norm_cfg.std``."""

SIZE_DIVISOR = 32
"""``PadMultiViewImage(size_divisor=32)``: images are padded at the bottom/right to a multiple of this."""

STRIDE = 16
"""The stride of the feature level the heads read (CPFPN's first output, C4 of ``out_indices=(2, 3)``): the
``stride=16`` default of ``FocalHead`` and ``StreamPETRHead``, which the config leaves as is."""

# ------------------------------------------------------------------------------------------------- ranges
PC_RANGE = (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0)
"""``point_cloud_range``: the detection range, metres; reference points and box centres are normalised by it."""

POSITION_RANGE = (-61.2, -61.2, -10.0, 61.2, 61.2, 10.0)
"""``pts_bbox_head.position_range``: metres the 3D position embedding normalises to ``[0, 1]``."""

POST_CENTER_RANGE = (-61.2, -61.2, -10.0, 61.2, 61.2, 10.0)
"""``bbox_coder.post_center_range`` (``NMSFreeCoder``): a decoded box is kept when its centre lies in it."""

MAX_NUM = 300
"""``bbox_coder.max_num``: detections decoded per sample (top (query, class) scores, no NMS)."""

# ----------------------------------------------------------------------------------------------- 3D head
CODE_WEIGHTS = (2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
"""``pts_bbox_head.code_weights`` of the 10-dim box code ``(x, y, z, ln dx, ln dy, ln dz, sin, cos, vx, vy)``, in
the L1 loss and in the matching cost (its first 8 dims: ``match_with_velo=False``)."""

LOSS_WEIGHTS = {"loss_cls": 2.0, "loss_bbox": 0.25}
"""``loss_weight`` of ``loss_cls`` (sigmoid focal, α 0.25, γ 2) and ``loss_bbox`` (L1); ``loss_iou`` is 0 and not
computed. The denoising terms take the same weights (``dn_weight=1.0``)."""

MATCH_COSTS = {"cls_weight": 2.0, "reg_weight": 0.25}
"""``train_cfg.pts.assigner`` (``HungarianAssigner3D``): ``cls_cost`` (focal) and ``reg_cost`` (code-weighted L1)
weights; its ``iou_cost`` weight is 0."""

DN_SPLIT = 0.75
"""``pts_bbox_head.split``: the noise radius beyond which a denoising query is background (its label), and the
radius of the ball the denoising classification term is normalised by."""


# ------------------------------------------------------------------------------------------- augmentation
IMAGE_AUG = ImageAugConfig(
    source_size=(1600, 900), final_size=(704, 256), resize_lim=(0.38, 0.55), bot_pct_lim=(0.0, 0.0),
    rot_lim=(0.0, 0.0), rand_flip=True,
)  # fmt: skip
"""``ida_aug_conf`` of ``ResizeCropFlipRotImage``: nuScenes' 1600×900 images, resized by U(0.38, 0.55), the bottom
704×256 crop, flipped with probability 0.5, no rotation."""

BEV_AUG = BevAugConfig(
    rot_range=(-0.3925, 0.3925), scale_range=(0.95, 1.05), translation_std=(0.0, 0.0, 0.0),
    flip_horizontal=0.0, flip_vertical=0.0, point_range=None, object_range=None, shuffle=False,
)  # fmt: skip
"""``GlobalRotScaleTransImage`` (``reverse_angle=True``): rotation ±0.3925 rad, scale 0.95–1.05, no translation or
flip; no point or object range filter follows it (``ObjectRangeFilter`` runs before it)."""

CAMERA_AUG = CameraAugConfig(
    image=IMAGE_AUG, bev=BEV_AUG, photometric=None, normalize=True, mean=MEAN, std=STD, filter_invisible=True
)
"""The train pipeline's camera augmentation: ``ResizeCropFlipRotImage`` (with the invisible-box filter),
``GlobalRotScaleTransImage``, ``NormalizeMultiviewImage``; PETR's photometric distortion is off."""

AUGMENT = AugmentConfig(camera=CAMERA_AUG)
"""The model's training augmentation (``data.augment``: the camera section; no lidar section)."""
