"""The smoke dataset: generated tensors for the smoke model (:mod:`.model`), which trains on them in seconds on a CPU.

Each sample is an image ``(C, H, W)`` (or a volume ``(C, S, H, W)`` with ``dims=3``) of Gaussian noise plus a
pattern in one channel, that channel's index, and four numbers derived from the pattern. Per-sample data comes
from a generator seeded by ``(seed, index)`` only: any sample can be produced in any order, in any worker, after
any resume. ``dtype`` ("float32" or "float64"): the equivalence tests train in float64 (tests/helpers/engine.py).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from drivetrain.seeding import mix_seed

__all__ = ["DTYPES", "SmokeDataset", "torch_dtype"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``name`` ("float32" or "float64"); ValueError naming ``dtype`` otherwise."""
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
        self.dtype = torch_dtype(dtype)

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
