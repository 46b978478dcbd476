"""to_device: nested structures, objects that move themselves, memory formats, and no copy on a CPU target."""

from __future__ import annotations

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
