"""The smoke model: a small conv net that trains in seconds on a CPU, on the generated tensors of
:class:`~.dataset.SmokeDataset` (the engine's tests and the ``smoke`` config).

The task is learnable and cheap: the model classifies which channel of an image (or volume) carries the brightest
pattern and regresses four box-like numbers derived from it. It follows the engine protocol
(``forward(batch) -> outputs``, ``loss(outputs, batch) -> {name: scalar}``) and has what a real detector
has that matters to the engine: a named ``backbone`` (for lr multipliers, activation checkpointing and
compile), GroupNorm, dropout (so RNG state matters) and optionally a streaming memory (a buffer updated
every training forward plus a frame counter kept through ``get_extra_state``), so checkpoints must carry
non-parameter state.

``dtype`` ("float32" or "float64"): the equivalence tests train in float64, where two runs that do the same
arithmetic in another order (data-parallel ranks vs one process, accumulation vs one batch) agree to rounding that
AdamW cannot amplify past the tests' bounds (see tests/helpers/engine.py).

Its spec (:mod:`.spec`) declares no args dataclass: the builder is the class, its keyword arguments are
``model.args`` as a config writes them, checked against this signature (the engine tests' model of a builder without
typed arguments, as a plugin may register one).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from drivetrain.models.smoke.dataset import torch_dtype

__all__ = ["SmokeModel"]


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
        param_dtype = torch_dtype(dtype)
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
