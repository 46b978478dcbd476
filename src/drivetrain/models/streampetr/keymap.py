"""StreamPETR's weight formats (``model.init_from``): a torchvision ResNet-50 into its trunk, and the StreamPETR
repository's checkpoints, each map renaming the original's state dict into our names
(:mod:`drivetrain.detector.keymap`).

Each map reads a state dict in the original's parameter and buffer names and returns our model's names, with the
tensor converted where our layout differs (said at the rule that does it). The names were read from the original
module definitions at these versions:

* **torchvision ResNet-50** (``torchvision/models/resnet.py``: ``ResNet``, ``Bottleneck``): ``conv1``, ``bn1``,
  ``layer{1..4}.{i}.conv{1,2,3}`` / ``bn{1,2,3}`` / ``downsample.{0,1}``, ``fc``. mmdet's ``ResNet``
  (``mmdet/models/backbones/resnet.py``: ``Bottleneck``, ``ResLayer``, norms named by ``build_norm_layer``'s
  ``bn`` + postfix) uses the same names without ``fc``, so it maps onto :class:`~.backbone.ResNet50` as it is;
  ``fc`` (the ImageNet classifier) is ignored.
* **StreamPETR** (repository ``exiawsh/StreamPETR`` at commit 95f6470, the published
  ``projects/configs/StreamPETR/stream_petr_r50_flash_704_bs2_seq_24e.py``): ``Petr3D``
  (``projects/mmdet3d_plugin/models/detectors/petr3d.py``: ``img_backbone``, ``img_neck``, ``img_roi_head``,
  ``pts_bbox_head``; its ``GridMask`` has no parameters); ``CPFPN`` (``models/necks/cp_fpn.py``: mmcv
  ``ConvModule`` s ``lateral_convs.{i}.conv`` and ``fpn_convs.0.conv``, level 0 only); ``FocalHead``
  (``models/dense_heads/focal_head.py``, ``_init_layers``: our attribute names); ``StreamPETRHead``
  (``models/dense_heads/streampetr_head.py``, ``_init_layers`` and ``__init__``) with ``SELayer_Linear`` and
  ``MLN`` (``models/utils/misc.py``); ``PETRTemporalTransformer`` → ``PETRTransformerDecoder`` (``post_norm``) →
  ``PETRTemporalDecoderLayer`` (``models/utils/petr_transformer.py``: ``attentions``, ``ffns``, ``norms``) whose
  self-attention is mmcv's ``MultiheadAttention`` and cross-attention ``PETRMultiheadFlashAttention`` — both hold
  ``attn.in_proj_weight`` ``(3E, E)`` (q, k, v stacked, ``nn.MultiheadAttention`` / ``FlashMHA`` in
  ``models/utils/attention.py``) and ``attn.out_proj``, the layout of our packed ``in_proj`` (no conversion);
  mmcv 1.7's ``FFN`` (``mmcv/cnn/bricks/transformer.py``): ``layers.0.0`` (Linear E→F) and ``layers.1``
  (Linear F→E), our ``ffn.0`` and ``ffn.3``.

Class order: the class channels of the original's heads follow its config's ``class_names``. A checkpoint's
``meta`` names them (mmcv: ``meta.CLASSES``; mmengine: ``meta.dataset_meta.classes``); without it the published
order is assumed (:data:`.recipe.CLASSES`, which is drivetrain's). When that order differs from the model's, the
class channels of the class linear layers are permuted to the model's order (a conversion); another class set is
reported as a mismatch.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import torch
from torch import nn

from drivetrain.data.formats.nuscenes.tables import CLASSES
from drivetrain.detector.keymap import (
    CONSTANT_RTOL,
    KeyMap,
    KeyMapError,
    class_order,
    file_classes,
    permute_classes,
    rename,
    rules,
    short,
)
from drivetrain.detector.spec import WeightFormat
from drivetrain.models.streampetr import recipe
from drivetrain.models.streampetr.backbone import ResNet50
from drivetrain.models.streampetr.detector import StreamPETR

__all__ = [
    "STREAMPETR_RULES",
    "STREAMPETR_WEIGHTS",
    "TORCHVISION_RESNET50",
    "map_streampetr",
    "map_torchvision_resnet50",
]


# --------------------------------------------------------------------------------------- torchvision ResNet-50
def map_torchvision_resnet50(model: nn.Module, state: dict[str, torch.Tensor], meta: dict | None = None) -> KeyMap:
    """A torchvision ResNet-50 state dict into the model's one :class:`~.backbone.ResNet50` trunk
    (StreamPETR's ``backbone.trunk`` with ``backbone: resnet50``): the same names, ``fc.*`` ignored."""
    trunks = [name for name, module in model.named_modules() if isinstance(module, ResNet50)]
    if len(trunks) != 1:
        out = KeyMap(scope=None, unexpected=list(state))
        kind = "no ResNet-50 trunk" if not trunks else f"{len(trunks)} ResNet-50 trunks ({', '.join(trunks)})"
        out.notes.append(f"the {type(model).__name__} has {kind}; StreamPETR builds one with backbone: resnet50")
        return out
    prefix = f"{trunks[0]}." if trunks[0] else ""
    out = KeyMap(scope=prefix)
    for key, value in state.items():
        if key in ("fc.weight", "fc.bias"):
            out.ignored.append((key, "the ImageNet classifier; the trunk has none"))
        else:
            out.add(prefix + key, key, value)
    return out


# -------------------------------------------------------------------------------------------------- StreamPETR
_LAYER = r"pts_bbox_head\.transformer\.decoder\.layers\.(\d+)\."
STREAMPETR_RULES = rules(
    (r"img_backbone\.(.+)", r"backbone.trunk.\1"),  # mmdet ResNet = torchvision names
    (r"img_neck\.lateral_convs\.(\d+)\.conv\.(weight|bias)", r"backbone.neck.lateral_convs.\1.\2"),
    (r"img_neck\.fpn_convs\.0\.conv\.(weight|bias)", r"backbone.neck.fpn_conv.\1"),
    (r"img_roi_head\.(.+)", r"focal_head.\1"),
    (r"pts_bbox_head\.position_encoder\.(.+)", r"position.encoder.\1"),
    (r"pts_bbox_head\.featurized_pe\.conv_(reduce|expand)\.(weight|bias)", r"featurized_pe.\1.\2"),
    (r"pts_bbox_head\.pseudo_reference_points\.weight", "memory.pseudo_reference.weight"),
    (r"pts_bbox_head\.cls_branches\.0\.(.+)", r"cls_branch.\1"),
    (r"pts_bbox_head\.reg_branches\.0\.(.+)", r"reg_branch.\1"),
    (r"pts_bbox_head\.transformer\.decoder\.post_norm\.(weight|bias)", r"decoder.post_norm.\1"),
    (_LAYER + r"attentions\.0\.attn\.in_proj_(weight|bias)", r"decoder.layers.\1.self_attn.in_proj.\2"),
    (_LAYER + r"attentions\.0\.attn\.out_proj\.(weight|bias)", r"decoder.layers.\1.self_attn.out_proj.\2"),
    (_LAYER + r"attentions\.1\.attn\.in_proj_(weight|bias)", r"decoder.layers.\1.cross_attn.in_proj.\2"),
    (_LAYER + r"attentions\.1\.attn\.out_proj\.(weight|bias)", r"decoder.layers.\1.cross_attn.out_proj.\2"),
    (_LAYER + r"ffns\.0\.layers\.0\.0\.(weight|bias)", r"decoder.layers.\1.ffn.0.\2"),
    (_LAYER + r"ffns\.0\.layers\.1\.(weight|bias)", r"decoder.layers.\1.ffn.3.\2"),
    (_LAYER + r"norms\.(\d+)\.(weight|bias)", r"decoder.layers.\1.norms.\2.\3"),
    (
        r"pts_bbox_head\.(memory_embed|reference_points|query_embedding|spatial_alignment|time_embedding|"
        r"ego_pose_pe|ego_pose_memory)\.(.+)",
        r"\1.\2",
    ),
)
"""StreamPETR's names → ours (see the module docstring for the definitions they come from)."""

_SHARED_COPY = re.compile(r"pts_bbox_head\.(cls|reg)_branches\.([1-9]\d*)\.(.+)")
_LOSS_CONSTANTS = ("pts_bbox_head.code_weights", "pts_bbox_head.match_costs")


def _streampetr_constants(model: StreamPETR) -> dict[str, torch.Tensor]:
    """What the original keeps as frozen ``nn.Parameter`` s and we derive from the model's arguments."""
    position = model.position
    return {
        "pts_bbox_head.pc_range": torch.tensor(model.pc_range, dtype=torch.float32),
        "pts_bbox_head.position_range": torch.cat([position.range_min, position.range_min + position.range_size]),
        "pts_bbox_head.coords_d": position.depths,
    }


def map_streampetr(model: nn.Module, state: dict[str, torch.Tensor], meta: dict | None = None) -> KeyMap:
    """A StreamPETR-repository checkpoint (``Petr3D``'s ``state_dict``) into :class:`~.detector.StreamPETR`.

    Beyond :data:`STREAMPETR_RULES`: the original puts one class and one box branch object in its list once per
    layer (``_init_layers``), so ``cls_branches.{1..5}`` / ``reg_branches.{1..5}`` repeat ``.0`` — they are ignored
    when equal and mismatched otherwise; its frozen ``pc_range``, ``position_range`` and ``coords_d`` are checked
    against the model's detection range, position range and depth bins; ``code_weights`` / ``match_costs`` are
    loss constants and ignored.
    """
    if not isinstance(model, StreamPETR):
        raise KeyMapError(f"the streampetr format maps StreamPETR checkpoints; the model is a {type(model).__name__}")
    out = KeyMap(scope="")
    constants = _streampetr_constants(model)
    rest: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        copy = _SHARED_COPY.fullmatch(key)
        if copy:
            first = f"pts_bbox_head.{copy[1]}_branches.0.{copy[3]}"
            if first in state and state[first].shape == value.shape and torch.equal(state[first], value):
                out.ignored.append((key, f"the same tensor as {first}: one branch shared by every layer"))
            else:
                out.mismatched.append((key, f"differs from {first}; the model shares one branch across layers"))
        elif key in constants:
            ours = constants[key].to(value.device)
            if value.shape != ours.shape or not torch.allclose(value.float(), ours, rtol=CONSTANT_RTOL, atol=0):
                out.mismatched.append((key, f"{short(value)} in the file, {short(ours)} in the model"))
            else:
                out.ignored.append((key, "a constant of the model's arguments; it agrees"))
        elif key in _LOSS_CONSTANTS:
            out.ignored.append((key, "a loss constant, held by the criterion (drivetrain.models.streampetr.loss_3d)"))
        else:
            rest[key] = value
    rename(rest, STREAMPETR_RULES, out)
    classes_in_file = file_classes(meta) or recipe.CLASSES  # the published config's class_names
    last = len(model.cls_branch) - 1
    permute_classes(
        out,
        [f"cls_branch.{last}.weight", f"cls_branch.{last}.bias", "focal_head.cls.weight", "focal_head.cls.bias"],
        class_order(classes_in_file, CLASSES),
        "cls_branch, focal_head.cls",
    )
    return out


# ------------------------------------------------------------------------------------------------ the formats
_STREAMPETR_PREFIXES = ("img_backbone.", "img_neck.", "img_roi_head.", "pts_bbox_head.transformer.")


def _is_streampetr(names: Collection[str]) -> bool:
    return any(name.startswith(_STREAMPETR_PREFIXES) for name in names)


def _is_torchvision_resnet50(names: Collection[str]) -> bool:
    return "conv1.weight" in names and "layer1.0.conv1.weight" in names


TORCHVISION_RESNET50 = WeightFormat(
    "torchvision-resnet50",
    "a torchvision ResNet-50 state dict, into the model's ResNet-50 trunk (the published backbone initialisation)",
    _is_torchvision_resnet50,
    map_torchvision_resnet50,
)
"""``format: torchvision-resnet50``: :func:`map_torchvision_resnet50`."""

STREAMPETR_WEIGHTS = WeightFormat(
    "streampetr", "a StreamPETR-repository checkpoint (the state_dict of Petr3D)", _is_streampetr, map_streampetr
)
"""``format: streampetr``: :func:`map_streampetr`."""
