"""The small synthetic dataset the data tests share (generated once per session by the conftest fixture)."""

from __future__ import annotations

# A small synthetic nuScenes-format dataset, generated once per session: 2 mini_train + the 2 mini_val
# scenes × 3 key frames, 160×90 images, a 16-beam lidar with one sweep per key frame.
SYNTH_TEST_CONFIG = dict(
    scenes=("scene-0061", "scene-0553", "scene-0103", "scene-0916"),
    samples_per_scene=3,
    sweeps_per_sample=1,
    image_width=160,
    image_height=90,
    focal=1266.0 * 0.1,
    lidar_rings=16,
    lidar_azimuths=360,
)
