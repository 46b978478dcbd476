"""Tests for drivetrain.models.focal2d: the 2D focal detector is built from its typed arguments, each declared once
(:class:`Focal2DArgs`), keywords replacing fields, and runs the loss path ``impl`` chose when it was built."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drivetrain.models.focal2d import Focal2DArgs, FocalDetector2D
from helpers.heads import focal_case


def test_the_args_object_builds_the_model_and_keywords_replace_its_fields():
    args = Focal2DArgs(width=8)
    model = FocalDetector2D(args, num_classes=3)
    assert model.args == dataclasses.replace(args, num_classes=3)
    assert model.cls.out_channels == 3 and model.backbone[0][0].out_channels == 8
    with pytest.raises(TypeError, match="widht"):
        FocalDetector2D(args, widht=8)
    with pytest.raises(ValueError, match="impl: expected 'batched' or 'reference', got 'fast'"):
        FocalDetector2D(args, impl="fast")


@pytest.mark.parametrize("impl", ["batched", "reference"])
def test_the_loss_runs_the_path_chosen_at_build(impl, gen):
    outputs, targets = focal_case([[0, 3], [5, 1]], gen)
    model = FocalDetector2D(width=8, impl=impl)
    model.criterion.assigner = dataclasses.replace(model.criterion.assigner, backend="scipy")
    chosen = model.criterion if impl == "batched" else model.criterion.reference
    got, expected = model.loss(outputs, targets), chosen(outputs, targets)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in got)
