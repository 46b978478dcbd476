"""Moving and preparing batches for the model: host→device transfer (more to come: stream prefetch, GPU
augmentation, voxelization, the DALI loader)."""

from drivetrain.pipeline.transfer import to_device

__all__ = ["to_device"]
