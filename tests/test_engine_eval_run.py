"""Evaluation with the official metric: the decode → submission → devkit path scores ground truth as perfect,
evaluating leaves the streaming memory and the RNGs as they were (so training with ``eval.every`` learns exactly
what training without it learns), and ``drivetrain eval --checkpoint`` scores a run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from drivetrain.data.sources import frames
from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.engine.eval_run import evaluate_model, model_from_checkpoint
from drivetrain.models.streampetr import StreamPETR, decode
from drivetrain.models.streampetr.box_code import encode_boxes
from helpers.engine import assert_same_weights, final_state, metrics
from helpers.streampetr import SMALL

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "streampetr_tiny.yaml"


class GroundTruthDetector(nn.Module):
    """Feeds each frame's ground truth through StreamPETR's decoder as if the network had predicted it."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def detect(self, batch):
        boxes, labels = batch.gt_boxes, batch.gt_labels
        b, g = labels.tensor.shape
        logits = torch.full((b, g, 10), -20.0)  # (B, G, C): padding rows score ~2e-9 in every class
        logits.scatter_(2, labels.tensor.clamp(min=0).unsqueeze(-1), 20.0)
        logits = torch.where(labels.mask.unsqueeze(-1), logits, torch.full_like(logits, -20.0))
        codes = encode_boxes(boxes.tensor.reshape(-1, 9)).view(b, g, 10)  # (B, G, 10)
        # The threshold drops the ~2e-9 entries: false positives after full recall would still cost the devkit's
        # last recall bin (its precision there is the final one, after every false positive).
        return decode(logits, codes, max_num=min(300, g * 10), score_threshold=0.5)


def test_ground_truth_through_the_decoder_scores_a_perfect_map(synth_index, synth_root, tmp_path):
    dataset = frames(str(synth_root / "drivetrain_index.npz"), split="mini_val")
    result = evaluate_model(GroundTruthDetector(), dataset, "cpu", tmp_path, split="mini_val", progress=False)
    assert result.frames == len(dataset) == 6 and result.skipped == 0
    assert result.metrics["mean_ap"] >= 0.99, result.metrics["mean_dist_aps"]
    submission = json.loads(result.predictions.read_text())
    assert len(submission["results"]) == 6
    summary = result.summary()
    assert summary["mAP"] == result.metrics["mean_ap"] and "AP/car" in summary


def test_evaluation_leaves_the_memory_mode_and_rng_as_they_were(synth_index, synth_root, tmp_path):
    torch.manual_seed(0)
    model = StreamPETR(**SMALL)
    train = frames(str(synth_root / "drivetrain_index.npz"), split="mini_train")
    model(train.collate([train[0], train[3]]))  # training mode, a batch of 2: the memory holds 2 samples
    memory = {k: v.clone() for k, v in model.memory.get_extra_state().items()}
    rng = torch.get_rng_state()
    val = frames(str(synth_root / "drivetrain_index.npz"), split="mini_val")
    result = evaluate_model(model, val, "cpu", tmp_path, split="mini_val", progress=False, quiet=True)
    assert result.frames == 6 and (tmp_path / "devkit.log").is_file()
    assert model.training
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.memory.get_extra_state()
    assert after.keys() == memory.keys()
    for key, value in memory.items():
        assert torch.equal(after[key], value), key


def _train(out_dir: Path, index: Path, *extra: str) -> Trainer:
    args = ", ".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items())
    cfg = load_config(
        CONFIG,
        [
            f"run.out_dir={out_dir}",
            "run.threads=1",
            "run.deterministic=true",
            "log.progress=false",
            "log.tensorboard=false",
            "log.every=1",
            f"model.args={{{args}}}",
            "data.name=drivetrain.data.sources:frames",
            f"data.args={{index: {index}, split: mini_train}}",
            "train.device=cpu",
            "train.steps=4",
            *extra,
        ],
    )
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer


def test_training_with_evaluation_learns_exactly_what_training_without_it_learns(synth_index, synth_root, tmp_path):
    index = synth_root / "drivetrain_index.npz"
    _train(tmp_path / "plain", index)
    _train(tmp_path / "eval", index, "eval.every=2", "eval.at_start=true")
    evals = [m for m in metrics(tmp_path / "eval") if "eval/mAP" in m]
    assert [m["step"] for m in evals] == [0, 2, 4]
    assert all(0.0 <= m["eval/mAP"] <= 1.0 and "eval/AP/car" in m for m in evals)
    assert (tmp_path / "eval" / "eval" / "step-00000002" / "metrics_summary.json").is_file()
    assert_same_weights(final_state(tmp_path / "eval")["model"], final_state(tmp_path / "plain")["model"])


def test_eval_cli_scores_a_run_and_names_bad_paths(synth_index, synth_root, tmp_path, capsys):
    from drivetrain.cli.main import main

    index = synth_root / "drivetrain_index.npz"
    _train(tmp_path / "run", index, "train.steps=2")
    model, cfg, path = model_from_checkpoint(tmp_path / "run")
    assert isinstance(model, StreamPETR) and path.name == "step-00000002" and cfg.train.steps == 2
    assert main(["eval", "--checkpoint", str(tmp_path / "run"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("{\n") :])
    assert set(summary) >= {"mAP", "NDS", "trans_err", "AP"} and "car" in summary["AP"]
    assert (tmp_path / "run" / "eval" / "step-00000002-mini_val" / "results.json").is_file()
    with pytest.raises(SystemExit, match="does not exist"):
        main(["eval", "--checkpoint", str(tmp_path / "nothing")])
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no committed checkpoint"):
        main(["eval", "--checkpoint", str(tmp_path / "empty")])
    with pytest.raises(SystemExit, match="needs --root"):
        main(["eval", "--predictions", str(tmp_path / "results.json")])


def test_evaluation_during_training_is_refused_where_it_cannot_run(tmp_path):
    with pytest.raises(ConfigError, match=r"eval\.every"):
        load_config(ROOT / "configs" / "smoke.yaml", ["eval.every=5", "distributed.strategy=fsdp"])
    cfg = load_config(ROOT / "configs" / "smoke.yaml", [f"run.out_dir={tmp_path}", "eval.every=5"])
    with pytest.raises(ConfigError, match="no detect"):
        Trainer(cfg)


def test_evaluation_puts_the_first_frame_with_its_boxes_into_tensorboard(synth_index, synth_root, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator

    index = synth_root / "drivetrain_index.npz"
    _train(tmp_path / "run", index, "eval.every=4", "log.tensorboard=true")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={IMAGES: 0})
    events.Reload()
    assert "eval/frame-0" in events.Tags()["images"]
    image = events.Images("eval/frame-0")[-1]
    assert image.step == 4 and (image.width, image.height) == (3 * 160, 2 * 90)  # six 160×90 cameras, 3 × 2
    import io

    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(image.encoded_image_string)))
    assert pixels.std() > 10  # the camera images, not a blank canvas


@pytest.mark.parametrize("train_split", ["mini_val", None])
def test_training_on_the_evaluated_scenes_is_warned_about(synth_index, synth_root, tmp_path, train_split):
    index = synth_root / "drivetrain_index.npz"
    split = "null" if train_split is None else train_split  # null: every scene, the evaluated ones too
    cfg = load_config(
        CONFIG,
        [f"run.out_dir={tmp_path}", "log.tensorboard=false", "data.name=frames", "train.device=cpu",
         f"data.args={{index: {index}, split: {split}}}", "eval.every=2", "eval.split=mini_val"],
    )  # fmt: skip
    with pytest.warns(RuntimeWarning, match=r"eval.split: 'mini_val' is also what the run trains on"):
        Trainer(cfg).close()


def test_training_on_another_split_is_not_warned_about(synth_index, synth_root, tmp_path, recwarn):
    index = synth_root / "drivetrain_index.npz"
    cfg = load_config(
        CONFIG,
        [f"run.out_dir={tmp_path}", "log.tensorboard=false", "data.name=frames", "train.device=cpu",
         f"data.args={{index: {index}, split: mini_train}}", "eval.every=2"],
    )  # fmt: skip
    Trainer(cfg).close()
    assert not [w for w in recwarn if "also what the run trains on" in str(w.message)]
