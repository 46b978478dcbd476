"""What a model reads: :class:`Batch`, a collated list of samples with ground truth as ``RaggedBatch`` and one
``to(device)``; and :data:`ModelBatch`, any batch the engine carries to a model.

Field names are what drivetrain's losses read (``gt_boxes``, ``gt_labels``, ``gt_boxes_2d``,
``gt_labels_2d``, ``centers_2d``, ``depths_2d``, ``image_size``), so a ``Batch`` is passed to them as the
``targets`` directly. Glossary: ``B`` samples, ``N`` cameras, ``G`` max GT boxes (3D: per sample; 2D: per
image), ``P`` max points.

``drivetrain.data.collate`` builds a ``Batch`` from loaded samples; the pipeline (transfer, augmentation), the
engine's protocol, the models and the losses read it. It sits below all of them and imports only ``ragged``.

A batch may carry a model's image-encoder output computed ahead (``speed.encoder_overlap``: the engine runs the
model's frozen encoder for the next batch while this one trains): ``Batch[E]``'s ``encoded`` holds a value of the
type ``E`` the model's ``encode`` returns (:class:`drivetrain.engine.protocol.FrozenEncoder`), which the engine
carries without reading it and the model's ``forward`` uses instead of encoding again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, NoReturn, TypeAlias, TypeVar

import torch

from drivetrain.ragged import RaggedBatch

__all__ = ["Batch", "BatchFieldError", "Encoded", "ModelBatch", "TensorTree"]

Encoded = TypeVar("Encoded")
"""The type of a model's encoder output that a :class:`Batch` carries (``Batch[Encoded]``), the model's to declare."""


class BatchFieldError(AttributeError):
    """A name read from a :class:`Batch` that is none of its fields or members (``batch.gt_box``): the message names
    the field, the closest existing ones and every field; an ``AttributeError``, so ``hasattr``/``getattr`` with a
    default still work. :meth:`located` adds the line of the model's code that read it (the command line prints that,
    one line, instead of a traceback)."""

    def located(self) -> str:
        """The message after the place that read the name: ``myproj/bevgrid.py:57 in loss: ...`` (the innermost frame
        of the traceback outside this module)."""
        import traceback

        frames = [f for f in traceback.extract_tb(self.__traceback__) if f.filename != __file__]
        if not frames:
            return str(self)
        frame = frames[-1]
        return f"{frame.filename}:{frame.lineno} in {frame.name}: {self}"


@dataclass(frozen=True)
class Batch(Generic[Encoded]):
    """A batch of key frames (all tensors on one device; boxes in each sample's lidar frame); ``Batch[E]`` carries a
    model's encoder output of type ``E`` computed ahead (``encoded``)."""

    # (B, N, 3, H, W) uint8 RGB as loaded, float32 after the camera augmentation; None when images are not loaded
    images: torch.Tensor | None
    intrinsics: torch.Tensor  # (B, N, 3, 3) float32
    lidar2img: torch.Tensor  # (B, N, 4, 4) float32: K_4x4 @ lidar2cam
    cam2ego: torch.Tensor  # (B, N, 4, 4) float32: camera → ego frame of the key frame
    lidar2ego: torch.Tensor  # (B, 4, 4) float32
    ego_pose: torch.Tensor  # (B, 4, 4) float32: lidar → global, the pose of the sample's lidar frame in the world
    ego_pose_inv: torch.Tensor  # (B, 4, 4) float32: global → lidar
    timestamps: torch.Tensor  # (B,) float64 seconds
    prev_exists: torch.Tensor  # (B,) bool: the previous step of this batch slot was the previous frame
    gt_boxes: RaggedBatch  # (B, G, 9) float32 (x, y, z_centre, dx, dy, dz, yaw, vx, vy)
    gt_labels: RaggedBatch  # (B, G) int64
    gt_boxes_2d: RaggedBatch  # (B, N, G, 4) float32 pixel xyxy
    gt_labels_2d: RaggedBatch  # (B, N, G) int64
    centers_2d: RaggedBatch  # (B, N, G, 2) float32 pixels: projected 3D box centres
    depths_2d: RaggedBatch  # (B, N, G) float32 metres
    gt_index_2d: RaggedBatch  # (B, N, G) int64: the 3D box (row of gt_boxes) each 2D box comes from
    points: RaggedBatch | None  # (B, P, 5) float32 (x, y, z, intensity, Δt)
    image_size: tuple[int, int]  # (W, H)
    sample_tokens: tuple[str, ...]
    frame_index: torch.Tensor  # (B,) int64 rows of the frame index
    skipped: tuple[str, ...] = ()  # tokens of samples dropped as unreadable (on_error="skip")
    images_normalized: bool = False  # images are mean/std-normalised already (drivetrain.pipeline.augment.camera)
    # the model's frozen image-encoder output for these images, computed ahead by the engine (speed.encoder_overlap;
    # its type is what the model's encode returns); None: not computed, the model encodes in its forward
    encoded: Encoded | None = None

    if not TYPE_CHECKING:  # at run time only: a type checker flags a misspelt field itself

        def __getattr__(self, name: str) -> NoReturn:
            # Called only for a name that normal lookup did not find: a misspelt field in a model's forward or loss.
            if name.startswith("__"):  # pickle, copy and friends probing for optional dunders: the plain error
                raise AttributeError(name)
            import difflib

            names = [f.name for f in dataclasses.fields(self)]
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise BatchFieldError(
                f"Batch has no field {name!r}{hint}; its fields (drivetrain.batch.Batch): {', '.join(names)}",
                name=name, obj=self,
            )  # fmt: skip

    @property
    def batch_size(self) -> int:
        """Samples in the batch, B."""
        return len(self.sample_tokens)

    def to(self, device: torch.device | str, non_blocking: bool | None = None) -> Batch[Encoded]:
        """A copy with every tensor on ``device``, each copied once (a ragged field: its data, sizes and cached mask).

        Args:
            device: the target device.
            non_blocking: None (default) copies toward a device without blocking — asynchronously from pinned memory
                (:meth:`pin_memory`, a loader with ``pin_memory``) — and blocks for copies to the CPU, which the host
                is about to read; True or False forces it either way.

        Returns:
            The batch on ``device`` (tensors already there are shared, not copied).
        """
        device = torch.device(device)
        asynchronous = device.type != "cpu" if non_blocking is None else non_blocking
        return self._map(lambda t: t.to(device, non_blocking=asynchronous))

    def pin_memory(self) -> Batch[Encoded]:
        """Page-locked copy (``DataLoader(pin_memory=True)`` calls this), ragged sizes and masks included; a no-op
        without CUDA."""
        if not torch.cuda.is_available():
            return self
        return self._map(lambda t: t.pin_memory())

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch[Encoded]:
        """The batch with ``fn`` applied once to every tensor, ragged fields' data, sizes and cached masks too."""
        changes = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                changes[f.name] = fn(value)
            elif isinstance(value, RaggedBatch):
                mask = value.cached_mask
                changes[f.name] = RaggedBatch.unchecked(
                    fn(value.tensor), fn(value.sizes), value.ragged_dim, None if mask is None else fn(mask)
                )
        return dataclasses.replace(self, **changes)


# A plugin dataset's collated batch as the engine moves it (drivetrain.pipeline.transfer.to_device): tensors and
# ragged batches in dicts, lists and tuples, nested, plain values passed through — e.g. the smoke model's
# {"image": (B, C, H, W), "label": (B,), "target": (B, 4)}.
# (The recursion is a string, as type checkers read it; typing.get_type_hints resolves it only in this module.)
TensorTree: TypeAlias = (
    torch.Tensor | RaggedBatch | Mapping[str, "TensorTree"] | Sequence["TensorTree"] | str | int | float | bool | None
)
# What the engine's protocol hands a model (drivetrain.engine.protocol.Model): drivetrain's Batch for its own
# datasets, a plugin dataset's nested tensors otherwise.
ModelBatch: TypeAlias = Batch | TensorTree
