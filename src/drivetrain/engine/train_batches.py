"""The training batches of a run, from its config: loader, augmentation stage, device transform and prefetcher.

:func:`build_train_batches` makes what the trainer reads each micro-batch from (``next() -> (batch, dataset
indices)``, with ``state_dict``/``load_state_dict`` for its position, a checkpointed component):

- ``data.loader=torch``: a :class:`~drivetrain.engine.batches.BatchStream` (a DataLoader over this rank's shard),
  augmenting each sample in the loader workers with ``data.augment_on=worker``;
- ``data.loader=dali``: a :class:`~drivetrain.pipeline.dali.DaliStream` (JPEG decoding and the camera augmentation
  in DALI; camera frames only);
- on the training device, in a :class:`~drivetrain.pipeline.prefetch.DevicePrefetcher`: the augmentation
  (``data.augment_on=device``), then, with ``speed.encoder_overlap``, the frozen image encoder under the run's
  autocast; with ``data.prefetch`` the next batch is copied (and transformed) on a side stream while one trains.

The augmentation (camera and lidar, :class:`~drivetrain.pipeline.augment.stage.Augmentation`) draws each batch's
parameters per sample from (run seed, epoch, the sample's place in the epoch's global order), so a resumed run draws
the same, also on another number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import torch

from drivetrain.batch import Batch
from drivetrain.engine.batches import BatchStream
from drivetrain.engine.config import ConfigError, TrainConfig
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.precision import autocast
from drivetrain.engine.protocol import FrozenEncoder
from drivetrain.pipeline.augment.stage import Augmentation
from drivetrain.pipeline.prefetch import DevicePrefetcher

__all__ = ["build_train_batches", "close_train_batches"]

Transform = Callable[[Batch, dict[str, Any]], Batch]  # (batch, its position) -> batch


@runtime_checkable
class _Closing(Protocol):
    """A batch stream holding processes or files until closed (a DALI pipeline)."""

    def close(self) -> None: ...


def build_train_batches(
    cfg: TrainConfig, model: torch.nn.Module, dataset: Any, ctx: DistContext
) -> tuple[Any, Augmentation | None]:
    """This rank's batch stream of ``dataset`` and the run's augmentation stage (None without one).

    Args:
        cfg: the run's configuration (``data``, ``speed``, ``precision``, ``run.seed``).
        model: the run's model (its frozen encoder with ``speed.encoder_overlap``).
        dataset: the training dataset.
        ctx: this process's place in the process group (rank, world size, device).

    Returns:
        ``(batches, augmentation)``.

    Raises:
        ConfigError: a setting the loader, the model or the strategy cannot honour (one line naming it).
    """
    data, device = cfg.data, ctx.device
    augment = None
    aug_cfg = data.augment
    if aug_cfg is not None and aug_cfg.active:  # camera and lidar, drawn per sample (its global place)
        augment = Augmentation(aug_cfg, seed=cfg.run.seed, rank=ctx.rank, on=data.augment_on)
    in_worker = augment if data.augment_on == "worker" else None
    shard = {"seed": cfg.run.seed, "rank": ctx.rank, "world_size": ctx.world_size}
    if data.loader == "dali":  # decoding and the camera augmentation in DALI (drivetrain.pipeline.dali)
        batches: Any = _dali_stream(cfg, dataset, shard, augment, device)
        on_device = _device_transform(cfg, model, None, device)
    else:
        batches = BatchStream(dataset, data, **shard, accumulation=cfg.train.accumulation, transform=in_worker)
        on_device = _device_transform(cfg, model, augment if in_worker is None else None, device)
    if on_device is not None:  # augment / encode ahead on the device (on a side stream with data.prefetch)
        batches = DevicePrefetcher(batches, device, transform=on_device, overlap=data.prefetch)
    elif data.prefetch:  # the next batch goes to the device on a side stream (a pass-through on a CPU)
        batches = DevicePrefetcher(batches, device)
    return batches, augment


def close_train_batches(batches: Any) -> None:
    """Stop what a batch stream holds open (a DALI pipeline's worker processes); others need nothing."""
    stream = batches.stream if isinstance(batches, DevicePrefetcher) else batches
    if isinstance(stream, _Closing):
        stream.close()


def _dali_stream(
    cfg: TrainConfig, dataset: Any, shard: dict[str, int], augment: Augmentation | None, device: torch.device
) -> Any:
    """``data.loader=dali``: the DALI batch stream of ``dataset`` (errors name the setting)."""
    from drivetrain.pipeline.dali import DaliStream

    data = cfg.data
    if augment is not None and augment.config.lidar is not None:
        raise ConfigError("data.augment.lidar: data.loader=dali carries camera frames only; use data.loader=torch")
    try:
        return DaliStream(
            dataset, data.batch_size, shuffle=data.shuffle, **shard,
            augment=augment.config.camera if augment is not None else None, device=device,
            workers=data.num_workers, threads=max(1, data.num_workers), prefetch=data.prefetch_factor or 2,
        )  # fmt: skip
    except (ImportError, ValueError) as err:
        raise ConfigError(str(err)) from None


def _device_transform(
    cfg: TrainConfig, model: torch.nn.Module, augment: Augmentation | None, device: torch.device
) -> Transform | None:
    """What the prefetcher does to each batch on the device: the augmentation (camera and lidar), then (with
    ``speed.encoder_overlap``) the frozen image encoder under the run's autocast; None when neither."""
    encode = None
    if cfg.speed.encoder_overlap:
        if not (isinstance(model, FrozenEncoder) and model.frozen_encoder):
            raise ConfigError(
                f"speed.encoder_overlap: {cfg.model.name} has no frozen encoder (needs encode(batch) and "
                "frozen_encoder, e.g. a camera detector whose model.args freeze its backbone)"
            )
        if cfg.distributed.strategy in ("fsdp", "deepspeed"):
            raise ConfigError(
                f"speed.encoder_overlap: the encoder runs outside the {cfg.distributed.strategy} forward, "
                "whose parameters are sharded; use distributed.strategy ddp or none"
            )
        encode = model.encode
    if augment is None and encode is None:
        return None

    def transform(batch: Batch, position: dict[str, Any]) -> Batch:
        if augment is not None:
            batch = augment(batch, position)
        if encode is not None:
            with torch.no_grad(), autocast(cfg.precision.mode, device):
                batch = replace(batch, encoded=encode(batch))
        return batch

    return transform
