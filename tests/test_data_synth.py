"""The synthetic generator: the devkit loads it, it is deterministic, geometry and occlusion are right."""

import hashlib
from pathlib import Path

import numpy as np
import pytest
from nuscenes.utils.data_classes import LidarPointCloud
from nuscenes.utils.splits import mini_train, mini_val
from pyquaternion import Quaternion

from drivetrain.data.formats.schema import CAMERAS, LIDAR
from drivetrain.data.synth import SynthConfig, generate
from drivetrain.data.synth.render import background, corners_in_camera, make_rig, render
from drivetrain.geometry.rigid import box_corners


def test_devkit_loads_the_synthetic_dataset_with_mini_split_scene_names(nusc):
    names = {s["name"] for s in nusc.scene}
    assert names <= set(mini_train) | set(mini_val) and names & set(mini_val)
    for sample in nusc.sample:
        assert set(sample["data"]) == {*CAMERAS, LIDAR}
        assert sample["anns"], "every synthetic key frame has annotations"
    cam = nusc.get("sample_data", nusc.sample[0]["data"]["CAM_FRONT"])
    assert (cam["width"], cam["height"]) == (160, 90)


def test_annotation_chains_give_the_devkit_the_true_velocity(nusc):
    moving = [a for a in nusc.sample_annotation if a["prev"] and a["next"]]
    assert moving
    for ann in moving[:50]:
        v = nusc.box_velocity(ann["token"])
        nxt = nusc.get("sample_annotation", ann["next"])
        dt = (
            nusc.get("sample", nxt["sample_token"])["timestamp"] - nusc.get("sample", ann["sample_token"])["timestamp"]
        ) / 1e6
        forward = (np.array(nxt["translation"]) - np.array(ann["translation"])) / dt
        np.testing.assert_allclose(v, forward, atol=1e-6)  # linear motion: centred = forward difference


def test_num_lidar_pts_equals_devkit_points_in_box_count(nusc, synth_root):
    from nuscenes.utils.geometry_utils import points_in_box

    sample = nusc.sample[1]
    sd_token = sample["data"][LIDAR]
    pc = LidarPointCloud.from_file(str(synth_root / nusc.get("sample_data", sd_token)["filename"]))
    _, boxes, _ = nusc.get_sample_data(sd_token)  # boxes in the lidar frame
    counts = {b.token: int(points_in_box(b, pc.points[:3]).sum()) for b in boxes}
    assert sum(counts.values()) > 0
    for token, count in counts.items():
        assert nusc.get("sample_annotation", token)["num_lidar_pts"] == count


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_generation_is_deterministic_for_a_seed(tmp_path):
    config = SynthConfig(
        scenes=("scene-0103",),
        samples_per_scene=2,
        sweeps_per_sample=1,
        image_width=96,
        image_height=54,
        focal=76.0,
        lidar_rings=8,
        lidar_azimuths=90,
    )
    generate(tmp_path / "a", config, progress=False)
    generate(tmp_path / "b", config, progress=False)
    generate(tmp_path / "c", config.with_overrides(seed=1), progress=False)
    a, b, c = _digest(tmp_path / "a"), _digest(tmp_path / "b"), _digest(tmp_path / "c")
    assert a == b and len(a) > 20
    assert a != c


def _boxes_in_front(rng: np.random.Generator, count: int) -> np.ndarray:
    """Random ego-frame boxes (x, y, z_centre, dx, dy, dz, yaw) in front of the vehicle, on the ground."""
    size = rng.uniform(0.5, 6.0, (count, 3))
    xy = np.stack([rng.uniform(4, 40, count), rng.uniform(-15, 15, count)], 1)
    return np.concatenate([xy, size[:, 2:3] / 2, size, rng.uniform(-np.pi, np.pi, (count, 1))], 1)


def _centre_pixels(rig, boxes_ego) -> np.ndarray:
    centre_cam = corners_in_camera(boxes_ego, rig.cam2ego[0]).mean(1)  # (M, 3)
    uv = centre_cam @ rig.intrinsics[0].T
    return uv[:, :2] / uv[:, 2:3], centre_cam[:, 2]


@pytest.mark.parametrize("seed", range(3))
def test_projected_centre_lands_on_its_cuboid_when_alone(seed):
    rig = make_rig(320, 180, 253.0)
    bg = background(rig, 0)
    boxes = _boxes_in_front(np.random.default_rng(seed), 20)
    uv, depth = _centre_pixels(rig, boxes)
    checked = 0
    for m in range(len(boxes)):
        u, v = int(uv[m, 0]), int(uv[m, 1])
        if depth[m] <= 0.1 or not (0 <= u < 320 and 0 <= v < 180):
            continue
        shot = render(
            rig, 0, corners_in_camera(boxes[m : m + 1], rig.cam2ego[0]), np.array([m % 10]), bg, np.array([0, -1.0, 0])
        )
        assert shot.instance[v, u] == 0
        assert (shot.image[v, u] != np.clip(bg[v, u], 0, 255).astype(np.uint8)).any()
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("seed", range(3))
def test_projected_centre_shows_its_cuboid_or_a_nearer_one(seed):
    rig = make_rig(320, 180, 253.0)
    boxes = _boxes_in_front(np.random.default_rng(10 + seed), 15)
    corners = corners_in_camera(boxes, rig.cam2ego[0])
    shot = render(rig, 0, corners, np.arange(15) % 10, background(rig, 0), np.array([0, -1.0, 0]))
    uv, depth = _centre_pixels(rig, boxes)
    seen_self = 0
    for m in range(len(boxes)):
        u, v = int(uv[m, 0]), int(uv[m, 1])
        if depth[m] <= 0.1 or not (0 <= u < 320 and 0 <= v < 180):
            continue
        j = shot.instance[v, u]
        assert j >= 0, "a box centre inside the image is never background"
        if j == m:
            seen_self += 1
        else:  # the occluder must be nearer than this box's centre
            assert corners[j, :, 2].min() < depth[m]
    assert seen_self >= 1


def test_visibility_tokens_reflect_occlusion(nusc):
    levels = [a["visibility_token"] for a in nusc.sample_annotation]
    assert set(levels) <= {"1", "2", "3", "4"}
    assert "4" in levels and "1" in levels


def test_camera_calibration_is_a_proper_rotation_with_nuscenes_axes(nusc):
    for cs in nusc.calibrated_sensor:
        rot = Quaternion(cs["rotation"]).rotation_matrix
        np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-9)
        if cs["camera_intrinsic"]:
            # camera z (optical axis) is horizontal, camera y points down
            assert abs(rot[2, 2]) < 1e-9 and rot[2, 1] == pytest.approx(-1.0)


def test_box_corners_of_annotations_sit_on_the_ground(nusc):
    for ann in nusc.sample_annotation[:100]:
        w, length, h = ann["size"]
        corners = box_corners(
            np.array([[*ann["translation"], length, w, h, Quaternion(ann["rotation"]).yaw_pitch_roll[0]]])
        )
        assert corners[0, :, 2].min() == pytest.approx(0.0, abs=1e-9)
