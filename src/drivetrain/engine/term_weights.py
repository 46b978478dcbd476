"""The weight of each loss term in a run: the model's declared weights, overridden by ``model.loss_weights``.

A model that declares ``loss_weights`` (:class:`~drivetrain.engine.protocol.WeightedLoss`) has them resolved once
with the config's overrides, a name it does not declare being a one-line :class:`ConfigError` when the run is built.
A model that declares none weighs its terms 1 unless the config names them; the config's names are then checked
against the terms of the first step. Terms are named by base name: ``loss_cls`` also weighs ``d3.loss_cls``
(:func:`~drivetrain.losses.weights.base_name`).
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.engine.config import ConfigError
from drivetrain.engine.protocol import WeightedLoss
from drivetrain.losses.weights import base_name, resolve_weights

__all__ = ["TermWeights"]


class TermWeights:
    """The weight of every loss term of ``model`` under the config's ``overrides`` (call it with a step's terms).

    Args:
        model: the run's model.
        overrides: ``model.loss_weights``: base term name → weight.

    Raises:
        ConfigError: an override names a term the model's declared weights lack (one line naming it).
    """

    def __init__(self, model: Any, overrides: dict[str, float]) -> None:
        self.overrides = overrides
        self.declared: dict[str, float] | None = None
        if isinstance(model, WeightedLoss):
            try:
                self.declared = resolve_weights(model.loss_weights, overrides)
            except KeyError as err:
                raise ConfigError(f"model.loss_weights.{err.args[0]}") from None

    def __call__(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        """The weight of every term of ``terms`` (a step's loss terms, by name).

        Raises:
            ConfigError: for a model that declares no weights, an override naming none of the terms.
        """
        if self.declared is not None:
            return self.declared
        bases = {base_name(k) for k in terms}
        unknown = sorted(set(self.overrides) - bases)
        if unknown:
            raise ConfigError(
                f"model.loss_weights.{unknown[0]}: not a loss term of this model; its terms are {sorted(bases)}"
            )
        return {**dict.fromkeys(bases, 1.0), **self.overrides}
