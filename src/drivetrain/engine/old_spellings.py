"""The data of :mod:`drivetrain.engine.compat`'s rules: the old spellings older configs and run directories used, and
what each maps to today, in one place (the rules that read them, and how long they are read, are in
:mod:`drivetrain.engine.compat`).

- :data:`ALIASES` (compat rule 6): our builders' ``package.module:Name`` spellings → short names;
- :data:`MOVED_ARGS` (compat rule 2): ``model.args`` keys that moved out of a model → their new dotted key and the
  one-line hint a config that sets one is refused with.

A leaf of the engine (it imports nothing): the registry reads both tables to resolve a name and to check a config's
``model.args``, and :mod:`drivetrain.engine.compat` sits above the registry and the config (it upgrades saved
configs with both), so the tables cannot live there without an import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ALIASES", "MOVED_ARGS", "READ_UNTIL", "moved_args"]

# The last minor version that reads compat's rules (docs/design.md, "Compatibility policy"): they date from 0.1, and
# are read for two minor versions after it; the next minor version refuses them in one line and drops the rule.
READ_UNTIL = (0, 3)

# Rule 6: the spellings configs and run directories used before the registry, mapped to short names (a fixed table).
ALIASES: dict[str, dict[str, str]] = {
    "model": {
        "drivetrain.models:StreamPETR": "streampetr",
        "drivetrain.models.streampetr:StreamPETR": "streampetr",
        "drivetrain.models.streampetr.detector:StreamPETR": "streampetr",
        "drivetrain.models:PointPillars": "pointpillars",
        "drivetrain.models.pointpillars:PointPillars": "pointpillars",
        "drivetrain.models.pointpillars.model:PointPillars": "pointpillars",
        "drivetrain.models:SSN": "ssn",
        "drivetrain.models.pointpillars:SSN": "ssn",
        "drivetrain.models.pointpillars.model:SSN": "ssn",
        "drivetrain.models:FocalDetector2D": "focal2d",
        "drivetrain.models.focal2d:FocalDetector2D": "focal2d",
        "drivetrain.engine.smoke:SmokeModel": "smoke",
    },
    "data": {
        "drivetrain.data.sources:synthetic": "synthetic",
        "drivetrain.data.sources:frames": "frames",
        "drivetrain.engine.smoke:SmokeDataset": "smoke",
    },
}

# Rule 2: before the augmentation stage, the lidar models took their own augmentation and generator seed.
_LIDAR_MOVED_ARGS = {
    "augment": (
        "data.augment.lidar",
        "moved to data.augment.lidar (the same BevAugConfig fields; the trainer augments every model's batches)",
    ),
    "seed": (
        "",
        "the lidar models draw no random numbers any more; remove it (their augmentation, data.augment.lidar, "
        "is seeded by run.seed, the rank and the batch position)",
    ),
}
# ``model.args`` keys of older configs that now live elsewhere, by model (short name): old key → (new dotted key, ""
# when dropped; the one-line hint a config that sets it is refused with).
MOVED_ARGS: dict[str, dict[str, tuple[str, str]]] = {"pointpillars": _LIDAR_MOVED_ARGS, "ssn": _LIDAR_MOVED_ARGS}


def moved_args(name: str) -> Mapping[str, tuple[str, str]]:
    """The ``model.args`` keys of model ``name`` (a short name) that moved (rule 2): old key → (new dotted key, ""
    when dropped; hint). Empty for a model none moved out of."""
    return MOVED_ARGS.get(name, {})
