"""The mmdetection3d PointPillars / SSN checkpoints' key map (``model.init_from`` format ``mmdet3d``).

:func:`map_mmdet3d` reads a state dict in the original's parameter and buffer names and returns our model's names
(the shared record and rules: :mod:`drivetrain.detector.keymap`). The names were read from the original module
definitions of **mmdetection3d** v1.4.0 (the attribute names are the same in v0.17.3): ``HardVFE`` / ``VFELayer``
(``mmdet3d/models/voxel_encoders/voxel_encoder.py``, ``utils.py``: ``vfe_layers.{i}.linear`` / ``.norm``);
``PointPillarsScatter`` (``middle_encoders/pillar_scatter.py``, no parameters); ``SECOND``
(``backbones/second.py``: ``blocks.{i}`` = Sequential of conv, BN, ReLU, ...: our indices); ``SECONDFPN``
(``necks/second_fpn.py``: ``deblocks.{i}.{0,1}``); ``Anchor3DHead`` (``dense_heads/anchor3d_head.py``:
``conv_cls``, ``conv_reg``, ``conv_dir_cls``); SSN's ``ShapeAwareHead`` (``dense_heads/shape_aware_head.py``:
``heads.{t}`` = ``BaseShapeHead`` with ``shared_conv.{k}`` mmcv ``ConvModule`` s ``.conv`` / ``.bn``, our
``shared_conv.{3k}`` / ``.{3k+1}``). The nuScenes models (``MVXFasterRCNN``, ``configs/_base_/models/
pointpillars_hv_fpn_nus.py``, ``configs/pointpillars/pointpillars_hv_secfpn_sbn-all_8xb4-2x_nus-3d.py``,
``configs/ssn/ssn_hv_secfpn_sbn-all_16xb2-2x_nus-3d.py``) prefix them with ``pts_``; ``VoxelNet`` (KITTI)
does not; both are read.

Class order: the class channels of the original's heads follow its config's ``class_names``. A checkpoint's
``meta`` names them (mmdet3d 0.x / mmcv: ``meta.CLASSES``; mmengine: ``meta.dataset_meta.classes``); without it
the published order is assumed (mmdetection3d's ``configs/_base_/datasets/nus-3d.py`` for PointPillars, the SSN
config's own — both in :mod:`.recipe`). When that order differs from the model's, the class channels of the class
convolutions are permuted to the model's order (a conversion); another class set is reported as a mismatch.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from drivetrain.detector.keymap import (
    KeyMap,
    KeyMapError,
    Rule,
    class_order,
    file_classes,
    permute_classes,
    rename,
    rules,
)
from drivetrain.models.pointpillars.model import PointPillars
from drivetrain.models.pointpillars.recipe import PP_NUS_CLASSES, SSN_NUS_CLASSES

__all__ = ["map_mmdet3d"]


def _mmdet3d_rules(prefix: str) -> tuple[Rule, ...]:
    p = re.escape(prefix)
    return rules(
        (p + r"voxel_encoder\.vfe_layers\.(\d+)\.(linear|norm)\.(.+)", r"vfe.layers.\1.\2.\3"),
        (p + r"backbone\.blocks\.(\d+)\.(\d+)\.(.+)", r"backbone.blocks.\1.\2.\3"),
        (p + r"neck\.deblocks\.(\d+)\.([01])\.(.+)", r"neck.blocks.\1.\2.\3"),
        (p + r"bbox_head\.(conv_cls|conv_reg|conv_dir_cls)\.(weight|bias)", r"head.\1.\2"),
        # ConvModule k of a BaseShapeHead (.conv, .bn) → our flat Sequential [conv, BN, ReLU] × n
        (
            p + r"bbox_head\.heads\.(\d+)\.shared_conv\.(\d+)\.conv\.weight",
            lambda m: f"head.heads.{m[1]}.shared_conv.{3 * int(m[2])}.weight",
        ),
        (
            p + r"bbox_head\.heads\.(\d+)\.shared_conv\.(\d+)\.bn\.(.+)",
            lambda m: f"head.heads.{m[1]}.shared_conv.{3 * int(m[2]) + 1}.{m[3]}",
        ),
        (p + r"bbox_head\.heads\.(\d+)\.(conv_cls|conv_reg|conv_dir_cls)\.(weight|bias)", r"head.heads.\1.\2.\3"),
    )


def map_mmdet3d(model: nn.Module, state: dict[str, torch.Tensor], meta: dict | None = None) -> KeyMap:
    """An mmdetection3d PointPillars or SSN checkpoint (``pts_`` prefixed or not) into :class:`~.model.PointPillars` /
    :class:`~.model.SSN`; the class channels of ``conv_cls`` are reordered to the model's
    classes (published PointPillars: ``nus-3d.py``'s order, our default is the nuScenes devkit's)."""
    if not isinstance(model, PointPillars):
        raise KeyMapError(
            f"the mmdet3d format maps PointPillars and SSN checkpoints; the model is a {type(model).__name__}"
        )
    prefix = "pts_" if any(key.startswith("pts_") for key in state) else ""
    out = KeyMap(scope="")
    rename(state, _mmdet3d_rules(prefix), out)
    published = SSN_NUS_CLASSES if model.tasks is not None else PP_NUS_CLASSES
    classes_in_file = file_classes(meta)
    if classes_in_file is None:
        if sorted(published) == sorted(model.class_names):
            classes_in_file = published
        else:  # a class set of no published nuScenes config: nothing to go by but the model's own order
            classes_in_file = tuple(model.class_names)
            out.notes.append("the file names no classes; its class channels are taken in the model's class order")
    own = model.state_dict().keys()
    names = [n for n in out.tensors if n in own and re.fullmatch(r"head\.(heads\.\d+\.)?conv_cls\.(weight|bias)", n)]
    permute_classes(out, names, class_order(classes_in_file, model.class_names), "conv_cls")
    return out
