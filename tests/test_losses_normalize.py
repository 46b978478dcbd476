"""losses/normalize.py: the average factor (count clamped to ≥ 1, averaged over ranks on the device)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from drivetrain.losses import average_factor


@pytest.mark.parametrize("count", [0, 0.25, 1, 7, 123.5])
def test_average_factor_is_count_clamped_to_one(count: float) -> None:
    for value in (count, torch.tensor(count), torch.tensor(count, dtype=torch.float64)):
        for across_ranks in (True, False):
            factor = average_factor(value, across_ranks=across_ranks)
            assert factor.dtype == torch.float32 and factor.dim() == 0
            assert factor.item() == max(count, 1.0)


def test_average_factor_of_int_tensor_and_input_untouched() -> None:
    count = torch.tensor(0, dtype=torch.int64)
    factor = average_factor(count)
    assert factor.dtype == torch.float32 and factor.item() == 1.0
    assert count.item() == 0 and count.dtype == torch.int64
    count = torch.tensor(0.5)
    average_factor(count)
    assert count.item() == 0.5


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_average_factor_averages_over_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a (faked) process group of 2 ranks whose other rank counts 3, the factor is the mean."""
    assert not dist.is_initialized()
    other_rank = torch.tensor(3.0)

    def fake_all_reduce(tensor: torch.Tensor, op=None) -> None:
        tensor.add_(other_rank)

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    assert average_factor(torch.tensor(5.0)).item() == 4.0
    assert average_factor(torch.tensor(0.0)).item() == 1.5
    assert average_factor(torch.tensor(5.0), across_ranks=False).item() == 5.0
    other_rank.fill_(0.0)
    assert average_factor(torch.tensor(1.0)).item() == 1.0  # mean 0.5, clamped
