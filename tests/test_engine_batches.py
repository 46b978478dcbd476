"""The trainer's batch stream: shuffled batches sharded by rank, datasets with their own batching, the
resume position the engine records per batch (exact with prefetching and persistent workers), and the
worker-count rule."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate

from drivetrain.data.sampler import SequenceSampler
from drivetrain.engine import BatchStream, ShuffledBatches, brings_own_batching
from drivetrain.engine.batches import HEADROOM, WAIT_TARGET, loader_wait_ms, suggest_num_workers
from drivetrain.engine.config import DataConfig
from drivetrain.models.smoke import SmokeDataset
from drivetrain.seeding import mix_seed

SCENES = [3, 4, 2, 5, 3, 3]  # frames per scene: 20 frames


class SceneSmoke(SmokeDataset):
    """Smoke samples batched by scene sequences, as streaming datasets are (keys are FrameKey)."""

    def __init__(self) -> None:
        super().__init__(num_samples=sum(SCENES), size=4)

    def __getitem__(self, key):
        return super().__getitem__(key.index)

    def batch_sampler(self, batch_size, *, seed, shuffle, rank, world_size):
        return SequenceSampler(SCENES, batch_size, seed=seed, shuffle=shuffle, rank=rank, world_size=world_size)

    def collate(self, samples):
        return default_collate(samples)


def dataset_of(kind: str):
    return SmokeDataset(num_samples=10, size=4) if kind == "shuffled" else SceneSmoke()


def config(workers: int, batch_size: int = 2) -> DataConfig:
    return DataConfig(batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)


def test_shuffled_batches_shard_disjointly_and_cover_the_divisible_part() -> None:
    shards = [ShuffledBatches(10, 1, seed=1, rank=r, world_size=3).epoch_indices(0) for r in range(3)]
    flat = torch.cat(shards).flatten()
    assert len(flat) == 9 and len(set(flat.tolist())) == 9
    one = ShuffledBatches(10, 2, seed=1)
    assert one.epoch_indices(0).shape == (5, 2)
    assert not torch.equal(one.epoch_indices(0), one.epoch_indices(1))
    assert torch.equal(ShuffledBatches(10, 2, shuffle=False).epoch_indices(3).flatten(), torch.arange(10))


def test_shuffled_batches_walk_one_epoch_per_pass_and_refuse_other_shapes() -> None:
    sampler = ShuffledBatches(7, 3, seed=0)
    first = list(sampler)
    assert len(first) == 2 and all(len(b) == 3 for b in first)  # the 7th sample is dropped this epoch
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["step"] == 0
    assert list(sampler) == sampler.epoch_indices(1).tolist()
    with pytest.raises(ValueError, match=r"global batch of 3, this run has 2; keep data\.batch_size × ranks"):
        ShuffledBatches(7, 2).load_state_dict(ShuffledBatches(7, 3).state_dict())
    with pytest.raises(ValueError, match="global batch of 2, this run has 4"):
        ShuffledBatches(8, 2, world_size=2).load_state_dict(ShuffledBatches(8, 2).state_dict())
    with pytest.raises(
        ValueError,
        match=r"^one optimizer step takes 4 × 2 rank\(s\) × 1 micro-batch\(es\) = 8 samples, more than its 7$",
    ):
        ShuffledBatches(7, 4, world_size=2)


def test_shuffled_batches_cut_epochs_in_global_steps_whatever_the_split() -> None:
    """For one global batch (8), 2 ranks × 4, 1 rank × 4 × accumulation 2, 1 rank × 8 and 4 ranks × 1 × 2 read the
    same rows in each optimizer step, and the epoch of 21 rows ends after 2 steps on every split."""

    def steps(batch_size: int, world_size: int, accumulation: int) -> list[list[int]]:
        shards = [
            list(ShuffledBatches(21, batch_size, seed=3, rank=r, world_size=world_size, accumulation=accumulation))
            for r in range(world_size)
        ]
        micro = [[row for shard in shards for row in shard[m]] for m in range(len(shards[0]))]
        return [sorted(r for m in micro[s : s + accumulation] for r in m) for s in range(0, len(micro), accumulation)]

    reference = steps(8, 1, 1)
    assert len(reference) == 2 and len({row for step in reference for row in step}) == 16
    for split in [(4, 2, 1), (4, 1, 2), (1, 4, 2), (2, 2, 2)]:
        assert steps(*split) == reference, split


def test_shuffled_batches_continue_a_global_position_on_another_split() -> None:
    """A position after 3 optimizer steps of 2 ranks × 2 continues on 1 rank × 2 × accumulation 2 (and 4 ranks × 1)
    at the same rows; a position inside a micro-batch of the new split is refused in one line."""
    ran = ShuffledBatches(40, 2, seed=1, rank=0, world_size=2)
    for _ in zip(range(3), ran, strict=False):
        pass
    state = ran.state_dict()
    assert (state["epoch"], state["sample"], state["global_batch"]) == (0, 12, 4)
    one = ShuffledBatches(40, 2, seed=1, accumulation=2)
    one.load_state_dict(state)
    rest = [row for batch in one for row in batch]
    order = torch.randperm(40, generator=torch.Generator().manual_seed(mix_seed(1, 0))).tolist()
    assert rest == order[12:40]  # one rank reads the permutation in order from row 12
    four = [ShuffledBatches(40, 1, seed=1, rank=r, world_size=4) for r in range(4)]
    for sampler in four:
        sampler.load_state_dict(state)
    assert sorted(row for sampler in four for batch in sampler for row in batch) == sorted(order[12:40])
    odd = ShuffledBatches(40, 8, seed=1, accumulation=1, world_size=1)
    with pytest.raises(ValueError, match="global batch of 4, this run has 8"):
        odd.load_state_dict(state)
    with pytest.raises(ValueError, match=r"^sampler: position 6 falls inside a micro-batch of 4 × 1 rank\(s\)"):
        ShuffledBatches(40, 4, seed=1).load_state_dict({**state, "sample": 6})


def test_shuffled_batches_read_an_older_per_rank_position_on_the_same_split() -> None:
    """A checkpoint of a drivetrain before elastic resume holds ``(epoch, step)`` per rank: it continues with the
    same batch size and world size (at ``step × B × R`` rows) and names both otherwise."""
    old = {"epoch": 2, "step": 3, "batch_size": 2, "world_size": 2}
    sampler = ShuffledBatches(40, 2, rank=1, world_size=2)
    sampler.load_state_dict(old)
    assert (sampler.epoch, sampler.step, sampler.state_dict()["sample"]) == (2, 3, 12)
    with pytest.raises(ValueError, match="world_size 2, this run has 1; a checkpoint of a drivetrain before elastic"):
        ShuffledBatches(40, 2, accumulation=2).load_state_dict(old)


def test_shuffled_batches_refuse_a_state_without_a_batch_position_in_one_line() -> None:
    """The sample-counted position of format-version-1 checkpoints is no longer read (the trainer refuses those
    checkpoints by their version first, tests/test_engine_state.py); a sampler given one names the field."""
    sampler = ShuffledBatches(10, 2)
    with pytest.raises(
        ValueError, match=r"^sampler: the state has no 'step' \(it holds epoch, position, num_replicas\)$"
    ):
        sampler.load_state_dict({"epoch": 1, "position": 4, "num_replicas": 1})
    assert (sampler.epoch, sampler.step) == (0, 0)  # nothing moved


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["shuffled", "own"])
def test_stream_resumes_at_the_next_unseen_batch_across_epochs(kind: str, workers: int) -> None:
    dataset = dataset_of(kind)
    assert brings_own_batching(dataset) == (kind == "own")
    full = BatchStream(dataset, config(workers), seed=3)
    expected = [full.next() for _ in range(12)]  # 5 (shuffled) or 6–9 (scenes) batches an epoch: crosses epochs
    for cut in (1, 4, 7):
        first = BatchStream(dataset, config(workers), seed=3)
        got = [first.next()[1] for _ in range(cut)]  # workers have drawn batches beyond the cut by now
        resumed = BatchStream(dataset, config(workers), seed=3)
        resumed.load_state_dict(first.state_dict())
        got += [resumed.next()[1] for _ in range(12 - cut)]
        assert all(torch.equal(a, b) for (_, a), b in zip(expected, got, strict=True)), cut
    for batch, rows in expected:  # each batch holds the rows the stream names
        assert torch.equal(batch["image"], torch.stack([SmokeDataset.__getitem__(dataset, i)["image"] for i in rows]))


@pytest.mark.parametrize("kind", ["shuffled", "own"])
def test_a_live_stream_restarts_at_a_restored_position_with_persistent_workers(kind: str) -> None:
    dataset = dataset_of(kind)
    stream = BatchStream(dataset, config(2), seed=0)
    rows = [stream.next()[1] for _ in range(3)]
    state = stream.state_dict()
    rows += [stream.next()[1] for _ in range(4)]
    stream.load_state_dict(state)
    again = [stream.next()[1] for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(rows[3:], again, strict=True))


@pytest.mark.parametrize("kind", ["shuffled", "own"])
def test_stream_leaves_the_global_rng_alone(kind: str) -> None:
    # Worker seeds come from the loader's private generator; drawing them from the global RNG would shift
    # dropout and augmentation draws of a resumed run against the original one.
    stream = BatchStream(dataset_of(kind), config(0), seed=0)
    before = torch.get_rng_state()
    for _ in range(8):
        stream.next()
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("kind", ["shuffled", "own"])
def test_ranks_read_disjoint_rows(kind: str) -> None:
    dataset = dataset_of(kind)
    streams = [BatchStream(dataset, config(0), seed=5, rank=r, world_size=2) for r in range(2)]
    rows = [torch.cat([s.next()[1] for _ in range(2)]) for s in streams]  # within the first epoch
    assert not set(rows[0].tolist()) & set(rows[1].tolist())


def test_no_workers_while_the_loader_costs_at_most_the_wait_target_of_the_step() -> None:
    assert suggest_num_workers(16, worker_ms_per_batch=5.0, step_ms=5.0 / WAIT_TARGET) == 0
    assert suggest_num_workers(16, worker_ms_per_batch=5.01, step_ms=5.0 / WAIT_TARGET) == 1
    assert loader_wait_ms(0, 5.0, 100.0) == 5.0  # without workers the step waits for the whole loader


@pytest.mark.parametrize("cores", [2, 4, 16, 64])
def test_suggested_workers_keep_up_with_headroom_unless_the_cores_run_out(cores: int) -> None:
    for worker_ms in (1.0, 7.5, 33.0, 111.6, 400.0):
        for step_ms in (10.0, 44.9, 250.0, 1000.0):
            workers = suggest_num_workers(cores, worker_ms, step_ms)
            assert 0 <= workers <= max(1, cores - 1)
            if workers == 0:
                continue
            delivered = workers * step_ms / worker_ms  # batches the workers deliver per batch the step takes
            if workers < cores - 1:  # not capped: HEADROOM × what the step takes, and one worker fewer is short
                assert delivered >= HEADROOM and loader_wait_ms(workers, worker_ms, step_ms) == 0
                assert workers == 1 or (workers - 1) * step_ms / worker_ms < HEADROOM
            elif worker_ms / workers > step_ms:  # capped and short: the wait says by how much
                assert loader_wait_ms(workers, worker_ms, step_ms) == pytest.approx(worker_ms / workers - step_ms)


def test_the_published_lidar_loader_needs_four_workers_on_an_h200_host() -> None:
    # bench iteration, PointPillars full, H200 (benchmarks/results/iteration-pointpillars-full-cuda.md): 111.6 ms data
    # wait without workers, 156.5 ms iteration
    assert suggest_num_workers(16, 111.6, 156.5 - 111.6) == 4
    assert suggest_num_workers(2, 111.6, 156.5 - 111.6) == 1  # a 2-core machine: the cap
    assert loader_wait_ms(1, 111.6, 44.9) == pytest.approx(111.6 - 44.9)
    with pytest.raises(ValueError, match="cores ≥ 1"):
        suggest_num_workers(0, 10.0, 10.0)


@pytest.mark.parametrize("lost", [ConnectionResetError(104, "Connection reset by peer"), EOFError()])
def test_a_worker_lost_while_it_sends_a_batch_is_the_dead_worker_error(lost) -> None:
    """A worker killed while it hands over a batch's shared memory surfaces in the main process as a reset or closed
    connection inside the loader's unpickling, not as torch's worker-exit error: the stream says it in the words the
    trainer turns into its one line with a checkpoint; without workers the error is the error."""
    from drivetrain.engine.step_outcome import dead_worker

    class Lost:
        def __next__(self):
            raise lost

    stream = BatchStream(dataset_of("shuffled"), config(2), seed=0)
    stream._iter = Lost()
    with pytest.raises(RuntimeError, match=r"^DataLoader worker lost while it sent a batch \(") as caught:
        stream.next()
    died = dead_worker(caught.value)
    assert died is not None and "a data loader worker process died (DataLoader worker lost" in str(died)
    alone = BatchStream(dataset_of("shuffled"), config(0), seed=0)
    alone._iter = Lost()
    with pytest.raises(type(lost)):
        alone.next()
