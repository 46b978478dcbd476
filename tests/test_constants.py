"""drivetrain.constants: cached device constants, and the no-sync harness that points users to them."""

import pytest
import torch

from drivetrain.constants import constant
from helpers.nosync import HostSyncError, no_host_sync


def test_constant_is_made_once_per_values_dtype_and_device():
    a = constant((1, 2.5), dtype=torch.float32, device="cpu")
    assert a is constant([1.0, 2.5], dtype=torch.float32, device=torch.device("cpu"))
    assert a is not constant((1, 2.5), dtype=torch.float64, device="cpu")
    assert a.dtype == torch.float32 and a.tolist() == [1.0, 2.5] and not a.requires_grad
    assert constant(3, dtype=torch.int64, device="cpu").shape == ()


def test_constant_takes_part_in_autograd_without_history():
    x = torch.ones(2, requires_grad=True)
    (x / constant((2.0, 4.0), dtype=torch.float32, device="cpu")).sum().backward()
    assert x.grad.tolist() == [0.5, 0.25]


def test_no_host_sync_refuses_tensors_from_python_data_but_not_cached_constants():
    constant((7.0, 8.0), dtype=torch.float32, device="cpu")  # warm-up, as a training loop's first step
    with no_host_sync():
        constant((7.0, 8.0), dtype=torch.float32, device="cpu")
        torch.as_tensor(torch.ones(2))  # a tensor in: no copy from the host
        with pytest.raises(HostSyncError, match=r"torch\.tensor of Python data"):
            torch.tensor([1.0, 2.0])
        with pytest.raises(HostSyncError, match=r"torch\.as_tensor"):
            torch.as_tensor(3.0)
    torch.tensor([1.0])  # restored on exit
