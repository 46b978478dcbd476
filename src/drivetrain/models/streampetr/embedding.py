"""Fixed encodings and small conditioning layers of StreamPETR's query side.

- :func:`sine_embedding_3d` / :func:`sine_embedding_1d`: sin/cos of ``2π·x`` at ``F`` frequencies
  ``T^(2⌊k/2⌋/F)`` (interleaved sin, cos of each), per axis; the 3D one concatenates the axes as
  ``(y, x, z)`` — ``pos2posemb3d`` / ``pos2posemb1d`` of StreamPETR
  (``projects/mmdet3d_plugin/models/utils/positional_encoding.py``).
- :func:`nerf_encoding`: ``[sin(x·2^0), cos(x·2^0), …, sin(x·2^(K−1)), cos(x·2^(K−1))]`` of the whole
  vector per frequency — ``nerf_positional_encoding`` (same file; log sampling, input not included).
- :class:`MLN`: LayerNorm without affine, then a scale and shift computed from a condition ``c``
  (``γ(c)·LN(x) + β(c)``; initialised to the identity: γ weight 0, bias 1; β 0) — ``MLN`` of
  ``projects/mmdet3d_plugin/models/utils/misc.py``.
- :class:`SEGate`: ``x · σ(W₂ ReLU(W₁ s))``, the gate of the position embedding by the image features —
  ``SELayer_Linear`` (same file).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["MLN", "SEGate", "nerf_encoding", "sine_embedding_1d", "sine_embedding_3d"]


def _sine(values: torch.Tensor, num_feats: int, temperature: float) -> torch.Tensor:
    """``(...)`` → ``(..., F)``: interleaved sin/cos of ``2π·values`` over ``F`` frequencies."""
    k = torch.arange(num_feats, dtype=torch.float32, device=values.device)  # (F,)
    dim_t = temperature ** (2 * torch.div(k, 2, rounding_mode="floor") / num_feats)  # (F,)
    scaled = (values * 2 * math.pi).unsqueeze(-1) / dim_t  # (..., F)
    return torch.stack((scaled[..., 0::2].sin(), scaled[..., 1::2].cos()), dim=-1).flatten(-2)  # (..., F)


def sine_embedding_3d(pos: torch.Tensor, num_feats: int = 128, temperature: float = 10000.0) -> torch.Tensor:
    """Sine embedding of 3D points normalised to ``[0, 1]``.

    Args:
        pos: ``(..., 3)`` points ``(x, y, z)``.
        num_feats: frequencies per axis, ``F`` (128).
        temperature: frequency base ``T`` (10000).

    Returns:
        ``(..., 3F)`` in the order ``(y, x, z)``.
    """
    x, y, z = (_sine(pos[..., i], num_feats, temperature) for i in range(3))  # (..., F) each
    return torch.cat((y, x, z), dim=-1)  # (..., 3F)


def sine_embedding_1d(pos: torch.Tensor, num_feats: int = 256, temperature: float = 10000.0) -> torch.Tensor:
    """Sine embedding of a scalar (e.g. an age in seconds).

    Args:
        pos: ``(..., 1)``.
        num_feats: frequencies, ``F`` (256).
        temperature: frequency base ``T`` (10000).

    Returns:
        ``(..., F)``.
    """
    return _sine(pos[..., 0], num_feats, temperature)  # (..., F)


def nerf_encoding(values: torch.Tensor, num_freqs: int = 6) -> torch.Tensor:
    """NeRF encoding of a vector at frequencies ``2^0 … 2^(K−1)``.

    Args:
        values: ``(..., V)``.
        num_freqs: ``K`` (6).

    Returns:
        ``(..., 2·K·V)``: per frequency, the sines of all ``V`` values, then their cosines.
    """
    freqs = 2.0 ** torch.linspace(0.0, num_freqs - 1, num_freqs, dtype=values.dtype, device=values.device)
    parts = [fn(values * f) for f in freqs for fn in (torch.sin, torch.cos)]  # 2K × (..., V)
    return torch.cat(parts, dim=-1)  # (..., 2KV)


class MLN(nn.Module):
    """Modulated LayerNorm: ``γ(c)·LN(x) + β(c)``, the identity LayerNorm at initialisation.

    Args:
        c_dim: size of the condition ``c``.
        f_dim: size of the features ``x`` (256).
    """

    def __init__(self, c_dim: int, f_dim: int = 256) -> None:
        super().__init__()
        self.reduce = nn.Sequential(nn.Linear(c_dim, f_dim), nn.ReLU())
        self.gamma = nn.Linear(f_dim, f_dim)
        self.beta = nn.Linear(f_dim, f_dim)
        self.ln = nn.LayerNorm(f_dim, elementwise_affine=False)
        nn.init.zeros_(self.gamma.weight)
        nn.init.ones_(self.gamma.bias)
        nn.init.zeros_(self.beta.weight)
        nn.init.zeros_(self.beta.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Modulate ``x`` ``(..., f_dim)`` by ``c`` ``(..., c_dim)``; returns ``(..., f_dim)``."""
        h = self.reduce(c)  # (..., f_dim)
        return self.gamma(h) * self.ln(x) + self.beta(h)  # (..., f_dim)


class SEGate(nn.Module):
    """``x · σ(W₂ ReLU(W₁ s))``: gates ``x`` channel-wise by a squeeze signal ``s`` of the same size.

    Args:
        channels: feature size.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce = nn.Linear(channels, channels)
        self.expand = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor, signal: torch.Tensor) -> torch.Tensor:
        """``x`` ``(..., channels)`` gated by ``signal`` ``(..., channels)``."""
        return x * torch.sigmoid(self.expand(torch.relu(self.reduce(signal))))  # (..., channels)
