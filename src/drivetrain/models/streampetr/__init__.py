"""StreamPETR, the streaming multi-camera 3D detector, one concept per module (in progress: the position
embedding, the query-side encodings and the temporal memory so far; the decoder, heads and the detector
follow)."""

from drivetrain.models.streampetr.embedding import MLN, SEGate, nerf_encoding, sine_embedding_1d, sine_embedding_3d
from drivetrain.models.streampetr.memory import MemoryBank
from drivetrain.models.streampetr.position import PositionEmbedding3D, inverse_sigmoid, lid_depths, token_points

__all__ = [
    "MLN",
    "MemoryBank",
    "PositionEmbedding3D",
    "SEGate",
    "inverse_sigmoid",
    "lid_depths",
    "nerf_encoding",
    "sine_embedding_1d",
    "sine_embedding_3d",
    "token_points",
]
