"""Configuration of the synthetic nuScenes-format generator: presets ``tiny`` and ``full``."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["PRESETS", "SynthConfig"]

# nuScenes v1.0-mini scene names (nuscenes.utils.splits.mini_train / mini_val), so the devkit's
# mini splits select the synthetic scenes.
MINI_TRAIN = (
    "scene-0061",
    "scene-0553",
    "scene-0655",
    "scene-0757",
    "scene-0796",
    "scene-1077",
    "scene-1094",
    "scene-1100",
)
MINI_VAL = ("scene-0103", "scene-0916")
# Generation order: two mini_train scenes, then both mini_val scenes, so the first N ≥ 4 scenes (the CLI's
# --scenes N) always hold both splits.
MINI_SCENES = MINI_TRAIN[:2] + MINI_VAL + MINI_TRAIN[2:]


@dataclass(frozen=True)
class SynthConfig:
    """What the generator makes; every field is checked in ``__post_init__``."""

    scenes: tuple[str, ...] = MINI_SCENES  # scene names (the devkit splits select by name)
    samples_per_scene: int = 40  # key frames per scene, 0.5 s apart (2 Hz, as nuScenes)
    sweeps_per_sample: int = 9  # lidar sweeps before each key frame, 0.05 s apart (20 Hz)
    image_width: int = 1600  # camera image size in pixels
    image_height: int = 900
    focal: float = 1266.0  # focal length in pixels at this image size (nuScenes: ≈ 1266 at 1600×900)
    lidar_rings: int = 32  # lidar beams, elevation −30° … +10° (a 32-beam sensor like nuScenes')
    lidar_azimuths: int = 1084  # rays per beam and sweep
    lidar_range: float = 70.0  # metres; rays hitting nothing closer return no point
    annotation_range: float = 60.0  # objects within this BEV distance of the ego vehicle are annotated
    jpeg_quality: int = 90
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.scenes or len(set(self.scenes)) != len(self.scenes):
            raise ValueError(f"scenes: need distinct names, got {self.scenes}")
        for name in ("samples_per_scene", "image_width", "image_height", "lidar_rings", "lidar_azimuths"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be ≥ 1, got {getattr(self, name)}")
        if self.sweeps_per_sample < 0 or self.sweeps_per_sample > 9:
            raise ValueError(
                f"sweeps_per_sample: must be in [0, 9] (20 Hz between 2 Hz key frames), got {self.sweeps_per_sample}"
            )
        if self.focal <= 0 or self.lidar_range <= 0 or self.annotation_range <= 0:
            raise ValueError("focal, lidar_range and annotation_range must be > 0")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality: must be in [1, 100], got {self.jpeg_quality}")

    def with_overrides(self, **kwargs: object) -> SynthConfig:
        """A copy with some fields changed (unknown names are errors)."""
        unknown = set(kwargs) - set(self.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown SynthConfig fields: {sorted(unknown)}")
        return replace(self, **kwargs)  # type: ignore[arg-type]


PRESETS = {
    # The ten v1.0-mini scenes × 8 key frames at 320×180: generates in seconds on a laptop CPU.
    "tiny": SynthConfig(
        samples_per_scene=8,
        sweeps_per_sample=2,
        image_width=320,
        image_height=180,
        focal=1266.0 * 0.2,
        lidar_rings=16,
        lidar_azimuths=360,
    ),
    # The ten v1.0-mini scenes × 40 key frames at nuScenes' 1600×900 with 9 lidar sweeps per key frame.
    "full": SynthConfig(),
}
