"""The whole loop on synthetic nuScenes-format data: scene-sequence batches, the focal-head detector and the
batched loss under the trainer, with exact resume of the sequence sampler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from drivetrain.data.sources import StreamingFrames, frames
from drivetrain.engine import ConfigError, Trainer, brings_own_batching, load_config
from drivetrain.models.focal2d import FocalDetector2D
from helpers.engine import assert_same_weights, final_state, losses, metrics

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "synth_tiny.yaml"


def run(out_dir: Path, index: Path, *extra: str, resume: str | None = None) -> Trainer:
    cfg = load_config(
        CONFIG,
        [
            f"run.out_dir={out_dir}",
            "run.threads=1",
            "run.deterministic=true",
            "log.progress=false",
            "log.tensorboard=false",
            "log.every=1",
            "model.args.width=8",
            "data.name=drivetrain.data.sources:frames",
            f"data.args={{index: {index}}}",
            "schedule.total_steps=8",
            *extra,
        ],
    )
    trainer = Trainer(cfg, resume=resume)
    trainer.fit()
    return trainer


def test_frames_bring_their_own_scene_batching(synth_index, synth_root):
    dataset = frames(str(synth_root / "drivetrain_index.npz"))
    assert isinstance(dataset, StreamingFrames) and brings_own_batching(dataset)
    sampler = dataset.batch_sampler(2, seed=0, shuffle=True, rank=0, world_size=1)
    first = next(iter(sampler))
    batch = dataset.collate([dataset[key] for key in first])
    assert batch.images.shape[:2] == (2, 6)
    assert (sampler.state_dict()["epoch"], sampler.state_dict()["step"]) == (0, 1)  # the position after it


def test_detector_outputs_fit_the_focal_head_loss(synth_index, synth_root):
    dataset = frames(str(synth_root / "drivetrain_index.npz"))
    sampler = dataset.batch_sampler(2, seed=0, shuffle=False, rank=0, world_size=1)
    batch = dataset.collate([dataset[key] for key in next(iter(sampler))])
    model = FocalDetector2D(width=8)
    outputs = model(batch)
    _, cams, _, height, width = batch.images.shape
    q = -(-height // 16) * -(-width // 16)
    assert outputs["cls_logits"].shape == (2, cams, q, 10) and outputs["centerness"].shape[-2:] == (
        -(-height // 16),
        -(-width // 16),
    )
    terms = model.loss(outputs, batch)
    reference = FocalDetector2D(width=8, impl="reference")
    reference.load_state_dict(model.state_dict())
    ref_terms = reference.loss(reference(batch), batch)
    for key, value in terms.items():
        assert torch.isfinite(value)
        torch.testing.assert_close(value, ref_terms[key], rtol=1e-5, atol=1e-7)


def test_trainer_runs_on_synthetic_frames_and_resumes_exactly(synth_index, synth_root, tmp_path):
    index = synth_root / "drivetrain_index.npz"
    run(tmp_path / "full", index, "train.steps=8", "checkpoint.every=4")
    reference = losses(tmp_path / "full")
    assert len(reference) == 8 and all(torch.isfinite(torch.tensor(reference)))
    assert metrics(tmp_path / "full")[0]["samples_per_s"] > 0

    run(tmp_path / "resumed", index, "train.steps=3", "checkpoint.every=4")
    run(tmp_path / "resumed", index, "train.steps=8", "checkpoint.every=4", resume="auto")
    assert losses(tmp_path / "resumed") == reference
    assert_same_weights(final_state(tmp_path / "full")["model"], final_state(tmp_path / "resumed")["model"])
    # The data position is the sequence sampler's: 8 batches of the 6 per epoch (4 scenes × 3 frames, 2 slots).
    data = final_state(tmp_path / "resumed")["data"]
    assert (data["epoch"], data["step"]) == (1, 2)


def test_a_resume_that_keeps_the_global_batch_but_not_the_scene_streams_is_refused_in_one_line(
    synth_index, synth_root, tmp_path
):
    """2 streams × 1 micro-batch and 1 stream × 2 micro-batches are the same global batch, but a stream's frames
    follow one another: the resume names the data.batch_size that keeps the streams."""
    index = synth_root / "drivetrain_index.npz"
    run(tmp_path, index, "train.steps=1")
    with pytest.raises(
        ConfigError,
        match=r"^--resume: checkpoint \S+: sampler: the checkpoint walked 2 scene streams "
        r"\(data\.batch_size × ranks\), this run 1 × 1 = 1; set data\.batch_size=2 to keep them$",
    ):
        run(tmp_path, index, "train.steps=2", "data.batch_size=1", "train.accumulation=2", resume="auto")


def test_synthetic_builder_reuses_a_finished_dataset_with_the_same_settings(tmp_path, monkeypatch):
    import drivetrain.data.synth as synth_module
    from drivetrain.data.sources import synthetic

    small = {"scenes": 4, "frames_per_scene": 2, "image_size": (160, 90)}
    first = synthetic(root=str(tmp_path), **small, generate=True)
    assert len(first) == 2 * 2  # the mini_train scenes of the four (the two mini_val ones are held out)
    assert len(synthetic(root=str(tmp_path), **small, split="mini_val")) == 2 * 2

    def fail(*args, **kwargs):
        raise AssertionError("the dataset was generated again")

    monkeypatch.setattr(synth_module, "generate", fail)
    (tmp_path / ".generate.lock").unlink()
    tmp_path.chmod(0o555)  # a read-only dataset is reused without writing anything
    try:
        assert len(synthetic(root=str(tmp_path), **small)) == len(first)
        assert not (tmp_path / ".generate.lock").exists()
    finally:
        tmp_path.chmod(0o755)
    with pytest.raises(ValueError, match=r"other settings \(seed: the data has 0, asked for 7"):
        synthetic(root=str(tmp_path), **small, seed=7)
    with pytest.raises(ValueError, match="samples_per_scene: the data has 2, asked for 8"):
        synthetic(root=str(tmp_path), scenes=4, image_size=(160, 90))
    with pytest.raises(ValueError, match="size"):
        synthetic(root=str(tmp_path), size="huge")


def test_synthetic_builder_reindexes_an_index_of_an_older_format(tmp_path):
    import numpy as np

    from drivetrain.data.sources import synthetic

    small = {"scenes": 4, "frames_per_scene": 2, "image_size": (160, 90)}
    synthetic(root=str(tmp_path), **small, generate=True)
    index = tmp_path / "drivetrain_index.npz"
    with np.load(index, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays["meta_json"].tobytes().decode())
    meta["format"] = "drivetrain-frame-index/2"  # written by an older drivetrain
    arrays["meta_json"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(index, **arrays)
    with pytest.warns(RuntimeWarning, match="re-indexing the synthetic dataset"):
        assert len(synthetic(root=str(tmp_path), **small, generate=True)) == 4


def test_gpu_solver_shapes_met_in_a_step_are_compiled_between_steps(
    synth_index, synth_root, tmp_path, monkeypatch, capsys
):
    """The trainer with the gpu backend's plumbing on the CPU (a recording SciPy stand-in for the Triton kernel):
    the first step meets its shapes uncompiled and solves them with SciPy, the trainer compiles every bucket of
    that head after the step (one line saying so), no later step falls back, and the losses are those of a run
    with the scipy backend."""
    import importlib

    import test_match_solve_buckets as buckets

    index = synth_root / "drivetrain_index.npz"
    run(tmp_path / "scipy", index, "train.steps=4")
    solve_module = importlib.import_module("drivetrain.match.solve")
    kernel = buckets.RecordingKernel()
    monkeypatch.setattr(solve_module, "gpu_solver_available", lambda device: True)
    monkeypatch.setattr(solve_module, "_triton_assignment", kernel)
    monkeypatch.setattr(solve_module, "_SHAPES", solve_module._ShapeBook())
    with pytest.warns(UserWarning, match="not compiled yet"):
        run(tmp_path / "gpu", index, "train.steps=4")
    shapes = solve_module.gpu_solver_shapes()
    fallbacks = shapes["fallbacks"]
    assert fallbacks >= 1 and shapes["pending"] == []
    compiled = {(q, g) for _, q, g in shapes["compiled"]}
    assert {g for _, g in compiled} == {8, 16, 32, 64}  # every bucket up to 64 of the head's Q
    assert set(kernel.shapes) <= compiled and len(kernel.shapes) > len(compiled)  # later steps ran the kernel
    assert losses(tmp_path / "gpu") == losses(tmp_path / "scipy")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("solver: ")]
    assert len(lines) == 1 and lines[0].startswith("solver: compiled 4 GPU assignment kernels (Q ")
    assert lines[0].endswith("after step 1")


def test_streampetr_3d_head_kernels_compile_before_the_first_step(
    synth_index, synth_root, tmp_path, monkeypatch, capsys
):
    """A model that declares its matched queries (``MatchedQueries``: StreamPETR's num_query + num_propagated) has
    that head's GPU solver kernels compiled before step 1, so no step falls back for it; the focal head's Q (tokens
    per image) is known only from a batch and compiles after step 1. On the CPU, with the recording stand-in."""
    import importlib

    import test_match_solve_buckets as buckets
    from helpers.streampetr import SMALL

    solve_module = importlib.import_module("drivetrain.match.solve")
    kernel = buckets.RecordingKernel()
    monkeypatch.setattr(solve_module, "gpu_solver_available", lambda device: True)
    monkeypatch.setattr(solve_module, "_triton_assignment", kernel)
    monkeypatch.setattr(solve_module, "_SHAPES", solve_module._ShapeBook())
    model = ", ".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items())
    cfg = load_config(
        ROOT / "configs" / "streampetr_tiny.yaml",
        [
            f"run.out_dir={tmp_path / 'run'}", "run.threads=1", "log.progress=false", "log.tensorboard=false",
            "eval.every=0", "eval.at_start=false", f"model.args={{{model}}}", "data.name=frames",
            f"data.args={{index: {synth_root / 'drivetrain_index.npz'}, split: mini_train}}", "train.steps=2",
        ],
    )  # fmt: skip
    with pytest.warns(UserWarning, match="not compiled yet"):  # the focal head's, in step 1
        Trainer(cfg).fit()
    queries = SMALL["num_query"] + SMALL["num_propagated"]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("solver: ")]
    assert lines[0].startswith(f"solver: compiled 4 GPU assignment kernels (Q {queries}: G 8, 16, 32, 64)")
    assert lines[0].endswith("before the first step")
    assert len(lines) == 2 and lines[1].endswith("after step 1") and f"Q {queries}:" not in lines[1]
    noted = {q for _, q, _ in solve_module.gpu_solver_shapes()["compiled"]}
    assert queries in noted and len(noted) == 2  # the 3D head's Q before step 1, the focal head's after it


def test_a_resumed_run_warming_the_gpu_solver_continues_bit_identically(synth_index, synth_root, tmp_path, monkeypatch):
    """StreamPETR (dropout, denoising noise) with the gpu backend's plumbing on the CPU (the recording stand-in for the
    Triton kernel): the resumed run warms the solver again after its RNG state was restored — the 3D head before its
    first step, the focal head after it, at other steps than the uninterrupted run — and still ends with the same
    losses and weights: the warm-up's random costs come from a generator of its own."""
    import importlib

    import test_match_solve_buckets as buckets
    from helpers.streampetr import SMALL

    solve_module = importlib.import_module("drivetrain.match.solve")
    buckets.install_recording_kernel(monkeypatch)
    model = ", ".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items())

    def fit(out: Path, steps: int, resume: str | None = None) -> None:
        monkeypatch.setattr(solve_module, "_SHAPES", solve_module._ShapeBook())  # a new process: nothing compiled
        cfg = load_config(
            ROOT / "configs" / "streampetr_tiny.yaml",
            [
                f"run.out_dir={out}", "run.threads=1", "run.deterministic=true", "log.progress=false",
                "log.tensorboard=false", "log.every=1", "eval.every=0", "eval.at_start=false",
                f"model.args={{{model}}}", "data.name=frames",
                f"data.args={{index: {synth_root / 'drivetrain_index.npz'}, split: mini_train}}",
                f"train.steps={steps}", "checkpoint.every=2", "checkpoint.keep=2",
            ],
        )  # fmt: skip
        with pytest.warns(UserWarning, match="not compiled yet"):  # the focal head's shapes, in the first step
            Trainer(cfg, resume=resume).fit()

    fit(tmp_path / "full", 4)
    fit(tmp_path / "resumed", 2)
    fit(tmp_path / "resumed", 4, resume="auto")
    assert losses(tmp_path / "resumed") == losses(tmp_path / "full") and len(losses(tmp_path / "full")) == 4
    assert_same_weights(final_state(tmp_path / "resumed")["model"], final_state(tmp_path / "full")["model"])
