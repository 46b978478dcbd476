"""to_device: nested structures, objects that move themselves, memory formats, and no copy on a CPU target."""

from __future__ import annotations

import pytest
import torch

from drivetrain.pipeline import to_device
from drivetrain.ragged import RaggedBatch


def test_nested_structures_keep_their_shape_and_non_tensor_leaves() -> None:
    batch = {"image": torch.rand(2, 3, 4, 4), "meta": [torch.arange(3), ("token", 7)], "name": "x"}
    moved = to_device(batch, torch.device("meta"))
    assert moved["image"].device.type == "meta" and moved["meta"][0].device.type == "meta"
    assert moved["meta"][1] == ("token", 7) and isinstance(moved["meta"], list) and moved["name"] == "x"


def test_objects_that_move_themselves_are_asked_to() -> None:
    ragged = RaggedBatch.from_list([torch.rand(2, 3), torch.rand(0, 3)])
    moved = to_device({"gt": ragged}, torch.device("meta"))["gt"]
    assert isinstance(moved, RaggedBatch) and moved.tensor.device.type == "meta"


def test_memory_format_applies_to_float_images_and_volumes_only() -> None:
    image, volume, mask = torch.rand(2, 3, 4, 4), torch.rand(2, 3, 2, 4, 4), torch.ones(2, 3, 4, 4, dtype=torch.bool)
    out = to_device([image, volume, mask], torch.device("cpu"), channels_last="2d")
    assert out[0].is_contiguous(memory_format=torch.channels_last) and not out[0].is_contiguous()
    assert out[1].is_contiguous() and out[2].is_contiguous()  # 5-D and non-float tensors keep their layout
    out3d = to_device([volume], torch.device("cpu"), channels_last="3d")
    assert out3d[0].is_contiguous(memory_format=torch.channels_last_3d) and torch.equal(out3d[0], volume)


def test_a_cpu_target_copies_nothing() -> None:
    image = torch.rand(2, 3)
    assert to_device({"a": image}, torch.device("cpu"))["a"] is image


def test_every_tensor_is_copied_once_and_without_blocking_toward_a_device() -> None:
    from helpers.copies import CopyRecorder

    ragged = RaggedBatch.from_list([torch.rand(2, 3), torch.rand(0, 3)])
    _ = ragged.mask  # a cached mask travels with the data and the sizes
    batch = {"image": torch.rand(2, 3, 4, 4), "gt": ragged, "meta": [torch.arange(3), ("token", 7)]}
    with CopyRecorder() as copies:
        moved = to_device(batch, "meta")
    expected = [batch["image"], ragged.tensor, ragged.sizes, ragged.cached_mask, batch["meta"][0]]
    assert sorted(copies.sources()) == sorted(map(id, expected))  # each once: no second copy of ragged data
    assert all(call.non_blocking for call in copies.calls)
    gt = moved["gt"]
    assert gt.tensor.device.type == gt.sizes.device.type == gt.cached_mask.device.type == "meta"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("pinned", [True, False])
def test_cuda_copies_are_non_blocking_from_pinned_and_pageable_memory_and_equal(pinned: bool) -> None:
    from helpers.copies import CopyRecorder

    gen = torch.Generator().manual_seed(3)
    ragged = RaggedBatch.from_list([torch.randn(4, 9, generator=gen), torch.randn(1, 9, generator=gen)])
    batch = {"image": torch.randn(2, 3, 8, 8, generator=gen), "gt": ragged, "index": torch.arange(5)}
    if pinned:
        batch = {"image": batch["image"].pin_memory(), "gt": ragged.pin_memory(), "index": batch["index"].pin_memory()}
        assert batch["gt"].sizes.is_pinned()
    with CopyRecorder() as copies:
        moved = to_device(batch, torch.device("cuda"), channels_last="2d")
    assert len(copies.calls) == 4 and all(call.non_blocking for call in copies.calls)  # image, data, sizes, index
    assert moved["image"].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(moved["image"].cpu(), batch["image"]) and torch.equal(moved["index"].cpu(), batch["index"])
    assert torch.equal(moved["gt"].tensor.cpu(), ragged.tensor) and torch.equal(moved["gt"].sizes.cpu(), ragged.sizes)


@pytest.mark.cuda
@needs_cuda
def test_cuda_copies_back_to_the_cpu_block_so_the_host_reads_them_at_once() -> None:
    from helpers.copies import CopyRecorder

    on_gpu = {"x": torch.arange(1000, device="cuda") * 3, "gt": RaggedBatch.from_list([torch.ones(3, 2)]).to("cuda")}
    with CopyRecorder() as copies:
        back = to_device(on_gpu, "cpu")
    assert len(copies.calls) == 3 and not any(call.non_blocking for call in copies.calls)
    assert back["x"].tolist() == [3 * i for i in range(1000)] and back["gt"].sizes.tolist() == [3]
