"""Tests for drivetrain.models.streampetr.recipe and .criteria: StreamPETR and the 2D focal detector build their
criteria and matchers from the recipe's constants (the generic losses and assigners have no defaults for them),
and the recipe's class order is the dataset's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drivetrain.data.formats.nuscenes.tables import CLASSES as DATASET_CLASSES
from drivetrain.losses.focal_head import FOCAL_HEAD_MATCH_COSTS, FOCAL_HEAD_WEIGHTS, FocalHeadLoss, focal_head_loss
from drivetrain.match import HungarianAssigner2D, HungarianAssigner3D
from drivetrain.models.focal2d import FocalDetector2D
from drivetrain.models.streampetr import StreamPETR
from drivetrain.models.streampetr.box_code import encode_boxes
from drivetrain.models.streampetr.loss import streampetr_loss
from drivetrain.models.streampetr.loss_3d import StreamPETRLoss
from drivetrain.models.streampetr.recipe import (
    CLASSES,
    CODE_WEIGHTS,
    DN_SPLIT,
    LOSS_WEIGHTS,
    MATCH_COSTS,
    MEAN,
    PC_RANGE,
    POSITION_RANGE,
    STD,
    STRIDE,
)
from helpers.streampetr import SMALL


def test_streampetr_criteria_are_built_from_the_recipe():
    model = StreamPETR(**SMALL)
    assert model.num_classes == len(CLASSES)
    assert tuple(model.criterion.code_weights.tolist()) == CODE_WEIGHTS
    assert model.criterion.weights["loss_cls"] == LOSS_WEIGHTS["loss_cls"]
    assert model.criterion.weights["loss_bbox"] == LOSS_WEIGHTS["loss_bbox"]
    assert model.criterion.assigner == HungarianAssigner3D(
        code_weights=CODE_WEIGHTS, encode=encode_boxes, **MATCH_COSTS
    )
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


@pytest.mark.parametrize(
    ("build", "published"),
    [
        (StreamPETRLoss, ("cls_weight", "bbox_weight", "code_weights", "dn_split", "assigner")),
        (FocalHeadLoss, ("stride", "weights", "assigner")),
        (HungarianAssigner3D, ("cls_weight", "reg_weight", "code_weights")),
        (HungarianAssigner2D, ("cls_weight", "box_weight", "giou_weight", "centre_weight")),
    ],
)
def test_the_generic_pieces_default_to_no_published_value(build, published):
    # The recipe is the one owner of StreamPETR's weights and costs: a generic piece built without them fails and
    # names them, instead of falling back on a second copy of the values.
    with pytest.raises(TypeError, match="missing") as error:
        build(10) if build in (StreamPETRLoss, FocalHeadLoss) else build()
    assert all(name in str(error.value) for name in published), str(error.value)


def test_the_criteria_functions_pass_the_recipe():
    loss = streampetr_loss(backend="scipy", dn_split=0.5)
    assert loss.weights == {"loss_cls": 2.0, "loss_bbox": 0.25, "dn_loss_cls": 2.0, "dn_loss_bbox": 0.25}
    assert tuple(loss.code_weights.tolist()) == CODE_WEIGHTS and loss.dn_split == 0.5
    assert loss.assigner == dataclasses.replace(streampetr_loss().assigner, backend="scipy")
    assert streampetr_loss().dn_split == DN_SPLIT
    focal = focal_head_loss(backend="scipy", stride=8)
    assert focal.weights == FOCAL_HEAD_WEIGHTS and focal.stride == 8 and focal.assigner.backend == "scipy"
    assert focal_head_loss().stride == STRIDE


def test_focal_detector_uses_the_focal_head_recipe():
    model = FocalDetector2D(num_classes=len(CLASSES))
    assert model.loss_weights == FOCAL_HEAD_WEIGHTS
    assert model.criterion.assigner == HungarianAssigner2D(**FOCAL_HEAD_MATCH_COSTS)
    torch.testing.assert_close(model.mean.flatten(), torch.tensor(MEAN), rtol=0, atol=0)


def test_recipe_classes_are_the_dataset_order():
    # The model's class channels index the dataset's labels directly: the published class_names must be
    # drivetrain's nuScenes order, name for name.
    assert CLASSES == DATASET_CLASSES
