"""The smoke model and its generated-tensor dataset: the engine's tests and the ``smoke`` config train them in
seconds on a CPU (:mod:`.model`, :mod:`.dataset`; the registry's ``smoke`` model and dataset, :mod:`.spec`)."""

from drivetrain.models.smoke.dataset import SmokeDataset
from drivetrain.models.smoke.model import SmokeModel

__all__ = ["SmokeDataset", "SmokeModel"]
