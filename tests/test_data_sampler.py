"""SequenceSampler: slots walk scenes in order, seeded shuffles, sharding, exact mid-epoch resume."""

import itertools

import numpy as np
import pytest

from drivetrain.data import SequenceSampler

LENGTHS = [5, 3, 7, 4, 6, 2, 5, 8]
STARTS = [sum(LENGTHS[:i]) for i in range(len(LENGTHS))]


def scene_of(frame: int) -> tuple[int, int]:
    scene = max(i for i, s in enumerate(STARTS) if s <= frame)
    return scene, frame - STARTS[scene]


def epoch(sampler) -> list[list]:
    return list(iter(sampler))


def test_each_slot_walks_consecutive_frames_and_prev_exists_marks_continuations():
    batches = epoch(SequenceSampler(LENGTHS, 3, seed=0))
    assert batches
    for slot in range(3):
        keys = [b[slot] for b in batches]
        for prev, key in itertools.pairwise(keys):
            ps, pf = scene_of(prev.index)
            s, f = scene_of(key.index)
            assert key.prev_exists == (s == ps and f == pf + 1)
            assert (s == ps and f == pf + 1) or f == 0  # a new scene starts at its first frame
        assert scene_of(keys[0].index)[1] == 0 and not keys[0].prev_exists


def test_no_frame_is_visited_twice_in_an_epoch():
    frames = [k.index for b in epoch(SequenceSampler(LENGTHS, 2, seed=1)) for k in b]
    assert len(frames) == len(set(frames))


def test_scene_order_is_shuffled_by_seed_and_epoch():
    first = [k.index for k in epoch(SequenceSampler(LENGTHS, 2, seed=5))[0]]
    assert first == [k.index for k in epoch(SequenceSampler(LENGTHS, 2, seed=5))[0]]
    orders = {tuple(k.index for b in epoch(SequenceSampler(LENGTHS, 2, seed=s)) for k in b) for s in range(6)}
    assert len(orders) > 1
    sampler = SequenceSampler(LENGTHS, 2, seed=5)
    e0 = epoch(sampler)
    assert sampler.state_dict()["epoch"] == 1  # a pass ends by moving to the next epoch
    e1 = epoch(sampler)
    assert e0 != e1


def test_ranks_get_disjoint_scenes_and_the_same_number_of_steps():
    shards = [epoch(SequenceSampler(LENGTHS, 2, seed=2, rank=r, world_size=2)) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) > 0
    scenes = [{scene_of(k.index)[0] for b in shard for k in b} for shard in shards]
    assert not scenes[0] & scenes[1]


@pytest.mark.parametrize("stop", [0, 1, 3])
def test_resume_mid_epoch_continues_exactly_without_replaying(stop):
    reference = SequenceSampler(LENGTHS, 2, seed=7)
    full = epoch(reference) + epoch(reference)
    sampler = SequenceSampler(LENGTHS, 2, seed=7)
    it = iter(sampler)
    for _ in range(stop):
        next(it)
    state = sampler.state_dict()
    resumed = SequenceSampler(LENGTHS, 2, seed=7)
    resumed.load_state_dict(state)
    rest = epoch(resumed) + epoch(resumed)
    assert rest == full[stop:]


def test_state_read_right_after_a_batch_resumes_after_it_despite_prefetch():
    sampler = SequenceSampler(LENGTHS, 2, seed=9)
    it = iter(sampler)
    batches = [next(it), next(it)]
    after_second = sampler.state_dict()  # what the engine records when the loader draws this batch
    batches += list(it)  # the loader draws ahead; the recorded state does not move
    resumed = SequenceSampler(LENGTHS, 2, seed=9)
    resumed.load_state_dict(after_second)
    assert epoch(resumed) == batches[2:]


def test_resume_at_the_end_of_an_epoch_starts_the_next():
    sampler = SequenceSampler(LENGTHS, 2, seed=1)
    steps = len(sampler)
    sampler.load_state_dict({"epoch": 0, "step": steps})
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["step"] == 0


def test_load_state_dict_rejects_a_state_of_another_configuration():
    state = SequenceSampler(LENGTHS, 2, seed=1).state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        SequenceSampler(LENGTHS, 3, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        SequenceSampler(LENGTHS, 2, seed=2).load_state_dict(state)


def test_a_position_saved_on_rank_0_resumes_every_rank():
    """A checkpoint holds rank 0's position; rank 1 continues at the same (epoch, step) with its own scenes."""
    first, second = SequenceSampler(LENGTHS, 1, rank=0, world_size=2), SequenceSampler(LENGTHS, 1, rank=1, world_size=2)
    iter_first, iter_second = iter(first), iter(second)
    next(iter_first), next(iter_second)
    state, expected = first.state_dict(), next(iter_second)
    resumed = SequenceSampler(LENGTHS, 1, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert resumed.state_dict()["step"] == 1 and next(iter(resumed)) == expected


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="cannot fill"):
        SequenceSampler([3, 3], 2, world_size=2)
    with pytest.raises(ValueError, match="rank"):
        SequenceSampler(LENGTHS, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="at least one frame"):
        SequenceSampler([3, 0, 2], 1)


def global_steps(batch_size: int, world_size: int, epochs: int = 2, stop: int | None = None) -> list[list]:
    """Every rank's batches side by side, step after step (streams in global order), over ``epochs`` epochs; with
    ``stop``, 4 streams walked that far by 2 ranks × 2 first and the rest by this split, resumed from rank 0's state."""
    samplers = [SequenceSampler(LENGTHS, batch_size, seed=4, rank=r, world_size=world_size) for r in range(world_size)]
    if stop is not None:
        first = SequenceSampler(LENGTHS, 2, seed=4, rank=0, world_size=2)
        for _ in zip(range(stop), first, strict=False):
            pass
        for sampler in samplers:
            sampler.load_state_dict(first.state_dict())
    steps = []
    for _ in range(epochs):
        per_rank = [epoch(s) for s in samplers]
        steps += [[key for rank in step for key in rank] for step in zip(*per_rank, strict=True)]
    return steps


@pytest.mark.parametrize("split", [(4, 1), (2, 2), (1, 4)])
def test_any_split_of_the_same_streams_walks_the_same_frames_without_repeats(split):
    """4 streams as 1 rank × 4, 2 × 2 or 4 × 1: the same frames in the same streams at every step, no frame twice in
    an epoch; a position of 2 ranks × 2 resumes on each split mid-epoch and continues the straight walk."""
    reference = global_steps(4, 1)
    assert global_steps(*split) == reference
    first_epoch = [key.index for step in reference[: len(epoch(SequenceSampler(LENGTHS, 4, seed=4)))] for key in step]
    assert len(first_epoch) == len(set(first_epoch))
    for stop in (2, 5):
        resumed = global_steps(*split, epochs=1, stop=stop)
        assert resumed == reference[stop : stop + len(resumed)]


def test_another_number_of_streams_is_refused_naming_the_batch_size_that_keeps_them():
    state = SequenceSampler(LENGTHS, 2, rank=0, world_size=2).state_dict()  # 4 streams
    with pytest.raises(ValueError, match=r"walked 4 scene streams .*this run 2 × 1 = 2; set data.batch_size=4"):
        SequenceSampler(LENGTHS, 2).load_state_dict(state)


def test_an_older_per_rank_dealing_continues_on_the_same_split():
    """A state without ``streams`` (scenes dealt round-robin to ranks, then to slots) keeps that dealing."""
    old = {"epoch": 0, "step": 1, "seed": 3, "batch_size": 1, "rank": 0, "world_size": 2, "num_frames": 40}
    samplers = [SequenceSampler(LENGTHS, 1, seed=3, rank=r, world_size=2) for r in range(2)]
    for r, sampler in enumerate(samplers):
        sampler.load_state_dict({**old, "rank": r})
        order = [int(s) for s in np.random.default_rng([3, 0]).permutation(len(LENGTHS))]
        mine = [STARTS[s] + f for s in order[r::2] for f in range(LENGTHS[s])]  # one slot: the rank's scenes in turn
        assert [b[0].index for b in epoch(sampler)] == mine[1 : sampler.steps_in_epoch(0)]
        assert sampler.state_dict()["dealing"] == "per_rank"
    with pytest.raises(ValueError, match=r"same data\.batch_size and number of ranks"):
        SequenceSampler(LENGTHS, 2, seed=3).load_state_dict(old)
