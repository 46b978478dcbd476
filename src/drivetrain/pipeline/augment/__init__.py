"""The training augmentation, one module per part:

- :mod:`.stage` — the one stage the trainer runs for camera and lidar (:class:`Augmentation`, ``data.augment``):
  draws each batch's parameters, applies them on the device or per sample in the loader workers;
- :mod:`.camera` — the camera recipe for a whole batch (``data.augment.camera``: image ops, BEV step,
  photometric distortion, normalisation) and its per-sample reference;
- :mod:`.image_ops` — the camera image operations: the resize/crop/flip/rotation matrix, the warp, the camera
  matrices, the 2D boxes and the invisible-box filter;
- :mod:`.bev` — the BEV augmentation of points and 3D boxes (``data.augment.lidar``, and the camera's BEV step);
- :mod:`.photometric` — photometric distortion and normalisation of camera images.
"""

from drivetrain.pipeline.augment.stage import Augmentation, AugmentConfig, AugmentParams

__all__ = ["AugmentConfig", "AugmentParams", "Augmentation"]
