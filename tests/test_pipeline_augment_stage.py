"""The one augmentation stage (camera and lidar): the worker and device lidar paths draw the same parameters and
agree; the draws follow (seed, rank, position) in a fixed order, camera first; a lidar step on a batch with images
keeps every pixel on its world point; evaluation moves no point; the config names bad fields, and the old spellings
(``model.args.augment``, a flat camera ``data.augment``) say where the setting lives now; old checkpoints upgrade
(camera), are refused in one line for resuming (lidar) and still evaluate."""

from __future__ import annotations

import copy
import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from drivetrain.data.sources import frames
from drivetrain.detector.spec import ModelSpec, keywords
from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.engine.compat import upgrade_saved_config
from drivetrain.engine.config import config_diff, config_to_dict
from drivetrain.engine.registry import _REGISTERED, register_model
from drivetrain.models.pointpillars.recipe import LIDAR_AUG
from drivetrain.models.smoke import SmokeModel
from drivetrain.models.streampetr.recipe import CAMERA_AUG, IMAGE_AUG
from drivetrain.pipeline.augment.bev import BevAugConfig, draw_bev_params
from drivetrain.pipeline.augment.camera import sample_params as camera_sample_params
from drivetrain.pipeline.augment.stage import Augmentation, AugmentConfig, apply, sample_params, sample_params_each
from helpers.nosync import no_host_sync

ROOT = Path(__file__).resolve().parents[1]
EPS32 = torch.finfo(torch.float32).eps
# Every step of the lidar recipe on: SSN's vertical flips, a translation, both range filters and the shuffle.
LIDAR = dataclasses.replace(
    LIDAR_AUG, translation_std=(0.2, 0.2, 0.2), flip_vertical=0.5,
    point_range=(-20.0, -20.0, -5.0, 20.0, 20.0, 3.0), object_range=(-20.0, -20.0, 20.0, 20.0),
)  # fmt: skip
CAMERA = dataclasses.replace(
    CAMERA_AUG,
    image=dataclasses.replace(IMAGE_AUG, source_size=(160, 90), final_size=(128, 48), resize_lim=(0.76, 1.1)),
    bev=None,
)
POSITION = {"epoch": 1, "step": 3}


def _batch(synth_root, images=False, frames_=(0, 1, 2)):
    """Three training frames with the lidar (key frame + 1 sweep, x y z Δt) and, with ``images``, the cameras."""
    reading = {"load_points": True, "num_sweeps": 1, "use_dim": [0, 1, 2, 4], "load_images": images}
    dataset = frames(str(synth_root / "drivetrain_index.npz"), split="mini_train", **reading)
    return dataset.collate([dataset[i] for i in frames_])


def _coordinate_bound(batch, params) -> float:
    """The float32 bound of the two paths' coordinates: each rounds a three-term dot product of terms up to
    ``s·‖p‖₁`` plus ``|t|`` (≤ 3 roundings each, and the reference's translation after): 8 eps (s ‖p‖₁ + |t|)
    covers both with margin — the bound of tests/test_pipeline_lidar.py with this batch's draws."""
    longest = batch.points.tensor[..., :3].abs().sum(-1).max()
    return float(8 * EPS32 * (params.scale.max() * longest + params.translation.abs().sum(-1).max()))


def test_worker_and_device_lidar_paths_draw_the_same_and_agree(synth_index, synth_root):
    batch = _batch(synth_root)
    stage = AugmentConfig(lidar=LIDAR)
    device = Augmentation(stage, seed=7, rank=1, on="device")
    worker = Augmentation(stage, seed=7, rank=1, on="worker")
    drawn, again = device.params(batch, POSITION).lidar, worker.params(batch, POSITION).lidar
    for field in dataclasses.fields(drawn):
        assert torch.equal(getattr(drawn, field.name), getattr(again, field.name)), field.name
    assert drawn.flip_v.any() or drawn.flip_h.any()  # the seed draws some flip: the test covers them
    fast, ref = device(batch, POSITION), worker(batch, POSITION)
    assert fast.points.max_size == batch.points.max_size  # the device path keeps the padded length (no sync)
    for name in ("points", "gt_boxes", "gt_labels"):
        assert torch.equal(getattr(fast, name).sizes, getattr(ref, name).sizes), name
    assert int(fast.points.sizes.sum()) < int(batch.points.sizes.sum())  # the point range filter dropped some
    for a, b in zip(fast.gt_labels.to_list(), ref.gt_labels.to_list(), strict=True):
        assert torch.equal(a, b)
    bound = _coordinate_bound(batch, drawn)
    for name in ("points", "gt_boxes"):
        for a, b in zip(getattr(fast, name).to_list(), getattr(ref, name).to_list(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=bound)
    # the batch moved: not the identity (the same frames, other coordinates)
    assert not torch.equal(fast.gt_boxes.to_list()[0], batch.gt_boxes.to_list()[0][: int(fast.gt_boxes.sizes[0])])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_path_agrees_with_the_worker_path_without_a_host_sync(synth_index, synth_root):
    batch = _batch(synth_root)
    stage = AugmentConfig(lidar=LIDAR)
    params = Augmentation(stage, seed=7).params(batch, POSITION)  # drawn on the CPU, whatever the device
    apply(batch.to("cuda"), params, stage)  # warm-up
    with no_host_sync():
        fast = apply(batch.to("cuda"), params, stage)
    ref = Augmentation(stage, seed=7, on="worker")(batch, POSITION)
    bound = _coordinate_bound(batch, params.lidar)
    for name in ("points", "gt_boxes", "gt_labels"):
        moved = getattr(fast, name).to("cpu")
        assert torch.equal(moved.sizes, getattr(ref, name).sizes), name
        for a, b in zip(moved.to_list(), getattr(ref, name).to_list(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=bound if a.is_floating_point() else 0)


def test_the_device_path_syncs_nothing_and_replays_exactly(synth_index, synth_root):
    batch = _batch(synth_root)
    stage = AugmentConfig(lidar=LIDAR)
    params = Augmentation(stage, seed=3).params(batch, POSITION)
    with no_host_sync():
        first = apply(batch, params, stage)
    again = apply(batch, params, stage)
    for name in ("points", "gt_boxes", "gt_labels"):
        assert torch.equal(getattr(first, name).tensor, getattr(again, name).tensor), name


def test_draws_follow_seed_rank_and_position(synth_index, synth_root):
    batch = _batch(synth_root)
    stage = AugmentConfig(lidar=LIDAR)

    def angles(seed, rank, position):
        return Augmentation(stage, seed=seed, rank=rank).params(batch, position).lidar.angle

    base = angles(0, 0, POSITION)
    assert torch.equal(base, angles(0, 0, dict(POSITION)))  # a resumed run draws what the first one drew
    for other in (angles(0, 1, POSITION), angles(1, 0, POSITION), angles(0, 0, {"epoch": 1, "step": 4})):
        assert not torch.equal(base, other)


def test_a_sample_is_augmented_the_same_in_any_batch(synth_index, synth_root):
    """Each sample's draws come from its own generator (sample_params_each): a frame alone and beside two others
    (another padded point count, so other shuffle-key lengths) gets the same points, boxes, images and matrices."""
    lidar = dataclasses.replace(LIDAR, shuffle=True, object_range=None)
    stage = AugmentConfig(camera=dataclasses.replace(CAMERA, bev=None), lidar=lidar)

    def augmented(frames_):
        batch = _batch(synth_root, images=True, frames_=frames_)
        params = sample_params_each(batch, stage, [torch.Generator().manual_seed(50 + i) for i in frames_])
        return batch, apply(batch, params, stage)

    before, whole = augmented((0, 1, 2))
    small = int(before.points.sizes.argmin())  # padded beside the others: its shuffle keys are longer there
    _, alone = augmented((small,))
    assert before.points.max_size > alone.points.max_size
    for name in ("points", "gt_boxes", "gt_labels"):
        assert torch.equal(getattr(whole, name).to_list()[small], getattr(alone, name).to_list()[0]), name
    assert torch.equal(whole.lidar2img[small], alone.lidar2img[0])
    assert torch.equal(whole.images[small], alone.images[0])


def test_the_camera_draws_first_then_the_lidar(synth_index, synth_root):
    """The fixed order: one generator gives the camera's draws (as the camera stage alone draws them), then the
    lidar's; a camera-only recipe draws exactly what it drew before the lidar joined the stage."""
    batch = _batch(synth_root, images=True, frames_=(0, 1))
    stage = AugmentConfig(camera=CAMERA, lidar=dataclasses.replace(LIDAR, object_range=None))
    params = sample_params(batch, stage, torch.Generator().manual_seed(11))
    generator = torch.Generator().manual_seed(11)
    camera = camera_sample_params(batch, CAMERA, generator)
    lidar = draw_bev_params(2, batch.points.max_size, stage.lidar, generator)
    assert torch.equal(params.camera.image.scale, camera.image.scale)
    assert torch.equal(params.camera.image.crop, camera.image.crop)
    assert torch.equal(params.lidar.matrix, lidar.matrix) and torch.equal(params.lidar.shuffle_keys, lidar.shuffle_keys)
    alone = sample_params(batch, AugmentConfig(camera=CAMERA), torch.Generator().manual_seed(11))
    assert torch.equal(alone.camera.image.scale, params.camera.image.scale) and alone.lidar is None


@pytest.mark.parametrize("on", ["device", "worker"])
def test_a_lidar_step_on_a_batch_with_images_keeps_every_pixel_on_its_world_point(synth_index, synth_root, on):
    """lidar2img' · M p = lidar2img · p and ego_pose' · M p = ego_pose · p for every point p (no filter or shuffle:
    the points keep their rows). Bound per output row i: the moved point's coordinates carry the float32 error of
    the point test above, times ‖row_i‖₁ of the new matrix, plus the new matrix's own float32 rounding (eps
    relative per entry) times the largest coordinate."""
    batch = _batch(synth_root, images=True, frames_=(0, 1))
    plain = dataclasses.replace(LIDAR, point_range=None, object_range=None, shuffle=False)
    stage = Augmentation(AugmentConfig(lidar=plain), seed=2, on=on)
    params = stage.params(batch, POSITION).lidar
    out = stage(batch, POSITION)
    assert torch.equal(out.images, batch.images)  # the images are the camera step's business
    point_error = _coordinate_bound(batch, params)
    for b in range(2):
        n = int(batch.points.sizes[b])
        before = torch.cat([batch.points.tensor[b, :n, :3], torch.ones(n, 1)], dim=1).double()  # (P, 4)
        after = torch.cat([out.points.tensor[b, :n, :3], torch.ones(n, 1)], dim=1).double()  # (P, 4)
        largest = float(after[:, :3].abs().max())
        pairs = [(out.lidar2img[b, c], batch.lidar2img[b, c]) for c in range(batch.lidar2img.shape[1])]
        for new, old in [*pairs, (out.ego_pose[b], batch.ego_pose[b])]:
            new, old = new.double(), old.double()  # (4, 4)
            bound = new.abs().sum(-1) * (point_error + EPS32 * largest)  # (4,)
            assert ((after @ new.T - before @ old.T).abs() <= bound).all()
        # global → lidar: M · ego_pose_inv, a float64 product stored in float32 (half an eps relative per entry)
        expected = params.matrix[b].double() @ batch.ego_pose_inv[b].double()  # (4, 4)
        assert ((out.ego_pose_inv[b].double() - expected).abs() <= EPS32 * expected.abs()).all()


def test_evaluation_moves_no_point_and_training_needs_points(synth_index, synth_root):
    batch = _batch(synth_root)
    stage = Augmentation(AugmentConfig(lidar=LIDAR))
    out = stage.test_time(batch)
    for name in ("points", "gt_boxes", "gt_labels"):
        assert getattr(out, name) is getattr(batch, name), name
    with pytest.raises(ValueError, match=r"batch\.points: data\.augment\.lidar moves lidar points"):
        stage(dataclasses.replace(batch, points=None), POSITION)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.augment.lidar.rot_range=[1, 0]", "data.augment.lidar.rot_range: lower bound"),
        ("data.augment.lidar.rott=1", "data.augment.lidar: unknown field(s) ['rott']"),
        ("data.augment.lidar.flip_vertical=2", "data.augment.lidar.flip_vertical: probability"),
        ("data.augment.camera.imag={}", "data.augment.camera: unknown field(s) ['imag']"),
        ("data.augment.camera.bev={flip_horizontal: 0.5}", "data.augment.camera.bev: the camera recipe has no BEV"),
        ("data.augment.camera={}", "data.augment.camera.bev: must be null with data.augment.lidar"),
        ("data.augment.camera={bev: null}", "data.augment.lidar.object_range: must be null with data.augment.camera"),
        ("data.augment.fisheye={}", "data.augment.fisheye: unknown key; known keys: camera, lidar"),
        # the spellings before the stage: one line saying where the setting lives now
        ("data.augment.image={}", "data.augment.image: the camera augmentation moved to data.augment.camera"),
        ("model.args.augment={shuffle: false}", "model.args.augment: moved to data.augment.lidar"),
        ("model.args.seed=3", "model.args.seed: the lidar models draw no random numbers any more"),
    ],
)
def test_bad_or_moved_settings_are_one_line_naming_the_key(override, message):
    config = ROOT / "configs" / "pointpillars_tiny.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(config, [override])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_saved_configs_of_the_old_spelling_upgrade_to_the_new_one():
    """A checkpoint's config from before the stage reads as today's (the camera recipe keeps its draws: it draws
    first from the same seed), so a camera run resumes with the new spelling."""
    for name in ("streampetr_tiny_aug", "pointpillars_tiny"):
        new = config_to_dict(load_config(ROOT / "configs" / f"{name}.yaml"))
        assert upgrade_saved_config(new) == new  # today's spelling is left as it is
        augment = new["data"]["augment"]
        if augment["camera"] is not None:
            old = {**new, "data": {**new["data"], "augment": augment["camera"]}}
        else:
            args = {**new["model"]["args"], "augment": augment["lidar"], "seed": 0}
            old = {**new, "model": {**new["model"], "args": args}, "data": {**new["data"], "augment": None}}
        saved = copy.deepcopy(old)
        assert config_diff(old, new) != [] and config_diff(upgrade_saved_config(old), new) == []
        assert old == saved  # the saved config itself is not changed


def test_a_section_fills_what_it_leaves_out_from_the_models_recipe():
    """The published values live in the model's folder: a config's section sets some fields, the rest are the
    recipe its model's spec offers — the same values the configs trained with when they were the types' defaults."""
    lidar = load_config(ROOT / "configs" / "pointpillars_tiny.yaml").data.augment.lidar
    ranges = {"point_range": (-32.0, -32.0, -5.0, 32.0, 32.0, 3.0), "object_range": (-32.0, -32.0, 32.0, 32.0)}
    assert lidar == dataclasses.replace(LIDAR_AUG, **ranges)
    assert load_config(ROOT / "configs" / "ssn_tiny.yaml").data.augment.lidar == lidar  # SSN's spec: the same
    camera = load_config(ROOT / "configs" / "streampetr_tiny_aug.yaml").data.augment.camera
    sizes = {"source_size": (320, 180), "final_size": (256, 96), "resize_lim": (0.76, 1.1)}
    assert camera == dataclasses.replace(CAMERA_AUG, image=dataclasses.replace(IMAGE_AUG, **sizes))
    # the recipe never turns a section on, and a model that publishes none gets the types' defaults: every step off
    assert load_config(ROOT / "configs" / "pointpillars_tiny.yaml").data.augment.camera is None
    off = load_config(ROOT / "configs" / "smoke.yaml", ["data.augment={lidar: {}}"]).data.augment.lidar
    assert off == BevAugConfig() and off.rot_range == (0.0, 0.0) and not off.flip_horizontal and not off.shuffle
    with pytest.raises(ConfigError, match=r"data\.augment\.camera\.image: required"):
        load_config(ROOT / "configs" / "smoke.yaml", ["data.augment={camera: {}}"])


def test_a_plugin_spec_offers_its_own_recipe_and_a_wrong_one_is_one_line():
    """A plugin's spec offers its recipe as the built-in ones do; an ``augment`` that is not an AugmentConfig is refused
    when a config with a ``data.augment`` section loads, naming the model."""
    own = AugmentConfig(lidar=dataclasses.replace(LIDAR_AUG, flip_vertical=0.5, shuffle=False))
    for name, augment in (("recipe-plugin", own), ("recipe-bad", {"lidar": {}})):
        register_model(ModelSpec(name, build=SmokeModel, args=None, modalities=frozenset({"tensor"}), augment=augment))
    try:
        cfg = load_config(ROOT / "configs" / "smoke.yaml", ["model.name=recipe-plugin", "data.augment={lidar: {}}"])
        assert cfg.data.augment == own
        with pytest.raises(
            ConfigError, match=r"^.*model\.name: recipe-bad's spec offers augment=.*not an AugmentConfig$"
        ):
            load_config(ROOT / "configs" / "smoke.yaml", ["model.name=recipe-bad", "data.augment={lidar: {}}"])
        assert load_config(ROOT / "configs" / "smoke.yaml", ["model.name=recipe-bad"]).data.augment is None
    finally:
        _REGISTERED["model"].pop("recipe-plugin")
        _REGISTERED["model"].pop("recipe-bad")


def test_a_saved_config_that_holds_only_the_fields_it_set_reads_over_the_recipe():
    """A run's config written when the recipes were the types' defaults kept only the augmentation fields it set: it
    reads to the same numbers as today's, which holds every field (so such a run resumes)."""
    sets = {
        "pointpillars_tiny": {"lidar": {"point_range": [-32, -32, -5, 32, 32, 3], "object_range": [-32, -32, 32, 32]}},
        "streampetr_tiny_aug": {"camera": {"image": {"source_size": [320, 180], "final_size": [256, 96],
                                                     "resize_lim": [0.76, 1.1]}}},
    }  # fmt: skip
    for name, augment in sets.items():
        new = config_to_dict(load_config(ROOT / "configs" / f"{name}.yaml"))
        old = {**new, "data": {**new["data"], "augment": augment}}
        assert config_diff(old, new) == []
        section = next(iter(augment))
        other = {**new, "data": {**new["data"], "augment": {section: {**augment[section], "bev": None}}}}
        if section == "lidar":
            other["data"]["augment"] = {"lidar": {**augment["lidar"], "shuffle": False}}
        assert len(config_diff(other, new)) == 1  # one field set otherwise is a difference


def _lidar_run(out: Path, synth_root: Path, *extra: str):
    index = synth_root / "drivetrain_index.npz"
    return load_config(
        ROOT / "configs" / "pointpillars_tiny.yaml",
        [
            f"run.out_dir={out}", "run.threads=1", "run.deterministic=true", "log.progress=false",
            "log.tensorboard=false", "data.name=drivetrain.data.sources:frames",
            f"data.args={{index: {index}, split: mini_train, load_images: false, load_points: true, num_sweeps: 1, "
            "use_dim: [0, 1, 2, 4]}", "model.args.max_voxels=2000", "train.device=cpu", "train.steps=2",
            "checkpoint.every=2", "eval.every=0", "eval.at_start=false", *extra,
        ],
    )  # fmt: skip


def test_an_old_lidar_checkpoint_is_refused_for_resume_in_one_line_and_still_evaluates(
    synth_index, synth_root, tmp_path
):
    """A checkpoint written when the lidar model drew its own augmentation (its generator in the model's extra
    state, ``model.args.augment``/``seed`` in the config) cannot continue exactly; it still loads for evaluation."""
    from drivetrain.engine import Checkpointer
    from drivetrain.engine.eval_run import model_from_checkpoint
    from helpers.engine import final_state

    Trainer(_lidar_run(tmp_path / "new", synth_root)).fit()
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    shutil.rmtree(tmp_path / "old" / "checkpoints" / "step-00000002")
    state = final_state(tmp_path / "new")
    config = state["config"]
    config["model"]["args"].update(augment=config["data"]["augment"]["lidar"], seed=0)
    config["data"]["augment"] = None
    state["model"]["_extra_state"] = {"generator": torch.Generator().get_state()}
    Checkpointer(tmp_path / "old" / "checkpoints").save(2, state)
    with pytest.raises(ConfigError) as info:
        Trainer(_lidar_run(tmp_path / "old", synth_root, "train.steps=4"), resume="auto")
    assert "data.augment.lidar" in str(info.value) and "\n" not in str(info.value)
    model, cfg, _ = model_from_checkpoint(tmp_path / "old")
    assert cfg.data.augment.lidar is not None and "augment" not in keywords(cfg.model.args)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state["model"][key]), key
