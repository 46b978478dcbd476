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


def test_cpu_prefetcher_hands_out_each_batchs_host_shapes_with_it():
    """``shapes`` sees the host batch before its transform and the position after it; its result is the handed-out
    batch's, and its error surfaces when that batch is asked for."""
    seen = []

    def shapes(batch, position):
        seen.append(float(batch["x"][0]))
        if position["step"] == 3:
            raise ValueError("model.args.step_voxels: a batch needs 9, above the largest bucket 8")
        return ("bucket", float(batch["x"][0]), position["step"])

    prefetcher = DevicePrefetcher(
        CountingStream(), "cpu", transform=lambda b, p: {**b, "x": b["x"] + 0.5}, shapes=shapes
    )
    for i in range(2):
        batch, _ = prefetcher.next()
        assert prefetcher.handed_shapes == ("bucket", float(i), i + 1) and batch["x"][0] == i + 0.5
    with pytest.raises(ValueError, match=r"^model\.args\.step_voxels: "):
        prefetcher.next()
    assert seen == [0.0, 1.0, 2.0]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetcher_bounds_the_next_batch_on_its_helper_thread_while_this_one_trains():
    import threading

    threads = []

    def shapes(batch, position):
        threads.append(threading.current_thread().name)
        return float(batch["x"][0])

    prefetcher = DevicePrefetcher(
        CountingStream(), "cuda", transform=lambda b, p: {**b, "x": b["x"] * 2}, shapes=shapes
    )
    for i in range(3):
        batch, _ = prefetcher.next()
        assert prefetcher.handed_shapes == float(i) and batch["x"].is_cuda
    assert threads and all(name.startswith("drivetrain-shapes") for name in threads)


# the shipped GPU configs' loader: the prefetcher with persistent workers
GPU_LOADER = ["data.prefetch=true", "data.num_workers=2", "data.persistent_workers=true"]


@pytest.mark.parametrize("loader", [["data.prefetch=true"], GPU_LOADER], ids=["prefetch", "prefetch+persistent"])
def test_training_with_prefetch_learns_and_resumes_exactly(tmp_path, loader):
    def run(out, *extra, resume=None):  # 64 samples: 4 batches an epoch, so the runs cross epochs (and resume in one)
        steps = ["train.steps=6", "checkpoint.every=3", "data.args.num_samples=64"]
        Trainer(load_config(SMOKE, overrides(out, *steps, *extra)), resume=resume).fit()

    run(tmp_path / "plain")
    run(tmp_path / "prefetch", *loader)
    assert_same_weights(final_state(tmp_path / "prefetch")["model"], final_state(tmp_path / "plain")["model"])
    run(tmp_path / "resumed", *loader)
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-00000006")
    run(tmp_path / "resumed", *loader, resume="auto")
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


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
BUSY = 200_000_000  # GPU cycles of torch.cuda._sleep: ~0.1 s at 2 GHz, far longer than the host work around it


class BatchStream:
    """Collated synthetic batches (with points) in a fixed order, their position as the state."""

    def __init__(self, batches) -> None:
        self.batches, self.position = batches, 0

    def next(self):
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return batch, torch.tensor([self.position - 1])

    def state_dict(self):
        return {"epoch": 0, "step": self.position}

    def load_state_dict(self, state):
        self.position = state["step"]


@pytest.fixture(scope="module")
def batches(synth_index, synth_root):
    from drivetrain.data import DatasetConfig, FrameDataset, collate

    dataset = FrameDataset(synth_index, DatasetConfig(load_points=True), synth_root)
    return [collate([dataset[i], dataset[i + 1]]) for i in (0, 2, 4)]


def scale_images(batch, position):
    """A device transform: float images scaled by the step (a stand-in for the augmentation)."""
    from dataclasses import replace

    return replace(batch, images=batch.images.float() * position["step"])


@pytest.mark.cuda
@needs_cuda
def test_cuda_prefetched_batches_equal_the_cpu_pass_through(batches):
    from drivetrain.pipeline.transfer import flatten

    on_cpu = DevicePrefetcher(BatchStream(batches), "cpu", transform=scale_images)
    on_gpu = DevicePrefetcher(BatchStream(batches), "cuda", transform=scale_images)
    for _ in range(5):  # wraps around the three batches
        (want, want_rows), (got, got_rows) = on_cpu.next(), on_gpu.next()
        assert torch.equal(want_rows, got_rows) and got.sample_tokens == want.sample_tokens
        for a, b in zip(flatten(got)[0], flatten(want)[0], strict=True):
            assert a.is_cuda and a.dtype == b.dtype and torch.equal(a.cpu(), b)


@pytest.mark.cuda
@needs_cuda
def test_cuda_transform_runs_on_the_side_stream_and_the_consumer_waits_for_it():
    seen = []

    def slow_double(batch, position):
        seen.append(torch.cuda.current_stream())
        torch.cuda._sleep(BUSY)  # the transform's work is still queued when next() returns
        return {**batch, "x": batch["x"] * 2}

    prefetcher = DevicePrefetcher(CountingStream(), "cuda", transform=slow_double)
    for i in range(3):
        batch, _ = prefetcher.next()
        assert batch["x"].tolist() == [2.0 * i] * 3  # read on the consumer stream: after the transform
    consumer = torch.cuda.current_stream()
    assert seen and all(stream == prefetcher._side and stream != consumer for stream in seen)


@pytest.mark.cuda
@needs_cuda
def test_cuda_batch_freed_while_the_consumer_reads_it_is_not_overwritten_by_the_next():
    """The prefetcher records each batch on the consumer stream: freed by the host while the consumer's kernels
    still read it, its memory is not handed to batch n+1's copy or transform on the side stream."""
    for transform in (None, lambda batch, position: {**batch, "x": batch["x"] + 0}):
        prefetcher = DevicePrefetcher(CountingStream(), "cuda", transform=transform)
        totals = []
        for _ in range(4):
            batch, _ = prefetcher.next()
            torch.cuda._sleep(BUSY // 4)  # the consumer is busy ...
            totals.append(batch["x"].sum())  # ... then reads the batch
            del batch  # batch n+1 was started with the last next(); batch n+2 starts with the next one
        assert [t.item() for t in totals] == [3.0 * i for i in range(4)]


@pytest.mark.cuda
@needs_cuda
def test_cuda_batches_already_on_the_device_are_transformed_once_the_current_stream_wrote_them():
    """A stream handing out device tensors (DALI's images: copied into torch's tensors on the current stream) while
    the current stream is busy: the transform on the side stream reads them once written, not before."""

    class OnDevice(CountingStream):
        def next(self):
            batch, indices = super().next()
            x = torch.zeros(3, device="cuda")
            torch.cuda._sleep(BUSY)  # the current stream is busy (a step) ...
            x.fill_(float(self.position))  # ... then writes the batch
            return {**batch, "x": x}, indices

    prefetcher = DevicePrefetcher(OnDevice(), "cuda", transform=lambda b, position: {**b, "x": b["x"] * 2})
    for i in range(3):
        batch, _ = prefetcher.next()
        assert batch["x"].tolist() == [2.0 * (i + 1)] * 3
