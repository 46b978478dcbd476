"""Synthetic nuScenes-format data: scene layouts, a z-buffered cuboid renderer, a ray-cast lidar, the writer."""

from drivetrain.data.synth.config import PRESETS, SynthConfig
from drivetrain.data.synth.generate import VERSION, generate

__all__ = ["PRESETS", "VERSION", "SynthConfig", "generate"]
