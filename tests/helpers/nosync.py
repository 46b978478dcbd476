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
def no_host_sync() -> Iterator[None]:
    """Make every ``torch.Tensor`` method that reads values on the host raise ``HostSyncError``.

    Catches Python-level reads (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool(t)``,
    ``int(t)``, ``float(t)``, ``operator.index(t)``, ``if t:``) and ``torch.tensor`` / ``torch.as_tensor``
    of anything but a tensor (use :func:`drivetrain.constants.constant`); build inputs before entering.
    """
    missing = object()
    saved = {name: vars(torch.Tensor).get(name, missing) for name in SYNC_METHODS}
    factories = {name: getattr(torch, name) for name in FROM_DATA}

    def make_raiser(name: str):
        def raiser(self, *args, **kwargs):
            raise HostSyncError(f"host sync: Tensor.{name} called on a tensor of shape {tuple(self.shape)}")

        return raiser

    def make_factory(name: str):
        original = factories[name]

        def factory(data, *args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not isinstance(data, torch.Tensor) and caller not in ALLOWED_CALLERS:
                raise HostSyncError(f"host-to-device copy: torch.{name} of Python data {data!r:.60} in {caller}")
            return original(data, *args, **kwargs)

        return factory

    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, make_raiser(name))
        for name in FROM_DATA:
            setattr(torch, name, make_factory(name))
        yield
    finally:
        for name, original in saved.items():
            if original is missing:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
        for name, original in factories.items():
            setattr(torch, name, original)
