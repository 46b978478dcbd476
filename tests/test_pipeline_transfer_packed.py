"""The packed copier: nested structures (dicts, sequences, named tuples, frozen dataclasses, RaggedBatch) flatten
and rebuild; every dtype, empty, 0-d and non-contiguous tensor survives a packed round trip bit for bit, the
small ones in one buffer with no padding; the host work is a fixed number of torch calls whatever the number of
tensors; below ``min_leaves`` (and above ``pack_below`` bytes) tensors go one by one; a CPU target without
``always`` copies nothing; on CUDA the copy runs on a side stream, the consumer stream waits for its event, the
buffers are recorded on the consumer stream, and the outputs equal the CPU path's."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import pytest
import torch
from torch.overrides import TorchFunctionMode

from drivetrain.pipeline.transfer import PACK_BELOW, PACK_MIN_LEAVES, PackedCopier, flatten
from drivetrain.ragged import RaggedBatch

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool]  # fmt: skip
Pair = namedtuple("Pair", ["left", "right"])


@dataclasses.dataclass(frozen=True)
class Frame:
    image: torch.Tensor
    boxes: RaggedBatch
    token: str


def tensors(generator: torch.Generator) -> list[torch.Tensor]:
    """One tensor per dtype plus the awkward shapes: empty, 0-d, transposed, strided."""
    out = []
    for i, dtype in enumerate(DTYPES):
        values = torch.randn(3, 5 + i, generator=generator) * 100
        if dtype.is_complex:
            out.append(torch.complex(values, -values).to(dtype))
        else:
            out.append(values.to(dtype) if dtype != torch.bool else values > 0)
    big = torch.randn(6, 8, generator=generator)
    out += [torch.zeros(0, 4), torch.tensor(7, dtype=torch.int64), big.t(), big[::2, 1::3]]
    return out


def structure(generator: torch.Generator) -> dict:
    ts = tensors(generator)
    boxes = RaggedBatch.from_list([torch.randn(2, 9, generator=generator), torch.randn(4, 9, generator=generator)])
    _ = boxes.mask  # cached: it travels too
    return {
        "plain": ts[:5],
        "pair": Pair(ts[5], (ts[6], "label", 3)),
        "frame": Frame(ts[7], boxes, "token-1"),
        "rest": tuple(ts[8:]),
        "none": None,
    }


def assert_same(a, b) -> None:
    leaves_a, _ = flatten(a)
    leaves_b, _ = flatten(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


def test_flatten_rebuilds_every_container_kind():
    value = structure(torch.Generator().manual_seed(0))
    leaves, rebuild = flatten(value)
    again = rebuild([t.clone() for t in leaves])
    assert isinstance(again["pair"], Pair) and again["pair"].right[1:] == ("label", 3)
    assert isinstance(again["frame"], Frame) and again["frame"].token == "token-1" and again["none"] is None
    assert isinstance(again["frame"].boxes, RaggedBatch) and again["frame"].boxes.ragged_dim == 1
    assert again["frame"].boxes.sizes.tolist() == [2, 4]
    assert_same(again, value)
    assert value["frame"].image is not again["frame"].image  # rebuilt, not the old objects


@pytest.mark.parametrize("direction", ["to_device", "to_host"])
def test_packed_round_trip_is_bit_exact_with_one_buffer(direction):
    value = structure(torch.Generator().manual_seed(1))
    copier = PackedCopier("cpu", always=True, min_leaves=0)
    handle = getattr(copier, direction)(value)
    assert handle.ready()
    moved = handle.get()
    assert_same(moved, value)
    leaves, _ = flatten(moved)
    originals, _ = flatten(value)
    assert handle.num_packed == len(leaves) and handle.num_single == 0
    assert handle.nbytes_packed == sum(t.nbytes for t in originals)  # regions back to back, no padding
    storages = {t.untyped_storage().data_ptr() for t in leaves if t.numel()}
    assert len(storages) == 1  # every non-empty output is a view of the one landed buffer
    assert all(t.is_contiguous() for t in leaves)
    starts: dict[torch.dtype, int] = {}  # each dtype's region: its first byte in the landed buffer
    for t in leaves:
        if t.numel():
            starts[t.dtype] = min(starts.get(t.dtype, 1 << 62), t.storage_offset() * t.element_size())
    assert len(starts) == len(DTYPES)
    by_start = sorted(starts, key=starts.get)
    assert [d.itemsize for d in by_start] == sorted((d.itemsize for d in by_start), reverse=True)  # aligned
    pairs = zip(leaves, originals, strict=True)
    assert all(t.untyped_storage().data_ptr() != o.untyped_storage().data_ptr() for t, o in pairs if t.numel())


class CallCounter(TorchFunctionMode):
    """Counts torch calls other than attribute reads (``t.dtype``, ``t.nbytes``): the host work that costs a
    dispatch each."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += getattr(func, "__name__", "") != "__get__"
        return func(*args, **(kwargs or {}))


def test_packing_makes_the_same_torch_calls_for_24_and_528_tensors():
    """The packed path's host work per tensor is one pass of attribute reads: the torch calls (allocations,
    concatenations, the copy, the splits into views) are per dtype, so 22× the tensors make no more calls. The
    previous path made three per tensor (reshape, split piece, view) and lost to per-tensor copies on an H200."""
    copier = PackedCopier("cpu", always=True, min_leaves=0)

    def calls(count: int) -> int:
        value = {f"t{i}": kinds[i % len(kinds)].clone() for i in range(count)}
        with CallCounter() as counter:
            copier.to_device(value).get()
        return counter.calls

    gen = torch.Generator().manual_seed(4)
    kinds = [torch.randn(6, 4, 4, generator=gen), torch.randn(60, 9, generator=gen).double(),
             torch.randint(0, 9, (60,), generator=gen), torch.rand(3, generator=gen) > 0.5]  # fmt: skip
    assert calls(24) == calls(528)
    assert calls(24) < 24  # fewer calls than tensors: a per-tensor step would make at least one each


def test_fewer_tensors_than_min_leaves_go_one_by_one_with_the_same_result():
    gen = torch.Generator().manual_seed(5)
    value = {f"t{i}": torch.randn(3, i + 1, generator=gen) for i in range(6)}
    alone = PackedCopier("cpu", always=True, min_leaves=7).to_device(value)
    assert (alone.num_packed, alone.num_single, alone.nbytes_packed) == (0, 6, 0)
    packed = PackedCopier("cpu", always=True, min_leaves=6).to_device(value)
    assert (packed.num_packed, packed.num_single) == (6, 0)
    one_by_one, together = alone.get(), packed.get()
    assert_same(one_by_one, value)
    assert_same(together, value)
    assert len({t.untyped_storage().data_ptr() for t in one_by_one.values()}) == 6  # each its own copy
    assert len({t.untyped_storage().data_ptr() for t in together.values()}) == 1
    assert all(one_by_one[k] is not value[k] for k in value)


def test_default_thresholds_pack_small_tensors_and_send_large_ones_alone():
    small = [torch.ones(PACK_BELOW // 4 - 1) for _ in range(PACK_MIN_LEAVES)]  # just under PACK_BELOW bytes
    value = {"small": small, "large": torch.ones(PACK_BELOW // 4)}  # exactly PACK_BELOW bytes: alone
    handle = PackedCopier("cpu", always=True).to_device(value)
    assert (handle.num_packed, handle.num_single) == (PACK_MIN_LEAVES, 0)  # large: already on the (CPU) target
    assert handle.get()["large"] is value["large"]
    few = PackedCopier("cpu", always=True).to_device({"small": small[: PACK_MIN_LEAVES - 1]})
    assert few.num_packed == 0 and few.num_single == PACK_MIN_LEAVES - 1


def test_large_tensors_go_alone_and_cpu_targets_copy_nothing():
    value = {"small": torch.ones(10), "large": torch.ones(300_000)}
    handle = PackedCopier("cpu", always=True, pack_below=1 << 20, min_leaves=0).to_device(value)
    assert (handle.num_packed, handle.num_single) == (1, 0)  # the large one is already on the target
    moved = handle.get()
    assert moved["large"] is value["large"] and moved["small"] is not value["small"]
    assert PackedCopier("cpu").to_device(value).get() is value
    assert PackedCopier("cpu", always=True, pack_below=0).to_device(value).num_packed == 0
    with pytest.raises(ValueError, match="pack_below"):
        PackedCopier("cpu", pack_below=-1)
    with pytest.raises(ValueError, match="min_leaves"):
        PackedCopier("cpu", min_leaves=-1)


def test_a_collated_batch_round_trips(synth_index, synth_root):
    from drivetrain.data import DatasetConfig, FrameDataset, collate

    dataset = FrameDataset(synth_index, DatasetConfig(load_points=True), synth_root)
    batch = collate([dataset[0], dataset[3]])
    moved = PackedCopier("cpu", always=True, pack_below=1 << 16).to_device(batch).get()
    assert type(moved) is type(batch) and moved.sample_tokens == batch.sample_tokens
    assert_same(moved, batch)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
BUSY = 200_000_000  # GPU cycles of torch.cuda._sleep: ~0.1 s at 2 GHz, far longer than the host work that follows


def on_host(value):
    """``value`` with every tensor copied to the host by a plain blocking ``.cpu()`` (the reference path)."""
    leaves, rebuild = flatten(value)
    return rebuild([t.cpu() for t in leaves])


@pytest.mark.cuda
@needs_cuda
def test_cuda_copy_on_a_side_stream_then_back():
    value = structure(torch.Generator().manual_seed(2))
    value["large"] = torch.randn(1 << 19)
    copier = PackedCopier("cuda")
    side = torch.cuda.Stream()
    handle = copier.to_device(value, stream=side)
    moved = handle.get()  # the current stream waits for the side stream's copy
    leaves, _ = flatten(moved)
    assert all(t.is_cuda for t in leaves) and handle.num_single == 1
    back = copier.to_host(moved).get()
    assert_same(back, value)
    assert all(t.is_pinned() for t in flatten(back)[0] if t.numel())


@pytest.mark.cuda
@needs_cuda
def test_cuda_packed_batch_equals_the_cpu_path_with_images_and_points_alone(synth_index, synth_root):
    from drivetrain.data import DatasetConfig, FrameDataset, collate

    dataset = FrameDataset(synth_index, DatasetConfig(load_points=True), synth_root)
    batch = collate([dataset[0], dataset[3]])
    _ = batch.gt_boxes.mask  # a cached mask travels too
    cpu = PackedCopier("cpu", always=True).to_device(batch).get()
    handle = PackedCopier("cuda").to_device(batch)
    moved = handle.get()
    assert type(moved) is type(batch) and moved.sample_tokens == batch.sample_tokens
    assert all(t.is_cuda for t in flatten(moved)[0])
    large = [t for t in flatten(batch)[0] if t.nbytes >= PACK_BELOW]
    assert batch.images.nbytes >= PACK_BELOW and handle.num_single == len(large)  # images, points: alone
    assert handle.num_packed + handle.num_single == len(flatten(batch)[0])
    assert_same(on_host(moved), cpu)
    assert_same(cpu, batch)


@pytest.mark.cuda
@needs_cuda
def test_cuda_packed_copy_is_one_non_blocking_copy_from_pinned_staging():
    from helpers.copies import CopyRecorder

    gen = torch.Generator().manual_seed(6)
    value = {f"t{i}": torch.randn(4, i + 1, generator=gen) for i in range(24)}  # pageable sources
    value["flags"] = [torch.rand(5, generator=gen) > 0.5, torch.randint(0, 9, (7,), generator=gen)]
    with CopyRecorder() as copies:
        handle = PackedCopier("cuda").to_device(value)
    assert (handle.num_packed, handle.num_single) == (26, 0)
    assert len(copies.calls) == 1 and copies.calls[0].non_blocking and copies.calls[0].source.is_pinned()
    assert_same(on_host(handle.get()), value)


@pytest.mark.cuda
@needs_cuda
def test_cuda_below_min_leaves_each_tensor_goes_alone_non_blocking_from_pinned_memory():
    from helpers.copies import CopyRecorder

    gen = torch.Generator().manual_seed(7)
    count = PACK_MIN_LEAVES - 1
    value = {f"t{i}": torch.randn(3, i + 1, generator=gen).pin_memory() for i in range(count)}
    with CopyRecorder() as copies:
        handle = PackedCopier("cuda").to_device(value)
    assert (handle.num_packed, handle.num_single) == (0, count)
    assert sorted(copies.sources()) == sorted(id(t) for t in value.values())  # each pinned source once, directly
    assert all(call.non_blocking for call in copies.calls)
    moved = handle.get()
    assert_same(on_host(moved), value)
    assert len({t.data_ptr() for t in moved.values()}) == count  # separate device tensors


@pytest.mark.cuda
@needs_cuda
def test_cuda_get_makes_the_consumer_wait_for_a_busy_side_stream_without_a_host_wait():
    side = torch.cuda.Stream()
    value = {f"t{i}": torch.full((4, i + 1), float(i)) for i in range(24)}
    with torch.cuda.stream(side):
        torch.cuda._sleep(BUSY)  # the side stream is busy before the copy is queued behind it
    handle = PackedCopier("cuda").to_device(value, stream=side)
    assert not handle.ready()  # the copy's event has not fired
    moved = handle.get()
    assert not side.query()  # get() queued a wait for the consumer stream; the host did not wait
    sums = torch.stack([t.sum() for t in moved.values()])  # consumer stream: runs after the copy
    assert torch.equal(sums.cpu(), torch.stack([t.sum() for t in value.values()]))


@pytest.mark.cuda
@needs_cuda
def test_cuda_buffers_freed_while_the_consumer_still_reads_them_are_not_reused():
    """``get()`` records the landed buffer on the consumer stream: freed by the host while the consumer's kernels
    are still queued, the block is not handed to the next copy on the side stream (which would overwrite it)."""
    side, copier = torch.cuda.Stream(), PackedCopier("cuda")
    first = {f"t{i}": torch.full((256,), float(i)) for i in range(24)}
    moved = copier.to_device(first, stream=side).get()
    torch.cuda._sleep(BUSY)  # the consumer is busy ...
    total = torch.stack([t.sum() for t in moved.values()]).sum()  # ... then reads the batch
    del moved  # the host lets go of it while those reads are queued
    second = {f"t{i}": torch.full((256,), -1.0) for i in range(24)}  # same layout: the same block size
    copier.to_device(second, stream=side).get()
    assert total.item() == 256.0 * sum(range(24))  # exact: integer-valued float32 sums below 2^24


@pytest.mark.cuda
@needs_cuda
def test_cuda_to_host_get_waits_on_the_host_for_the_copy():
    side = torch.cuda.Stream()
    gen = torch.Generator().manual_seed(8)
    source = {f"t{i}": torch.randn(5, i + 2, generator=gen) for i in range(24)}
    on_gpu = {k: v.cuda() for k, v in source.items()}
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(BUSY)
    back = PackedCopier("cuda").to_host(on_gpu, stream=side).get()  # read at once: get() waited for it
    assert_same(back, source)
    assert all(t.is_pinned() for t in back.values())


@pytest.mark.cuda
@needs_cuda
def test_cuda_to_host_on_a_side_stream_reads_what_the_current_stream_wrote():
    """The device tensors are written by kernels queued on the current stream behind a busy one; the copy on the
    side stream waits for them (no host sync) and brings back the written values, not the zeros before."""
    side = torch.cuda.Stream()
    on_gpu = {f"t{i}": torch.zeros(5, i + 2, device="cuda") for i in range(24)}
    torch.cuda.synchronize()
    torch.cuda._sleep(BUSY)  # the current stream is busy ...
    for i, tensor in enumerate(on_gpu.values()):
        tensor.fill_(float(i + 1))  # ... then writes the values
    back = PackedCopier("cuda").to_host(on_gpu, stream=side).get()
    assert all(torch.equal(t, torch.full_like(t, float(i + 1))) for i, t in enumerate(back.values()))


@pytest.mark.cuda
@needs_cuda
def test_cuda_to_device_on_a_side_stream_hands_on_device_tensors_once_the_current_stream_wrote_them():
    """Tensors already on the device (a DALI batch's images) pass through the copy; work queued on its side stream
    after it (the prefetcher's transform) reads them once the current stream has written them (no host wait)."""
    side = torch.cuda.Stream()
    images = torch.zeros(1000, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(BUSY)  # the current stream is busy ...
    images.fill_(3.0)  # ... then writes the values
    value = {"images": images, **{f"t{i}": torch.full((4,), float(i)) for i in range(24)}}
    handle = PackedCopier("cuda").to_device(value, stream=side)
    assert not torch.cuda.current_stream().query()  # the host did not wait for the current stream
    with torch.cuda.stream(side):
        total = handle.get()["images"].sum()  # on the side stream, as the prefetcher's transform
    side.synchronize()
    assert total.item() == 3000.0  # exact: integer-valued float32 sums below 2^24
