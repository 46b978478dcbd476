"""Batch n+1 copied to the device on a side stream while batch n trains.

:class:`DevicePrefetcher` wraps the trainer's batch stream (anything with ``next() -> (batch, indices)``,
``state_dict()`` and ``load_state_dict(state)``, e.g. :class:`drivetrain.engine.batches.BatchStream`). On a CUDA
device, handing out batch n first starts batch n+1: it is read from the stream and copied by a
:class:`~drivetrain.pipeline.transfer.PackedCopier` on a side stream (and, when given, transformed there — the
place for device augmentation); ``next()`` then makes the current stream wait for batch n's copy (no host
sync) and returns it. Tensors a stream hands out on the device already (DALI's images, written on the current stream
when the stream is read) pass through the copier, which makes the side stream wait for the current one first. On a
CPU device (or with ``overlap=False``) it is a pass-through: ``next()`` is the stream's ``next()``, then the copy
and the transform on the current stream (nothing to overlap with).

**A bucket chosen on the host.** With ``shapes`` (``speed.compile_step`` with device augmentation: the model's
bound of the augmented batch's bucket from the host batch and the augmentation's parameters), each batch's bucket is
computed from the host batch on a helper thread while the batch before it trains, and :attr:`handed_shapes` holds
the bucket of the batch last handed out: the compiled step then reads nothing of the device before its graph.

**Resume stays the stream's.** The stream's own position runs one batch ahead of what the trainer took; the
prefetcher keeps the position after the batch it handed out and returns that from :meth:`state_dict`, and
:meth:`load_state_dict` drops the batch in flight and restores the stream, so no batch is lost or repeated.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from drivetrain.batch import ModelBatch
from drivetrain.pipeline.transfer import PackedCopier, Transfer

__all__ = ["DevicePrefetcher"]


class DevicePrefetcher:
    """The batch stream with the next batch on its way to the device (see the module docstring).

    Args:
        stream: the host batch stream.
        device: where batches go.
        copier: the copier (default: a :class:`PackedCopier` for ``device``).
        transform: ``transform(batch, position)`` applied to each batch on the device after its copy, with the
            stream position after the batch (e.g. :class:`~drivetrain.pipeline.augment.stage.Augmentation`); on
            the side stream it must only enqueue work (no host reads), or it stalls the overlap.
        overlap: on CUDA, prepare batch n+1 on the side stream while batch n trains (``data.prefetch``);
            False copies and transforms each batch on the current stream when it is asked for.
        shapes: ``shapes(host_batch, position)``, host work on the batch before its copy (e.g. a compiled step's
            bucket of the transformed batch): run on a helper thread, its result in :attr:`handed_shapes` when the
            batch is handed out (an error it raises, raised there).
    """

    def __init__(
        self,
        stream: Any,
        device: torch.device | str,
        *,
        copier: PackedCopier | None = None,
        transform: Callable[[ModelBatch, dict[str, Any]], ModelBatch] | None = None,
        overlap: bool = True,
        shapes: Callable[[ModelBatch, dict[str, Any]], Any] | None = None,
    ) -> None:
        self.stream, self.device = stream, torch.device(device)
        self.shapes = shapes
        self._helper = ThreadPoolExecutor(1, thread_name_prefix="drivetrain-shapes") if shapes is not None else None
        self.handed_shapes: Any = None  # shapes(...) of the batch last handed out (None without shapes)
        self.copier = copier or PackedCopier(self.device)
        self.transform = transform
        self.cuda = self.device.type == "cuda" and overlap
        self._side = torch.cuda.Stream(self.device) if self.cuda else None
        self._pending: tuple[Transfer, Any, dict[str, Any], torch.cuda.Event | None, Future | None] | None = None
        self._state = stream.state_dict()

    def _start(self) -> None:
        """Read the next batch and start its copy (and transform) on the side stream."""
        batch, indices = self.stream.next()
        state = self.stream.state_dict()  # the position after this batch
        shaped = self._helper.submit(self.shapes, batch, state) if self._helper is not None else None
        handle = self.copier.to_device(batch, stream=self._side)
        event = None
        if self.transform is not None:
            with torch.cuda.stream(self._side):
                moved = self.transform(handle.get(), state)  # the side stream is current: no wait, no record
                event = torch.cuda.Event()
                event.record(self._side)
            handle = Transfer(moved, None, [], self._side)
        self._pending = (handle, indices, state, event, shaped)

    def next(self) -> tuple[ModelBatch, torch.Tensor]:
        """The next batch on the device and its dataset rows; batch n+1 is on its way when this returns."""
        if not self.cuda:
            batch, indices = self.stream.next()
            self._state = self.stream.state_dict()
            if self.shapes is not None:
                self.handed_shapes = self.shapes(batch, self._state)
            if self.transform is not None:
                batch = self.transform(self.copier.to_device(batch).get(), self.stream.state_dict())
            return batch, indices
        if self._pending is None:
            self._start()
        assert self._pending is not None
        handle, indices, state, event, shaped = self._pending
        if shaped is not None:
            self.handed_shapes = shaped.result()
        current = torch.cuda.current_stream(self.device)
        if event is not None:  # a transformed batch: wait for the transform; its outputs live on the side stream
            current.wait_event(event)
            batch = handle.get()
            _record(batch, current)
        else:
            batch = handle.get()  # waits for the copy, records its buffers on the current stream
        self._state = state
        self._start()  # batch n+1 goes over while batch n trains
        return batch, indices

    def state_dict(self) -> dict[str, Any]:
        """The stream position after the last batch handed out (not the one in flight)."""
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Drop the batch in flight and continue the stream right after the batch ``state`` was taken after."""
        self._pending = None
        self.stream.load_state_dict(state)
        self._state = self.stream.state_dict()


def _record(structure: ModelBatch, stream: torch.cuda.Stream) -> None:
    """``record_stream`` every CUDA tensor of ``structure`` on ``stream`` (made on the side stream, used here)."""
    from drivetrain.pipeline.transfer import flatten

    for tensor in flatten(structure)[0]:
        if tensor.is_cuda:
            tensor.record_stream(stream)
