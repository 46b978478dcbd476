"""StreamPETR, the streaming multi-camera 3D detector, one concept per module.

In progress: the position embedding, the query-side encodings, the temporal memory and the NMS-free
decoding so far; the backbone, decoder, heads, denoising queries and the detector follow.
"""

from drivetrain.models.streampetr.embedding import MLN, SEGate, nerf_encoding, sine_embedding_1d, sine_embedding_3d
from drivetrain.models.streampetr.memory import MemoryBank
from drivetrain.models.streampetr.position import PositionEmbedding3D, inverse_sigmoid, lid_depths, token_points
from drivetrain.models.streampetr.postprocess import decode, reference_decode

__all__ = [
    "MLN",
    "MemoryBank",
    "PositionEmbedding3D",
    "SEGate",
    "decode",
    "inverse_sigmoid",
    "lid_depths",
    "nerf_encoding",
    "reference_decode",
    "sine_embedding_1d",
    "sine_embedding_3d",
    "token_points",
]
