"""Tests for drivetrain.models.streampetr.recipe: StreamPETR and the 2D focal detector build their criteria and
matchers from the recipe's constants, which are the values the generic losses and assigners default to (so
passing them changes nothing), and the recipe's class order is the dataset's."""

from __future__ import annotations

import torch

from drivetrain.data.nuscenes_format import CLASSES as DATASET_CLASSES
from drivetrain.geometry import CODE_WEIGHTS as GEOMETRY_CODE_WEIGHTS
from drivetrain.losses import FocalHeadLoss, StreamPETRLoss
from drivetrain.match import HungarianAssigner2D, HungarianAssigner3D
from drivetrain.models import FocalDetector2D, StreamPETR
from drivetrain.models.streampetr.recipe import (
    CLASSES,
    CODE_WEIGHTS,
    FOCAL_HEAD_MATCH_COSTS,
    FOCAL_HEAD_WEIGHTS,
    LOSS_WEIGHTS,
    MATCH_COSTS,
    MEAN,
    PC_RANGE,
    POSITION_RANGE,
    STD,
)
from helpers.streampetr import SMALL


def test_streampetr_criteria_are_built_from_the_recipe():
    model = StreamPETR(**SMALL)
    assert model.num_classes == len(CLASSES)
    assert tuple(model.criterion.code_weights.tolist()) == CODE_WEIGHTS
    assert model.criterion.weights["loss_cls"] == LOSS_WEIGHTS["loss_cls"]
    assert model.criterion.weights["loss_bbox"] == LOSS_WEIGHTS["loss_bbox"]
    assert model.criterion.assigner == HungarianAssigner3D(code_weights=CODE_WEIGHTS, **MATCH_COSTS)
    assert model.focal_criterion is not None
    assert {k: model.focal_criterion.weights[k] for k in FOCAL_HEAD_WEIGHTS} == FOCAL_HEAD_WEIGHTS
    assert model.focal_criterion.assigner == HungarianAssigner2D(**FOCAL_HEAD_MATCH_COSTS)
    assert model.pc_range == PC_RANGE
    torch.testing.assert_close(model.mean.flatten(), torch.tensor(MEAN), rtol=0, atol=0)
    torch.testing.assert_close(model.std.flatten(), torch.tensor(STD), rtol=0, atol=0)
    position = model.position
    torch.testing.assert_close(
        torch.cat([position.range_min, position.range_min + position.range_size]),
        torch.tensor(POSITION_RANGE),
        rtol=2 * torch.finfo(torch.float32).eps,  # max = (max − min) + min: two float32 roundings of ½ ulp each
        atol=0,
    )


def test_the_recipe_equals_the_generic_defaults_so_passing_it_changes_nothing():
    # StreamPETRLoss, FocalHeadLoss and the Hungarian assigners still default to StreamPETR's values (their
    # modules are not the recipe's to change); the model passes the recipe's, and the two must agree.
    assert StreamPETRLoss().weights == StreamPETR(**SMALL).criterion.weights
    assert HungarianAssigner3D() == HungarianAssigner3D(code_weights=CODE_WEIGHTS, **MATCH_COSTS)
    assert HungarianAssigner2D() == HungarianAssigner2D(**FOCAL_HEAD_MATCH_COSTS)
    assert FocalHeadLoss().weights == FOCAL_HEAD_WEIGHTS
    assert GEOMETRY_CODE_WEIGHTS == CODE_WEIGHTS
    assert tuple(StreamPETRLoss().code_weights.tolist()) == CODE_WEIGHTS


def test_focal_detector_uses_the_focal_head_recipe():
    model = FocalDetector2D(num_classes=len(CLASSES))
    assert model.loss_weights == FOCAL_HEAD_WEIGHTS
    assert model.criterion.assigner == HungarianAssigner2D(**FOCAL_HEAD_MATCH_COSTS)
    torch.testing.assert_close(model.mean.flatten(), torch.tensor(MEAN), rtol=0, atol=0)


def test_recipe_classes_are_the_dataset_order():
    # The model's class channels index the dataset's labels directly: the published class_names must be
    # drivetrain's nuScenes order, name for name.
    assert CLASSES == DATASET_CLASSES
