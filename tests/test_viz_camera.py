"""Camera pictures: a box drawn alone colours pixels only inside its projected corners, in its class's colour,
with all 12 edges when it is wholly in front of the camera and none when it is behind; ``viz frame`` on a camera
frame writes the six cameras with projected boxes beside the BEV panel, and with a StreamPETR checkpoint draws
its detections."""

from __future__ import annotations

import numpy as np
import pytest

from drivetrain.cli.main import main
from drivetrain.engine import Trainer, load_config
from drivetrain.viz.camera import CLASS_COLOURS, draw_boxes, frame_png, project_box_edges

mpimg = pytest.importorskip("matplotlib.image")

# A camera looking along lidar +x (u = 100·(−y)/x + 160, v = 100·(−z)/x + 90) on a 320×180 image.
K = np.array([[100.0, 0, 160], [0, 100.0, 90], [0, 0, 1]])
LIDAR2CAM = np.array([[0.0, -1, 0, 0], [0, 0, -1, 0], [1, 0, 0, 0], [0, 0, 0, 1]])
LIDAR2IMG = np.eye(4)
LIDAR2IMG[:3, :3] = K
LIDAR2IMG = LIDAR2IMG @ LIDAR2CAM
BOX = np.array([[10.0, 1.0, 0.0, 4.0, 2.0, 1.5, 0.3]])


def _mask(image: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    return np.abs(image.astype(int) - np.array(colour)).max(-1) == 0


def test_a_box_alone_colours_only_pixels_inside_its_projection():
    edges = project_box_edges(BOX, LIDAR2IMG)
    assert len(edges) == 1 and edges[0].shape == (12, 2, 2)
    blank = np.zeros((180, 320, 3), dtype=np.uint8)
    drawn = draw_boxes(blank, LIDAR2IMG, BOX, np.array([3]), width=1)
    mask = _mask(drawn, CLASS_COLOURS[3])
    rows, cols = np.nonzero(mask)
    assert mask.sum() > 100 and mask.sum() == (drawn.sum(-1) > 0).sum()  # every coloured pixel is the class's
    corners = edges[0].reshape(-1, 2)
    assert cols.min() >= np.floor(corners[:, 0].min()) - 1 and cols.max() <= np.ceil(corners[:, 0].max()) + 1
    assert rows.min() >= np.floor(corners[:, 1].min()) - 1 and rows.max() <= np.ceil(corners[:, 1].max()) + 1
    behind = BOX * [-1, 1, 1, 1, 1, 1, 1]
    assert project_box_edges(behind, LIDAR2IMG)[0].shape == (0, 2, 2)
    assert (draw_boxes(blank, LIDAR2IMG, behind, np.array([3])) == 0).all()
    thick = _mask(draw_boxes(blank, LIDAR2IMG, BOX, np.array([3]), width=3), CLASS_COLOURS[3]).sum()
    assert 2.0 * mask.sum() < thick < 4.0 * mask.sum()


def test_frame_png_lays_out_cameras_and_the_bev_panel(tmp_path):
    images = np.full((6, 180, 320, 3), 90, dtype=np.uint8)
    lidar2img = np.repeat(LIDAR2IMG[None], 6, axis=0)
    path = frame_png(tmp_path / "f.png", images, lidar2img, BOX, np.array([0]), BOX, np.array([1]),
                     points=np.random.default_rng(0).normal(size=(500, 3)) * 10)  # fmt: skip
    picture = (mpimg.imread(path)[..., :3] * 255).round().astype(int)
    assert picture.shape[1] > picture.shape[0] > 300  # six cameras in two rows beside the BEV panel
    for label in (0, 1):
        assert (np.abs(picture - np.array(CLASS_COLOURS[label])).max(-1) <= 20).sum() > 50, label


def test_viz_frame_draws_cameras_and_a_streampetr_checkpoints_detections(synth_index, synth_root, tmp_path, capsys):
    png = tmp_path / "gt.png"
    assert main(["viz", "frame", "--root", str(synth_root), "--frame", "1", "--png", str(png)]) == 0
    gt = mpimg.imread(png)
    assert gt.shape[1] > gt.shape[0] and gt[..., :3].std() > 0.05
    index = synth_root / "drivetrain_index.npz"
    cfg = load_config(
        "configs/streampetr_tiny.yaml",
        [f"run.out_dir={tmp_path / 'run'}", "train.steps=2", "log.progress=false", "log.tensorboard=false",
         "data.name=drivetrain.data.sources:frames", f"data.args={{index: {index}, split: mini_train}}"],
    )  # fmt: skip
    Trainer(cfg).fit()
    out, none = tmp_path / "pred.png", tmp_path / "none.png"
    argv = ["viz", "frame", "--checkpoint", str(tmp_path / "run"), "--frame", "1"]
    assert main([*argv, "--png", str(out), "--score-threshold", "0"]) == 0  # every detection
    assert main([*argv, "--png", str(none), "--score-threshold", "2"]) == 0  # none (scores are ≤ 1)
    with_pred, without = mpimg.imread(out)[..., :3], mpimg.imread(none)[..., :3]
    assert with_pred.shape == without.shape and with_pred.shape[1] < gt.shape[1]  # no points: no BEV panel
    changed = (np.abs(with_pred - without).max(-1) > 0.1).sum()
    assert changed > 500  # the detections' thin boxes
    with pytest.raises(SystemExit, match="--ply"):
        main([*argv, "--png", str(tmp_path / "x.png"), "--ply", str(tmp_path / "x.ply")])
    assert not (tmp_path / "x.png").exists()  # refused before drawing anything


def test_class_colours_are_ten_distinct_hues():
    """car, truck, trailer and construction vehicle were three near-identical oranges; now every pair of the ten
    classes differs by at least 60 in the sum of its RGB channel differences."""
    from itertools import combinations

    from drivetrain.viz.camera import CLASS_COLOURS

    assert len(set(CLASS_COLOURS)) == 10
    closest = min(sum(abs(a - b) for a, b in zip(p, q, strict=True)) for p, q in combinations(CLASS_COLOURS, 2))
    assert closest >= 60, closest
