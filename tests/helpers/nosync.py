"""A host-sync detector for tests: inside ``no_host_sync()`` every tensor method that reads values on the host
raises, so a batched op that syncs is caught on the CPU (where nothing would otherwise show it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class HostSyncError(AssertionError):
    """Raised by the patched tensor methods inside :func:`no_host_sync`."""


SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Make every ``torch.Tensor`` method that reads values on the host raise ``HostSyncError``.

    Catches Python-level reads (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool(t)``,
    ``int(t)``, ``float(t)``, ``operator.index(t)``, ``if t:``); build inputs before entering.
    """
    missing = object()
    saved = {name: vars(torch.Tensor).get(name, missing) for name in SYNC_METHODS}

    def make_raiser(name: str):
        def raiser(self, *args, **kwargs):
            raise HostSyncError(f"host sync: Tensor.{name} called on a tensor of shape {tuple(self.shape)}")

        return raiser

    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, make_raiser(name))
        yield
    finally:
        for name, original in saved.items():
            if original is missing:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
