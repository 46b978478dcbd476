"""StreamPETR, the streaming multi-camera 3D detector, one concept per module (in progress: the position
embedding and the temporal memory so far; the decoder, heads and the detector follow)."""

from drivetrain.models.streampetr.memory import MemoryBank
from drivetrain.models.streampetr.position import PositionEmbedding3D, inverse_sigmoid, lid_depths, token_points

__all__ = ["MemoryBank", "PositionEmbedding3D", "inverse_sigmoid", "lid_depths", "token_points"]
