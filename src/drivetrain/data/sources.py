"""Training data sources: the builders a run config's ``data.name`` names, and the dataset they return.

:class:`StreamingFrames` is a :class:`FrameDataset` that brings its own batching (``batch_sampler`` and
``collate``, the protocol of :mod:`drivetrain.engine.batches`), so the trainer walks scenes in order per
batch slot and resumes mid-epoch exactly. Builders for a run config's ``data.name``:

- ``frames`` — an existing frame index (``data.args.index``);
- ``synthetic`` — the synthetic dataset under ``data.args.root``, reused when its recorded generator settings
  (``drivetrain_synth.json``) are the ones asked for (otherwise an error names the differing settings). Only a
  command that trains (``train``, ``tune loader``, the benchmarks) passes ``generate=True`` and has a missing set
  generated and indexed (deterministic for the seed) — and only into a new or empty folder or over an unfinished
  generation of ours, never into a folder drivetrain did not make (:mod:`drivetrain.data.synth.manifest`). Every
  command that reads a run (``eval --checkpoint``, ``viz frame --checkpoint``, ``doctor``) builds it with
  ``generate=False``: a run's config naming a folder never makes them write there; a missing set is an error
  saying how to make it.

Both take ``split`` (a devkit scene split such as ``mini_train`` / ``mini_val``): training configs name the
train split so that evaluation on the val split sees scenes the model has not trained on. Their ``data.args`` is a
typed record, :class:`FramesArgs` / :class:`SyntheticArgs`: the source's own fields plus every reading option of
:class:`DatasetConfig`, which both extend (images, points, sweeps, the sweep cache, GT filters, ``on_error``), so each
is settable from YAML and as a ``data.args.KEY=VALUE`` override, checked when the config is loaded (the registry's
``check_args``: unknown keys list the known ones, wrong types and values name ``data.args.KEY``) and held by the
loaded config as that record; the builders take its fields as keyword arguments.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import sys
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from drivetrain.batch import Batch
from drivetrain.data.collate import collate
from drivetrain.data.dataset import DatasetConfig, FrameDataset, FrameKey, Sample, Skipped
from drivetrain.data.errors import DataError
from drivetrain.data.index import FrameIndex, load_index
from drivetrain.data.sampler import SequenceSampler

__all__ = ["FramesArgs", "StreamingFrames", "SyntheticArgs", "frames", "reading_options", "synthetic"]

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

    @property
    def index(self) -> FrameIndex:
        """The frames' index (its :attr:`~drivetrain.data.index.FrameIndex.format` says how they are scored)."""
        return self.frames.index

    @property
    def root(self) -> Path:
        """The dataset root the frames are read from."""
        return self.frames.root

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


@dataclass(frozen=True)
class FramesArgs(DatasetConfig):
    """``data.args`` of ``frames``: an indexed root's frames, and how they are read (every :class:`DatasetConfig`
    field)."""

    index: str = ""  # the index file (`drivetrain data index` writes ROOT/drivetrain_index.npz); required
    root: str | None = None  # dataset root (default: the one the index names, relative to the index file)
    split: str | None = None  # scene split to keep (train, val, mini_train, ...); null: every indexed scene

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.index:
            raise ValueError("index: required, the index file of the root (drivetrain data index --root ROOT)")


@dataclass(frozen=True)
class SyntheticArgs(DatasetConfig):
    """``data.args`` of ``synthetic``: which synthetic set (generated on first use), and how it is read (every
    :class:`DatasetConfig` field)."""

    root: str = "data/synth-tiny"  # dataset folder (a finished one with the same settings is reused)
    size: str = "tiny"  # generator preset: tiny or full
    scenes: int | None = None  # only the first this many scenes of the preset
    frames_per_scene: int | None = None  # key frames per scene instead of the preset's
    image_size: tuple[int, int] | None = None  # (W, H) of the camera images instead of the preset's (focal scales)
    sweeps_per_sample: int | None = None  # lidar sweeps between key frames instead of the preset's (tiny: 2)
    seed: int = 0  # generator seed
    split: str | None = "mini_train"  # scene split to train on (mini_val is held out for evaluation); null: all

    def __post_init__(self) -> None:
        super().__post_init__()
        from drivetrain.data.synth import PRESETS

        if self.size not in PRESETS:
            raise ValueError(f"size: expected one of {sorted(PRESETS)}, got {self.size!r}")


def reading_options(args: DatasetConfig | Mapping[str, Any], drop: tuple[str, ...] = ()) -> DatasetConfig:
    """The :class:`DatasetConfig` part of a source's arguments (what is read and how): of a typed record such as
    :class:`FramesArgs`, or of a run config's ``data.args`` mapping (its other keys, and those in ``drop``, left out).
    """
    names = [f.name for f in fields(DatasetConfig) if f.name not in drop]
    if isinstance(args, DatasetConfig):
        return DatasetConfig(**{name: getattr(args, name) for name in names})
    return DatasetConfig(**_tuples({k: v for k, v in args.items() if k in names}))


def frames(index: str, root: str | None = None, split: str | None = None, **reading: Any) -> StreamingFrames:
    """Training frames of the index file ``index``, optionally one split's scenes, read as ``reading`` says
    (:class:`DatasetConfig` fields; see :class:`FramesArgs`)."""
    args = FramesArgs(index=index, root=root, split=split, **_tuples(reading))
    return StreamingFrames(FrameDataset(args.index, reading_options(args), args.root, args.split))


def synthetic(*, generate: bool = False, **options: Any) -> StreamingFrames:
    """The synthetic nuScenes-format dataset at ``root``.

    Args:
        generate: make the dataset if it is not there (generated, then indexed), as ``train`` does; only into a
            missing or empty folder, or over an unfinished generation of ours (a killed one), never into a folder
            without the generator's manifest. A finished dataset of ours without an index is indexed. False (every
            command that reads a run): nothing is ever written; a missing or unfinished dataset is a DataError
            naming the ``drivetrain data synth`` command that makes it, and one without an index (as
            ``data synth`` leaves it) or with a stale index is indexed in memory. Not a ``data.args`` key: the
            command decides, never a config.
        options: :class:`SyntheticArgs` fields: ``root`` (a finished dataset there is reused when its
            ``drivetrain_synth.json`` records the settings asked for; other settings are a ValueError naming them —
            use another root, or delete the folder to regenerate; nothing is written when the dataset is reused,
            so it may live on a read-only mount), the generator's ``size``, ``scenes``, ``frames_per_scene``,
            ``image_size``, ``sweeps_per_sample`` and ``seed``, the ``split`` trained on, and every reading option
            of :class:`DatasetConfig` (a lidar model: ``load_images=False, load_points=True, num_sweeps=10,
            use_dim=(0, 1, 2, 4)``).

    Raises:
        DataError: the folder is not ours (generating), or holds no finished dataset (reading); one line, naming it.
        ValueError: the dataset there was generated with other settings.
    """
    from drivetrain.data.synth import PRESETS

    args = SyntheticArgs(**_tuples(options))
    config = PRESETS[args.size].with_overrides(seed=args.seed)
    if args.scenes is not None:
        config = config.with_overrides(scenes=config.scenes[: args.scenes])
    if args.frames_per_scene is not None:
        config = config.with_overrides(samples_per_scene=args.frames_per_scene)
    if args.sweeps_per_sample is not None:
        config = config.with_overrides(sweeps_per_sample=args.sweeps_per_sample)
    if args.image_size is not None:
        width, height = (int(v) for v in args.image_size)
        config = config.with_overrides(image_width=width, image_height=height, focal=1266.0 * width / 1600)
    path = Path(args.root)
    if generate:
        _generate_once(path, config)
    index = _finished_index(path, config, args, write=generate)
    return StreamingFrames(FrameDataset(index, reading_options(args), split=args.split))


def _finished_index(path: Path, config: Any, args: SyntheticArgs, *, write: bool) -> FrameIndex:
    """The index of the finished dataset at ``path`` (its settings checked first); a missing or stale one is
    rebuilt — saved with ``write`` (under the node lock), in memory otherwise."""
    from drivetrain.data.index import build_index
    from drivetrain.data.synth.manifest import folder_state

    state, manifest = folder_state(path)
    if manifest is None or not manifest.complete:
        what = {"unfinished": "an unfinished synthetic dataset (its generation was stopped)"}.get(
            state, f"no synthetic dataset (no {SYNTH_FILE})"
        )
        raise DataError(
            f"holds {what}, and this command reads data without generating it; make it with "
            f"`{_synth_command(path, config, args)}` (or train once with this data.args.root)",
            path,
        )
    _check_settings(path, manifest.settings, config)
    if not (path / INDEX_FILE).is_file():
        if write:  # a finished dataset of ours, e.g. from `data synth`: index it (another rank may already have)
            with _node_lock(path):
                if not (path / INDEX_FILE).is_file():
                    _write_index(path)
            return load_index(path / INDEX_FILE)
        return build_index(path, progress=False)
    try:
        return load_index(path / INDEX_FILE)
    except DataError as err:  # an index of an older drivetrain, or stale: the data itself is what was asked for
        warnings.warn(f"re-indexing the synthetic dataset at {path}: {err}", RuntimeWarning, stacklevel=3)
        if not write:
            return build_index(path, progress=False)
        with _node_lock(path):
            _write_index(path)
        return load_index(path / INDEX_FILE)


def _synth_command(path: Path, config: Any, args: SyntheticArgs) -> str:
    """The ``drivetrain data synth`` command line that writes the dataset ``args`` asks for into ``path``."""
    words = ["drivetrain data synth --out", shlex.quote(str(path)), "--size", args.size]
    if args.seed:
        words += ["--seed", str(args.seed)]
    if args.scenes is not None:
        words += ["--scenes", str(args.scenes)]
    if args.frames_per_scene is not None:
        words += ["--frames-per-scene", str(args.frames_per_scene)]
    if args.image_size is not None:
        words += ["--image-size", f"{config.image_width}x{config.image_height}"]
    if args.sweeps_per_sample is not None:
        words += ["--sweeps-per-sample", str(args.sweeps_per_sample)]
    return " ".join(words)


def _tuples(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the list values a YAML config gives (``use_dim``, ``image_size``) as tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}


def _generate_once(path: Path, config: Any) -> None:
    """Make the finished dataset ``config`` at ``path`` if it is not there: generate (and index) it into a missing
    or empty folder or over an unfinished generation of ours; a finished one of ours is left for the settings check
    (and indexed there); a folder that is not ours is a DataError before anything is created in it. Ranks of one
    node take the generation lock: one of them generates, the others wait and reuse it."""
    from drivetrain.data.synth import generate
    from drivetrain.data.synth.manifest import folder_state

    state, _ = folder_state(path)  # a foreign folder is refused here, before the lock file is made in it
    if state == "complete":
        return
    _refuse_foreign(path, state)
    path.mkdir(parents=True, exist_ok=True)
    with _node_lock(path):
        state, _ = folder_state(path)  # again under the lock: another rank may have finished it meanwhile
        if state != "complete":
            _refuse_foreign(path, state)
            print(_generating_note(path, config, state), file=sys.stderr, flush=True)
            generate(path, config, progress=True)
            _write_index(path)


MAX_SIBLINGS = 256  # folders beside a new synthetic root whose manifests are read to find one with its settings


def _generating_note(path: Path, config: Any, state: str) -> str:
    """The line a run prints before it generates a synthetic set at ``path`` (a typo in ``data.args.root`` would
    otherwise write a whole new set silently): what it makes, and a finished set of ours beside it with the very
    settings asked for, when there is one (the first of :data:`MAX_SIBLINGS` folders, by name)."""
    from drivetrain.data.synth.manifest import read_manifest

    frames = len(config.scenes) * config.samples_per_scene
    stopped = "replacing the unfinished set (its generation was stopped)"
    what = stopped if state == "unfinished" else "generating a new set"
    note = (
        f"data.args.root: {path} holds no finished synthetic dataset; {what} there (scenes: {len(config.scenes)}, "
        f"key frames: {frames}, images: {config.image_width}x{config.image_height}, seed: {config.seed})"
    )
    wanted = json.loads(json.dumps(asdict(config)))  # tuples → lists, as recorded
    try:
        siblings = sorted(p for p in path.parent.iterdir() if p.name != path.name)[:MAX_SIBLINGS]
    except OSError:
        siblings = []
    for sibling in siblings:
        try:
            manifest = read_manifest(sibling) if sibling.is_dir() else None
        except (DataError, OSError):  # a folder that is not ours, or unreadable: not the one meant
            continue
        if manifest is not None and manifest.complete:
            recorded = manifest.settings
            if all(_same_setting(recorded.get(k), v) for k, v in wanted.items()):
                return f"{note}; {sibling} beside it holds one with these settings: data.args.root={sibling} uses it"
    return note


def _refuse_foreign(path: Path, state: str) -> None:
    if state == "foreign":
        raise DataError(
            f"is not empty and holds no synthetic dataset of drivetrain (no {SYNTH_FILE}); not generating into it — "
            "choose a new or empty data.args.root (or, for a real nuScenes-format root, data.name=frames)",
            path,
        )


def _write_index(path: Path) -> None:
    """(Re)build the index of the dataset at ``path``; it appears only once complete (hold the node lock)."""
    from drivetrain.data.index import build_index, save_index

    tmp = path / f".{INDEX_FILE}.tmp.npz"
    save_index(build_index(path, progress=False), tmp)
    tmp.replace(path / INDEX_FILE)


@contextlib.contextmanager
def _node_lock(path: Path) -> Iterator[None]:
    """Ranks of one node take this lock around writing the dataset: one of them does it, the others wait."""
    from drivetrain.data.synth.manifest import generation_lock

    with generation_lock(path):
        yield


# Float settings are products of a few float64 operations, spelt differently by the callers: the tiny preset's focal
# is 1266.0 * 0.2 (0.2 rounded, then the product: within 2 unit roundoffs u = 2⁻⁵³ of 253.2), an image_size's is
# 1266.0 * 320 / 1600 (an exact product, one rounding in the division: within u). The two spellings of one value
# thus differ by at most 3u relative; 2·eps = 4u bounds that (JSON keeps a float64 exactly, adding nothing).
_SETTING_RTOL = 2 * sys.float_info.epsilon


def _same_setting(recorded: Any, wanted: Any) -> bool:
    """A recorded generator setting equals the asked one: floats to :data:`_SETTING_RTOL`, the rest exactly."""
    if isinstance(recorded, float) and isinstance(wanted, float):
        return math.isclose(recorded, wanted, rel_tol=_SETTING_RTOL, abs_tol=0.0)
    return recorded == wanted


def _check_settings(path: Path, recorded: dict[str, Any], config: object) -> None:
    """ValueError naming the settings in which the dataset at ``path`` (its manifest's ``recorded`` settings)
    differs from ``config``."""
    wanted = json.loads(json.dumps(asdict(config)))  # tuples → lists, as recorded
    differ = [
        f"{k}: the data has {recorded.get(k)!r}, asked for {v!r}"
        for k, v in wanted.items()
        if not _same_setting(recorded.get(k), v)
    ]
    if differ:
        raise ValueError(
            f"root: {path} holds a synthetic dataset generated with other settings ("
            + "; ".join(differ)
            + "); choose another data.args.root, or delete the folder to regenerate it"
        )
