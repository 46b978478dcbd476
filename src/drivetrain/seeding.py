"""Seeds mixed from several integers: a leaf module (no drivetrain imports), so that the engine's samplers and
the pipeline's augmentation draw from the same rule without the pipeline importing the engine.

Example:
    >>> gen = torch.Generator().manual_seed(mix_seed(run_seed, epoch))  # this epoch's shuffle
"""

from __future__ import annotations

__all__ = ["mix_seed"]


# A prime multiplier: mix_seed(seed, i) differs for every (seed, i) with 0 ≤ i < 1_000_003.
_MIX = 1_000_003


def mix_seed(*parts: int) -> int:
    """One seed from several integers (a run seed, a sample index, an epoch, ...), stable across runs and
    processes: ``mix_seed(a, b) = a·1_000_003 + b``, and so on for more parts; below 2**63 (torch's range).

    Args:
        parts: the integers to mix, most significant first.

    Returns:
        An int in ``[0, 2**63)``.

    Example:
        >>> torch.Generator().manual_seed(mix_seed(seed, index))  # the draws of sample ``index``
    """
    value = 0
    for part in parts:
        value = (value * _MIX + int(part)) % (2**63)
    return value
