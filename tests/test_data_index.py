"""The frame index against the nuScenes devkit: boxes, calibration, velocities, storage, bad roots."""

import json
import os
import shutil

import numpy as np
import pytest
from nuscenes.eval.detection.utils import category_to_detection_name
from nuscenes.utils.geometry_utils import BoxVisibility, view_points

from drivetrain.data.errors import DataError
from drivetrain.data.formats.nuscenes.tables import CATEGORIES, CATEGORY_TO_CLASS, CLASSES
from drivetrain.data.formats.schema import LIDAR
from drivetrain.data.index import build_index, load_index, save_index
from drivetrain.geometry.projection import lidar2img


def test_category_map_equals_the_devkits():
    for category in CATEGORIES:
        assert CATEGORY_TO_CLASS.get(category) == category_to_detection_name(category)


def test_index_has_every_key_frame_in_scene_order(synth_index, nusc):
    assert len(synth_index) == len(nusc.sample)
    arr = synth_index.arrays
    assert synth_index.scene_lengths() == [3, 3, 3, 3]
    for f in range(1, len(synth_index)):
        if arr["scene_id"][f] == arr["scene_id"][f - 1]:
            assert arr["frame_in_scene"][f] == arr["frame_in_scene"][f - 1] + 1
            assert arr["timestamp"][f] == pytest.approx(arr["timestamp"][f - 1] + 0.5)


def test_camera_transforms_and_times_match_the_devkit_records(synth_index, nusc):
    arr, meta = synth_index.arrays, synth_index.meta
    for f in (0, 5, 11):
        sample = nusc.get("sample", meta["sample_tokens"][f])
        assert meta["prev_tokens"][f] == sample["prev"] and meta["next_tokens"][f] == sample["next"]
        global2lidar = np.linalg.inv(arr["ego_pose"][f])
        for n, cam in enumerate(meta["cameras"]):
            sd = nusc.get("sample_data", sample["data"][cam])
            assert arr["cam_timestamp"][f, n] == pytest.approx(sd["timestamp"] / 1e6)
            cs = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
            np.testing.assert_allclose(arr["cam2ego"][f, n, :3, 3], cs["translation"], atol=1e-9)
            pose = nusc.get("ego_pose", sd["ego_pose_token"])
            np.testing.assert_allclose(arr["cam_ego_pose"][f, n, :3, 3], pose["translation"], atol=1e-9)
            composed = global2lidar @ arr["cam_ego_pose"][f, n] @ arr["cam2ego"][f, n]
            np.testing.assert_allclose(arr["cam2lidar"][f, n], composed, atol=1e-9)


def test_boxes_equal_devkit_boxes_in_the_lidar_frame(synth_index, nusc):
    arr = synth_index.arrays
    for f in (0, 4, 10):
        token = synth_index.meta["sample_tokens"][f]
        _, dev_boxes, _ = nusc.get_sample_data(nusc.get("sample", token)["data"][LIDAR])
        dev_boxes = [b for b in dev_boxes if b.name in CATEGORY_TO_CLASS]
        ours = arr["boxes"][synth_index.boxes_of(f)]
        labels = arr["labels"][synth_index.boxes_of(f)]
        assert len(ours) == len(dev_boxes) > 0
        for box, label, dev in zip(ours, labels, dev_boxes, strict=True):
            np.testing.assert_allclose(box[:3], dev.center, atol=1e-3)
            np.testing.assert_allclose(box[3:6], dev.wlh[[1, 0, 2]], atol=1e-5)
            assert np.cos(box[6] - dev.orientation.yaw_pitch_roll[0]) == pytest.approx(1.0, abs=1e-6)
            assert CLASSES[label] == CATEGORY_TO_CLASS[dev.name]


def test_velocities_are_devkit_velocities_rotated_into_the_lidar_frame_and_nan_becomes_zero(synth_index, nusc):
    arr = synth_index.arrays
    ego_inv = np.linalg.inv(arr["ego_pose"])
    for f in range(len(synth_index)):
        anns = [
            nusc.get("sample_annotation", t) for t in nusc.get("sample", synth_index.meta["sample_tokens"][f])["anns"]
        ]
        for ann, box in zip(anns, arr["boxes"][synth_index.boxes_of(f)], strict=True):
            v = nusc.box_velocity(ann["token"])
            if np.isnan(v).any():
                assert (box[7:9] == 0).all()
            else:
                np.testing.assert_allclose(box[7:9], (ego_inv[f, :3, :3] @ v)[:2], atol=1e-4)
    assert (arr["boxes"][:, 7:9] != 0).any()


def test_lidar2img_projects_box_centres_like_the_devkit(synth_index, nusc):
    arr = synth_index.arrays
    f = 5
    proj = lidar2img(arr["intrinsics"][f], arr["cam2lidar"][f])  # (N, 4, 4)
    sample = nusc.get("sample", synth_index.meta["sample_tokens"][f])
    boxes = arr["boxes"][synth_index.boxes_of(f)].astype(np.float64)
    for c, cam in enumerate(synth_index.meta["cameras"]):
        _, dev_boxes, k = nusc.get_sample_data(sample["data"][cam], box_vis_level=BoxVisibility.NONE)
        centres = np.stack([b.center for b in dev_boxes if b.name in CATEGORY_TO_CLASS], 1)  # (3, M) camera frame
        dev_uv = view_points(centres, k, normalize=True)[:2].T
        hom = np.concatenate([boxes[:, :3], np.ones((len(boxes), 1))], 1) @ proj[c].T
        front = hom[:, 2] > 0.5
        np.testing.assert_allclose(hom[front, :2] / hom[front, 2:3], dev_uv[front], atol=1e-2)


def test_index_round_trips_through_npz_without_pickle(synth_index, tmp_path):
    path = save_index(synth_index, tmp_path / "index.npz")
    with np.load(path, allow_pickle=False) as npz:
        assert all(npz[k].dtype != object for k in npz.files)
    back = load_index(path)
    assert back.meta.pop("root_from_index") == os.path.relpath(synth_index.meta["root"], tmp_path.resolve())
    assert back.meta == synth_index.meta
    for key, value in synth_index.arrays.items():
        np.testing.assert_array_equal(back.arrays[key], value)


def test_sweeps_are_previous_lidar_records_with_their_time_offsets(synth_index):
    arr = synth_index.arrays
    first = synth_index.sweeps_of(0)
    np.testing.assert_allclose(arr["sweep_dt"][first], [0.05])
    later = synth_index.sweeps_of(2)
    np.testing.assert_allclose(arr["sweep_dt"][later], [0.05, 0.5, 0.55, 1.0, 1.05])
    # the ego drives forward along its heading: the sweep origin lies behind the key-frame lidar (lidar y forward)
    assert (arr["sweep2lidar"][later][:, 1, 3] <= 1e-9).all()


@pytest.fixture()
def tables_copy(synth_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(synth_root / "v1.0-mini", root / "v1.0-mini")
    shutil.copytree(synth_root / "maps", root / "maps")
    for folder in ("samples", "sweeps"):
        (root / folder).symlink_to(synth_root / folder)
    return root


def test_missing_table_is_named(tables_copy):
    (tables_copy / "v1.0-mini" / "ego_pose.json").unlink()
    with pytest.raises(DataError, match=r"ego_pose\.json.*missing nuScenes table"):
        build_index(tables_copy, progress=False)


def test_corrupt_table_is_named(tables_copy):
    (tables_copy / "v1.0-mini" / "sample.json").write_text("[{")
    with pytest.raises(DataError, match=r"sample\.json.*not valid JSON"):
        build_index(tables_copy, progress=False)


def test_root_that_is_not_nuscenes_format_is_rejected(tmp_path, tables_copy):
    with pytest.raises(DataError, match="no nuScenes tables found"):
        build_index(tmp_path / "root" / "samples", progress=False)
    with pytest.raises(DataError, match=r"table folders found: \['v1.0-mini'\]"):
        build_index(tables_copy, version="v1.0-trainval", progress=False)
    with pytest.raises(DataError, match="does not exist"):
        build_index(tmp_path / "nowhere", progress=False)


def test_missing_data_file_is_named_at_index_time(synth_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(synth_root, root, ignore=shutil.ignore_patterns("*.npz"))
    victim = next((root / "samples" / "CAM_BACK").iterdir())
    victim.unlink()
    with pytest.raises(DataError, match=victim.name):
        build_index(root, progress=False)


def test_frames_without_annotations_get_empty_ground_truth(tables_copy):
    path = tables_copy / "v1.0-mini" / "sample_annotation.json"
    anns = json.loads(path.read_text())
    sample = json.loads((tables_copy / "v1.0-mini" / "sample.json").read_text())[0]["token"]
    kept = [a for a in anns if a["sample_token"] != sample]
    for a in kept:  # cut the chains at the removed annotations
        a["prev"] = "" if a["prev"] and all(b["token"] != a["prev"] for b in kept) else a["prev"]
        a["next"] = "" if a["next"] and all(b["token"] != a["next"] for b in kept) else a["next"]
    path.write_text(json.dumps(kept))
    instances = json.loads((tables_copy / "v1.0-mini" / "instance.json").read_text())
    live = {a["instance_token"] for a in kept}
    for inst in instances:
        own = [a for a in kept if a["instance_token"] == inst["token"]]
        if own:
            inst["first_annotation_token"], inst["last_annotation_token"] = own[0]["token"], own[-1]["token"]
            inst["nbr_annotations"] = len(own)
    (tables_copy / "v1.0-mini" / "instance.json").write_text(json.dumps([i for i in instances if i["token"] in live]))
    index = build_index(tables_copy, progress=False)
    f = index.meta["sample_tokens"].index(sample)
    assert index.boxes_of(f).stop == index.boxes_of(f).start


def test_a_renamed_category_is_counted_and_named_not_dropped_silently(tables_copy, synth_index):
    path = tables_copy / "v1.0-mini" / "category.json"
    categories = json.loads(path.read_text())
    for c in categories:
        if c["name"] == "vehicle.car":
            c["name"] = "car"  # a converter's renamed category
    path.write_text(json.dumps(categories))
    expected = r"sample_annotation\.json: (\d+) of (\d+) annotations have a category"
    with pytest.warns(RuntimeWarning, match=expected) as w:
        index = build_index(tables_copy, progress=False)
    message = str(w[0].message)
    cars = int((synth_index.arrays["labels"] == CLASSES.index("car")).sum())
    assert f": {cars} of " in message and "'car' (" in message and cars > 0
    assert not (index.arrays["labels"] == CLASSES.index("car")).any()


def test_boxes_of_no_extent_are_counted_and_left_out(tables_copy, synth_index):
    path = tables_copy / "v1.0-mini" / "sample_annotation.json"
    anns = json.loads(path.read_text())
    indexed = {a["token"] for a in anns}  # every annotation of the synthetic set is of a detection class
    for a in anns[:3]:
        a["size"] = [0.0, a["size"][1], a["size"][2]]
    anns[3]["size"] = [1.0, -2.0, 1.5]
    path.write_text(json.dumps(anns))
    with pytest.warns(RuntimeWarning, match=rf"4 of {len(indexed)} annotations have a size of zero or below"):
        index = build_index(tables_copy, progress=False)
    assert len(index.arrays["boxes"]) == len(synth_index.arrays["boxes"]) - 4
    assert (index.arrays["boxes"][:, 3:6] > 0).all()


def _npy_with_cut_header() -> bytes:
    """A ``.npy`` member whose header dict is cut off (numpy parses the header as a Python literal: it fails in the
    tokenizer, with neither a ValueError nor an OSError)."""
    header = b"{'descr': '|u1', 'fortran_order': False, 'shape': (3,), "
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"abc"


def test_an_index_with_a_damaged_array_header_is_one_data_error_naming_it(synth_index, tmp_path):
    import zipfile

    path = tmp_path / "index.npz"
    save_index(synth_index, path)
    damaged = tmp_path / "damaged.npz"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(damaged, "w") as out:
        for name in source.namelist():
            out.writestr(name, _npy_with_cut_header() if name == "meta_json.npy" else source.read(name))
    with pytest.raises(DataError, match=r"corrupt \.npz index") as info:
        load_index(damaged)
    assert str(damaged) in str(info.value)
