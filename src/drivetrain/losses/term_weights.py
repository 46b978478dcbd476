"""One home for loss weights: each criterion declares its published weights once, per base term; one
function applies them, to every per-layer copy of a term (``d3.loss_cls`` is weighted as ``loss_cls``); a
run config may override them by base name, and a name the criterion does not have is an error.

Example:
    >>> weights = resolve_weights({"loss_cls": 2.0, "loss_bbox": 0.25}, {"loss_bbox": 0.5})
    >>> weighted_total({"loss_cls": cls, "d0.loss_cls": cls0, "loss_bbox": box}, weights)  # 2·cls + 2·cls0 + 0.5·box
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["base_name", "resolve_weights", "weighted_total"]


def base_name(term: str) -> str:
    """The base term of a per-layer name: ``d3.dn_loss_cls`` → ``dn_loss_cls``; other names unchanged."""
    head, sep, tail = term.partition(".")
    return tail if sep and head[:1] == "d" and head[1:].isdigit() else term


def resolve_weights(declared: Mapping[str, float], overrides: Mapping[str, float]) -> dict[str, float]:
    """``declared`` updated by ``overrides``; KeyError naming an override the criterion does not declare."""
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise KeyError(f"{unknown[0]}: not a loss term of this model; its terms are {sorted(declared)}")
    return {**declared, **overrides}


def weighted_total(terms: Mapping[str, torch.Tensor], weights: Mapping[str, float]) -> torch.Tensor:
    """Σ weight(base_name(name)) · term, each term in float32 at least (a float64 term stays float64).

    Args:
        terms: ``{name: 0-dim tensor}``, unweighted.
        weights: per base term; every term's base must be present.

    Returns:
        0-dim tensor.
    """
    if not terms:
        raise ValueError("terms: the loss returned no terms")
    total = None
    for name, term in terms.items():
        base = base_name(name)
        if base not in weights:
            raise KeyError(f"{name}: the loss returned a term without a declared weight (declared: {sorted(weights)})")
        value = term.to(torch.promote_types(term.dtype, torch.float32)) * weights[base]
        total = value if total is None else total + value
    return total
