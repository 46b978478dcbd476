"""The device prefetcher: on a CPU a pass-through with the stream's positions; the trainer with
``data.prefetch=true`` learns exactly what it learns without, and resumes exactly; on CUDA the batch in flight
is not part of the resume position, and batches arrive equal and in order."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from drivetrain.engine import Trainer, load_config
from drivetrain.pipeline.prefetch import DevicePrefetcher
from helpers.engine import assert_same_weights, final_state, overrides

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


class CountingStream:
    """Batches 0, 1, 2, ... with their position as the state."""

    def __init__(self) -> None:
        self.position = 0

    def next(self):
        batch = {"x": torch.full((3,), float(self.position)), "meta": [torch.tensor([self.position])]}
        self.position += 1
        return batch, torch.tensor([self.position - 1])

    def state_dict(self):
        return {"epoch": 0, "step": self.position}

    def load_state_dict(self, state):
        self.position = state["step"]


def test_cpu_prefetcher_passes_through_with_the_streams_positions():
    def transform(batch, position):
        return {**batch, "x": batch["x"] + 0.5, "position": position["step"]}

    prefetcher = DevicePrefetcher(CountingStream(), "cpu", transform=transform)
    for i in range(3):
        batch, indices = prefetcher.next()
        assert batch["x"].tolist() == [i + 0.5] * 3 and indices.tolist() == [i]
        assert batch["position"] == i + 1  # the transform sees the position after its batch
        assert prefetcher.state_dict()["step"] == i + 1
    prefetcher.load_state_dict({"epoch": 0, "step": 1})
    assert prefetcher.next()[1].tolist() == [1]


def test_training_with_prefetch_learns_and_resumes_exactly(tmp_path):
    def run(out, *extra, resume=None):
        cfg = load_config(SMOKE, overrides(out, "train.steps=6", "checkpoint.every=3", *extra))
        Trainer(cfg, resume=resume).fit()

    run(tmp_path / "plain")
    run(tmp_path / "prefetch", "data.prefetch=true")
    assert_same_weights(final_state(tmp_path / "prefetch")["model"], final_state(tmp_path / "plain")["model"])
    run(tmp_path / "resumed", "data.prefetch=true")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-00000006")
    run(tmp_path / "resumed", "data.prefetch=true", resume="auto")
    assert_same_weights(final_state(tmp_path / "resumed")["model"], final_state(tmp_path / "plain")["model"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetcher_hands_out_in_order_and_keeps_the_batch_in_flight_out_of_the_state():
    stream = CountingStream()
    prefetcher = DevicePrefetcher(stream, "cuda", transform=lambda b, position: {**b, "x": b["x"] * 2})
    for i in range(4):
        batch, _ = prefetcher.next()
        assert batch["x"].is_cuda and batch["x"].tolist() == [2.0 * i] * 3 and batch["meta"][0].item() == i
        assert prefetcher.state_dict()["step"] == i + 1 and stream.position == i + 2  # one in flight
    prefetcher.load_state_dict({"epoch": 0, "step": 2})
    assert prefetcher.next()[0]["meta"][0].item() == 2
