"""Rigid transforms and box corners against pyquaternion and the nuScenes devkit."""

import numpy as np
import pytest
from nuscenes.utils.data_classes import Box
from pyquaternion import Quaternion

from drivetrain.geometry.rigid import (
    box_corners,
    invert,
    matrix_to_quaternion,
    quaternion_to_matrix,
    transform,
    yaw_from_matrix,
    yaw_quaternion,
)


def random_quaternions(n: int, seed: int = 0) -> np.ndarray:
    q = np.random.default_rng(seed).normal(size=(n, 4))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def test_quaternion_to_matrix_matches_pyquaternion():
    for q in random_quaternions(50):
        np.testing.assert_allclose(quaternion_to_matrix(q), Quaternion(q).rotation_matrix, atol=1e-12)


def test_matrix_to_quaternion_round_trips_up_to_sign():
    for q in random_quaternions(50, seed=1):
        back = matrix_to_quaternion(quaternion_to_matrix(q))
        assert back[0] >= 0
        np.testing.assert_allclose(back, q if q[0] >= 0 else -q, atol=1e-10)


def test_invert_is_the_matrix_inverse():
    for q, t in zip(random_quaternions(10, 2), np.random.default_rng(3).normal(size=(10, 3)) * 100, strict=True):
        mat = transform(q, t)
        np.testing.assert_allclose(invert(mat) @ mat, np.eye(4), atol=1e-10)


@pytest.mark.parametrize("yaw", [-3.0, -1.0, 0.0, 0.5, 2.9])
def test_yaw_quaternion_and_yaw_from_matrix_round_trip(yaw):
    assert yaw_from_matrix(quaternion_to_matrix(yaw_quaternion(yaw))) == pytest.approx(yaw)


def test_box_corners_match_devkit_box_corners():
    rng = np.random.default_rng(4)
    boxes = np.concatenate(
        [rng.normal(size=(20, 3)) * 10, rng.uniform(0.3, 10, (20, 3)), rng.uniform(-3, 3, (20, 1))], 1
    )
    ours = box_corners(boxes)  # (M, 8, 3)
    for box, corners in zip(boxes, ours, strict=True):
        dev = Box(box[:3], [box[4], box[3], box[5]], Quaternion(axis=[0, 0, 1], angle=box[6])).corners().T  # (8, 3)
        # same set of corners (orders differ)
        dist = np.linalg.norm(corners[:, None] - dev[None], axis=-1)
        assert np.allclose(dist.min(1), 0, atol=1e-9) and np.allclose(dist.min(0), 0, atol=1e-9)
