"""Runs made deliberately slow in one place, for ``drivetrain doctor``'s tests: a dataset that sleeps in
``__getitem__`` (data-bound with ``num_workers=0``) and a smoke model whose loss sleeps (loss-bound). Importing
this module registers them as ``slow-data`` and ``slow-loss`` (as a ``--plugin`` module would)."""

from __future__ import annotations

import time
from typing import Any

from drivetrain.engine.registry import register_dataset, register_model
from drivetrain.models.smoke import SmokeDataset, SmokeModel


@register_dataset("slow-data")
class SlowData(SmokeDataset):
    """The smoke dataset, ``delay_s`` seconds per sample."""

    def __init__(self, delay_s: float = 0.01, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay_s = delay_s

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.delay_s)
        return super().__getitem__(index)


@register_model("slow-loss")
class SlowLoss(SmokeModel):
    """The smoke model, ``delay_s`` seconds in every loss call."""

    def __init__(self, delay_s: float = 0.05, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay_s = delay_s

    def loss(self, outputs: Any, batch: Any) -> Any:
        time.sleep(self.delay_s)
        return super().loss(outputs, batch)
