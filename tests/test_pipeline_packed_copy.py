"""The packed copier: nested structures (dicts, sequences, named tuples, frozen dataclasses, RaggedBatch) flatten
and rebuild; every dtype, empty, 0-d and non-contiguous tensor survives a packed round trip bit for bit, the
small ones in one buffer; a CPU target without ``always`` copies nothing; on CUDA the copy runs on a side
stream and the consumer stream waits for it."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import pytest
import torch

from drivetrain.pipeline.transfer import ALIGN, PackedCopier, flatten
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
    copier = PackedCopier("cpu", always=True)
    handle = getattr(copier, direction)(value)
    assert handle.ready()
    moved = handle.get()
    assert_same(moved, value)
    leaves, _ = flatten(moved)
    originals, _ = flatten(value)
    assert handle.num_packed == len(leaves) and handle.num_single == 0
    storages = {t.untyped_storage().data_ptr() for t in leaves if t.numel()}
    assert len(storages) == 1  # every non-empty output is a view of the one landed buffer
    assert all(t.is_contiguous() for t in leaves)
    starts: dict[torch.dtype, int] = {}  # each dtype's region starts at a multiple of ALIGN bytes
    for t in leaves:
        if t.numel():
            starts[t.dtype] = min(starts.get(t.dtype, 1 << 62), t.storage_offset() * t.element_size())
    assert len(starts) == len(DTYPES) and all(offset % ALIGN == 0 for offset in starts.values())
    pairs = zip(leaves, originals, strict=True)
    assert all(t.untyped_storage().data_ptr() != o.untyped_storage().data_ptr() for t, o in pairs)


def test_large_tensors_go_alone_and_cpu_targets_copy_nothing():
    value = {"small": torch.ones(10), "large": torch.ones(300_000)}
    handle = PackedCopier("cpu", always=True, pack_below=1 << 20).to_device(value)
    assert (handle.num_packed, handle.num_single) == (1, 0)  # the large one is already on the target
    moved = handle.get()
    assert moved["large"] is value["large"] and moved["small"] is not value["small"]
    assert PackedCopier("cpu").to_device(value).get() is value
    assert PackedCopier("cpu", always=True, pack_below=0).to_device(value).num_packed == 0
    with pytest.raises(ValueError, match="pack_below"):
        PackedCopier("cpu", pack_below=-1)


def test_a_collated_batch_round_trips(synth_index, synth_root):
    from drivetrain.data import DatasetConfig, FrameDataset, collate

    dataset = FrameDataset(synth_index, DatasetConfig(load_points=True), synth_root)
    batch = collate([dataset[0], dataset[3]])
    moved = PackedCopier("cpu", always=True, pack_below=1 << 16).to_device(batch).get()
    assert type(moved) is type(batch) and moved.sample_tokens == batch.sample_tokens
    assert_same(moved, batch)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
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
