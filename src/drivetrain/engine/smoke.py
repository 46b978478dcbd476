"""The built-in smoke model and its generated-tensor dataset: trains in seconds on a CPU.

The task is learnable and cheap: an image ``(C, H, W)`` (or a volume ``(C, S, H, W)`` with ``dims=3``) of
Gaussian noise plus a per-sample pattern; the model classifies which channel carries the brightest pattern
and regresses four box-like numbers derived from it. The model follows the engine protocol
(``forward(batch) -> outputs``, ``loss(outputs, batch) -> {name: scalar}``) and has what a real detector
has that matters to the engine: a named ``backbone`` (for lr multipliers, activation checkpointing and
compile), GroupNorm, dropout (so RNG state matters) and optionally a streaming memory (a buffer updated
every training forward plus a frame counter kept through ``get_extra_state``), so checkpoints must carry
non-parameter state.

Both take ``dtype`` ("float32" or "float64"): the equivalence tests train in float64, where two runs that do
the same arithmetic in another order (data-parallel ranks vs one process, accumulation vs one batch) agree
to rounding that AdamW cannot amplify past the tests' bounds (see tests/helpers/engine.py).

Per-sample data comes from a generator seeded by ``(seed, index)`` only: any sample can be produced in any
order, in any worker, after any resume.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from drivetrain.detector.spec import ModelSpec
from drivetrain.seeding import mix_seed

__all__ = ["SmokeDataset", "SmokeModel"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


class SmokeDataset(Dataset):
    """Generated samples ``{"image": (C, [S,] H, W), "label": int64 (), "target": (4,)}``, floats in ``dtype``.

    Args:
        num_samples: dataset length.
        channels, size: image channels and spatial size (H = W = S = size).
        dims: 2 for images, 3 for volumes.
        seed: data seed.
        dtype: "float32" or "float64"; the values are drawn in float32 either way, so both hold the same data.
    """

    def __init__(
        self,
        num_samples: int = 256,
        channels: int = 3,
        size: int = 16,
        dims: int = 2,
        seed: int = 0,
        dtype: str = "float32",
    ):
        if num_samples < 1 or channels < 2 or size < 4 or dims not in (2, 3):
            raise ValueError("SmokeDataset: need num_samples ≥ 1, channels ≥ 2, size ≥ 4, dims in (2, 3)")
        self.num_samples, self.channels, self.size, self.dims, self.seed = num_samples, channels, size, dims, seed
        self.dtype = _dtype(dtype)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} outside [0, {self.num_samples})")
        gen = torch.Generator().manual_seed(mix_seed(self.seed, index))
        shape = (self.channels, *([self.size] * self.dims))
        image = 0.5 * torch.randn(shape, generator=gen)
        label = int(torch.randint(0, self.channels, (), generator=gen))
        center = torch.rand(self.dims, generator=gen) * 0.6 + 0.2  # pattern centre in [0.2, 0.8]
        extent = torch.rand((), generator=gen) * 0.2 + 0.1
        axes = torch.meshgrid(*[torch.linspace(0, 1, self.size)] * self.dims, indexing="ij")
        dist2 = sum((ax - c) ** 2 for ax, c in zip(axes, center.tolist(), strict=True))
        image[label] += torch.exp(-dist2 / (2 * extent**2)) * 4.0
        target = torch.cat([center[:2], extent.view(1), image[label].mean().view(1)])
        return {"image": image.to(self.dtype), "label": torch.tensor(label), "target": target.to(self.dtype)}


class SmokeModel(nn.Module):
    """Small conv net: ``backbone`` (conv-GroupNorm-ReLU blocks) → pooled features (+ memory) → ``head``.

    Args:
        channels: input channels (= number of classes).
        width: feature channels of the backbone.
        depth: conv blocks in the backbone.
        dims: 2 (Conv2d) or 3 (Conv3d).
        dropout: dropout before the head.
        memory: keep a streaming memory of pooled features (a buffer and a frame counter) fed to the head.
        dtype: "float32" or "float64" parameters and buffers (initialised in float32, then cast).
    """

    def __init__(
        self,
        channels: int = 3,
        width: int = 32,
        depth: int = 3,
        dims: int = 2,
        dropout: float = 0.1,
        memory: bool = True,
        dtype: str = "float32",
    ) -> None:
        super().__init__()
        param_dtype = _dtype(dtype)
        if dims not in (2, 3):
            raise ValueError(f"dims: must be 2 or 3, got {dims}")
        if depth < 1 or channels < 2 or width < 4 or width % 4:
            raise ValueError(
                f"need depth ≥ 1, channels ≥ 2 and a width divisible by 4 (GroupNorm of 4 groups), got "
                f"depth={depth}, channels={channels}, width={width}"
            )
        conv = nn.Conv2d if dims == 2 else nn.Conv3d
        blocks: list[nn.Module] = []
        c_in = channels
        for i in range(depth):
            blocks += [conv(c_in, width, 3, padding=1, stride=2 if i else 1), nn.GroupNorm(4, width), nn.ReLU()]
            c_in = width
        self.backbone = nn.Sequential(*blocks)
        self.dropout = nn.Dropout(dropout)
        self.use_memory = memory
        self.head = nn.Sequential(nn.Linear(2 * width, width), nn.ReLU(), nn.Linear(width, channels + 4))
        self.num_classes = channels
        self.register_buffer("memory", torch.zeros(width))
        self.frames_seen = 0
        self.to(param_dtype)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Classify the brightest-pattern channel and regress the four target numbers.

        In training mode with memory on, also updates the memory buffer (EMA of the batch-mean pooled
        features) and ``frames_seen``.

        Args:
            batch: ``"image"``: ``(B, C, H, W)`` (or ``(B, C, S, H, W)`` with ``dims=3``) float.

        Returns:
            ``{"logits": (B, C), "boxes": (B, 4)}``, float in the compute dtype.
        """
        feats = self.backbone(batch["image"]).flatten(2).amax(-1)  # (B, width): max-pooled
        memory = self.memory.expand_as(feats) if self.use_memory else torch.zeros_like(feats)
        if self.training and self.use_memory:
            with torch.no_grad():  # streaming state: what a temporal model carries between frames
                self.memory.mul_(0.9).add_(feats.detach().to(self.memory.dtype).mean(0), alpha=0.1)
            self.frames_seen += feats.shape[0]
        out = self.head(self.dropout(torch.cat([feats, memory.to(feats.dtype)], dim=1)))  # (B, C + 4)
        logits, boxes = out.split([self.num_classes, 4], dim=1)
        return {"logits": logits.clone(), "boxes": boxes.clone()}  # own storage, not views of one tensor

    # The declared weight of each term (a run config's model.loss_weights overrides them by name).
    loss_weights: ClassVar[dict[str, float]] = {"cls": 1.0, "box": 1.0}

    def loss(self, outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Unweighted named terms: cross-entropy of the class, smooth-L1 of the box numbers."""
        return {
            "cls": F.cross_entropy(outputs["logits"], batch["label"]),
            "box": F.smooth_l1_loss(outputs["boxes"], batch["target"]),
        }

    def get_extra_state(self) -> dict[str, Any]:
        """Non-parameter state for checkpoints: ``{"frames_seen": int}``."""
        return {"frames_seen": self.frames_seen}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore ``frames_seen`` from :meth:`get_extra_state`'s dict."""
        self.frames_seen = int(state["frames_seen"])


SMOKE_SPEC = ModelSpec(
    "smoke",
    build=SmokeModel,
    args=None,
    modalities=frozenset({"tensor"}),
    summary="a small conv net on generated tensors",
)
"""The engine tests' model (registered as ``smoke``); its arguments are checked against its signature."""
