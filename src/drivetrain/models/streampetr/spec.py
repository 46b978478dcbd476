"""StreamPETR as the engine sees it: :data:`SPEC` (builder, typed ``model.args``, camera input, weight formats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drivetrain.model_spec import LossPath, ModelSpec
from drivetrain.models.streampetr.detector import StreamPETR
from drivetrain.models.streampetr.recipe import AUGMENT, CLASSES, DN_SPLIT, PC_RANGE, POSITION_RANGE
from drivetrain.models.streampetr.weights import STREAMPETR_WEIGHTS, TORCHVISION_RESNET50

__all__ = ["SPEC", "StreamPETRArgs"]


@dataclass(frozen=True)
class StreamPETRArgs:
    """``model.args`` of ``model.name: streampetr``: :class:`~.detector.StreamPETR`'s keyword arguments, with its
    defaults (the published R50 704×256 config; see its docstring for each)."""

    num_classes: int = len(CLASSES)  # C: class channels, the dataset's classes
    backbone: str = "resnet50"  # tiny (small conv net, CPU runs) or resnet50
    backbone_args: dict[str, Any] | None = None  # extra keyword arguments of the backbone (e.g. tiny's width)
    embed_dims: int = 256  # E: the transformer's width
    num_heads: int = 8  # attention heads
    ffn_dims: int = 2048  # decoder FFN hidden size
    num_layers: int = 6  # decoder layers L
    dropout: float = 0.1  # decoder dropout
    num_query: int = 644  # learned queries
    memory_len: int = 1024  # memory entries per sample
    topk: int = 256  # queries added to the memory per frame
    num_propagated: int = 256  # memory entries that become queries
    depth_num: int = 64  # depth bins of the position embedding
    depth_start: float = 1.0  # first depth bin, metres
    position_range: tuple[float, ...] = POSITION_RANGE  # metres normalised to [0, 1] by the position embedding
    pc_range: tuple[float, ...] = PC_RANGE  # detection range of reference points and box centres
    dn_groups: int = 10  # denoising groups (0: no denoising)
    dn_noise_scale: float = 1.0  # denoising box noise scale
    dn_split: float = DN_SPLIT  # noise radius beyond which a denoising query is background
    with_focal_head: bool = True  # the 2D focal head and its loss
    with_cp: bool = False  # activation checkpointing of the decoder layers
    impl: str = "batched"  # batched or reference path of the losses and denoising queries
    sync_cls_avg_factor: bool = False  # average classification counts over ranks (False, as published)
    freeze_backbone: bool = False  # a fixed image encoder (speed.encoder_overlap can run it ahead)
    compile_loss: bool | dict[str, Any] = False  # both criteria under torch.compile: true or its keyword arguments


IMPL = LossPath("impl", reference="reference", batched="batched")
"""``model.args.impl``: the loss path (``drivetrain doctor`` advises the batched one)."""

SPEC = ModelSpec(
    "streampetr",
    build=StreamPETR,
    args=StreamPETRArgs,
    modalities=frozenset({"camera"}),
    summary="StreamPETR camera 3D detector",
    weight_formats=(TORCHVISION_RESNET50, STREAMPETR_WEIGHTS),
    augment=AUGMENT,
    loss_path=IMPL,
)
"""The registry's entry for ``model.name: streampetr``."""
