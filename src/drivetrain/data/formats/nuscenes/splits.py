"""Scene splits of nuScenes: the devkit's (``mini_train``/``mini_val`` of v1.0-mini, ``train``/``val`` of v1.0-trainval,
``test``), by split name. Read from the devkit when asked (the ``nuscenes`` extra), never at import."""

from __future__ import annotations

__all__ = ["nuscenes_splits"]


def nuscenes_splits() -> dict[str, list[str]]:
    """The devkit's scene splits (nuScenes trainval/test/mini), by split name."""
    from nuscenes.utils.splits import create_splits_scenes

    return {name: list(scenes) for name, scenes in create_splits_scenes(verbose=False).items()}
