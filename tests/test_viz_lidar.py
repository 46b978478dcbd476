"""Lidar frame pictures: the PLY holds the points and each box as 8 corners and 6 quads (read back), the BEV
PNG draws a box where it is (coloured pixels counted), and ``drivetrain viz frame`` writes both."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from drivetrain.cli.main import main
from drivetrain.data import FrameDataset
from drivetrain.geometry.rigid import box_corners
from drivetrain.viz.lidar import BOX_FACES, GT_COLOUR, bev_png, write_ply

BOX = np.array([[4.0, -2.0, -1.0, 4.0, 2.0, 1.5, 0.3, 0.0, 0.0]])


def read_ply(path):
    """(header lines, vertices structured array, faces structured array) of a file write_ply wrote."""
    raw = path.read_bytes()
    end = raw.index(b"end_header\n") + len(b"end_header\n")
    header = raw[:end].decode("ascii").splitlines()
    counts = {line.split()[1]: int(line.split()[2]) for line in header if line.startswith("element")}
    vertex = np.frombuffer(raw, dtype=[("xyz", "<f4", 3), ("rgb", "u1", 3)], count=counts["vertex"], offset=end)
    face = np.frombuffer(raw, dtype=[("n", "u1"), ("idx", "<i4", 4)], count=counts["face"], offset=end + vertex.nbytes)
    assert end + vertex.nbytes + face.nbytes == len(raw)
    return header, vertex, face


def test_ply_has_points_then_box_corners_and_closed_quads(tmp_path):
    points = np.random.default_rng(0).uniform(-10, 10, (100, 4)).astype(np.float32)
    moved = BOX + np.array([0.0, 5, 0, 0, 0, 0, 0, 0, 0])
    path = write_ply(tmp_path / "f.ply", points, BOX, moved, np.array([0.7]), 3)
    header, vertex, face = read_ply(path)
    assert header[:2] == ["ply", "format binary_little_endian 1.0"]
    assert len(vertex) == 100 + 16 and len(face) == 12 and np.all(face["n"] == 4)
    np.testing.assert_allclose(vertex["xyz"][:100], points[:, :3])
    np.testing.assert_allclose(vertex["xyz"][100:108], box_corners(BOX)[0], atol=1e-5)
    assert tuple(vertex["rgb"][100]) == GT_COLOUR and tuple(vertex["rgb"][108]) != GT_COLOUR
    assert face["idx"].min() == 100 and face["idx"].max() == 115
    # Each quad is a face of the box: its 4 corners share one coordinate sign in the box frame.
    for quad in BOX_FACES:
        bits = np.array([[(c >> k) & 1 for k in range(3)] for c in quad])  # (4, 3)
        assert (bits == bits[0]).all(axis=0).sum() == 1
    with pytest.raises(ValueError, match="gt_boxes"):
        write_ply(tmp_path / "bad.ply", points, np.zeros((2, 5)))


def green_pixels(path):
    import matplotlib.image as mpimg

    rgb = (mpimg.imread(path)[..., :3] * 255).astype(int)
    target = np.array(GT_COLOUR)
    return np.argwhere(np.abs(rgb - target).sum(-1) < 30)  # (n, 2) rows, cols


def test_bev_png_draws_the_box_where_it_is(tmp_path):
    pytest.importorskip("matplotlib")
    empty = bev_png(tmp_path / "empty.png", np.zeros((0, 3)), extent=10.0, size_px=400)
    assert len(green_pixels(empty)) == 0
    one = bev_png(tmp_path / "one.png", np.zeros((0, 3)), BOX, extent=10.0, size_px=400)
    pixels = green_pixels(one)
    assert len(pixels) > 50  # the outline and the heading tick
    rows, cols = pixels[:, 0], pixels[:, 1]
    # x = +4 m is right of the centre, y = −2 m below it (image rows grow downwards).
    assert cols.mean() > 200 and rows.mean() > 200
    two = bev_png(tmp_path / "two.png", np.zeros((0, 3)), np.concatenate([BOX, BOX * [-1, 1, 1, 1, 1, 1, 1, 1, 1]]),
                  extent=10.0, size_px=400)  # fmt: skip
    assert len(green_pixels(two)) > 1.6 * len(pixels)


def test_viz_frame_cli_writes_png_and_ply(synth_index, synth_root, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png, ply = tmp_path / "f.png", tmp_path / "f.ply"
    argv = ["viz", "frame", "--root", str(synth_root), "--frame", "1", "--sweeps", "1", "--png", str(png)]
    assert main([*argv, "--ply", str(ply)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _, vertex, face = read_ply(ply)
    assert len(face) % 6 == 0 and len(face) > 0 and len(vertex) > 1000
    with pytest.raises(SystemExit, match="--frame 999"):
        main(["viz", "frame", "--root", str(synth_root), "--frame", "999"])
    with pytest.raises(SystemExit, match="not found"):
        main(["viz", "frame", "--root", str(tmp_path), "--frame", "0"])


def test_bev_array_is_the_png_picture_as_pixels():
    pytest.importorskip("matplotlib")
    from drivetrain.viz.lidar import GT_COLOUR, bev_array

    picture = bev_array(np.zeros((0, 3)), BOX, extent=10.0, size_px=400)
    assert picture.shape == (400, 400, 3) and picture.dtype == np.uint8
    green = (np.abs(picture.astype(int) - np.array(GT_COLOUR)).max(-1) <= 30).sum()
    assert green > 50
    assert (np.abs(bev_array(np.zeros((0, 3)), extent=10.0, size_px=400).astype(int) - np.array(GT_COLOUR))
            .max(-1) <= 30).sum() == 0  # fmt: skip


def test_viz_frame_with_a_missing_file_is_one_line_naming_it(synth_index, synth_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(synth_root, root)
    frames = FrameDataset(root / "drivetrain_index.npz", split="mini_val")
    victim = root / frames.index.meta["image_files"][1][0]  # frame 1 of mini_val, its first camera
    victim.unlink()
    with pytest.raises(SystemExit) as exit_:
        main(["viz", "frame", "--root", str(root), "--frame", "1", "--png", str(tmp_path / "f.png")])
    message = str(exit_.value.code)
    assert message.startswith("viz frame: --frame 1: ") and victim.name in message and "\n" not in message
    assert not (tmp_path / "f.png").exists()


def test_the_bev_view_fits_the_points_and_names_the_sweep_ages(tmp_path):
    from drivetrain.viz.lidar import points_extent

    points = np.array([[31.0, -2.0, 0.0, 0.5, 0.0], [-3.0, 12.0, 0.0, 0.5, 0.45]])
    assert points_extent(points) == 35.0 and points_extent(None) == 50.0
    with_ages = bev_png(tmp_path / "a.png", points, time_column=4, extent=35.0)
    without = bev_png(tmp_path / "b.png", points, extent=35.0)
    import matplotlib.image as mpimg

    # the legend (white text on a dark box) is drawn only with sweep ages
    assert (mpimg.imread(with_ages)[..., :3] > 0.95).sum() > (mpimg.imread(without)[..., :3] > 0.95).sum()
