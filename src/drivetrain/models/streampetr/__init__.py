"""StreamPETR, the streaming multi-camera 3D detector, one concept per module — everything specific to it.

The model: ``backbone`` (tiny conv net or ResNet-50 + CPFPN), ``position`` (the PETR 3D position embedding),
``embedding`` (query-side encodings), ``memory`` (the temporal memory bank), ``denoising`` (denoising queries),
``decoder`` (the transformer decoder), ``heads`` (class/box branches and the 2D focal head), ``box_code`` (the 3D
box code its heads regress), ``postprocess`` (NMS-free decoding) and ``detector`` (:class:`StreamPETR`, which
composes them; its arguments, each declared once, in ``args``). Its training: ``loss_3d`` (the 3D head's loss) and
``loss`` (the criteria built from ``recipe``, the published constants: classes, ranges, image normalisation, code
and loss weights, matching costs; and the reference or batched :class:`~.loss.Path`, chosen once per model); the
2D focal head's loss is model-neutral, :mod:`drivetrain.losses.focal_head`. The engine's view: ``weights`` (the
weight formats it imports) and ``spec`` (its :class:`~drivetrain.detector.spec.ModelSpec`).
"""

from drivetrain.models.streampetr.backbone import ResNet50, ResNetBackbone, TinyBackbone, build_backbone
from drivetrain.models.streampetr.decoder import Attention, Decoder, DecoderLayer
from drivetrain.models.streampetr.denoising import DNQueries, make_dn_queries, reference_make_dn_queries
from drivetrain.models.streampetr.detector import StreamPETR
from drivetrain.models.streampetr.embedding import MLN, SEGate, nerf_encoding, sine_embedding_1d, sine_embedding_3d
from drivetrain.models.streampetr.heads import FocalHead, box_codes
from drivetrain.models.streampetr.memory import MemoryBank
from drivetrain.models.streampetr.position import PositionEmbedding3D, inverse_sigmoid, lid_depths, token_points
from drivetrain.models.streampetr.postprocess import decode, reference_decode

__all__ = [
    "MLN",
    "Attention",
    "DNQueries",
    "Decoder",
    "DecoderLayer",
    "FocalHead",
    "MemoryBank",
    "PositionEmbedding3D",
    "ResNet50",
    "ResNetBackbone",
    "SEGate",
    "StreamPETR",
    "TinyBackbone",
    "box_codes",
    "build_backbone",
    "decode",
    "inverse_sigmoid",
    "lid_depths",
    "make_dn_queries",
    "nerf_encoding",
    "reference_decode",
    "reference_make_dn_queries",
    "sine_embedding_1d",
    "sine_embedding_3d",
    "token_points",
]
