"""The typed ``model.args`` of StreamPETR: :class:`StreamPETRArgs`, each argument declared once.

Each field is an argument of :class:`~.detector.StreamPETR` with its type, default (the published R50 704×256
config, its constants in :mod:`.recipe`) and one-line doc; a config's ``model.args`` is checked against it when
the config loads (an unknown key or a wrong type is one line naming ``model.args.KEY``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from drivetrain.models.streampetr.recipe import CLASSES, DN_SPLIT, PC_RANGE, POSITION_RANGE

__all__ = ["StreamPETRArgs"]


@dataclass(frozen=True)
class StreamPETRArgs:
    """``model.args`` of ``model.name: streampetr``: the arguments of :class:`~.detector.StreamPETR`."""

    num_classes: int = len(CLASSES)  # C: class channels, the dataset's classes
    backbone: Literal["tiny", "resnet50"] = "resnet50"  # tiny: a small conv net (CPU runs); resnet50: random init
    backbone_args: dict[str, Any] | None = None  # extra keyword arguments of the backbone (e.g. tiny's width)
    embed_dims: int = 256  # E: the transformer's width (even)
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
    pc_range: tuple[float, ...] = PC_RANGE  # detection range: reference points and box centres live in it
    dn_groups: int = 10  # denoising groups (0: no denoising)
    dn_noise_scale: float = 1.0  # denoising box noise scale
    dn_split: float = DN_SPLIT  # noise radius beyond which a denoising query is background
    with_focal_head: bool = True  # the 2D focal head and its loss
    with_cp: bool = False  # activation checkpointing of the decoder layers
    impl: Literal["batched", "reference"] = "batched"  # path of the losses and denoising queries (.loss.PATHS)
    sync_cls_avg_factor: bool = False  # average classification counts over ranks (False, as published)
    freeze_backbone: bool = False  # a fixed image encoder, so speed.encoder_overlap can run it ahead
    compile_loss: bool | dict[str, Any] = False  # both criteria's batched paths through torch.compile (or its args)
    static_targets: bool = False  # pad G, the DN queries and the 2D boxes to buckets (.static; needs impl batched)
    max_targets: int = 64  # static_targets: ground truths per sample (2D boxes per image) the largest bucket holds
    step_images: tuple[int, ...] = (6, 256, 704)  # speed.compile_step: the images' (cameras, height, width)
    step_targets: tuple[int, ...] = ()  # speed.compile_step: G buckets, some of the solver's (): all to max_targets
