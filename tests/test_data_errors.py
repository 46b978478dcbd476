"""Bad input while loading: clear errors naming the file, or skip-and-count when configured."""

import shutil

import pytest

from drivetrain.data import DataError, DatasetConfig, FrameDataset, collate
from drivetrain.data.index import load_index


@pytest.fixture()
def broken_root(synth_root, synth_index, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(synth_root, root)
    return root


def dataset(root, **config):
    return FrameDataset(load_index(root / "drivetrain_index.npz", root), DatasetConfig(**config))


def test_missing_image_is_named(broken_root):
    ds = dataset(broken_root)
    victim = broken_root / ds.index.meta["image_files"][1][3]
    victim.unlink()
    with pytest.raises(DataError, match=victim.name):
        ds[1]


def test_corrupt_image_is_named(broken_root):
    ds = dataset(broken_root)
    victim = broken_root / ds.index.meta["image_files"][2][0]
    victim.write_bytes(victim.read_bytes()[:50])
    with pytest.raises(DataError, match=rf"{victim.name}.*corrupt"):
        ds[2]


def test_corrupt_lidar_file_is_named(broken_root):
    ds = dataset(broken_root, load_images=False, load_points=True)
    victim = broken_root / ds.index.meta["lidar_files"][0]
    victim.write_bytes(victim.read_bytes()[:-6])
    with pytest.raises(DataError, match=rf"{victim.name}.*not a whole number of 20-byte points"):
        ds[0]


def test_a_lidar_file_cut_inside_a_float_is_refused_not_read_short(broken_root):
    """1001 bytes would read as 250 floats = 50 whole points with the last byte dropped: refused instead."""
    ds = dataset(broken_root, load_images=False, load_points=True)
    victim = broken_root / ds.index.meta["lidar_files"][0]
    victim.write_bytes(victim.read_bytes()[:1001])
    with pytest.raises(DataError, match=rf"{victim.name}.*1001 bytes is not a whole number of 20-byte points"):
        ds[0]


def test_skip_mode_warns_drops_and_counts_the_sample(broken_root):
    ds = dataset(broken_root, on_error="skip")
    (broken_root / ds.index.meta["image_files"][1][0]).unlink()
    with pytest.warns(RuntimeWarning, match="skipping frame 1"):
        samples = [ds[0], ds[1], ds[2]]
    batch = collate(samples)
    assert batch.batch_size == 2 and batch.skipped == (ds.index.meta["sample_tokens"][1],)


def test_a_batch_of_only_unreadable_samples_is_an_error(broken_root):
    ds = dataset(broken_root, on_error="skip")
    (broken_root / ds.index.meta["image_files"][0][0]).unlink()
    with pytest.warns(RuntimeWarning):
        skipped = ds[0]
    with pytest.raises(DataError, match="every sample of the batch was unreadable"):
        collate([skipped])


def test_missing_or_foreign_index_file_is_named(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_index(tmp_path / "none.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz")
    with pytest.raises(DataError, match=r"bad\.npz"):
        load_index(bad)


def test_bad_config_values_are_rejected():
    with pytest.raises(ValueError, match="on_error"):
        DatasetConfig(on_error="ignore")
    with pytest.raises(ValueError, match="num_sweeps"):
        DatasetConfig(num_sweeps=2)
