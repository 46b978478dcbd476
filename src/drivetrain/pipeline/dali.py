"""NVIDIA DALI loader backend (``data.loader=dali``): the same :class:`~drivetrain.batch.Batch` stream as the PyTorch
loader, with JPEG decoding and the image augmentation in DALI's C++ (or GPU) operators.

**Data flow.** A parallel external source (``fn.external_source(parallel=True)``, ``--workers`` Python processes
started with ``spawn``) reads each sample's frame from the frame index: the six JPEG files as raw bytes, the
camera matrices and the ground truth — and, with ``data.augment``, draws the batch's augmentation parameters and
applies the *geometric* part per sample with the reference code (:func:`~.augment.camera.reference_geometry`:
``lidar2img``/intrinsics through the image matrix, 2D boxes with the invisible-box filter, the BEV rotation and
scale of boxes, ``lidar2img`` and ego poses). The DALI graph then decodes the JPEGs (``fn.decoders.image``,
``device="mixed"`` on a GPU, ``"cpu"`` without one) and, per image, resizes with an antialiased cubic filter to
``(int(H·s), int(W·s))``, cuts the crop (zeros outside the image), mirrors and normalises to CHW float32 — the
original's ``_img_transform`` op by op, as :func:`~.augment.image_ops.resize_crop_flip` does — and pads the ragged
annotations to the batch (``fn.pad``) with their counts. The iterator turns the padded outputs back into
RaggedBatches.

**Order, sharding, resume.** Batches follow a :class:`~drivetrain.data.SequenceSampler` with the run's seed,
rank and world size (each batch slot walks one scene; ranks take disjoint scenes), exactly as the PyTorch
loader does, so both loaders hand out the same frames in the same order. The source maps the pipeline's batch
count to the sampler position, starting at the resume position; :meth:`DaliStream.state_dict` is the sampler's
state after the last batch handed out (the PyTorch loader's format, so a checkpoint resumes with either
loader) and :meth:`DaliStream.load_state_dict` rebuilds the pipeline there.

**Randomness.** The augmentation parameters are not drawn by DALI's RNG operators: each sample's come from a
generator seeded by the run seed, epoch and the sample's place in the epoch's walk
(:func:`~.augment.camera.augment_seeds`), as with ``augment_on=worker|device``. So DALI's checkpointing is not
needed for an exact resume — the position alone decides every draw — and the three paths draw the same parameters
for the same batch.

**Bad data.** A missing or unreadable image, a file that is not a JPEG and an image of another size than the
index records are found where the source reads the file, from its JPEG header, before DALI decodes it; a bad
frame (e.g. non-finite boxes) where the source reads the frame. Any failure of the pipeline reaches the trainer
as one :class:`~drivetrain.data.DataError` naming the file, at the batch the PyTorch loader would raise it (so the
trainer checkpoints the same completed steps and stops with the same line). DALI prepares batches ahead, so a
failure may surface while an earlier batch is asked for: the frames of the batches in flight are then read on the
host with the PyTorch loader's checks (this error path only), which names the file — also for a JPEG whose header
is fine but whose data is cut short, which only the decoder sees — and finds the batch that holds it; the pipeline
is rebuilt to hand out the batches before that one (the bad batch's samples replaced by good ones it never hands
out), and the error is raised when the bad batch is asked for. A failure the host checks do not reproduce is
raised at once: a worker's DataError as it is, else a one-line summary of DALI's report naming the frames.

Not supported (a clear error): lidar points (the external source carries camera frames), ``on_error=skip``
(a DALI batch cannot drop a sample), the photometric distortion and image rotation. DALI runs on Linux x86_64
only; without a GPU it runs its CPU operators (``device_id=None``). Install with ``pip install
'drivetrain[dali]'`` (``nvidia-dali-cuda130``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drivetrain.batch import Batch
from drivetrain.data.collate import collate
from drivetrain.data.dataset import FrameDataset, FrameKey
from drivetrain.data.errors import DataError
from drivetrain.data.io import read_image, read_jpeg_bytes
from drivetrain.data.sampler import SequenceSampler
from drivetrain.pipeline.augment.camera import CameraAugConfig, augment_seeds, draw_params, reference_geometry
from drivetrain.ragged import RaggedBatch

__all__ = ["DaliStream", "dali_available"]

# the per-sample outputs of the external source after the N encoded images, with their padded (ragged) axis
_FIELDS = (
    ("resize", None), ("crop", None), ("flip", None), ("frame", None), ("prev_exists", None), ("timestamp", None),
    ("intrinsics", None), ("lidar2img", None), ("cam2ego", None), ("lidar2ego", None), ("ego_pose", None),
    ("ego_pose_inv", None), ("gt_boxes", 0), ("gt_labels", 0), ("num_gt", None), ("gt_boxes_2d", 1),
    ("centers_2d", 1), ("gt_labels_2d", 1), ("depths_2d", 1), ("gt_index_2d", 1), ("num_gt_2d", None),
)  # fmt: skip


def dali_available() -> bool:
    """Whether NVIDIA DALI imports here."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def _require_dali() -> None:
    if not dali_available():
        raise ImportError(
            "data.loader=dali needs NVIDIA DALI: pip install 'drivetrain[dali]' (nvidia-dali-cuda130, Linux x86_64)"
        )


class _Positions:
    """The sampler position of the pipeline's ``i``-th batch, counting from a start position."""

    def __init__(self, sampler: SequenceSampler, start: tuple[int, int]) -> None:
        self.sampler, self.start = sampler, start
        self._steps: dict[int, int] = {}

    def steps(self, epoch: int) -> int:
        if epoch not in self._steps:
            self._steps[epoch] = self.sampler.steps_in_epoch(epoch)
        return self._steps[epoch]

    def at(self, i: int) -> tuple[int, int]:
        epoch, step = self.start[0], self.start[1] + i
        while step >= self.steps(epoch):
            step -= self.steps(epoch)
            epoch += 1
        return epoch, step


class DaliSource:
    """The parallel external source: sample ``idx_in_batch`` of pipeline batch ``iteration`` (see the module).

    Picklable (it is sent to DALI's ``spawn``-ed workers); the frame dataset reads no images itself.
    """

    def __init__(
        self,
        frames: FrameDataset,
        sampler: SequenceSampler,
        start: tuple[int, int],
        augment: CameraAugConfig | None,
        seed: int,
        stop_at: int | None = None,
    ) -> None:
        self.frames = frames
        self.positions = _Positions(sampler, start)
        self.augment, self.seed = augment, seed
        self.cameras = frames.index.num_cameras
        self.stop_at = stop_at  # batches from here on are never handed out: they repeat batch 0's frames
        self._slots: tuple[int, list[list[tuple[int, bool]]]] | None = None

    def key(self, iteration: int, slot: int) -> tuple[FrameKey, dict[str, int]]:
        """The frame of ``slot`` in pipeline batch ``iteration`` and the sampler position after that batch."""
        epoch, step = self.positions.at(iteration)
        sampler = self.positions.sampler
        if self._slots is None or self._slots[0] != epoch:
            self._slots = (epoch, sampler._slots(epoch, sampler.rank))
        frame, prev = self._slots[1][slot][step]
        return FrameKey(frame, prev), {"epoch": epoch, "step": step + 1}

    def __call__(self, info: Any) -> tuple[np.ndarray, ...]:
        stopped = self.stop_at is not None and info.iteration >= self.stop_at
        key, position = self.key(0 if stopped else info.iteration, info.idx_in_batch)
        sample = self.frames[key]
        batch = collate([sample])  # one sample, no images: the same matrices and ragged GT as the PyTorch loader
        width, height = batch.image_size
        files = self.frames.index.meta["image_files"][key.index]
        encoded = [_read_jpeg(self.frames.root / f, (width, height)) for f in files]
        resize, crop, flip = [height, width], [0, 0], False
        if self.augment is not None:
            sampler = self.positions.sampler  # the sample's own generator, as the trainer's stage seeds it
            seeds = augment_seeds(self.seed, sampler.rank, {**sampler.state_dict(), **position}, sampler.batch_size)
            generator = torch.Generator().manual_seed(seeds[info.idx_in_batch])
            params = draw_params(1, self.cameras, self.augment, generator)
            batch = reference_geometry(batch, params, self.augment)
            s = float(params.image.scale[0])
            resize = [int(height * s), int(width * s)]
            crop = [int(params.image.crop[0, 1]), int(params.image.crop[0, 0])]  # (y, x)
            flip = bool(params.image.flip[0])
        out = {
            "resize": np.array(resize, np.float32), "crop": np.array(crop, np.int32), "flip": np.array(flip, np.int32),
            "frame": np.array([key.index], np.int64), "prev_exists": np.array([key.prev_exists], np.uint8),
            "timestamp": batch.timestamps.numpy(), "intrinsics": batch.intrinsics[0].numpy(),
            "lidar2img": batch.lidar2img[0].numpy(), "cam2ego": batch.cam2ego[0].numpy(),
            "lidar2ego": batch.lidar2ego[0].numpy(), "ego_pose": batch.ego_pose[0].numpy(),
            "ego_pose_inv": batch.ego_pose_inv[0].numpy(), "num_gt": batch.gt_boxes.sizes.numpy(),
            "num_gt_2d": batch.gt_boxes_2d.sizes[0].numpy(),
        }  # fmt: skip
        for name in ("gt_boxes", "gt_labels"):
            out[name] = getattr(batch, name).tensor[0, : int(batch.gt_boxes.sizes[0])].numpy()
        longest = int(batch.gt_boxes_2d.sizes.max()) if batch.gt_boxes_2d.sizes.numel() else 0
        for name in ("gt_boxes_2d", "centers_2d", "gt_labels_2d", "depths_2d", "gt_index_2d"):
            out[name] = getattr(batch, name).tensor[0, :, :longest].numpy()
        return (*encoded, *(np.ascontiguousarray(out[name]) for name, _ in _FIELDS))


def _read_jpeg(path: Path, size: tuple[int, int]) -> np.ndarray:
    """The encoded bytes of one image, uint8 ``(bytes,)``, after checking what can be checked without decoding.

    Raises:
        DataError: naming ``path`` (the PyTorch loader's messages, :func:`~drivetrain.data.io.read_jpeg_bytes`):
            the file is missing, unreadable, not a regular file or too large for its size, its header is not a
            JPEG's, or it holds another size than the ``(W, H)`` the index records.
    """
    return np.frombuffer(read_jpeg_bytes(path, size), dtype=np.uint8)


def _pipeline(source: DaliSource, batch_size: int, augment: CameraAugConfig | None, device_id: int | None,
              workers: int, threads: int, prefetch: int) -> Any:  # fmt: skip
    """The DALI pipeline of the module docstring (built, workers started)."""
    from nvidia.dali import fn, pipeline_def, types

    cameras = source.cameras
    gpu = device_id is not None

    @pipeline_def(
        batch_size=batch_size, num_threads=threads, device_id=device_id, py_num_workers=workers,
        py_start_method="spawn", prefetch_queue_depth=prefetch,
    )  # fmt: skip
    def graph() -> tuple[Any, ...]:
        outputs = fn.external_source(source=source, num_outputs=cameras + len(_FIELDS), batch=False, parallel=True)
        encoded, rest = outputs[:cameras], dict(zip([name for name, _ in _FIELDS], outputs[cameras:], strict=True))
        images = []
        for data in encoded:
            image = fn.decoders.image(data, device="mixed" if gpu else "cpu", output_type=types.RGB)
            if augment is None:
                image = fn.transpose(image, perm=[2, 0, 1])  # (3, H, W) uint8, as the PyTorch collate
            else:
                final_w, final_h = augment.image.final_size
                image = fn.resize(image, size=rest["resize"], interp_type=types.INTERP_CUBIC, antialias=True)
                image = fn.slice(image, start=rest["crop"], shape=[final_h, final_w], axis_names="HW",
                                 out_of_bounds_policy="pad", fill_values=0)  # fmt: skip
                image = fn.flip(image, horizontal=rest["flip"])
                mean, std = (augment.mean, augment.std) if augment.normalize else ((0.0,) * 3, (1.0,) * 3)
                image = fn.crop_mirror_normalize(
                    image, mean=list(mean), std=list(std), output_layout="CHW", dtype=types.FLOAT
                )
            images.append(image)
        padded = [fn.pad(rest[name], axes=(axis,)) if axis is not None else rest[name] for name, axis in _FIELDS]
        return (fn.stack(*images), *padded)

    pipe = graph()
    pipe.build()
    return pipe


class DaliStream:
    """The trainer's batch stream from a DALI pipeline (``next()``, ``state_dict()``, ``load_state_dict()``).

    Args:
        dataset: a :class:`~drivetrain.data.sources.StreamingFrames` (``frames``/``synthetic`` builders).
        batch_size, shuffle: as ``data.batch_size`` / ``data.shuffle``.
        seed, rank, world_size: the run seed and this process's shard.
        augment: the camera augmentation (None: decoded uint8 images, as the PyTorch loader without it).
        device: the training device (CUDA: GPU decoding and image operators).
        workers: DALI's Python source processes (``data.num_workers``, at least 1).
        threads: DALI's CPU operator threads.
        prefetch: batches DALI prepares ahead.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        augment: CameraAugConfig | None = None,
        device: torch.device | str = "cpu",
        workers: int = 1,
        threads: int = 1,
        prefetch: int = 2,
    ) -> None:
        _require_dali()
        frames = getattr(dataset, "frames", dataset)
        if not isinstance(frames, FrameDataset):
            raise ValueError(f"data.loader=dali: needs frames of a frame index, got {type(dataset).__name__}")
        config = frames.config
        if config.load_points:
            raise ValueError("data.loader=dali: carries camera frames only; load_points must be false")
        if config.on_error != "raise":
            raise ValueError("data.loader=dali: a DALI batch cannot drop a sample; use on_error=raise")
        if augment is not None and augment.photometric is not None:
            raise ValueError("data.loader=dali: the photometric distortion runs with augment_on=worker|device only")
        if augment is not None and augment.image.rot_lim != (0.0, 0.0):
            raise ValueError("data.loader=dali: no image rotation (the original has none either)")
        self._frames = FrameDataset(frames.index, dataclasses.replace(config, load_images=False), frames.root)
        self.augment, self.seed, self.rank = augment, seed, rank
        self.device = torch.device(device)
        self.batch_size, self.workers, self.threads, self.prefetch = batch_size, max(workers, 1), threads, prefetch
        self.sampler = SequenceSampler(
            frames.scene_lengths(), batch_size, seed=seed, shuffle=shuffle, rank=rank, world_size=world_size
        )
        self._tokens = frames.index.meta["sample_tokens"]
        self._image_size = tuple(int(v) for v in frames.index.arrays["image_size"][0, 0])
        self._state = self.sampler.state_dict()
        self._iter: Any = None
        self._pipe: Any = None
        self._stop: tuple[int, DataError] | None = None  # (batch of this pipeline, its error): see the module

    def _build(self) -> None:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        self.sampler.load_state_dict(self._state)  # normalises an end-of-epoch position
        start = (self.sampler.epoch, self.sampler.step)
        stop_at = None if self._stop is None else self._stop[0]
        source = DaliSource(self._frames, self.sampler, start, self.augment, self.seed, stop_at)
        self._source, self._positions, self._taken = source, source.positions, 0  # before DALI runs a batch
        cuda = self.device.type == "cuda"
        device_id = (
            (self.device.index if self.device.index is not None else torch.cuda.current_device()) if cuda else None
        )
        self._pipe = _pipeline(source, self.batch_size, self.augment, device_id, self.workers, self.threads,
                               self.prefetch)  # fmt: skip
        names = ["images", *(name for name, _ in _FIELDS)]
        self._iter = DALIGenericIterator([self._pipe], names, auto_reset=False)

    def next(self) -> tuple[Batch, torch.Tensor]:
        """The next batch and its frame rows (int64 ``(B,)``).

        Raises:
            DataError: one line naming the file (or frame) when this batch cannot be read (see the module); the
                pipeline is closed then, and the stream's position is that before the call.
        """
        if self._stop is not None and self._taken == self._stop[0]:
            failure, self._stop = self._stop[1], None
            self.close()
            raise failure
        try:
            if self._iter is None:
                self._build()  # DALI's iterator runs the first batch while it is built
            out = next(self._iter)[0]
        except StopIteration:
            raise
        except Exception as err:  # DALI: a source worker's error as a plain Exception with its traceback, or an
            ahead, failure = self._failure(str(err))  # operator's as a RuntimeError of many lines
            self.close()
            if not ahead or self._stop is not None:  # this batch's, or not found on the host: raise it now
                self._stop = None
                raise failure from None
            self._stop = (ahead, failure)  # batches before the bad one first, from a pipeline stopping there
            return self.next()
        epoch, step = self._positions.at(self._taken)
        self._taken += 1
        self._state = {**self._state, "epoch": epoch, "step": step + 1}
        return self._batch(out), out["frame"][:, 0].clone()

    def _failure(self, report: str) -> tuple[int | None, DataError]:
        """One DataError for a failed pipeline run and the batch it belongs to, counted from the one asked for
        (None: not found on the host), from DALI's multi-line ``report`` (see the module docstring)."""
        # The failed batch is the one asked for or one DALI prepares ahead: read those frames as the PyTorch loader
        # reads them (decoding every image), in order, on the host.
        keys = []
        for ahead in range(self.prefetch + 2):
            for slot in range(self.batch_size):
                key = self._source.key(self._taken + ahead, slot)[0]
                keys.append(key)
                try:
                    sample = self._frames[key]
                    for name in self._frames.index.meta["image_files"][key.index]:
                        read_image(self._frames.root / name, sample.image_size)
                except DataError as err:
                    return ahead, err
        lines = [line.strip() for line in report.splitlines() if line.strip()]
        for line in reversed(lines):  # a source worker's DataError, after its traceback
            if "DataError: " in line:
                return None, DataError(line.split("DataError: ", 1)[1])
        after = lines.index("encountered:") + 1 if "encountered:" in lines else 0
        what = next((line for line in lines[after:] if "no longer valid" not in line), "no message")
        frames = sorted({int(key.index) for key in keys})
        return None, DataError(
            f"the DALI pipeline failed on one of frames {frames} of {self._frames.root} ({what}), and they read "
            "without error on the host"
        )

    def _batch(self, out: dict[str, torch.Tensor]) -> Batch:
        num_gt, num_2d = out["num_gt"][:, 0], out["num_gt_2d"]  # (B,), (B, N)

        def ragged(name: str, sizes: torch.Tensor) -> RaggedBatch:
            return RaggedBatch(out[name], sizes, ragged_dim=sizes.dim())

        size = self.augment.image.final_size if self.augment is not None else self._image_size
        return Batch(
            images=out["images"], intrinsics=out["intrinsics"], lidar2img=out["lidar2img"], cam2ego=out["cam2ego"],
            lidar2ego=out["lidar2ego"], ego_pose=out["ego_pose"], ego_pose_inv=out["ego_pose_inv"],
            timestamps=out["timestamp"][:, 0], prev_exists=out["prev_exists"][:, 0].bool(),
            gt_boxes=ragged("gt_boxes", num_gt), gt_labels=ragged("gt_labels", num_gt),
            gt_boxes_2d=ragged("gt_boxes_2d", num_2d), gt_labels_2d=ragged("gt_labels_2d", num_2d),
            centers_2d=ragged("centers_2d", num_2d), depths_2d=ragged("depths_2d", num_2d),
            gt_index_2d=ragged("gt_index_2d", num_2d), points=None, image_size=tuple(size),
            sample_tokens=tuple(self._tokens[int(f)] for f in out["frame"][:, 0].tolist()),
            frame_index=out["frame"][:, 0].clone(),
            images_normalized=self.augment is not None and self.augment.normalize,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The sampler position after the last batch handed out (the PyTorch loader's format)."""
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue right after the batch ``state`` was taken after (the pipeline is rebuilt there)."""
        self.sampler.load_state_dict(state)
        self._state = {**self.sampler.state_dict(), "epoch": int(state["epoch"]), "step": int(state["step"])}
        self._stop = None
        self.close()

    def close(self) -> None:
        """Stop the pipeline and its workers (the next ``next()`` builds a new one)."""
        self._iter, self._pipe = None, None
