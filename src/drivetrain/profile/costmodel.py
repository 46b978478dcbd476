"""A GPU cost model measured on any device: the ATen kernels and host syncs of a call, and a launch-bound estimate.

A GPU is lent only now and then, and most of what batching saves there is launches and waits: a per-sample loop of
small ops pays each op's launch while the GPU idles, and every ``.item()`` or ``.cpu()`` drains the queue. Both
can be counted on a CPU. :class:`CostCounter` is a ``TorchDispatchMode``: it sees every ATen op a call dispatches
below autograd (so backward ops too), in the calling thread, and sorts them. On a GPU the autograd engine runs the
backward on a device thread of its own; while counting it runs in the calling thread instead
(``torch.autograd.set_multithreading_enabled(False)``), so the backward is counted on CUDA as on the CPU.

**Kernels**: every dispatched op except those that launch nothing on a GPU:

- views and metadata: every op whose schema returns an alias of an input it does not write (``view``, ``reshape``
  when it views, ``expand``, ``permute``, ``t``, ``transpose``, ``as_strided``, ``detach``, ``alias``,
  ``unsqueeze``, ``squeeze``, ``select``, ``slice``, ``split``, ``unbind``, ``diagonal``, ``lift_fresh``, ...)
  and ``_unsafe_view`` (a view its schema does not mark);
- allocation only: ``empty``, ``empty_like``, ``empty_strided``, ``new_empty``, ``new_empty_strided``,
  ``resize_``, ``set_``;
- ``_local_scalar_dense`` (``.item()``, ``bool``/``int``/``float`` of a tensor): a sync, below;
- bookkeeping outside ``aten`` (the ``profiler`` namespace);
- ops whose tensor inputs are all host tensors (below): on a GPU machine they run on its CPU.

``_foreach_*`` ops count the launches CUDA's ``multi_tensor_apply`` makes: one per 110 / 64 / 48 / 36 / 30 tensors
(1–5 tensor lists) and per 320 chunks of 65,536 elements, at least one.

**Syncs** (the host waits for the device), of tensors that are not host tensors:

- a value read: ``_local_scalar_dense`` (``.item()``, ``bool``/``int``/``float`` of a tensor, ``if t:``),
  ``equal``, ``allclose``; ``.tolist()`` and ``.numpy()`` (patched, as :mod:`tests.helpers.nosync` does: on
  the CPU they dispatch nothing);
- a copy to the host: ``.cpu()`` and ``.to("cpu")`` with the literal string (patched, as above);
- an output whose size depends on the data (each also a kernel): ``nonzero`` (``torch.where(mask)``,
  ``argwhere``), ``masked_select``, ``unique`` (``_unique``, ``_unique2``, ``unique_dim``,
  ``unique_consecutive``), ``bincount``, ``repeat_interleave`` of a tensor of repeats without ``output_size``,
  ``index`` / ``index_put_`` with a boolean index (``x[mask]``, ``x[mask] = v``);
- a blocking copy from host memory: ``torch.tensor`` / ``torch.as_tensor`` of Python data or a NumPy array with
  a ``device`` (not ``"cpu"``); ``.to(device)`` of a host tensor (with ``non_blocking=True`` the copy is a
  kernel instead); a host tensor of one or more dimensions used in an op with device tensors (a GPU takes
  host scalars by value, anything larger must have been copied over; counted once per tensor).

**Host tensors** are those the code keeps on the host on purpose: the results of ``.cpu()``, ``.to("cpu")``,
``torch.from_numpy``, ``torch.tensor`` / ``torch.as_tensor`` without a device or with ``device="cpu"``, an
optimizer's step counters, and the outputs of ops whose tensor inputs are all host tensors. Every other tensor
stands for a device tensor: on the CPU the device *is* the host, so tensors are told apart by how they were
made, not by where they are.

**Optimizers** count as CUDA runs them by default: a parameter group that leaves ``foreach`` to torch runs the
foreach implementation while counted (the CPU default is a loop over parameters), and its step counters are host
tensors (unless ``capturable`` or ``fused``).

What is not seen: code that branches on the device type is counted as its CPU branch (the batched solver's one
transfer on CUDA); ``torch.compile``'d code runs eagerly while counted (``set_stance("force_eager")``: Dynamo
does not trace under a dispatch mode), so it counts as its eager ops, an upper bound for the compiled graph;
other threads and processes (loader workers) are not counted; one ATen op may launch several CUDA kernels (a
sort, a cuDNN convolution), so kernels are a lower bound.
:func:`host_work` marks host work that is no GPU cost (reading, decoding, collating a batch): nothing in it is
counted, and a region that did nothing else has no cost (shown "–").

**The estimate**: ``est_ms = (kernels × PER_KERNEL_US + syncs × PER_SYNC_US) / 1000``, labelled
``GPU est. (launch-bound)``: what the launches and waits alone cost on the GPU the constants come from, nothing
about the kernels' own run time — a lower bound for launch-bound work. The two constants are the least-squares
fit of ``reference_ms = kernels × PER_KERNEL_US + syncs × PER_SYNC_US`` over the reference path's leaf rows of the
recorded H200 loss result (``benchmarks/results/loss-cuda.json``: NVIDIA H200, torch 2.11.0+cu130, CUDA 13.0, batch 8,
6 layers, 900 queries, 10 denoising groups, seed 0; its date is in the file), with the counts that run recorded
beside its times (:data:`CALIBRATION`). ``loss backward`` is left out: when that run was recorded the counter left the
backward on the autograd engine's device thread, which it does not count (87 counted kernels for 19.1 ms; the
backward now runs in the calling thread while counting, see above), so its count is no launch count:

=============================================  =======  =====  ==========
row (reference path)                           kernels  syncs  H200 ms
=============================================  =======  =====  ==========
loss forward/streampetr/cost                     1,200      0      31.133
loss forward/streampetr/targets                  1,506    196      32.459
loss forward/streampetr/losses                     372     36      10.335
loss forward/focal_head/cost                     3,240      0      51.275
loss forward/focal_head/targets                  1,905    193      33.187
loss forward/focal_head/heatmap                  1,909  1,455      83.168
loss forward/focal_head/losses                      88      0       2.045
heatmap drawing (48 images, 0-20 boxes each)       941  1,455      48.968
=============================================  =======  =====  ==========

→ ``PER_KERNEL_US`` = 17.2 µs, ``PER_SYNC_US`` = 28.4 µs (the reference ``loss forward`` as a whole: 10,259
kernels and 2,071 syncs, 327.4 ms measured, 235.3 ms estimated; the rest is the SciPy solves and transfers). The
fit before it (H100, the reference paths before they were rewritten op by op after the originals) gave 18.9 and
10.1 µs. ``tests/test_profile_costmodel.py`` refits them from the committed JSON and :data:`CALIBRATION`,
and (a slow test) recounts :data:`CALIBRATION` on the CPU, so neither can drift silently.

Example:
    >>> cost = count_call(lambda: (a + b).sum())
    >>> cost.kernels, cost.syncs
    (2, 0)
    >>> cost.gpu_est_ms  # (2 × PER_KERNEL_US + 0 × PER_SYNC_US) / 1000
    0.0344
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = [
    "CALIBRATION",
    "LABEL",
    "PER_KERNEL_US",
    "PER_SYNC_US",
    "Cost",
    "CostCounter",
    "calibrate",
    "count_call",
    "current",
    "gpu_estimate_ms",
    "host_work",
]

LABEL = "GPU est. (launch-bound)"
PER_KERNEL_US = 17.2  # H200, least squares over the loss benchmark's reference rows (see the module docstring)
PER_SYNC_US = 28.4  # H200, the same fit
CALIBRATION_RESULT = "benchmarks/results/loss-cuda.json"
# (kernels, syncs) of the reference path of CALIBRATION_RESULT's leaf rows, counted on the CPU with its config
CALIBRATION: dict[str, tuple[int, int]] = {
    "loss forward/streampetr/cost": (1200, 0),
    "loss forward/streampetr/targets": (1506, 196),
    "loss forward/streampetr/losses": (372, 36),
    "loss forward/focal_head/cost": (3240, 0),
    "loss forward/focal_head/targets": (1905, 193),
    "loss forward/focal_head/heatmap": (1909, 1455),
    "loss forward/focal_head/losses": (88, 0),
    "heatmap drawing (48 images, 0-20 boxes each)": (941, 1455),
}

NO_KERNEL = frozenset(
    {"_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "set_"}
)
READS = frozenset({"_local_scalar_dense", "equal", "allclose"})  # a value to the host
DATA_DEPENDENT = frozenset(
    {"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive", "bincount"}
)
INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})  # a sync with a boolean index
BOOKKEEPING = frozenset({"profiler"})  # namespaces of ops that launch nothing
FOREACH_MAX_TENSORS = (110, 64, 48, 36, 30)  # CUDA multi_tensor_apply, by the number of tensor lists
FOREACH_CHUNK, FOREACH_MAX_BLOCKS = 65536, 320

_CURRENT: CostCounter | None = None  # the counter now counting (one at a time)


def calibrate(times_ms: dict[str, float], counts: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(µs per kernel, µs per sync)`` of ``times_ms[row] ≈ kernels × k + syncs × s`` over the rows
    of ``counts`` (``row → (kernels, syncs)``); how :data:`PER_KERNEL_US` and :data:`PER_SYNC_US` were made.

    Raises:
        ValueError: if a row of ``counts`` has no time, or the rows cannot separate the two costs.
    """
    missing = sorted(set(counts) - set(times_ms))
    if missing:
        raise ValueError(f"times_ms: no time for rows {missing}")
    pairs = [(k, s, times_ms[row] * 1e3) for row, (k, s) in counts.items()]
    kk, ks, ss = (sum(k * k for k, _, _ in pairs), sum(k * s for k, s, _ in pairs), sum(s * s for _, s, _ in pairs))
    kt, st = sum(k * t for k, _, t in pairs), sum(s * t for _, s, t in pairs)
    det = kk * ss - ks * ks
    if det <= 0:
        raise ValueError("counts: kernels and syncs are proportional over these rows; no separate costs to fit")
    return (kt * ss - st * ks) / det, (kk * st - ks * kt) / det


def gpu_estimate_ms(kernels: float, syncs: float) -> float:
    """``(kernels × PER_KERNEL_US + syncs × PER_SYNC_US) / 1000``: the launch-bound GPU estimate in ms."""
    return (kernels * PER_KERNEL_US + syncs * PER_SYNC_US) / 1e3


@dataclass(frozen=True)
class Cost:
    """Kernels launched and host syncs of one call (or, scaled with :meth:`per`, of one frame or step)."""

    kernels: float
    syncs: float

    @property
    def gpu_est_ms(self) -> float:
        """The launch-bound GPU estimate of these counts (:func:`gpu_estimate_ms`)."""
        return gpu_estimate_ms(self.kernels, self.syncs)

    def per(self, n: float) -> Cost:
        """These counts divided by ``n`` (e.g. per frame of a batch)."""
        return Cost(self.kernels / n, self.syncs / n)

    def as_dict(self) -> dict[str, float]:
        """``{"kernels", "syncs", "gpu_est_ms"}`` (the JSON of a variant's cost)."""
        return {"kernels": _number(self.kernels), "syncs": _number(self.syncs), "gpu_est_ms": round(self.gpu_est_ms, 4)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, prefix: str = "") -> Cost | None:
        """The cost stored under ``{prefix}kernels`` / ``{prefix}syncs`` of ``data``; None where absent."""
        if not data or data.get(f"{prefix}kernels") is None or data.get(f"{prefix}syncs") is None:
            return None
        return cls(data[f"{prefix}kernels"], data[f"{prefix}syncs"])


def _number(value: float) -> float:
    return int(value) if float(value).is_integer() else round(value, 3)


class _Dispatch(TorchDispatchMode):
    """The dispatch mode of a :class:`CostCounter`: every op goes through :meth:`CostCounter._op`."""

    def __init__(self, counter: CostCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.counter._op(func, args, kwargs or {})


class CostCounter:
    """Counts the kernels and host syncs of what runs while it counts, per open region (see the module).

    Regions nest with ``/`` as :class:`~drivetrain.profile.Profiler`'s do; a region's cost includes its
    children's, and the root ``""`` holds everything counted. Only one counter counts at a time.

    Example:
        >>> counter = CostCounter()
        >>> with counter.counting(), counter.region("loss"):
        ...     loss = (pred - target).abs().mean()
        >>> counter.cost("loss")
        Cost(kernels=3, syncs=0)
    """

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {"": [0, 0]}
        self._stack: list[str] = []  # open region paths, outermost first
        self._host_paths: set[str] = set()
        self._host: dict[int, weakref.ref] = {}  # id → tensor of the host tensors (tensors compare elementwise)
        self._thread: int | None = None
        self._mode: _Dispatch | None = None
        self._patches: contextlib.ExitStack | None = None
        self._quiet = 0  # > 0 inside an op's own work or in host work: nothing is counted

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start counting in this thread (enters the dispatch mode and the patches)."""
        global _CURRENT
        if _CURRENT is not None:
            raise RuntimeError("CostCounter: another counter is counting; counters do not nest")
        _CURRENT, self._thread = self, threading.get_ident()
        self._patches = contextlib.ExitStack()
        try:
            self._patches.enter_context(torch.compiler.set_stance("force_eager"))  # compiled code: its eager ops
            # On a GPU the autograd engine runs the backward on a device thread of its own, whose ops this thread's
            # counter does not count: while counting, the backward runs in the calling thread (as on a CPU)
            self._patches.enter_context(torch.autograd.set_multithreading_enabled(False))
            self._patches.enter_context(_patched())
            self._patches.enter_context(_optimizers_as_on_cuda(self))
            self._mode = _Dispatch(self)
            self._mode.__enter__()
        except BaseException:
            self._patches.close()
            _CURRENT, self._mode, self._patches = None, None, None
            raise

    def stop(self) -> None:
        """Stop counting (a no-op when not counting)."""
        global _CURRENT
        if _CURRENT is not self:
            return
        try:
            assert self._mode is not None and self._patches is not None
            self._mode.__exit__(None, None, None)
            self._patches.close()
        finally:
            _CURRENT, self._mode, self._patches = None, None, None
            self._host.clear()

    @contextlib.contextmanager
    def counting(self) -> Iterator[CostCounter]:
        """Count the block (:meth:`start` … :meth:`stop`)."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    # ------------------------------------------------------------------ regions
    def push(self, name: str) -> None:
        """Open region ``name`` inside the open ones."""
        path = f"{self._stack[-1]}/{name}" if self._stack else name
        self._stack.append(path)
        self._counts.setdefault(path, [0, 0])

    def pop(self) -> None:
        """Close the innermost open region."""
        self._stack.pop()

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Attribute what the block dispatches to region ``name`` (and to every open region around it)."""
        self.push(name)
        try:
            yield
        finally:
            self.pop()

    def cost(self, path: str = "") -> Cost | None:
        """The cost of region ``path`` (``""``: everything counted); None for a region that only did host work
        or was never entered."""
        counts = self._counts.get(path)
        if counts is None or (path in self._host_paths and counts == [0, 0]):
            return None
        return Cost(*counts)

    def costs(self) -> dict[str, Cost | None]:
        """:meth:`cost` of every region entered (the root ``""`` included)."""
        return {path: self.cost(path) for path in self._counts}

    # ------------------------------------------------------------------ host tensors
    def mark_host(self, tensor: Any) -> None:
        """Record ``tensor`` (if it is one) as a host tensor."""
        if isinstance(tensor, torch.Tensor):
            key = id(tensor)
            self._host[key] = weakref.ref(tensor, lambda _, k=key, h=self._host: h.pop(k, None))

    def is_host(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a host tensor (see the module docstring)."""
        ref = self._host.get(id(tensor))
        return ref is not None and ref() is tensor

    # ------------------------------------------------------------------ counting
    def _owns(self) -> bool:
        return _CURRENT is self and self._quiet == 0 and threading.get_ident() == self._thread

    def _add(self, kernels: int, syncs: int) -> None:
        for path in ("", *self._stack):
            counts = self._counts[path]
            counts[0] += kernels
            counts[1] += syncs

    @contextlib.contextmanager
    def _silent(self) -> Iterator[None]:
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def _op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if not self._owns():
            return func(*args, **kwargs)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_host = [t for t in tensors if self.is_host(t)]
        with self._silent():
            out = func(*args, **kwargs)
        if tensors and len(on_host) == len(tensors):
            for t in tree_leaves(out):
                self.mark_host(t)
            return out
        if getattr(func, "namespace", "") not in BOOKKEEPING:
            self._add(*_classify(func, args, kwargs))
        for t in on_host:  # a GPU takes host scalars by value; anything larger must be copied over first
            if t.dim() > 0:
                self._add(0, 1)
                self._host.pop(id(t), None)  # copied once, a device tensor from now on
        return out


def _classify(func: Any, args: tuple, kwargs: dict) -> tuple[int, int]:
    """(kernels, syncs) of one dispatched op on device tensors."""
    name = getattr(func, "_opname", str(func))
    if name in READS:
        return (0 if name == "_local_scalar_dense" else 1), 1
    if getattr(func, "is_view", False) or name in NO_KERNEL:
        return 0, 0
    if name.startswith("_foreach_"):
        return _foreach_launches(name, args), 0
    if name in DATA_DEPENDENT:
        return 1, 1
    if name == "repeat_interleave":  # a tensor of repeats: the output size is their sum, unless given
        return 1, int(func._overloadname in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None)
    if name in INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        boolean = any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
        return 1, int(boolean)
    return 1, 0


def _foreach_launches(name: str, args: tuple) -> int:
    """Kernels CUDA's multi_tensor_apply launches for a foreach op (see the module docstring)."""
    lists = [a for a in args if isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor)]
    if not lists:
        return 1
    depth = min(len(lists) + (0 if name.endswith("_") else 1), len(FOREACH_MAX_TENSORS))
    chunks = sum(math.ceil(t.numel() / FOREACH_CHUNK) for t in lists[0])
    return max(1, math.ceil(len(lists[0]) / FOREACH_MAX_TENSORS[depth - 1]), math.ceil(chunks / FOREACH_MAX_BLOCKS))


# ---------------------------------------------------------------------- host reads and copies (patched)
def current() -> CostCounter | None:
    """The counter now counting, if any (in any thread)."""
    return _CURRENT


def _counter() -> CostCounter | None:
    """The counter that counts this call, if any (not inside an op's own work or host work, same thread)."""
    counter = _CURRENT
    return counter if counter is not None and counter._owns() else None


def _alias(original: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out``, or a view of it when the move returned ``original`` itself (on the CPU every move does), so
    the host-ness of the result does not rub off on the source."""
    return out.view_as(out) if out is original else out


def _placement(args: tuple, kwargs: dict, counter: CostCounter) -> str | None:
    """Where a ``Tensor.to`` call moves: "host" (the literal "cpu", or a host tensor's place), "device", or None
    (a dtype or layout change only)."""
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, str):
        return "host" if target.split(":")[0] == "cpu" else "device"
    if isinstance(target, torch.device):
        return "device"
    if isinstance(target, torch.Tensor):
        return "host" if counter.is_host(target) else "device"
    return None


def _move(counter: CostCounter, tensor: torch.Tensor, where: str | None, non_blocking: bool, call: Callable) -> Any:
    """Run the move ``call()`` of ``tensor`` to ``where``, counting the copy it is on a GPU."""
    host = counter.is_host(tensor)
    if where is None or (where == "host") == host:  # no move between host and device: the ops it dispatches count
        out = call()
        if host and isinstance(out, torch.Tensor):
            counter.mark_host(out)
        return out
    counter._add(*((1, 0) if where == "device" and non_blocking else (0, 1)))
    with counter._silent():
        out = _alias(tensor, call())
    if where == "host":
        counter.mark_host(out)
    return out


@contextlib.contextmanager
def _patched() -> Iterator[None]:
    """Patch the tensor methods and factories that move data between host and device (see the module)."""
    names = ("cpu", "to", "tolist", "numpy")
    own = {name: vars(torch.Tensor).get(name) for name in names}  # None: inherited from the C base class
    tensor_methods = {name: getattr(torch.Tensor, name) for name in names}
    factories = {name: getattr(torch, name) for name in ("tensor", "as_tensor", "from_numpy")}

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        counter = _counter()
        call = lambda: tensor_methods["to"](self, *args, **kwargs)  # noqa: E731
        if counter is None:
            return call()
        non_blocking = bool(kwargs.get("non_blocking", False)) or any(a is True for a in args[1:])
        return _move(counter, self, _placement(args, kwargs, counter), non_blocking, call)

    def cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        counter = _counter()
        call = lambda: tensor_methods["cpu"](self, *args, **kwargs)  # noqa: E731
        return call() if counter is None else _move(counter, self, "host", False, call)

    def reader(name: str) -> Callable:
        original = tensor_methods[name]

        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counter = _counter()
            if counter is None or counter.is_host(self):
                return original(self, *args, **kwargs)
            counter._add(0, 1)
            with counter._silent():
                return original(self, *args, **kwargs)

        return read

    def factory(name: str) -> Callable:
        original = factories[name]

        def make(data: Any, *args: Any, **kwargs: Any) -> Any:
            counter = _counter()
            if counter is None:
                return original(data, *args, **kwargs)
            device = kwargs.get("device")
            if isinstance(data, torch.Tensor):
                where = None if device is None else _placement((), {"device": device}, counter)
                return _move(counter, data, where, False, lambda: original(data, *args, **kwargs))
            on_host = device is None or _placement((), {"device": device}, counter) == "host"
            if not on_host:
                counter._add(0, 1)  # a blocking copy from pageable host memory
            with counter._silent():
                out = original(data, *args, **kwargs)
            if on_host:
                counter.mark_host(out)
            return out

        return make

    try:
        torch.Tensor.to, torch.Tensor.cpu = to, cpu
        torch.Tensor.tolist, torch.Tensor.numpy = reader("tolist"), reader("numpy")
        for name in factories:
            setattr(torch, name, factory(name))
        yield
    finally:
        for name, method in own.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)
        for name, function in factories.items():
            setattr(torch, name, function)


@contextlib.contextmanager
def _optimizers_as_on_cuda(counter: CostCounter) -> Iterator[None]:
    """While counting, optimizer steps run as CUDA's default would: foreach, step counters on the host."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    switched: list[dict[str, Any]] = []

    def before(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            if group.get("foreach", False) is None and not group.get("fused") and not group.get("differentiable"):
                group["foreach"] = True
                switched.append(group)
            if not group.get("capturable") and not group.get("fused"):
                for p in group["params"]:
                    counter.mark_host(optimizer.state.get(p, {}).get("step"))

    def after(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        while switched:
            switched.pop()["foreach"] = None

    handles = [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        after(None, None, None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- helpers
def count_call(fn: Callable[[], Any]) -> Cost:
    """Run ``fn()`` once under a :class:`CostCounter`; its kernels and syncs."""
    counter = CostCounter()
    with counter.counting():
        fn()
    cost = counter.cost()
    assert cost is not None
    return cost


@contextlib.contextmanager
def host_work() -> Iterator[None]:
    """Mark the block as host work that is no GPU cost (reading, decoding, collating a batch): nothing in it is
    counted, and the innermost open region shows "–" if it did nothing else. A no-op when nothing counts."""
    counter = _counter()
    if counter is None:
        yield
        return
    counter._host_paths.add(counter._stack[-1] if counter._stack else "")
    with counter._silent():
        yield
