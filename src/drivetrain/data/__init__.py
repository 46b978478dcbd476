"""nuScenes-format data: synthetic generator, frame index, dataset, sequence sampler, collate (into a
:class:`drivetrain.batch.Batch`), evaluation.

Knows nothing of models. Typical use::

    from drivetrain.data import FrameDataset, SequenceSampler, collate
    dataset = FrameDataset("data/synth-tiny/drivetrain_index.npz")
    sampler = SequenceSampler(dataset.scene_lengths(), batch_size=2, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=2)
"""

from drivetrain.data.collate import collate
from drivetrain.data.dataset import DatasetConfig, FrameDataset, FrameKey, Sample, Skipped
from drivetrain.data.errors import DataError
from drivetrain.data.index import FrameIndex, build_index, load_index, save_index
from drivetrain.data.sampler import SequenceSampler

__all__ = [
    "DataError",
    "DatasetConfig",
    "FrameDataset",
    "FrameIndex",
    "FrameKey",
    "Sample",
    "SequenceSampler",
    "Skipped",
    "build_index",
    "collate",
    "load_index",
    "save_index",
]
