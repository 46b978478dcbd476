"""What the engine and the command line ask of a model: one declared protocol, each member documented here once.

Every model the trainer builds follows :class:`Model`: ``forward(batch)`` and ``loss(outputs, batch)``. Beyond that
a model may offer capabilities, each a small runtime-checkable protocol of its own; a model has one by having its
members (no base class to inherit, so a plugin's model needs nothing of drivetrain). The engine and the CLI ask
with ``isinstance(model, Capability)`` where they need it — once, when the model is built or before a command uses
it — and call the member through the protocol, never probing the model for a name with a default:

- :class:`Model` — ``forward``, ``loss`` (required): the registry's builder check, the trainer;
- :class:`WeightedLoss` — ``loss_weights``: the trainer (the weight of each loss term);
- :class:`LossCounts` — ``loss_counts``: the trainer (device counters logged beside the loss terms);
- :class:`Detector` — ``detect``: evaluation in training, ``drivetrain eval`` and ``drivetrain viz frame``;
- :class:`Sensors` — ``input_modalities``: a submission's ``meta`` block;
- :class:`FrozenEncoder` — ``frozen_encoder``, ``encode``: ``speed.encoder_overlap``;
- :class:`TTADetector` — ``enable_tta``: ``drivetrain eval --tta``;
- :class:`MatchedQueries` — ``matched_queries``: the trainer (the GPU solver's kernels compiled before step 1);
- :class:`StreamMemory` — ``stream_state``, ``load_stream_state``: the trainer (checkpoints every rank's streams);
- :class:`VoxelModel` — ``grid_test``: ``drivetrain viz frame`` (the extent it draws);
- :class:`StaticStep` — ``step_buckets``, ``step_shapes``, ``step_inputs``, ``step_loss``: ``speed.compile_step``
  (:mod:`drivetrain.engine.build`).
- :class:`HostShapes` — ``step_shapes_on_host``: a static step's bucket chosen from the loader's host batch, without
  reading the device (when the batch stream hands out host batches).
- :class:`AugmentedHostShapes` — ``step_shapes_augmented``: a bucket that holds what the device's augmentation makes
  of the loader's host batch, bounded on the host from the augmentation's parameters (device augmentation on CUDA).
- :class:`StepCompileOptions` — ``step_compile_options``: inductor options a static step's graph is compiled with on
  a device (:func:`drivetrain.engine.build.step_compile_options`).

Members must be methods, properties, class attributes or plain instance attributes: Python 3.12+ checks protocol
members without running ``__getattr__``, so a submodule, parameter or buffer does not count as one.

Example:
    >>> import torch
    >>> class Net(torch.nn.Module):
    ...     loss_weights = {"l1": 1.0}
    ...     def forward(self, batch): return batch
    ...     def loss(self, outputs, batch): return {"l1": outputs.abs().mean()}
    >>> isinstance(Net(), Model), isinstance(Net(), WeightedLoss), isinstance(Net(), Detector)
    (True, True, False)
    >>> missing_members(torch.nn.Linear(2, 2))
    ['loss(outputs, batch)']
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from drivetrain.batch import Batch, Encoded, ModelBatch

if TYPE_CHECKING:
    from drivetrain.pipeline.voxelize import VoxelGrid

__all__ = [
    "AugmentedHostShapes",
    "Detector",
    "FrozenEncoder",
    "HostShapes",
    "LossCounts",
    "MapDataset",
    "MatchedQueries",
    "Model",
    "Sensors",
    "StaticStep",
    "StepCompileOptions",
    "StreamMemory",
    "TTADetector",
    "VoxelModel",
    "WeightedLoss",
    "input_modalities",
    "missing_members",
]


@runtime_checkable
class Model(Protocol):
    """Required of every model the trainer builds (an ``nn.Module``)."""

    def forward(self, batch: ModelBatch) -> Any:
        """The outputs of one batch (whatever :meth:`loss` reads); runs under the run's autocast. The batch is
        what the run's data builder collates: a :class:`~drivetrain.batch.Batch` for drivetrain's datasets, a
        plugin dataset's nested tensors otherwise (:data:`~drivetrain.batch.ModelBatch`)."""

    def loss(self, outputs: Any, batch: ModelBatch) -> Mapping[str, torch.Tensor]:
        """Named, unweighted scalar loss terms of ``outputs`` against the batch's ground truth (fp32; the engine
        weights them with :attr:`WeightedLoss.loss_weights` when declared, else sums them)."""


@runtime_checkable
class WeightedLoss(Protocol):
    """A model that declares the weight of each of its loss terms once."""

    @property
    def loss_weights(self) -> Mapping[str, float]:
        """Weight per base term name (``loss_cls`` also weighs ``d3.loss_cls``); a run config's
        ``model.loss_weights`` overrides them by name, and naming one not declared here is an error."""


@runtime_checkable
class LossCounts(Protocol):
    """A model that counts events of its last loss call on the device."""

    @property
    def loss_counts(self) -> Mapping[str, torch.Tensor]:
        """Device counters of the last :meth:`Model.loss` call by name (e.g. ground truths left unassigned); the
        trainer sums them over the log interval and reads them with the loss, so they add no host read."""


@runtime_checkable
class Detector(Protocol):
    """A model whose detections can be scored with a dataset's official metric."""

    def detect(self, batch: Batch) -> tuple[Any, Any, Any]:
        """Detections of a batch: lidar-frame boxes ``(B, K, 9)`` ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)``,
        scores ``(B, K)`` and labels ``(B, K)`` indexing the dataset's classes; plain tensors or
        :class:`~drivetrain.ragged.RaggedBatch`. Called with the model in evaluation mode, one frame at a time in
        scene order (a streaming model keeps its memory between calls)."""


@runtime_checkable
class Sensors(Protocol):
    """A model that says which sensors it reads (default: ``("camera",)``, see :func:`input_modalities`)."""

    input_modalities: tuple[str, ...]  # of "camera", "lidar": written to a submission's meta block


@runtime_checkable
class FrozenEncoder(Protocol[Encoded]):
    """A model whose image encoder can run apart from the trainable rest; ``Encoded`` is the type of its output, the
    model's own (e.g. features and a padded size), which the engine carries in :attr:`Batch.encoded
    <drivetrain.batch.Batch.encoded>` without reading it."""

    @property
    def frozen_encoder(self) -> bool:
        """Whether :meth:`encode` is a fixed function now (e.g. a backbone frozen by the model's arguments): the
        trainer may then run it for the next batch ahead (``speed.encoder_overlap``)."""

    def encode(self, batch: Batch[Encoded]) -> Encoded:
        """The encoder's output for ``batch``; the trainer stores it as ``batch.encoded`` (a ``Batch[Encoded]``) for
        :meth:`Model.forward` to use instead of encoding again."""


@runtime_checkable
class MatchedQueries(Protocol):
    """A model whose loss solves Hungarian matchings with prediction counts known when it is built."""

    @property
    def matched_queries(self) -> tuple[int, ...]:
        """The predictions ``Q`` of each matching the loss solves whose ``Q`` the model fixes (e.g. a query-based
        head's queries plus its propagated memory queries): the trainer compiles the GPU solver's kernels for them
        before the first step (:func:`drivetrain.match.warm_gpu_solver`); a matching not listed is compiled after the
        step that first meets it."""


@runtime_checkable
class StreamMemory(Protocol):
    """A model that carries state from one frame of a batch slot (a scene stream) to the next, per sample (a temporal
    detector's memory bank): the trainer checkpoints every rank's rows and hands each rank its streams' rows back on a
    resume, also on another number of ranks (:class:`~drivetrain.engine.state.StreamState`)."""

    def stream_state(self) -> dict[str, torch.Tensor]:
        """The state of this rank's streams: tensors whose first dim is its ``B`` streams, in batch-slot order
        (``{}`` before the first frame)."""
        ...

    def load_stream_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from ``state`` (:meth:`stream_state`'s form, on any device; ``{}`` empties it)."""
        ...


@runtime_checkable
class TTADetector(Protocol):
    """A model that can detect with test-time augmentation."""

    def enable_tta(self) -> None:
        """Make :meth:`Detector.detect` merge the detections of augmented views (the model's configured views,
        else its defaults)."""


@runtime_checkable
class VoxelModel(Protocol):
    """A lidar model reading points through a voxel grid."""

    grid_test: VoxelGrid  # the grid of evaluation; its point_cloud_range bounds what the model can detect


@runtime_checkable
class MapDataset(Protocol):
    """What a dataset builder returns: a map-style dataset (``torch.utils.data.Dataset``'s protocol)."""

    def __len__(self) -> int: ...

    def __getitem__(self, key: Any) -> Any: ...


def input_modalities(model: Any) -> tuple[str, ...]:
    """The sensors ``model`` reads: its :attr:`Sensors.input_modalities`, or ``("camera",)`` when undeclared."""
    return tuple(model.input_modalities) if isinstance(model, Sensors) else ("camera",)


@runtime_checkable
class _Forward(Protocol):
    def forward(self, batch: ModelBatch) -> Any: ...


@runtime_checkable
class _Loss(Protocol):
    def loss(self, outputs: Any, batch: ModelBatch) -> Any: ...


# Each required member of Model alone, with the call a message names (see missing_members).
_REQUIRED = ((_Forward, "forward(batch)"), (_Loss, "loss(outputs, batch)"))


def missing_members(model: Any) -> list[str]:
    """The required members of :class:`Model` that ``model`` lacks, as calls (``["loss(outputs, batch)"]``)."""
    return [call for member, call in _REQUIRED if not isinstance(model, member)]


@runtime_checkable
class StaticStep(Protocol):
    """A model whose training forward and loss run at a few static shapes ("buckets"), each one graph without a break
    under ``torch.compile(fullgraph=True)``: ``speed.compile_step`` compiles every bucket before the first step and
    runs each step through it (:mod:`drivetrain.engine.build`)."""

    def step_buckets(self, batch_size: int) -> Sequence[Hashable]:
        """Every bucket a batch of ``batch_size`` samples can meet (few: each is compiled before the first step)."""

    def step_shapes(self, batch: Batch) -> Hashable:
        """The bucket of ``batch`` (one of :meth:`step_buckets`; at most one host read, ``# sync:`` marked); a
        ValueError naming the config key to raise for a batch beyond the largest bucket."""

    def step_inputs(
        self, batch: Batch | None, shapes: Hashable, batch_size: int, device: torch.device
    ) -> tuple[Any, ...]:
        """The arguments of :meth:`step_loss` for ``batch`` padded to the bucket ``shapes``, or (``batch`` None) for an
        empty batch of ``batch_size`` samples at ``shapes`` on ``device``: the same shapes, dtypes and devices, for
        compiling the bucket before the first step."""

    def step_loss(self, *inputs: Any) -> Mapping[str, torch.Tensor]:
        """The training forward and the unweighted loss terms of :meth:`step_inputs`' arguments (the terms
        :meth:`Model.forward` then :meth:`Model.loss` give), in one function without a graph break or host read."""


@runtime_checkable
class HostShapes(Protocol):
    """A :class:`StaticStep` model that can choose a batch's bucket from the batch the loader handed out on the host
    (final: augmented in the loader, or not at all), so that the step reads nothing of the device before its graph;
    the graph then guards on the device that the bucket holds the batch (an error, never a cut)."""

    def step_shapes_on_host(self, batch: Batch) -> Hashable:
        """:meth:`StaticStep.step_shapes` of ``batch`` on the host (CPU tensors): host work only, no device read."""


@runtime_checkable
class AugmentedHostShapes(Protocol):
    """A :class:`StaticStep` model that can bound, on the host, the bucket of the batch the device's augmentation
    will make of a host batch (``data.augment_on=device``), from the batch before it and the augmentation's
    parameters (drawn on the host): the step then reads nothing of the device before its graph either."""

    def step_shapes_augmented(self, batch: Batch, params: Any, config: Any, roundoff: float) -> Hashable | None:
        """A bucket holding ``batch`` (host tensors, before the augmentation) once augmented on the device with
        ``params`` (:class:`~drivetrain.pipeline.augment.stage.AugmentParams`) and ``config``
        (:class:`~drivetrain.pipeline.augment.stage.AugmentConfig`), whose float32 matrix products round to
        ``roundoff``; None where no bound is cheap (the step then counts on the device)."""


@runtime_checkable
class StepCompileOptions(Protocol):
    """A :class:`StaticStep` model that asks for inductor options of its own on a device, where one of its layers
    compiles to measurably slower code under inductor's defaults (each option's reason in the model's docs)."""

    def step_compile_options(self, device: torch.device) -> Mapping[str, Any]:
        """Inductor options (``torch._inductor.config`` names) for the step's graph on ``device``; empty: the
        defaults. They go on top of the engine's own (``fallback_random``, ``cpp_wrapper``)."""
