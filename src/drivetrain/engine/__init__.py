"""The training engine: typed configs, precision, schedules, resumable data, atomic checkpoints, DDP/FSDP, logs.

The engine knows a model only through ``forward(batch) -> outputs`` and
``loss(outputs, batch) -> {name: scalar tensor}``; ``Trainer(load_config(path, overrides)).fit()`` trains it.
"""

from drivetrain.engine.batches import BatchStream, ShuffledBatches, brings_own_batching
from drivetrain.engine.build import lr_factor
from drivetrain.engine.checkpoint import Checkpointer, CheckpointError, CheckpointWarning
from drivetrain.engine.config import ConfigError, TrainConfig, load_config
from drivetrain.engine.precision import LossScaler
from drivetrain.engine.state import TrainState
from drivetrain.engine.step_outcome import NonFiniteLossError, TrainingDataError
from drivetrain.engine.trainer import Trainer

__all__ = [
    "BatchStream",
    "CheckpointError",
    "CheckpointWarning",
    "Checkpointer",
    "ConfigError",
    "LossScaler",
    "NonFiniteLossError",
    "ShuffledBatches",
    "TrainConfig",
    "TrainState",
    "Trainer",
    "TrainingDataError",
    "brings_own_batching",
    "load_config",
    "lr_factor",
]
