"""Tests for drivetrain.models.pointpillars.recipe: PointPillars and SSN build from their recipe's constants (the
values the generic pieces defaulted to before), the recipe's tables agree with each other, and the generic
pieces hold no model's constants."""

from __future__ import annotations

import inspect

import pytest
import torch

import drivetrain.geometry.delta_coder as delta_coder
import drivetrain.match as match
import drivetrain.match.max_iou as max_iou
import drivetrain.models.pointpillars.loss as anchor_head
from drivetrain.data.formats.nuscenes.tables import CLASSES
from drivetrain.data.formats.registry import FORMATS
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.pointpillars import SSN, PointPillars
from drivetrain.models.pointpillars.anchors import num_grid_anchors
from drivetrain.models.pointpillars.loss import AnchorHeadLoss
from drivetrain.models.pointpillars.model import dataset_class_names
from drivetrain.models.pointpillars.recipe import (
    LOSS_WEIGHTS,
    LYFT_CODE_WEIGHTS,
    NUS_CODE_WEIGHTS,
    NUS_DIR_OFFSET,
    NUS_PP_ANCHORS,
    NUS_PP_ASSIGNER,
    NUS_SSN_ANCHORS,
    NUS_SSN_ASSIGNERS,
    NUS_SSN_FEATURE_SIZES,
    NUS_TEST_CFG,
    PP_NUS_CLASSES,
    ROTATIONS,
    SSN_NUS_CLASSES,
    SSN_NUS_TASKS,
    code_weights_for,
)
from drivetrain.ragged import RaggedBatch
from test_models_pointpillars_detector import TINY


def test_pointpillars_defaults_are_the_recipe():
    model = PointPillars()
    assert model.anchor_config.ranges == NUS_PP_ANCHORS.ranges
    assert model.anchor_config.sizes == NUS_PP_ANCHORS.sizes
    assert model.anchor_config.rotations == NUS_PP_ANCHORS.rotations == ROTATIONS
    assert num_grid_anchors(model.anchor_config, (200, 200)) == 560_000
    assert model.assigners == (NUS_PP_ASSIGNER,)
    # the values AnchorHeadLoss and direction_target defaulted to before the recipe held them
    assert model.criterion.options["code_weights"] == NUS_CODE_WEIGHTS == (1.0,) * 7 + (0.2, 0.2)
    assert model.criterion.options["dir_offset"] == NUS_DIR_OFFSET == -0.7854
    assert model.loss_weights == LOSS_WEIGHTS == {"loss_cls": 1.0, "loss_bbox": 1.0, "loss_dir": 0.2}
    decode = model.decode_config
    assert {k: getattr(decode, k) for k in NUS_TEST_CFG} == NUS_TEST_CFG
    assert decode.dir_offset == model.criterion.options["dir_offset"]  # one direction convention, loss and decode
    assert model.class_names == CLASSES  # PointPillars takes the dataset's order


def test_ssn_defaults_are_the_recipe():
    model = SSN()
    assert model.class_names == SSN_NUS_CLASSES
    assert model.tasks == SSN_NUS_TASKS
    assert model.assigners == NUS_SSN_ASSIGNERS
    assert (model.anchor_config.ranges, model.anchor_config.sizes) == (NUS_SSN_ANCHORS.ranges, NUS_SSN_ANCHORS.sizes)
    assert model.criterion.options["code_weights"] == NUS_CODE_WEIGHTS
    assert model.loss_weights == LOSS_WEIGHTS
    assert model._class_feature_sizes((200, 200)) == NUS_SSN_FEATURE_SIZES


def test_recipe_tables_agree_with_each_other():
    assert len(SSN_NUS_CLASSES) == len(NUS_SSN_ANCHORS.sizes) == len(NUS_SSN_ASSIGNERS) == len(NUS_SSN_FEATURE_SIZES)
    assert sum(n for n, _, _ in SSN_NUS_TASKS) == len(SSN_NUS_CLASSES)
    for order in (PP_NUS_CLASSES, SSN_NUS_CLASSES):  # both are orders of the nuScenes classes
        assert sorted(order) == sorted(CLASSES)
    # The PointPillars sizes are SSN's for the same classes (the two configs share their anchor statistics).
    pp_names = ("car", "truck", "trailer", "bicycle", "pedestrian", "traffic_cone", "barrier")
    for name, size in zip(pp_names, NUS_PP_ANCHORS.sizes, strict=True):
        torch.testing.assert_close(
            torch.tensor(size), torch.tensor(NUS_SSN_ANCHORS.sizes[SSN_NUS_CLASSES.index(name)]), rtol=0, atol=1e-8
        )


def test_code_weights_follow_the_code_size():
    assert code_weights_for(9) == NUS_CODE_WEIGHTS and len(NUS_CODE_WEIGHTS) == 9
    assert code_weights_for(7) == LYFT_CODE_WEIGHTS and len(LYFT_CODE_WEIGHTS) == 7
    lyft = PointPillars(**{**TINY, "code_size": 7, "num_classes": 9, "dataset_classes": "lyft"})
    assert lyft.criterion.options["code_weights"] == LYFT_CODE_WEIGHTS
    with pytest.raises(ValueError, match="code_size"):
        code_weights_for(8)
    with pytest.raises(ValueError, match="code_size"):
        PointPillars(**{**TINY, "code_size": 8})


def test_a_dataset_format_name_reads_the_format_records_classes():
    # "nuscenes" and "lyft" name the records of drivetrain.data.formats: the model keeps no copy of their classes.
    assert dataset_class_names("lyft") == FORMATS["lyft"].classes
    assert dataset_class_names("nuscenes") == FORMATS["nuscenes"].classes == CLASSES
    assert dataset_class_names(["car", "truck"]) == ("car", "truck")
    with pytest.raises(ValueError, match=r"dataset_classes: expected one of \['lyft', 'nuscenes'\] or a list"):
        dataset_class_names("kitti")


def test_the_model_criterion_is_the_loss_built_from_the_recipe():
    model = PointPillars(**TINY)
    gen = torch.Generator().manual_seed(0)
    anchors = model.anchors((4, 4), "cpu")  # (A, 9)
    heads = [torch.randn(2, anchors.shape[0], d, generator=gen) for d in (10, 9, 2)]  # cls, boxes, dir
    assigned = torch.randint(-1, 3, (2, anchors.shape[0]), generator=gen)  # (B, A): ignored, negative, GT 0 or 1
    gt = torch.cat([anchors[:2, :6] + 0.1, anchors[:2, 6:]], dim=-1)  # (2, 9)
    boxes = RaggedBatch.from_list([gt, gt.flip(0)])
    labels = RaggedBatch.from_list([torch.tensor([0, 4]), torch.tensor([7, 1])])
    built = AnchorHeadLoss(10, code_weights=NUS_CODE_WEIGHTS, dir_offset=NUS_DIR_OFFSET, weights=LOSS_WEIGHTS)
    got = model.criterion.batched(*heads, anchors, assigned, boxes, labels)
    want = built.batched(*heads, anchors, assigned, boxes, labels)
    assert float(want["loss_bbox"]) > 0 and float(want["loss_dir"]) > 0  # positives exist
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
    assert float(weighted_total(got, model.criterion.weights)) == float(weighted_total(want, built.weights))


def test_generic_pieces_take_the_model_constants_as_arguments():
    for module in (max_iou, match, anchor_head, delta_coder):
        assert not [n for n in vars(module) if n.startswith(("NUS_", "LYFT_", "SSN_", "PP_"))], module.__name__
    required = {
        delta_coder.direction_target: ("dir_offset",),
        anchor_head.batched_anchor_head_loss: ("code_weights", "dir_offset"),
        anchor_head.reference_anchor_head_loss: ("code_weights", "dir_offset"),
        AnchorHeadLoss.__init__: ("num_classes", "code_weights", "dir_offset", "weights"),
    }
    for fn, names in required.items():
        params = inspect.signature(fn).parameters
        assert all(params[n].default is inspect.Parameter.empty for n in names), fn.__qualname__
