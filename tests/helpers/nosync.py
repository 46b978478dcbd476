"""A host-sync detector for tests: inside ``no_host_sync()`` every tensor method that reads values on the host
raises, and so does building a tensor from Python data (on a GPU, a copy from pageable memory that waits for
the stream), so a batched op that syncs is caught on the CPU (where nothing would otherwise show it)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch


class HostSyncError(AssertionError):
    """Raised by the patched tensor methods inside :func:`no_host_sync`."""


SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
# Factories that copy Python data into a new tensor. drivetrain.constants may call them: it copies each
# constant once per device and caches it (the first call is the warm-up that the CUDA test does too).
FROM_DATA = ("tensor", "as_tensor")
ALLOWED_CALLERS = ("drivetrain.constants",)


@contextlib.contextmanager
def _patched(on_read) -> Iterator[None]:
    """Route every host read through ``on_read(what, shape)`` (shape None for a factory of Python data)."""
    missing = object()
    saved = {name: vars(torch.Tensor).get(name, missing) for name in SYNC_METHODS}
    factories = {name: getattr(torch, name) for name in FROM_DATA}

    def method_of(name: str):
        original = getattr(torch.Tensor, name)

        def method(self, *args, **kwargs):
            on_read(name, tuple(self.shape))
            return original(self, *args, **kwargs)

        return method

    def factory_of(name: str):
        original = factories[name]

        def factory(data, *args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not isinstance(data, torch.Tensor) and caller not in ALLOWED_CALLERS:
                on_read(f"torch.{name}", None, data, caller)
            return original(data, *args, **kwargs)

        return factory

    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, method_of(name))
        for name in FROM_DATA:
            setattr(torch, name, factory_of(name))
        yield
    finally:
        for name, original in saved.items():
            if original is missing:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
        for name, original in factories.items():
            setattr(torch, name, original)


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Make every ``torch.Tensor`` method that reads values on the host raise ``HostSyncError``.

    Catches Python-level reads (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool(t)``,
    ``int(t)``, ``float(t)``, ``operator.index(t)``, ``if t:``) and ``torch.tensor`` / ``torch.as_tensor``
    of anything but a tensor (use :func:`drivetrain.constants.constant`); build inputs before entering.
    """

    def raise_error(what: str, shape: tuple[int, ...] | None, data: object = None, caller: str = "") -> None:
        if shape is None:
            raise HostSyncError(f"host-to-device copy: {what} of Python data {data!r:.60} in {caller}")
        raise HostSyncError(f"host sync: Tensor.{what} called on a tensor of shape {shape}")

    with _patched(raise_error):
        yield


@contextlib.contextmanager
def count_host_syncs() -> Iterator[list[str]]:
    """Record every host read :func:`no_host_sync` would raise on (``"tolist"``, ``"torch.tensor"``, ...)."""
    calls: list[str] = []
    with _patched(lambda what, *_: calls.append(what)):
        yield calls
