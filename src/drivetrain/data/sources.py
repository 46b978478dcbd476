"""Training data sources: the builders a run config's ``data.name`` names, and the dataset they return.

:class:`StreamingFrames` is a :class:`FrameDataset` that brings its own batching (``batch_sampler`` and
``collate``, the protocol of :mod:`drivetrain.engine.batches`), so the trainer walks scenes in order per
batch slot and resumes mid-epoch exactly. Builders for a run config's ``data.name``:

- ``frames`` — an existing frame index (``data.args.index``);
- ``synthetic`` — the synthetic dataset under ``data.args.root``, generated and
  indexed on first use (deterministic for the seed), then reused — only if its recorded generator settings
  (``drivetrain_synth.json``) are the ones asked for; otherwise an error names the differing settings.

Both take ``split`` (a devkit scene split such as ``mini_train`` / ``mini_val``): training configs name the
train split so that evaluation on the val split sees scenes the model has not trained on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from drivetrain.data.collate import Batch, collate
from drivetrain.data.dataset import DatasetConfig, FrameDataset, FrameKey, Sample, Skipped
from drivetrain.data.errors import DataError
from drivetrain.data.index import load_index
from drivetrain.data.sampler import SequenceSampler

__all__ = ["StreamingFrames", "frames", "synthetic"]

INDEX_FILE = "drivetrain_index.npz"
SYNTH_FILE = "drivetrain_synth.json"


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
        """One :class:`Batch` of the samples (unreadable ones dropped and listed in ``batch.skipped``)."""
        return collate(samples)


def frames(
    index: str,
    root: str | None = None,
    split: str | None = None,
    load_points: bool = False,
    num_sweeps: int = 0,
    on_error: str = "raise",
    load_images: bool = True,
    use_dim: tuple[int, ...] = (0, 1, 2, 3, 4),
) -> StreamingFrames:
    """Training frames of the index file ``index``, optionally one split's scenes (see :class:`DatasetConfig`;
    the reading options as :func:`synthetic`'s)."""
    config = DatasetConfig(
        load_images=load_images, load_points=load_points, num_sweeps=num_sweeps, use_dim=tuple(use_dim),
        on_error=on_error,
    )  # fmt: skip
    return StreamingFrames(FrameDataset(index, config, root, split))


def synthetic(
    root: str = "data/synth-tiny",
    size: str = "tiny",
    scenes: int | None = None,
    frames_per_scene: int | None = None,
    image_size: tuple[int, int] | None = None,
    seed: int = 0,
    split: str | None = "mini_train",
    on_error: str = "raise",
    load_images: bool = True,
    load_points: bool = False,
    num_sweeps: int = 0,
    use_dim: tuple[int, ...] = (0, 1, 2, 3, 4),
    sweeps_per_sample: int | None = None,
) -> StreamingFrames:
    """The synthetic nuScenes-format dataset at ``root``: generated and indexed unless already there.

    Args:
        root: dataset folder. A finished dataset there (its ``drivetrain_index.npz``) is reused when its
            ``drivetrain_synth.json`` records the settings asked for; other settings are a ValueError naming
            them (use another root, or delete the folder to regenerate). Nothing is written when the dataset
            is reused, so it may live on a read-only mount.
        size: preset, ``tiny`` or ``full``.
        scenes: only the first this many scenes of the preset.
        frames_per_scene: key frames per scene instead of the preset's.
        image_size: ``(W, H)`` of the camera images instead of the preset's (the focal length scales along).
        sweeps_per_sample: lidar sweeps recorded between key frames instead of the preset's (tiny: 2).
        seed: generator seed.
        split: devkit split of the scenes to train on (default ``mini_train``; ``mini_val`` is held out for
            evaluation); None for every scene.
        on_error: ``raise`` on an unreadable frame, or ``skip`` it with a warning (see :class:`DatasetConfig`).
        load_images: decode the camera images (a lidar model: False).
        load_points: read the lidar points (a lidar model: True).
        num_sweeps: earlier sweeps merged into each frame's points (PointPillars: 10).
        use_dim: point columns kept of (x, y, z, intensity, Δt) (PointPillars: 0, 1, 2, 4).
    """
    from drivetrain.data.synth import PRESETS

    if size not in PRESETS:
        raise ValueError(f"size: expected one of {sorted(PRESETS)}, got {size!r}")
    config = PRESETS[size].with_overrides(seed=seed)
    if scenes is not None:
        config = config.with_overrides(scenes=config.scenes[:scenes])
    if frames_per_scene is not None:
        config = config.with_overrides(samples_per_scene=frames_per_scene)
    if sweeps_per_sample is not None:
        config = config.with_overrides(sweeps_per_sample=sweeps_per_sample)
    if image_size is not None:
        width, height = (int(v) for v in image_size)
        config = config.with_overrides(image_width=width, image_height=height, focal=1266.0 * width / 1600)
    path = Path(root)
    if not (path / INDEX_FILE).is_file():
        _generate_once(path, config)
    _check_settings(path, config)
    try:
        index = load_index(path / INDEX_FILE)
    except DataError as err:  # an index of an older drivetrain, or stale: the data itself is what was asked for
        warnings.warn(f"re-indexing the synthetic dataset at {path}: {err}", RuntimeWarning, stacklevel=2)
        with _node_lock(path):
            _write_index(path)
        index = load_index(path / INDEX_FILE)
    config = DatasetConfig(
        load_images=load_images,
        load_points=load_points,
        num_sweeps=num_sweeps,
        use_dim=tuple(use_dim),
        on_error=on_error,
    )
    return StreamingFrames(FrameDataset(index, config, split=split))


def _generate_once(path: Path, config: object) -> None:
    """Generate and index ``config`` into ``path`` (ranks of one node take a lock: one of them does it)."""
    from drivetrain.data.synth import generate

    path.mkdir(parents=True, exist_ok=True)
    with _node_lock(path):
        if not (path / INDEX_FILE).is_file():
            generate(path, config, progress=True)
            _write_index(path)


def _write_index(path: Path) -> None:
    """(Re)build the index of the dataset at ``path``; it appears only once complete (hold the node lock)."""
    from drivetrain.data.index import build_index, save_index

    tmp = path / f".{INDEX_FILE}.tmp.npz"
    save_index(build_index(path, progress=False), tmp)
    tmp.replace(path / INDEX_FILE)


@contextlib.contextmanager
def _node_lock(path: Path) -> Iterator[None]:
    """Ranks of one node take this lock around writing the dataset: one of them does it, the others wait."""
    lock_path = path / ".generate.lock"
    if lock_path.is_symlink():  # opening it for writing would create or truncate the link's target
        lock_path.unlink()
    with open(lock_path, "a") as lock:
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _check_settings(path: Path, config: object) -> None:
    """ValueError naming the settings in which the dataset at ``path`` differs from ``config``."""
    recorded_file = path / SYNTH_FILE
    try:
        recorded = json.loads(recorded_file.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"not a synthetic dataset or its settings are unreadable ({err})", recorded_file) from None
    wanted = json.loads(json.dumps(asdict(config)))  # tuples → lists, as recorded
    differ = [
        f"{k}: the data has {recorded.get(k)!r}, asked for {v!r}" for k, v in wanted.items() if recorded.get(k) != v
    ]
    if differ:
        raise ValueError(
            f"root: {path} holds a synthetic dataset generated with other settings ("
            + "; ".join(differ)
            + "); choose another data.args.root, or delete the folder to regenerate it"
        )
