"""A host-sync detector for tests: inside ``no_host_sync()`` every operation that would make the host wait for the
device raises, so a batched op that syncs is caught on the CPU (where nothing would otherwise show it).

Two kinds of sync are watched:

- **Python-level reads** (patched ``torch.Tensor`` methods): ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``,
  ``bool(t)``, ``int(t)``, ``float(t)``, ``operator.index(t)``, ``if t:``; and ``torch.tensor`` /
  ``torch.as_tensor`` of Python data (on a GPU a copy from pageable memory that waits for the stream).
- **ATen ops** (a ``TorchDispatchMode``, which sees forward and backward ops below autograd): a value read
  (``_local_scalar_dense``, ``equal``, ``allclose``), an output whose size depends on the data (``nonzero`` —
  also ``torch.where(cond)``, ``argwhere``, ``nonzero(as_tuple=True)`` —, ``masked_select``, ``unique``,
  ``bincount``, ``repeat_interleave`` of a tensor of repeats without ``output_size``) and indexing with a boolean
  mask (``x[mask]``, ``x[mask] = v``: ``index`` / ``index_put_`` with a bool index). These lists are
  :mod:`drivetrain.profile.costmodel`'s, which counts the same syncs for the benchmarks.

Documented syncs: hot code may sync where it says why on the line (``# sync: why``, STYLE 7).
``no_host_sync(documented=n)`` lets up to ``n`` such syncs through — a sync is documented when the innermost
``drivetrain`` source line that caused it (its statement, or the comment lines right above it) carries
``# sync:`` — and yields the list of those it let through, so a test can hold their number exactly.
:func:`allow_host_sync` switches the check off for a block (a call the test knows to sync, e.g. the solver).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import linecache
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from drivetrain.profile.costmodel import DATA_DEPENDENT, INDEXING, READS


class HostSyncError(AssertionError):
    """Raised inside :func:`no_host_sync` by an operation that reads device values on the host."""


SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
# Factories that copy Python data into a new tensor. drivetrain.constants may call them: it copies each
# constant once per device and caches it (the first call is the warm-up that the CUDA test does too).
FROM_DATA = ("tensor", "as_tensor")
ALLOWED_CALLERS = ("drivetrain.constants",)
SOURCE = Path(__import__("drivetrain").__file__).resolve().parent  # src/drivetrain: where "# sync:" is looked up


@dataclass(frozen=True)
class Sync:
    """One host read: what (``"item"``, ``"nonzero"``, ``"index (bool mask)"``, ``"torch.tensor"``, ...), the
    shape it read (None for a factory), where (``path:line`` of the innermost drivetrain line, or ``""``) and
    whether that line documents it with ``# sync:``."""

    what: str
    shape: tuple[int, ...] | None
    site: str
    documented: bool

    def __str__(self) -> str:
        where = f" at {self.site}" if self.site else ""
        shape = "" if self.shape is None else f" of shape {self.shape}"
        return f"{self.what}{shape}{where}"


# ---------------------------------------------------------------------------------------------- the watch
class _State:
    """What the patches and the dispatch mode share: where reports go, and whether to report."""

    def __init__(self) -> None:
        self.report: Callable[[Sync], None] | None = None
        self.quiet = 0  # > 0 inside a reported Python-level read (its own ATen ops are the same sync) or allowed


_STATE = _State()


def _sync_op(func: Any, args: tuple, kwargs: dict) -> str | None:
    """The name under which a dispatched ATen op syncs (as :mod:`drivetrain.profile.costmodel` classifies it)."""
    name = getattr(func, "_opname", "")
    if name in READS or name in DATA_DEPENDENT:
        return name
    if name == "repeat_interleave" and func._overloadname in ("Tensor", "self_Tensor"):
        return None if kwargs.get("output_size") is not None else "repeat_interleave (tensor repeats)"
    if name in INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return f"{name} (bool mask)"
    return None


class _Watch(TorchDispatchMode):
    """Reports every ATen op that syncs (see the module docstring)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _STATE.report is not None and not _STATE.quiet:
            name = _sync_op(func, args, kwargs)
            if name is not None:
                first = next((a for a in args if isinstance(a, torch.Tensor)), None)
                _STATE.report(_sync(name, tuple(first.shape) if first is not None else ()))
        return func(*args, **kwargs)


def _sync(what: str, shape: tuple[int, ...] | None) -> Sync:
    """A :class:`Sync` located at the innermost drivetrain frame of the current stack."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(SOURCE):
            return Sync(
                what, shape, f"{path.relative_to(SOURCE.parent)}:{frame.f_lineno}", _documented(path, frame.f_lineno)
            )
        frame = frame.f_back
    return Sync(what, shape, "", False)


@functools.cache
def _statement_spans(path: Path) -> list[tuple[int, int, int]]:
    """``(first, last, comment_top)`` lines of every statement's header in ``path``: a simple statement whole, a
    compound one up to its body; ``comment_top`` is the first of the comment lines right above it."""
    lines = linecache.getlines(str(path))
    spans = []
    for node in ast.walk(ast.parse("".join(lines))):
        if not isinstance(node, ast.stmt):
            continue
        body = getattr(node, "body", None)
        last = node.end_lineno or node.lineno
        if isinstance(body, list) and body:
            last = max(node.lineno, body[0].lineno - 1)
        top = node.lineno
        while top > 1 and lines[top - 2].lstrip().startswith("#"):
            top -= 1
        spans.append((node.lineno, last, top))
    return spans


def _documented(path: Path, line: int) -> bool:
    """Whether the innermost statement around ``line`` (or the comments right above it) says ``# sync:``."""
    around = [span for span in _statement_spans(path) if span[0] <= line <= span[1]]
    if not around:
        return False
    _, last, top = min(around, key=lambda span: span[1] - span[0])
    return any("# sync:" in linecache.getline(str(path), n) for n in range(top, last + 1))


@contextlib.contextmanager
def _patched(report: Callable[[Sync], None]) -> Iterator[None]:
    """Route every host read through ``report`` for the block."""
    if _STATE.report is not None:
        raise RuntimeError("no_host_sync / count_host_syncs do not nest")
    missing = object()
    saved = {name: vars(torch.Tensor).get(name, missing) for name in SYNC_METHODS}
    factories = {name: getattr(torch, name) for name in FROM_DATA}

    def method_of(name: str):
        original = getattr(torch.Tensor, name)

        def method(self, *args, **kwargs):
            if not _STATE.quiet:
                report(_sync(name, tuple(self.shape)))
            _STATE.quiet += 1  # the read's own ATen ops (``_local_scalar_dense``) are this same sync
            try:
                return original(self, *args, **kwargs)
            finally:
                _STATE.quiet -= 1

        return method

    def factory_of(name: str):
        original = factories[name]

        def factory(data, *args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not isinstance(data, torch.Tensor) and caller not in ALLOWED_CALLERS and not _STATE.quiet:
                report(_sync(f"torch.{name} of Python data {data!r:.60} in {caller}", None))
            return original(data, *args, **kwargs)

        return factory

    watch = _Watch()
    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, method_of(name))
        for name in FROM_DATA:
            setattr(torch, name, factory_of(name))
        _STATE.report, _STATE.quiet = report, 0
        with torch.compiler.set_stance("force_eager"), watch:  # compiled code runs its eager ops, all watched
            yield
    finally:
        _STATE.report = None
        for name, original in saved.items():
            if original is missing:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
        for name, original in factories.items():
            setattr(torch, name, original)


# ---------------------------------------------------------------------------------------------- the API
@contextlib.contextmanager
def no_host_sync(documented: int = 0) -> Iterator[list[Sync]]:
    """Raise ``HostSyncError`` at every host sync in the block (see the module docstring).

    Build inputs before entering (``torch.tensor`` of Python data is a sync; use
    :func:`drivetrain.constants.constant` in library code).

    Args:
        documented: how many syncs marked ``# sync:`` at their drivetrain line may pass (0: none may).

    Yields:
        The documented syncs that passed, in order.
    """
    passed: list[Sync] = []

    def check(sync: Sync) -> None:
        if sync.documented and len(passed) < documented:
            passed.append(sync)
            return
        kind = "host-to-device copy" if sync.shape is None else "host sync"
        extra = f" (documented, but {documented} allowed and {len(passed)} passed)" if sync.documented else ""
        raise HostSyncError(f"{kind}: {sync}{extra}")

    with _patched(check):
        yield passed


@contextlib.contextmanager
def count_host_syncs() -> Iterator[list[str]]:
    """Record what every host read :func:`no_host_sync` would raise on is (``"tolist"``, ``"nonzero"``,
    ``"index (bool mask)"``, ``"torch.tensor ..."``, ...), in order; nothing raises."""
    calls: list[str] = []
    with _patched(lambda sync: calls.append(sync.what.split(" of Python data")[0])):
        yield calls


@contextlib.contextmanager
def allow_host_sync() -> Iterator[None]:
    """Inside a :func:`no_host_sync` block, let this block sync unchecked (a call the test knows to sync)."""
    _STATE.quiet += 1
    try:
        yield
    finally:
        _STATE.quiet -= 1
