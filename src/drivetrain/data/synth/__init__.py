"""Synthetic nuScenes-schema data: scene layouts, a z-buffered cuboid renderer, a ray-cast lidar, the writer (in the
format a :class:`~drivetrain.data.formats.synth_format.SynthFormat` names)."""

from drivetrain.data.synth.config import PRESETS, SynthConfig
from drivetrain.data.synth.generate import generate

__all__ = ["PRESETS", "SynthConfig", "generate"]
