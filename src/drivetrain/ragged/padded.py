"""`RaggedBatch`: a padded tensor plus per-sample sizes, with any number of leading batch dimensions.

A batch of samples whose lengths differ (ground-truth boxes per image, matches per decoder layer and
sample) is stored as one padded tensor of shape ``(*batch_shape, ..., S, ...)`` where ``S`` is the padded
length of the *ragged dimension*, plus ``sizes`` (int64, ``batch_shape``): sample ``b`` holds valid
entries at positions ``[0, sizes[b])`` of the ragged dimension; the rest is padding whose content is
unspecified unless an op says otherwise. Because ``S`` comes from the tensor's shape, output shapes are
known on the host without reading any sizes, so batched code never has to synchronise with the device.

Example:
    >>> gt = RaggedBatch.from_list([torch.randn(3, 9), torch.randn(0, 9), torch.randn(5, 9)])
    >>> gt.batch_shape, gt.max_size, gt.sizes.tolist()
    (torch.Size([3]), 5, [3, 0, 5])
    >>> per_layer = gt.expand_batch(6, 3)   # (L, B) view over the same memory, no copy
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from drivetrain.ragged._checks import assert_values, check_int_dtype, check_same_device

__all__ = ["RaggedBatch"]


class RaggedBatch:
    """A padded tensor with per-sample valid sizes along one ragged dimension.

    Args:
        tensor: ``(*batch_shape, ..., S, ...)`` padded data of any dtype; ``S`` sits at ``ragged_dim``.
        sizes: integer tensor (or nested list) of shape ``batch_shape``: valid length of each sample.
            Stored as int64 on ``tensor``'s device. Its number of dims is the number of batch dims (≥ 1).
        ragged_dim: dimension of ``tensor`` that is ragged; any dim after the batch dims (negative
            values count from the end). Defaults to the first dim after the batch dims.
        validate: check that every size lies in ``[0, S]``. The check never synchronises: on the CPU it
            raises ``ValueError`` at once; on a GPU it is a device-side assert. Set False to skip it.

    Raises:
        ValueError: naming ``tensor``, ``sizes`` or ``ragged_dim`` when shapes, dtypes or devices disagree.
    """

    __slots__ = ("_mask", "_ragged_dim", "_sizes", "_tensor")

    def __init__(
        self,
        tensor: torch.Tensor,
        sizes: torch.Tensor | Sequence[Any],
        ragged_dim: int | None = None,
        *,
        validate: bool = True,
    ) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor: expected a torch.Tensor, got {type(tensor).__name__}")
        if not isinstance(sizes, torch.Tensor):
            sizes = torch.as_tensor(sizes, dtype=torch.int64, device=tensor.device)
        check_int_dtype(sizes, "sizes", what="sizes")
        check_same_device(sizes, tensor, "sizes", "tensor")
        num_batch_dims = sizes.dim()
        if num_batch_dims < 1:
            raise ValueError("sizes: needs at least one batch dimension; got a 0-dim tensor")
        if tensor.dim() <= num_batch_dims:
            raise ValueError(
                f"tensor: has shape {tuple(tensor.shape)} but sizes has batch shape {tuple(sizes.shape)}; "
                "tensor needs the batch dims plus a ragged dim"
            )
        if tuple(tensor.shape[:num_batch_dims]) != tuple(sizes.shape):
            raise ValueError(
                f"sizes: shape {tuple(sizes.shape)} does not match the leading (batch) dims "
                f"{tuple(tensor.shape[:num_batch_dims])} of tensor {tuple(tensor.shape)}"
            )
        ragged_dim = _normalize_ragged_dim(ragged_dim, num_batch_dims, tensor.dim())
        sizes = sizes.to(torch.int64)
        if validate and sizes.numel() > 0:
            max_size = tensor.shape[ragged_dim]
            assert_values((sizes >= 0).all(), ValueError, "sizes: negative sample size")
            assert_values(
                (sizes <= max_size).all(),
                ValueError,
                f"sizes: a sample size exceeds the padded length {max_size} of tensor dim {ragged_dim}",
            )
        self._tensor = tensor
        self._sizes = sizes
        self._ragged_dim = ragged_dim
        self._mask: torch.Tensor | None = None

    @classmethod
    def unchecked(
        cls,
        tensor: torch.Tensor,
        sizes: torch.Tensor,
        ragged_dim: int | None = None,
        mask: torch.Tensor | None = None,
    ) -> RaggedBatch:
        """Wrap a consistent ``(tensor, sizes)`` pair without validating it: no checks, no launch, no sync.

        For callers that built the pair themselves (op outputs, a transfer's unpacked parts): nothing is checked,
        so inconsistent arguments give wrong results later rather than an error here. Everyone else uses the
        validating constructor ``RaggedBatch(tensor, sizes, ragged_dim)``.

        Args:
            tensor: ``(*batch_shape, ..., S, ...)`` padded data.
            sizes: int64 ``batch_shape`` on ``tensor``'s device, each in ``[0, S]``.
            ragged_dim: the non-negative index of ``S`` in ``tensor``, after the batch dims (default: the first
                dim after them, ``sizes.dim()``).
            mask: the cached :attr:`mask` (bool ``(*batch_shape, S)``) if the caller has it, else None.

        Returns:
            The batch, sharing ``tensor``, ``sizes`` and ``mask``.

        Example:
            >>> RaggedBatch.unchecked(out, gt.sizes, gt.ragged_dim, gt.cached_mask)  # same samples as ``gt``
        """
        out = cls.__new__(cls)
        out._tensor = tensor
        out._sizes = sizes
        out._ragged_dim = sizes.dim() if ragged_dim is None else ragged_dim
        out._mask = mask
        return out

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_list(
        cls,
        samples: Sequence[Any],
        *,
        ragged_dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        fill: float = 0,
    ) -> RaggedBatch:
        """Pad a (nested) list of per-sample tensors into one batch.

        Nesting depth gives the number of batch dims (nested lists must be rectangular). The padded
        batch is assembled where the samples live and moved to ``device`` in one transfer (plus one
        for the sizes), never one transfer per sample. Sizes come from the samples' shapes, so this
        never reads device memory.

        Args:
            samples: list (or nested lists) of tensors or numpy arrays; all of one dtype and equal in
                every dim but the ragged one.
            ragged_dim: the ragged dim in the *result* (default: first dim after the batch dims),
                i.e. dim ``ragged_dim - num_batch_dims`` of every sample.
            device: target device (default: the samples' device).
            dtype: convert to this dtype (default: the samples' common dtype).
            fill: padding value.

        Returns:
            RaggedBatch with ``tensor`` ``(*batch_shape, ..., S, ...)``, ``S`` = the longest sample.

        Example:
            >>> RaggedBatch.from_list([[torch.ones(2, 3)], [torch.ones(0, 3)]]).batch_shape
            torch.Size([2, 1])
        """
        batch_shape, leaves = _flatten_nested(samples)
        tensors = []
        for path, leaf in leaves:
            if isinstance(leaf, np.ndarray):
                leaf = torch.from_numpy(leaf)
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(f"samples{path}: expected a tensor or numpy array, got {type(leaf).__name__}")
            tensors.append((path, leaf))
        first_path, first = tensors[0]
        num_batch_dims = len(batch_shape)
        if first.dim() < 1:
            raise ValueError(f"samples{first_path}: a sample needs at least one dim (the ragged one)")
        sample_rd = _normalize_ragged_dim(ragged_dim, num_batch_dims, num_batch_dims + first.dim())
        sample_rd -= num_batch_dims
        out_dtype = dtype if dtype is not None else first.dtype
        for path, t in tensors[1:]:
            if t.dim() != first.dim():
                raise ValueError(f"samples{path}: has {t.dim()} dims, samples{first_path} has {first.dim()}")
            if dtype is None and t.dtype != first.dtype:
                raise ValueError(
                    f"samples{path}: dtype {t.dtype} differs from {first.dtype} of samples{first_path}; "
                    "pass dtype= to convert"
                )
            if t.device != first.device:
                raise ValueError(f"samples{path}: on {t.device}, samples{first_path} on {first.device}")
            other = [s for d, s in enumerate(t.shape) if d != sample_rd]
            expected = [s for d, s in enumerate(first.shape) if d != sample_rd]
            if other != expected:
                raise ValueError(
                    f"samples{path}: shape {tuple(t.shape)} differs from samples{first_path} "
                    f"{tuple(first.shape)} outside the ragged dim {sample_rd}"
                )
        moved = [t.to(out_dtype).movedim(sample_rd, 0) for _, t in tensors]
        padded = pad_sequence(moved, batch_first=True, padding_value=fill)  # (M, S, ...)
        padded = padded.movedim(1, 1 + sample_rd)  # (M, *sample shape with S at sample_rd)
        padded = padded.reshape(*batch_shape, *padded.shape[1:])  # (*batch, ..., S, ...)
        sizes = torch.tensor([t.shape[sample_rd] for _, t in tensors], dtype=torch.int64).reshape(batch_shape)
        target = torch.device(device) if device is not None else first.device
        padded = padded.to(target)
        sizes = sizes.to(target)
        return cls.unchecked(padded, sizes, num_batch_dims + sample_rd)

    @classmethod
    def from_dense(cls, tensor: torch.Tensor, num_batch_dims: int = 1, ragged_dim: int | None = None) -> RaggedBatch:
        """Wrap a tensor whose samples are all full (size = padded length)."""
        if not 1 <= num_batch_dims < tensor.dim():
            raise ValueError(
                f"num_batch_dims: must be in [1, {tensor.dim() - 1}] for a tensor of shape "
                f"{tuple(tensor.shape)}, got {num_batch_dims}"
            )
        ragged_dim = _normalize_ragged_dim(ragged_dim, num_batch_dims, tensor.dim())
        sizes = torch.full(
            tensor.shape[:num_batch_dims], tensor.shape[ragged_dim], dtype=torch.int64, device=tensor.device
        )
        return cls.unchecked(tensor, sizes, ragged_dim)

    # ------------------------------------------------------------------ properties
    @property
    def tensor(self) -> torch.Tensor:
        """The padded data, ``(*batch_shape, ..., S, ...)``."""
        return self._tensor

    @property
    def sizes(self) -> torch.Tensor:
        """Valid length of each sample, int64 ``batch_shape``, on the data's device."""
        return self._sizes

    @property
    def mask(self) -> torch.Tensor:
        """Bool ``(*batch_shape, S)``: True at valid positions. Computed on first use and cached."""
        if self._mask is None:
            positions = torch.arange(self.max_size, device=self._sizes.device)  # (S,)
            self._mask = positions < self._sizes.unsqueeze(-1)  # (*batch, S)
        return self._mask

    @property
    def cached_mask(self) -> torch.Tensor | None:
        """:attr:`mask` if it has been computed (or came with the batch), else None; computes nothing."""
        return self._mask

    @property
    def batch_shape(self) -> torch.Size:
        """Shape of the batch dims (``sizes.shape``)."""
        return self._sizes.shape

    @property
    def num_batch_dims(self) -> int:
        """Number of leading batch dims."""
        return self._sizes.dim()

    @property
    def ragged_dim(self) -> int:
        """Index of the ragged dim in ``tensor`` (non-negative, after the batch dims)."""
        return self._ragged_dim

    @property
    def max_size(self) -> int:
        """Padded length ``S`` of the ragged dim (from the shape: no sync)."""
        return self._tensor.shape[self._ragged_dim]

    @property
    def shape(self) -> torch.Size:
        """Shape of the padded data."""
        return self._tensor.shape

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the padded data."""
        return self._tensor.dtype

    @property
    def device(self) -> torch.device:
        """Device of the padded data (the sizes live there too)."""
        return self._tensor.device

    @property
    def requires_grad(self) -> bool:
        """Whether the padded data requires grad."""
        return self._tensor.requires_grad

    def broadcast_mask(self) -> torch.Tensor:
        """``mask`` viewed to broadcast against ``tensor``: size 1 in every non-batch, non-ragged dim."""
        nb, rd = self.num_batch_dims, self._ragged_dim
        shape = (*self.batch_shape, *([1] * (rd - nb)), self.max_size, *([1] * (self._tensor.dim() - rd - 1)))
        return self.mask.view(shape)

    # ------------------------------------------------------------------ conversions
    def to_list(self) -> list[Any]:
        """Per-sample views, cropped to their sizes, nested like the batch dims.

        Reads all sizes in **one** host transfer (a single sync on GPU), not one per sample.
        """
        sizes = self._sizes.tolist()  # sync: the host needs every sample's length to crop it
        rd = self._ragged_dim - self.num_batch_dims

        def crop(data: torch.Tensor, size: Any) -> Any:
            if isinstance(size, list):
                return [crop(d, s) for d, s in zip(data.unbind(0), size, strict=True)]
            return data.narrow(rd, 0, size)

        return crop(self._tensor, sizes)

    def to(self, *args: Any, **kwargs: Any) -> RaggedBatch:
        """``Tensor.to`` on the data; sizes (and a cached mask) follow a device change, never a dtype one."""
        tensor = self._tensor.to(*args, **kwargs)
        sizes, mask = self._sizes, self._mask
        if tensor.device != sizes.device:
            non_blocking = bool(kwargs.get("non_blocking", False))
            sizes = sizes.to(tensor.device, non_blocking=non_blocking)
            mask = mask.to(tensor.device, non_blocking=non_blocking) if mask is not None else None
        return RaggedBatch.unchecked(tensor, sizes, self._ragged_dim, mask)

    def pin_memory(self) -> RaggedBatch:
        """Page-locked copies of the data, sizes and cached mask (``DataLoader(pin_memory=True)`` calls this), so
        a later non-blocking copy of each to a GPU runs asynchronously."""
        mask = self._mask.pin_memory() if self._mask is not None else None
        return RaggedBatch.unchecked(self._tensor.pin_memory(), self._sizes.pin_memory(), self._ragged_dim, mask)

    def with_tensor(self, tensor: torch.Tensor, ragged_dim: int | None = None) -> RaggedBatch:
        """Wrap ``tensor`` with this batch's sizes (shared, not copied).

        ``tensor`` must have the same batch shape and padded length ``S`` at ``ragged_dim`` (default:
        this batch's ragged dim); other dims are free. This is how a result computed with plain torch
        ops on the padded data becomes ragged again.
        """
        nb = self.num_batch_dims
        rd = self._ragged_dim if ragged_dim is None else _normalize_ragged_dim(ragged_dim, nb, tensor.dim())
        if tuple(tensor.shape[:nb]) != tuple(self.batch_shape) or rd >= tensor.dim():
            raise ValueError(
                f"tensor: shape {tuple(tensor.shape)} does not start with the batch shape "
                f"{tuple(self.batch_shape)} or lacks ragged dim {rd}"
            )
        if tensor.shape[rd] != self.max_size:
            raise ValueError(
                f"tensor: dim {rd} has length {tensor.shape[rd]}, but the padded length is {self.max_size}"
            )
        if tensor.device != self._sizes.device:
            raise ValueError(f"tensor is on {tensor.device} but sizes are on {self._sizes.device}")
        return RaggedBatch.unchecked(tensor, self._sizes, rd, self._mask)

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor], ragged_dim: int | None = None) -> RaggedBatch:
        """``with_tensor(fn(tensor))``: run ``fn`` on the padded data and keep the sizes.

        Example:
            >>> rb.apply(lambda t: t.sigmoid())
        """
        return self.with_tensor(fn(self._tensor), ragged_dim)

    def with_padding(self, value: float) -> RaggedBatch:
        """Copy with every padding position set to ``value``; gradients at padding positions are 0."""
        if self.max_size == 0:
            return self
        return self.with_tensor(self._tensor.masked_fill(~self.broadcast_mask(), value))

    def detach(self) -> RaggedBatch:
        """The batch with its data detached from the autograd graph; sizes and cached mask are shared."""
        return RaggedBatch.unchecked(self._tensor.detach(), self._sizes, self._ragged_dim, self._mask)

    # ------------------------------------------------------------------ batch dims
    def flatten_batch(self) -> RaggedBatch:
        """Merge all batch dims into one (``(L, B)`` → ``(L*B,)``)."""
        nb = self.num_batch_dims
        if nb == 1:
            return self
        mask = self._mask.flatten(0, nb - 1) if self._mask is not None else None
        return RaggedBatch.unchecked(
            self._tensor.flatten(0, nb - 1), self._sizes.flatten(), self._ragged_dim - nb + 1, mask
        )

    def reshape_batch(self, *shape: int | Sequence[int]) -> RaggedBatch:
        """Reshape the batch dims (same number of samples; ``-1`` allowed), e.g. ``(L*B,)`` → ``(L, B)``."""
        shape_t = _shape_arg(shape)
        try:
            sizes = self._sizes.reshape(shape_t)
        except RuntimeError as err:
            raise ValueError(f"shape: cannot reshape batch shape {tuple(self.batch_shape)} to {shape_t}") from err
        if sizes.dim() < 1:
            raise ValueError("shape: needs at least one batch dim")
        nb = self.num_batch_dims
        tensor = self._tensor.reshape(*sizes.shape, *self._tensor.shape[nb:])
        mask = self._mask.reshape(*sizes.shape, self.max_size) if self._mask is not None else None
        return RaggedBatch.unchecked(tensor, sizes, self._ragged_dim - nb + sizes.dim(), mask)

    def expand_batch(self, *shape: int | Sequence[int]) -> RaggedBatch:
        """Broadcast the batch dims to ``shape`` without copying (``torch.expand`` rules).

        New leading dims may be added and size-1 batch dims broadcast, e.g. ground truth ``(B,)`` →
        ``(L, B)`` for L decoder layers. The result is a stride-0 view: do not write into it.
        """
        shape_t = _shape_arg(shape)
        nb = self.num_batch_dims
        if len(shape_t) < nb:
            raise ValueError(f"shape: {shape_t} has fewer dims than the batch shape {tuple(self.batch_shape)}")
        try:
            sizes = self._sizes.expand(shape_t)
        except RuntimeError as err:
            raise ValueError(f"shape: cannot expand batch shape {tuple(self.batch_shape)} to {shape_t}") from err
        tensor = self._tensor.expand(*sizes.shape, *self._tensor.shape[nb:])
        mask = self._mask.expand(*sizes.shape, self.max_size) if self._mask is not None else None
        return RaggedBatch.unchecked(tensor, sizes, self._ragged_dim - nb + sizes.dim(), mask)

    def __repr__(self) -> str:
        return (
            f"RaggedBatch(shape={tuple(self._tensor.shape)}, batch_shape={tuple(self.batch_shape)}, "
            f"ragged_dim={self._ragged_dim}, dtype={self.dtype}, device={self.device})"
        )


# ---------------------------------------------------------------------- helpers
def _normalize_ragged_dim(ragged_dim: int | None, num_batch_dims: int, ndim: int, name: str = "ragged_dim") -> int:
    if ragged_dim is None:
        return num_batch_dims
    rd = ragged_dim + ndim if ragged_dim < 0 else ragged_dim
    if not num_batch_dims <= rd < ndim:
        raise ValueError(
            f"{name}: {ragged_dim} must be a dim after the {num_batch_dims} batch dim(s) of a {ndim}-dim tensor"
        )
    return rd


def movedim(tensor: torch.Tensor, source: int, destination: int) -> torch.Tensor:
    """``tensor.movedim`` that skips the call (a measurable cost on tiny CPU tensors) when it is a no-op."""
    return tensor if source == destination else tensor.movedim(source, destination)


def _shape_arg(shape: tuple[Any, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        return tuple(int(s) for s in shape[0])
    return tuple(int(s) for s in shape)


def _flatten_nested(samples: Any) -> tuple[tuple[int, ...], list[tuple[str, Any]]]:
    """Walk a rectangular nested list; return its shape and the leaves with their index paths."""
    if not isinstance(samples, (list, tuple)):
        raise TypeError(f"samples: expected a list of tensors, got {type(samples).__name__}")
    if len(samples) == 0:
        raise ValueError("samples: empty list; a batch needs at least one sample to know its data shape")
    shape: tuple[int, ...] | None = None
    leaves: list[tuple[str, Any]] = []

    def walk(node: Any, path: str, depth_shape: tuple[int, ...]) -> None:
        nonlocal shape
        if isinstance(node, (list, tuple)):
            if len(node) == 0:
                raise ValueError(f"samples{path}: empty nested list; nested lists must be rectangular")
            for i, child in enumerate(node):
                walk(child, f"{path}[{i}]", (*depth_shape, len(node)))
            return
        if shape is None:
            shape = depth_shape
        elif shape != depth_shape:
            raise ValueError(f"samples{path}: nested lists are not rectangular ({depth_shape} vs {shape})")
        leaves.append((path, node))

    walk(samples, "", ())
    assert shape is not None
    return shape, leaves
