"""Key frames as a training data source: the dataset, its scene-sequence sampler and collate in one object.

:class:`StreamingFrames` follows the batching protocol of ``drivetrain.engine.stream`` (``batch_sampler``
and ``collate``), so the trainer walks scenes in order per batch slot and resumes mid-epoch exactly.
Builders for a run config's ``data.name``:

- ``drivetrain.data.training:frames`` — an existing frame index (``data.args.index``);
- ``drivetrain.data.training:synthetic`` — the synthetic dataset under ``data.args.root``, generated and
  indexed on first use (deterministic for the seed), then reused.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

from drivetrain.data.collate import Batch, collate
from drivetrain.data.dataset import DatasetConfig, FrameDataset, FrameKey, Sample, Skipped
from drivetrain.data.sampler import SequenceSampler

__all__ = ["StreamingFrames", "frames", "synthetic"]

INDEX_FILE = "drivetrain_index.npz"


class StreamingFrames:
    """A :class:`FrameDataset` that batches itself with a :class:`SequenceSampler` and :func:`collate`."""

    def __init__(self, dataset: FrameDataset) -> None:
        self.frames = dataset

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, key: int | FrameKey | tuple[int, bool]) -> Sample | Skipped:
        return self.frames[key]

    def batch_sampler(
        self, batch_size: int, *, seed: int, shuffle: bool, rank: int, world_size: int
    ) -> SequenceSampler:
        """Each of ``batch_size`` slots walks consecutive frames of one scene; sharded by rank."""
        return SequenceSampler(
            self.frames.scene_lengths(), batch_size, seed=seed, shuffle=shuffle, rank=rank, world_size=world_size
        )

    def collate(self, samples: list[Sample | Skipped]) -> Batch:
        return collate(samples)


def frames(
    index: str,
    root: str | None = None,
    load_points: bool = False,
    num_sweeps: int = 0,
    on_error: str = "raise",
) -> StreamingFrames:
    """Training frames of the index file ``index`` (see :class:`DatasetConfig` for the options)."""
    config = DatasetConfig(load_points=load_points, num_sweeps=num_sweeps, on_error=on_error)
    return StreamingFrames(FrameDataset(index, config, root))


def synthetic(
    root: str = "data/synth-tiny",
    size: str = "tiny",
    scenes: int | None = None,
    frames_per_scene: int | None = None,
    image_size: tuple[int, int] | None = None,
    seed: int = 0,
    on_error: str = "raise",
) -> StreamingFrames:
    """The synthetic nuScenes-format dataset at ``root``: generated and indexed unless already there.

    Args:
        root: dataset folder; its ``drivetrain_index.npz`` marks a finished dataset and is reused as is.
        size: preset, ``tiny`` or ``full``; scenes / frames_per_scene / image_size (W, H) override it.
        seed: generator seed (only used when generating).
    """
    from drivetrain.data.index import build_index, save_index
    from drivetrain.data.synth import PRESETS, generate

    if size not in PRESETS:
        raise ValueError(f"size: expected one of {sorted(PRESETS)}, got {size!r}")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / ".generate.lock", "w") as lock:  # ranks of one node generate it once
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / INDEX_FILE).is_file():
            config = PRESETS[size].with_overrides(seed=seed)
            if scenes is not None:
                config = config.with_overrides(scenes=config.scenes[:scenes])
            if frames_per_scene is not None:
                config = config.with_overrides(samples_per_scene=frames_per_scene)
            if image_size is not None:
                width, height = (int(v) for v in image_size)
                config = config.with_overrides(image_width=width, image_height=height, focal=1266.0 * width / 1600)
            generate(path, config, progress=True)
            tmp = path / f".{INDEX_FILE}.tmp.npz"
            save_index(build_index(path, progress=False), tmp)
            tmp.replace(path / INDEX_FILE)  # the index appears only once the dataset is complete
    return StreamingFrames(FrameDataset(path / INDEX_FILE, DatasetConfig(on_error=on_error)))
