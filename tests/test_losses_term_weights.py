"""Loss weights have one home: criteria declare them per base term, one function applies them to every
per-layer copy, a config overrides them by name, and a name the model does not have is a ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.losses.focal_head import FOCAL_HEAD_WEIGHTS, TERMS, FocalHeadLoss, focal_head_loss, hungarian_2d
from drivetrain.losses.term_weights import base_name, weighted_total
from drivetrain.models.streampetr.loss import streampetr_loss
from helpers.engine import SMOKE, losses, metrics, overrides


def test_per_layer_terms_take_their_base_weight() -> None:
    assert [base_name(n) for n in ("d3.dn_loss_cls", "loss_cls", "enc_loss_iou", "dx.loss")] == [
        "dn_loss_cls",
        "loss_cls",
        "enc_loss_iou",
        "dx.loss",
    ]
    terms = {"loss_cls": torch.tensor(1.0), "d0.loss_cls": torch.tensor(2.0), "loss_bbox": torch.tensor(4.0)}
    assert weighted_total(terms, {"loss_cls": 2.0, "loss_bbox": 0.25}).item() == 2.0 * 3.0 + 1.0
    with pytest.raises(KeyError, match="loss_bbox: the loss returned a term without a declared weight"):
        weighted_total(terms, {"loss_cls": 1.0})


def test_criteria_take_the_published_weights_from_the_recipe() -> None:
    assert streampetr_loss().weights == {"loss_cls": 2.0, "loss_bbox": 0.25, "dn_loss_cls": 2.0, "dn_loss_bbox": 0.25}
    published = {
        "enc_loss_cls": 2.0,
        "enc_loss_bbox": 5.0,
        "enc_loss_iou": 2.0,
        "centers2d_loss": 10.0,
        "centerness_loss": 1.0,
    }
    assert focal_head_loss().weights == FOCAL_HEAD_WEIGHTS == published
    assert set(TERMS) == set(published)


def test_a_focal_head_loss_needs_a_weight_for_every_term_and_no_other() -> None:
    def build(weights: dict[str, float]) -> FocalHeadLoss:
        return FocalHeadLoss(10, stride=16, weights=weights, assigner=hungarian_2d())

    assert build({**FOCAL_HEAD_WEIGHTS, "enc_loss_iou": 0.0}).weights["enc_loss_iou"] == 0.0
    with pytest.raises(KeyError, match=r"weights: no weight for enc_loss_iou; the terms are"):
        build({k: v for k, v in FOCAL_HEAD_WEIGHTS.items() if k != "enc_loss_iou"})
    with pytest.raises(KeyError, match=r"enc_loss_giou: not a loss term of this model"):
        build({**FOCAL_HEAD_WEIGHTS, "enc_loss_giou": 1.0})


def test_a_misspelled_config_weight_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.loss_weights\.boxx: not a loss term of this model.*'box', 'cls'"):
        Trainer(load_config(SMOKE, overrides(tmp_path, "model.loss_weights.boxx=2.0")))


def test_config_weights_override_the_declared_ones(tmp_path: Path) -> None:
    def first_step(name: str, weights: str) -> dict:
        Trainer(load_config(SMOKE, overrides(tmp_path / name, "train.steps=1", f"model.loss_weights={weights}"))).fit()
        return metrics(tmp_path / name)[0]

    # The logged loss is the weighted sum in float32: a product and a sum, two roundings (≤ 2.4e-7 relative).
    zero_box = first_step("a", "{cls: 1.0, box: 0.0}")
    assert zero_box["loss"] == pytest.approx(zero_box["loss/cls"], rel=1e-6)  # the box term weighs nothing
    double_box = first_step("b", "{cls: 1.0, box: 2.0}")
    assert double_box["loss"] == pytest.approx(double_box["loss/cls"] + 2.0 * double_box["loss/box"], rel=1e-6)
    assert losses(tmp_path / "a") != losses(tmp_path / "b")
