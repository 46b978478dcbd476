"""Argument checks shared by the ragged ops.

Checks on shapes, dtypes and devices read tensor metadata only. Checks on *values* (index ranges, size
ranges) use ``torch._assert_async``: on the CPU it raises at once, on a GPU it becomes a device-side
assert that never stalls the host. So every check here is free of host syncs.
"""

from __future__ import annotations

import torch

_INDEX_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def check_int_dtype(t: torch.Tensor, name: str, what: str = "index") -> None:
    """Raise ``ValueError`` naming ``name`` unless ``t`` holds integers (bool is not an integer here)."""
    if t.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{name}: {what} must have an integer dtype (int32 or int64), got {t.dtype}")


def check_batch_shape(shape: torch.Size, expected: torch.Size, name: str, other: str) -> None:
    """Raise ``ValueError`` unless the batch shape of ``name`` equals the one of ``other``."""
    if tuple(shape) != tuple(expected):
        raise ValueError(
            f"{name}: batch shape {tuple(shape)} does not match the batch shape {tuple(expected)} of {other}"
        )


def check_same_device(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    """Raise ``ValueError`` unless both tensors live on one device."""
    if a.device != b.device:
        raise ValueError(f"{name_a} is on {a.device} but {name_b} is on {b.device}; move them to one device")


def assert_values(ok: torch.Tensor, exc: type[Exception], message: str) -> None:
    """Raise ``exc(message)`` if the 0-dim bool tensor ``ok`` is False, without a host sync.

    On the CPU this raises immediately. On CUDA it enqueues a device-side assert (fatal to the CUDA
    context, as an out-of-bounds index in ``torch.gather`` would be), so no stream is synchronised.
    """
    if ok.device.type != "cpu":
        torch._assert_async(ok)  # device-side assert: no host sync
        return
    try:
        torch._assert_async(ok, message)
    except RuntimeError as err:
        if message in str(err):
            raise exc(message) from None
        raise


_device_checks = False


def set_device_checks(enabled: bool) -> None:
    """Also run the value checks of the ragged ops (index ranges, equal sizes) on non-CPU devices.

    Off by default: on a GPU each check costs a few small kernel launches per op, and a failed check is a
    device-side assert (fatal to the CUDA context). Indices outside the padded tensor are caught by
    PyTorch's own kernels either way; these checks also catch indices into a sample's padding. On the
    CPU the checks always run (they cost no sync there).
    """
    global _device_checks
    _device_checks = bool(enabled)


def values_checked(device: torch.device) -> bool:
    """Whether value checks run for tensors on ``device`` (always on the CPU, opt-in elsewhere)."""
    return device.type == "cpu" or _device_checks
