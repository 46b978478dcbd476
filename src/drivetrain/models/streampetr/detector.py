"""StreamPETR, the streaming multi-camera 3D detector: backbone → 3D position embedding → queries aligned with
the temporal memory → transformer decoder → shared class/box branches, with denoising queries in training and
the 2D focal head on the image features; trained by :class:`~.loss_3d.StreamPETRLoss` and
:class:`~drivetrain.losses.focal_head.FocalHeadLoss`, on the :class:`~.loss.Path` chosen when it is built,
through the engine's protocol (``forward(batch)``, ``loss(outputs, batch)``).

One frame per step, as the published streaming training (``seq_mode``, one frame per iteration): the memory
bank carries the top queries of each batch slot's previous frame, cleared where ``batch.prev_exists`` is
False. The data flow mirrors ``Petr3D.forward_train``/``extract_img_feat`` (``projects/mmdet3d_plugin/models/
detectors/petr3d.py``) and ``StreamPETRHead.forward`` and ``temporal_alignment`` (``projects/mmdet3d_plugin/
models/dense_heads/streampetr_head.py``) of StreamPETR:

1. images normalised (ImageNet mean/std, RGB), zero-padded at the bottom/right to a multiple of 32
   (``NormalizeMultiviewImage``, ``PadMultiViewImage(size_divisor=32)``), backbone + neck at stride 16;
2. tokens ``(B, N·h·w, E)`` → ``memory_embed`` MLP → MLN on the camera "cone" (spatial alignment); the PETR
   position embedding of each token's ray, gated by the tokens (``featurized_pe``);
3. queries: ``num_query`` learned reference points (``U(0, 1)``), the denoising queries in front in training;
   ``query_pos = MLP(sine3d(reference))``, content zero; the memory's entries embedded the same way from
   their reference points; both modulated by MLNs on the NeRF encoding of (velocity, age, pose) and given a
   time embedding of their age; the first ``num_propagated`` memory entries join the queries, the rest are
   extra self-attention keys;
4. decoder → ``nan_to_num`` → class logits and box codes of every layer (:func:`~.heads.box_codes`);
5. the memory takes the last layer's ``topk`` best (non-denoising) queries.

Deviations, each for a reason: the focal head's token ranking is not applied (see :mod:`.heads`); the memory
is saved with checkpoints (see :mod:`.memory`); images are padded here rather than in the data pipeline
(our batches carry the unpadded size, the focal head and its loss use the padded one, as the original's
``pad_shape``); the denoising queries are built before the backbone runs, so that their one host read waits
for the batch's copy only (the same random draws: nothing before the decoder draws any).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from drivetrain.batch import Batch
from drivetrain.constants import constant
from drivetrain.losses.focal_head import focal_head_loss
from drivetrain.models.streampetr.args import StreamPETRArgs
from drivetrain.models.streampetr.backbone import build_backbone
from drivetrain.models.streampetr.decoder import Decoder
from drivetrain.models.streampetr.denoising import DNQueries
from drivetrain.models.streampetr.embedding import MLN, SEGate, nerf_encoding, sine_embedding_1d, sine_embedding_3d
from drivetrain.models.streampetr.heads import FocalHead, box_codes, class_branch, regression_branch, token_locations
from drivetrain.models.streampetr.loss import path_of, streampetr_loss
from drivetrain.models.streampetr.memory import MemoryBank, MemoryState
from drivetrain.models.streampetr.position import PositionEmbedding3D
from drivetrain.models.streampetr.postprocess import decode
from drivetrain.models.streampetr.recipe import MAX_NUM, MEAN, POST_CENTER_RANGE, SIZE_DIVISOR, STD
from drivetrain.models.streampetr.static import StepShapes, buckets, empty_batch, step_batch, step_buckets, step_shapes
from drivetrain.ragged import RaggedBatch

__all__ = ["StreamPETR"]


class StreamPETR(nn.Module):
    """The StreamPETR detector (see the module docstring), built from :class:`~.args.StreamPETRArgs` (each
    argument's type, default and meaning; the defaults are the published R50 704×256 config, its constants in
    :mod:`.recipe`).

    ``input_modalities``: the sensors it reads (``("camera",)``), written to a submission's ``meta`` block.

    Args:
        args: the arguments.
        **changes: fields of ``args`` to replace, by name (``StreamPETR(num_query=20)``); an unknown name is a
            ``TypeError`` naming it.

    A frozen backbone (``freeze_backbone``: backbone and neck without gradients, normalisation in evaluation mode)
    makes :meth:`encode` run apart from the trainable rest, so the trainer can run it for the next batch while this
    one trains (``speed.encoder_overlap``). The path (``impl``: reference or batched losses and denoising queries;
    ``static_targets``: the batched path on ground truth padded to buckets, :mod:`.static`) is chosen here, once, as
    a :class:`~.loss.Path`.
    """

    input_modalities: tuple[str, ...] = ("camera",)

    def __init__(self, args: StreamPETRArgs = StreamPETRArgs(), **changes: Any) -> None:  # noqa: B008 (frozen)
        super().__init__()
        args = dataclasses.replace(args, **changes)
        self.args = args
        self.path = path_of(args.impl, args.static_targets)  # the one choice: a ValueError names a wrong impl
        if args.static_targets:
            buckets(args.max_targets)  # a ValueError names model.args.max_targets below 1
        if args.embed_dims % 2:
            raise ValueError(
                f"embed_dims: must be even (the 3D sine embedding has 3E/2 features), got {args.embed_dims}"
            )
        e, num_classes = args.embed_dims, args.num_classes
        self.num_classes, self.num_query = num_classes, args.num_query
        self.num_propagated, self.memory_len = args.num_propagated, args.memory_len
        self.dn = {"groups": args.dn_groups, "noise_scale": args.dn_noise_scale, "split": args.dn_split}
        self.pc_range = tuple(float(v) for v in args.pc_range)
        self.backbone = build_backbone(args.backbone, e, **(args.backbone_args or {}))
        self.stride = self.backbone.stride
        self.freeze_backbone = args.freeze_backbone
        if args.freeze_backbone:  # a fixed image encoder: no gradients, evaluation-mode normalisation
            self.backbone.requires_grad_(False)
            self.backbone.eval()
        self.focal_head = FocalHead(e, num_classes, self.stride) if args.with_focal_head else None
        self.position = PositionEmbedding3D(e, args.depth_num, args.depth_start, tuple(args.position_range))
        self.memory_embed = nn.Sequential(nn.Linear(e, e), nn.ReLU(), nn.Linear(e, e))
        self.featurized_pe = SEGate(e)
        self.spatial_alignment = MLN(8, e)
        self.reference_points = nn.Embedding(args.num_query, 3)
        nn.init.uniform_(self.reference_points.weight, 0, 1)
        self.query_embedding = nn.Sequential(nn.Linear(e * 3 // 2, e), nn.ReLU(), nn.Linear(e, e))
        self.time_embedding = nn.Sequential(nn.Linear(e, e), nn.LayerNorm(e))
        self.ego_pose_pe = MLN(180, e)
        self.ego_pose_memory = MLN(180, e)
        self.decoder = Decoder(args.num_layers, e, args.num_heads, args.ffn_dims, args.dropout, args.with_cp)
        self.cls_branch = class_branch(e, num_classes)
        self.reg_branch = regression_branch(e)
        self.memory = MemoryBank(e, args.memory_len, args.topk, args.num_propagated, self.pc_range)
        self._held: MemoryState | None = None  # the compiled step's bank tensors (:meth:`_held_bank`)
        sync, compile_loss = args.sync_cls_avg_factor, args.compile_loss
        self.criterion = streampetr_loss(
            num_classes, dn_split=args.dn_split, sync_cls_avg_factor=sync, compile=compile_loss
        )
        self.focal_criterion = (
            focal_head_loss(num_classes, stride=self.stride, sync_cls_avg_factor=sync, compile=compile_loss)
            if args.with_focal_head
            else None
        )
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(STD).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pc_min", torch.tensor(self.pc_range[:3]), persistent=False)
        self.register_buffer("pc_size", torch.tensor(self.pc_range[3:]) - torch.tensor(self.pc_range[:3]),
                             persistent=False)  # fmt: skip

    @property
    def matched_queries(self) -> tuple[int, ...]:
        """The 3D head's matching queries ``Q = num_query + num_propagated`` (the focal head's tokens per image depend
        on the image size: its solver kernels are compiled after the first step)."""
        return (self.num_query + self.num_propagated,)

    # ---------------------------------------------------------------------------------------------- forward
    def forward(self, batch: Batch) -> dict[str, Any]:
        """One frame of every batch slot.

        Args:
            batch: a :class:`~drivetrain.data.Batch`: ``images`` uint8 ``(B, N, 3, H, W)``, ``lidar2img``,
                ``intrinsics``, ``ego_pose``/``ego_pose_inv``, ``timestamps``, ``prev_exists``; in training also
                ``gt_boxes``/``gt_labels`` for the denoising queries.

        Returns:
            ``cls_logits`` ``(L, B, Q, C)`` and ``box_codes`` ``(L, B, Q, 10)`` of the matching queries
            (``Q = num_query + num_propagated``); with denoising ``dn_cls_logits``, ``dn_box_codes``
            ``(L, B, P, ·)``, ``dn_background`` ``(B, P)``, ``dn_groups``; with the focal head ``focal`` (its
            outputs, see :class:`~.heads.FocalHead`) and ``padded_size`` ``(W, H)``.
        """
        if batch.images is None:
            raise ValueError("batch.images: StreamPETR needs the camera images (the dataset was built without them)")
        # The denoising queries come first: their one host read (the shapes S and T) then waits only for the
        # batch's copy to the device, not for the backbone. Nothing before the decoder draws random numbers, so
        # the noise and the dropout masks are those of the original order (backbone first).
        dn = self._dn_queries(batch) if self.training and self.dn["groups"] > 0 else None
        self.memory.pre_update(batch.prev_exists, batch.timestamps, batch.ego_pose_inv)
        outputs, memory = self._frame(batch, dn, self.memory.state())
        self.memory.set_state(memory)
        return outputs

    def _frame(self, batch: Batch, dn: DNQueries | None, memory: MemoryState) -> tuple[dict[str, Any], MemoryState]:
        """The outputs of one frame (:meth:`forward`'s) on the memory ``memory`` brought into it
        (:meth:`~.memory.MemoryBank.aligned`), and the memory after it (:meth:`~.memory.MemoryBank.appended`)."""
        b, n = batch.images.shape[:2]
        encoded = batch.encoded  # computed ahead by the trainer (frozen backbone only)
        feats, padded = encoded if encoded is not None else self.encode(batch)  # (B·N, E, h', w')
        fh, fw = feats.shape[-2:]
        tokens = feats.view(b, n, -1, fh * fw).transpose(2, 3).reshape(b, n * fh * fw, -1)  # (B, N·T, E)
        locations = token_locations(fh, fw, self.stride, padded, feats.device)  # (T, 2)
        size = constant(padded, dtype=torch.float32, device=feats.device)  # (2,)
        pixels = (locations * size).expand(b, n, -1, 2)  # (B, N, T, 2) token centres in pixels
        pos_embed, cone = self.position(pixels, batch.lidar2img, batch.intrinsics)  # (B, N·T, E), (B, N·T, 8)
        tokens = self.spatial_alignment(self.memory_embed(tokens), cone.to(tokens.dtype))  # (B, N·T, E)
        pos_embed = self.featurized_pe(pos_embed, tokens)  # (B, N·T, E)

        pad = 0 if dn is None else dn.reference.shape[1]
        reference = self.reference_points.weight.unsqueeze(0).expand(b, -1, -1)  # (B, Qn, 3)
        if pad:
            reference = torch.cat([dn.reference.to(reference.dtype), reference], dim=1)  # (B, P+Qn, 3)
        query, query_pos, reference, keys, keys_pos = self._temporal_queries(reference, memory)
        visible = None if dn is None or dn.attn_mask is None else ~dn.attn_mask  # (P+Q, P+Qn+M) may attend
        hidden = self.decoder(query, query_pos, tokens, pos_embed, keys, keys_pos, visible)  # (L, B, P+Q, E)
        hidden = torch.nan_to_num(hidden)
        cls_logits = self.cls_branch(hidden)  # (L, B, P+Q, C)
        codes = box_codes(self.reg_branch(hidden), reference, self.pc_min, self.pc_size)  # (L, B, P+Q, 10)
        memory = self.memory.appended(
            memory, cls_logits[-1, :, pad:], codes[-1, :, pad:], hidden[-1, :, pad:], batch.timestamps, batch.ego_pose
        )
        outputs: dict[str, Any] = {"cls_logits": cls_logits[:, :, pad:], "box_codes": codes[:, :, pad:]}
        if pad:
            outputs.update(
                dn_cls_logits=cls_logits[:, :, :pad],
                dn_box_codes=codes[:, :, :pad],
                dn_background=dn.background,
                dn_groups=dn.groups,
            )
        if self.focal_head is not None:
            outputs["focal"] = self.focal_head(feats, padded, b)
            outputs["padded_size"] = padded
        return outputs, memory

    @property
    def frozen_encoder(self) -> bool:
        """Whether :meth:`encode` is a fixed function (``freeze_backbone``): the trainer may then run it for the
        next batch ahead, on a side stream (``speed.encoder_overlap``)."""
        return self.freeze_backbone

    def encode(self, batch: Batch) -> tuple[torch.Tensor, tuple[int, int]]:
        """The image encoder alone: features ``(B·N, E, h, w)`` of ``batch.images`` and the padded size ``(W, H)``;
        without gradients when the backbone is frozen."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_backbone):
            return self._image_features(batch.images, getattr(batch, "images_normalized", False))

    def train(self, mode: bool = True) -> StreamPETR:
        """As ``nn.Module.train``; a frozen backbone stays in evaluation mode."""
        super().train(mode)
        if self.freeze_backbone:
            self.backbone.eval()
        return self

    def _image_features(self, images: torch.Tensor, normalized: bool = False) -> tuple[torch.Tensor, tuple[int, int]]:
        """uint8 (or augmented float) ``(B, N, 3, H, W)`` → features ``(B·N, E, h, w)`` and the padded size
        ``(W, H)``; ``normalized`` images (the camera augmentation normalises) are used as they are."""
        b, n, _, h, w = images.shape
        x = images.reshape(b * n, 3, h, w).to(self.mean.dtype)  # (B·N, 3, H, W)
        if not normalized:
            x = (x - self.mean) / self.std
        ph, pw = math.ceil(h / SIZE_DIVISOR) * SIZE_DIVISOR, math.ceil(w / SIZE_DIVISOR) * SIZE_DIVISOR
        if (ph, pw) != (h, w):
            x = F.pad(x, (0, pw - w, 0, ph - h))  # (B·N, 3, H', W'), zeros after normalising, as the original
        return self.backbone(x), (pw, ph)

    def _dn_queries(self, batch: Batch, padded: bool = False) -> DNQueries:
        if not padded:  # padded to buckets on the static path (the compiled step's batch is at its bucket already)
            batch = self.path.targets(batch, self.args.max_targets)
        return self.path.make_dn_queries(
            batch.gt_boxes,
            batch.gt_labels,
            groups=self.dn["groups"],
            noise_scale=self.dn["noise_scale"],
            split=self.dn["split"],
            pc_range=self.pc_range,
            num_classes=self.num_classes,
            num_query=self.num_query,
            num_propagated=self.num_propagated,
            memory_len=self.memory_len,
        )

    def _temporal_queries(self, reference: torch.Tensor, bank: MemoryState) -> tuple[torch.Tensor, ...]:
        """Queries and memory keys aligned in time and ego motion (``temporal_alignment`` of the original).

        Args:
            reference: ``(B, P+Qn, 3)`` normalised reference points of the denoising and learned queries.
            bank: the memory brought into the frame, ``(B, M, ·)``.

        Returns:
            ``query`` and ``query_pos`` ``(B, P+Q, E)``, ``reference`` ``(B, P+Q, 3)``, ``memory`` and
            ``memory_pos`` ``(B, M − num_propagated, E)``.
        """
        p = self.num_propagated
        b, q, _ = reference.shape
        query_pos = self.query_embedding(sine_embedding_3d(reference, self.embed_half))  # (B, P+Qn, E)
        query = torch.zeros_like(query_pos)  # (B, P+Qn, E)
        memory_reference = ((bank.reference - self.pc_min) / self.pc_size).to(reference.dtype)  # (B, M, 3)
        memory_pos = self.query_embedding(sine_embedding_3d(memory_reference, self.embed_half))  # (B, M, E)
        memory = bank.embedding.to(query.dtype)  # (B, M, E)
        eye = torch.eye(4, device=reference.device, dtype=reference.dtype)[:3].flatten()  # (12,)
        motion = nerf_encoding(
            torch.cat([reference.new_zeros(b, q, 3), eye.expand(b, q, 12)], dim=-1)
        )  # (B, P+Qn, 180)
        query = self.ego_pose_memory(query, motion)  # (B, P+Qn, E)
        query_pos = self.ego_pose_pe(query_pos, motion)  # (B, P+Qn, E)
        pose = bank.pose[..., :3, :].flatten(-2)  # (B, M, 12)
        memory_motion = nerf_encoding(torch.cat([bank.velocity, bank.age, pose], dim=-1).float())  # (B, M, 180)
        memory_pos = self.ego_pose_pe(memory_pos, memory_motion.to(memory_pos.dtype))  # (B, M, E)
        memory = self.ego_pose_memory(memory, memory_motion.to(memory.dtype))  # (B, M, E)
        query_pos = query_pos + self.time_embedding(sine_embedding_1d(reference.new_zeros(b, q, 1), self.embed_dims))
        age_embedding = sine_embedding_1d(bank.age, self.embed_dims).float()  # (B, M, E)
        memory_pos = memory_pos + self.time_embedding(age_embedding.to(memory_pos.dtype))  # (B, M, E)
        if p > 0:
            query = torch.cat([query, memory[:, :p]], dim=1)  # (B, P+Q, E)
            query_pos = torch.cat([query_pos, memory_pos[:, :p]], dim=1)  # (B, P+Q, E)
            reference = torch.cat([reference, memory_reference[:, :p]], dim=1)  # (B, P+Q, 3)
        return query, query_pos, reference, memory[:, p:], memory_pos[:, p:]

    @property
    def embed_dims(self) -> int:
        """``E``."""
        return self.time_embedding[0].in_features

    @property
    def embed_half(self) -> int:
        """Frequencies per axis of the 3D sine embedding, ``E/2``."""
        return self.embed_dims // 2

    # ------------------------------------------------------------------------------------------------- loss
    @property
    def loss_weights(self) -> dict[str, float]:
        """The published weights of both heads' terms (a run config's ``model.loss_weights`` overrides them)."""
        weights = dict(self.criterion.weights)
        if self.focal_criterion is not None:
            weights.update(self.focal_criterion.weights)
        return weights

    @property
    def loss_counts(self) -> dict[str, torch.Tensor]:
        """Device counters of the last :meth:`loss` call: ground truths left unassigned (``unassigned_gt``, and
        ``unassigned_gt_2d`` with the focal head) because a frame holds more than there are queries (tokens)."""
        counts = dict(self.criterion.counts)
        if self.focal_criterion is not None:
            counts.update(self.focal_criterion.counts)
        return counts

    def loss(self, outputs: dict[str, Any], batch: Batch) -> dict[str, torch.Tensor]:
        """Unweighted terms of the 3D head (every layer, denoising) and of the focal head."""
        return self._loss(outputs, self.path.targets(batch, self.args.max_targets))  # buckets on the static path

    def _loss(self, outputs: dict[str, Any], batch: Batch) -> dict[str, torch.Tensor]:
        """:meth:`loss` of a batch padded as its path pads (or the compiled step's, at its bucket)."""
        terms = self.path.loss_3d(self.criterion, outputs, batch)
        if self.focal_criterion is not None:
            padded = dataclasses.replace(batch, image_size=outputs["padded_size"])  # the original's pad_shape
            terms.update(self.path.loss_focal_head(self.focal_criterion, outputs["focal"], padded))
        return terms

    # ------------------------------------------------------------------------------------ the compiled step
    def step_buckets(self, batch_size: int) -> tuple[StepShapes, ...]:
        """Every bucket of the compiled training step (``speed.compile_step``; :func:`~.static.step_buckets`): ``G``
        at each of ``step_targets`` (default: the solver's buckets up to ``max_targets``'s), the 2D boxes per image at
        the same length.

        Raises:
            ValueError: without ``static_targets`` (the compiled step is the static path), or with ``step_images``
                or ``step_targets`` it cannot build, naming the key.
        """
        if not self.args.static_targets:
            raise ValueError("model.args.static_targets: the compiled step runs the static path; set it true")
        if len(self.args.step_images) != 3:
            raise ValueError(f"model.args.step_images: expected [cameras, height, width], got {self.args.step_images}")
        return step_buckets(self.args.max_targets, tuple(self.args.step_targets))

    def step_shapes(self, batch: Batch) -> StepShapes:
        """The bucket of ``batch`` from its shapes (no host read); a ValueError naming ``model.args.max_targets``
        beyond the largest, ``model.args.step_images`` for images of another shape."""
        return step_shapes(batch, self.args.max_targets, self.args.step_images, tuple(self.args.step_targets))

    def step_inputs(
        self, batch: Batch | None, shapes: StepShapes, batch_size: int, device: torch.device
    ) -> tuple[Batch, MemoryState, torch.Tensor, MemoryState]:
        """The arguments of :meth:`step_loss`: the batch padded to ``shapes`` (:func:`~.static.step_batch`; None: an
        empty one, :func:`~.static.empty_batch`), the memory bank's tensors at their fixed shapes ``(B, K+M, ·)``,
        ``filled`` ``(B,)`` float32 (1: they hold the previous frame; 0: the bank is empty, as before the first frame
        or after a reset) and a copy of the bank for the step to read. The step writes the next memory into the bank's
        tensors in place and reads only the copy: AOTAutograd's partitioner may keep a graph input for the backward
        and recompute from it there (inductor's decompositions make it do so for the bank), which must not be a tensor
        the forward overwrote. For an empty batch they are fresh zeros, so compiling a bucket leaves the bank alone."""
        entries = self.memory.topk + self.memory_len
        if batch is None:
            frame = empty_batch(shapes, batch_size, self.args.step_images, device)
            memory = _static_address(self.memory.empty(batch_size, entries, device))
            return frame, memory, torch.zeros(batch_size, device=device), self.memory.empty(batch_size, entries, device)
        frame = step_batch(batch, shapes, self.mean, self.std)
        held = self._held_bank(batch_size, entries, device)
        if self.memory.embedding is None:  # the first frame, or after a reset: zeros standing for the empty bank
            for tensor in held:
                tensor.zero_()
            self.memory.set_state(held)
            return frame, _static_address(held), torch.zeros(batch_size, device=device), _copy(held)
        state = self.memory.state()
        if state.embedding.shape[:2] != (batch_size, entries):
            raise ValueError(
                f"memory: the compiled step holds {batch_size} streams of {entries} entries (topk + memory_len), the "
                f"bank holds {tuple(state.embedding.shape[:2])}"
            )
        if any(tensor is not mine for tensor, mine in zip(state, held, strict=True)):  # a resume, an evaluation
            with torch.no_grad():  # or an eager step set another bank: its values into the held tensors, so the
                for mine, tensor in zip(held, state, strict=True):  # graph's inputs keep their addresses (CUDA
                    mine.copy_(tensor)  # graphs: a new one would record the bucket again), dtypes and layout
            self.memory.set_state(held)
        return frame, _static_address(held), torch.ones(batch_size, device=device), _copy(held)

    def _held_bank(self, batch_size: int, entries: int, device: torch.device) -> MemoryState:
        """The bank tensors the compiled step writes in place (it reads a copy; :data:`~.memory.MEMORY_DTYPES`,
        contiguous), the same objects from step to step: made at the first step (or for another batch size or
        device)."""
        held = self._held
        if held is None or held.embedding.shape[:2] != (batch_size, entries) or held.embedding.device != device:
            held = self._held = self.memory.empty(batch_size, entries, device)
        return held

    def step_loss(
        self, batch: Batch, memory: MemoryState, filled: torch.Tensor, read: MemoryState | None = None
    ) -> dict[str, torch.Tensor]:
        """The training forward and the unweighted loss terms of :meth:`step_inputs`' arguments — :meth:`forward` then
        :meth:`loss` on the static path, the memory read from ``read`` (default ``memory`` itself: a caller without a
        backward) and written back into ``memory`` in place (it holds the next frame's bank after the call) — one
        graph without a break or host read under ``torch.compile``."""
        dn = self._dn_queries(batch, padded=True) if self.training and self.dn["groups"] > 0 else None
        keep = batch.prev_exists.to(torch.float32)  # (B,)
        bank = memory if read is None else read  # the copy: the backward may read it after the write below
        aligned = self.memory.aligned(bank, keep, filled, batch.timestamps, batch.ego_pose_inv)  # (B, M, ·)
        outputs, after = self._frame(batch, dn, aligned)  # after: (B, K+M, ·)
        with torch.no_grad():
            for held, new in zip(memory, after, strict=True):
                held.copy_(new)
        return self._loss(outputs, batch)  # the batch at its bucket: no padding to the solver's buckets

    def step_compile_options(self, device: torch.device) -> dict[str, bool]:
        """The compiled step's own inductor options. On a CPU, where a GroupNorm holds fewer than 16 channels a group
        (the tiny backbone's 4; one AVX-512 vector is 16 floats), inductor's layout optimisation off.

        With it on, inductor stores the convolutions' outputs channels-last, and its GroupNorm kernels then reduce
        each group over 4 strided channels: 4 of 16 vector lanes, masked (the ATen kernels it would call instead
        want NCHW and transpose). Measured on this CPU (1 thread, docs/streampetr.md): the whole compiled step of the
        tiny config 253.2 → 244.1 ms (``benchmarks/results/streampetr-static-cpu``, interleaved); the tiny backbone
        alone, forward and backward at 12 images of 192 × 320 in a one-off run, eager 67.8 ms, compiled 77.7,
        compiled with it off 69.0. On CUDA (cuDNN wants channels-last convolutions) and for wider groups the layout is
        left alone.

        On CUDA with the decoder checkpointed (``with_cp``, as published) ``fallback_random`` off: with it on,
        AOTAutograd replays each dropout of a checkpointed layer in the backward through ``run_and_save_rng_state``
        / ``run_with_rng_state`` (``torch/_functorch/partitioners.py``: its graph-safe RNG functionalization is
        skipped when ``fallback_random`` is set), ops that inductor does not capture in a CUDA graph
        (``FORBIDDEN_CUDAGRAPH_OPS``): ``reduce-overhead`` would split each bucket's graphs at every one (36 a
        direction for 6 layers). Off, inductor's own Philox generator draws the graph's random numbers — the same
        distributions, other values than the eager step's — and the checkpointed draws are replayed graph-safely.
        """
        narrow = any(m.num_channels // m.num_groups < 16 for m in self.modules() if isinstance(m, nn.GroupNorm))
        if device.type == "cpu":
            return {"layout_optimization": False} if narrow else {}
        return {"fallback_random": False} if device.type == "cuda" and self.decoder.with_cp else {}

    def stream_state(self) -> dict[str, torch.Tensor]:
        """The temporal memory of this rank's batch slots (``(B, M, ·)`` tensors; ``{}`` before the first frame)."""
        return self.memory.get_extra_state()

    def load_stream_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue with the memory ``state`` (:meth:`stream_state`'s; ``{}`` empties it)."""
        self.memory.set_extra_state(state)

    # -------------------------------------------------------------------------------------------- inference
    @torch.no_grad()
    def detect(
        self, batch: Batch, max_num: int = MAX_NUM, score_threshold: float | None = None
    ) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
        """Forward one frame and decode the last layer's top ``max_num`` boxes (no NMS).

        Args:
            batch: as :meth:`forward`.
            max_num: detections per sample (300; at most queries × classes, for small models).
            score_threshold: minimum score, or None.

        Returns:
            ``boxes`` ``(B, K, 9)`` (gravity centre, lidar frame), ``scores`` ``(B, K)``, ``labels`` ``(B, K)``.
        """
        outputs = self(batch)
        logits = outputs["cls_logits"][-1]  # (B, Q, C)
        return decode(
            logits,
            outputs["box_codes"][-1],
            max_num=min(max_num, logits.shape[1] * logits.shape[2]),
            post_center_range=POST_CENTER_RANGE,
            score_threshold=score_threshold,
        )


def _copy(memory: MemoryState) -> MemoryState:
    """A copy of ``memory``'s tensors (the bank as the compiled step reads it; :meth:`StreamPETR.step_inputs`)."""
    return MemoryState(*(tensor.clone() for tensor in memory))


def _static_address(memory: MemoryState) -> MemoryState:
    """``memory`` with its CUDA tensors marked as inputs at a fixed address (``torch._dynamo.mark_static_address``,
    unguarded): the step writes them in place, and CUDA graph trees replay a graph that mutates an input only when
    the input is static (the bank's tensors stay the same objects from step to step, a resumed or evaluated bank
    copied into them: :meth:`StreamPETR._held_bank`). CPU tensors are left unmarked."""
    for tensor in memory:
        if tensor.is_cuda:
            torch._dynamo.mark_static_address(tensor)
    return memory
