"""The ragged ops never synchronise with the device: on the CPU every Python-level value read is patched to
raise (``no_host_sync``), on CUDA ``torch.cuda.set_sync_debug_mode("error")`` turns a sync into an error."""

from __future__ import annotations

import operator
from collections.abc import Callable

import pytest
import torch

from drivetrain import ragged
from drivetrain.ragged import RaggedBatch
from helpers.nosync import SYNC_METHODS, HostSyncError, no_host_sync
from helpers.ragged import (
    Layout,
    leaf,
    random_index,
    random_ragged,
    random_values,
)

L, B, S, N, J, C = 2, 3, 5, 7, 4, 2


def make_inputs(gen: torch.Generator, device: str = "cpu") -> dict:
    """Every input of :func:`run_ops`, built (and moved to ``device``) before any sync check starts."""
    layout = Layout((L, B), after=(C,))
    data = random_ragged(layout, S, torch.float64, gen)  # NaN padding
    other = random_ragged(layout, 3, torch.float64, gen)
    gt = random_ragged(Layout((B,), after=(C,)), S, torch.float64, gen)
    index = random_index(data.sizes, (L, B), J, gen)
    distinct = random_index(N, (L, B), J, gen, distinct=True, negative=True)
    pair_sizes = torch.minimum(data.sizes, torch.full((L, B), J))
    src_index = random_index(data.sizes, (L, B), J, gen, sizes=pair_sizes.clone())
    dst_index = random_index(N, (L, B), J, gen, sizes=pair_sizes.clone(), distinct=True)
    values = random_ragged(layout, J, torch.float64, gen, sizes=distinct.sizes).tensor
    inputs = {
        "data": data,
        "other": other,
        "gt": gt,
        "index": index,
        "distinct": distinct,
        "src_index": src_index,
        "dst_index": dst_index,
        "gt_index": random_index(gt.sizes.expand(L, B), (L, B), J, gen),
        "plain": random_values((L, B, N, C), torch.float64, gen),
        "values": values,
        "mask": torch.rand(L, B, N, generator=gen) < 0.5,
        "weights": random_values((L, B, J, C), torch.float64, gen),
    }
    moved = {key: value.to(device) for key, value in inputs.items()}
    for key in ("data", "plain", "values"):  # leaves that collect gradients
        tensor = moved[key].tensor if isinstance(moved[key], RaggedBatch) else moved[key]
        grad_leaf = leaf(tensor)
        moved[key] = moved[key].with_tensor(grad_leaf) if isinstance(moved[key], RaggedBatch) else grad_leaf
    return moved


def run_ops(inp: dict) -> dict[str, torch.Tensor]:
    """Every sync-free op (and a backward through gather, scatter and write); returns their results."""
    data, plain, values, index, distinct = inp["data"], inp["plain"], inp["values"], inp["index"], inp["distinct"]
    gathered = ragged.gather(data, index)
    scattered = ragged.scatter(values, distinct, N, dim=2)
    written = ragged.write(plain, distinct, values)
    wide = inp["gt"].expand_batch(L, B)
    reshaped = wide.flatten_batch().reshape_batch(L, B)
    out = {
        "gather": gathered.tensor,
        "gather_plain": ragged.gather(plain, index, fill=None).tensor,
        "scatter": scattered,
        "write": written,
        "write_ragged": ragged.write(data, index.with_tensor(index.tensor * 0), values.new_zeros(L, B, J, C)).tensor,
        "map_pairs": ragged.map_pairs(data, inp["src_index"], inp["dst_index"], plain),
        "mask_from_indices": ragged.mask_from_indices(distinct, N),
        "combine": ragged.combine([data, inp["other"]], fill=-1).tensor,
        "sum": ragged.sum(data),
        "mean": ragged.mean(data),
        "fill_padding": ragged.fill_padding(data, 0).tensor,
        "with_padding": data.with_padding(2).tensor,
        "select": ragged.select(plain, inp["mask"], trim=False).tensor,
        "select_ragged": ragged.select(data, inp["mask"][..., :S], trim=False).tensor,
        "indices_from_mask": ragged.indices_from_mask(inp["mask"], trim=False).tensor,
        "expanded_gather": ragged.gather(reshaped, inp["gt_index"]).tensor,
        "expanded_mean": ragged.mean(wide),
        "apply": data.apply(torch.sin).with_padding(0).tensor,
    }
    loss = (gathered.tensor * inp["weights"]).sum() + scattered.sin().sum() + (written * written).sum()
    loss.backward()
    out["grad_data"], out["grad_plain"], out["grad_values"] = data.tensor.grad, plain.grad, values.grad
    return out


def test_ops_and_backward_never_read_tensor_values_on_the_host(gen):
    inputs = make_inputs(gen)
    with no_host_sync():
        out = run_ops(inputs)
    assert all(torch.isfinite(out[key]).all() for key in ("grad_data", "grad_plain", "grad_values"))
    assert out["grad_data"].abs().sum() > 0 and out["grad_values"].abs().sum() > 0


def test_select_and_indices_from_mask_with_trim_do_sync(gen):
    """Proof that the harness sees syncs: trimming reads the longest selection back to the host."""
    inputs = make_inputs(gen)
    with no_host_sync():
        with pytest.raises(HostSyncError):
            ragged.select(inputs["plain"], inputs["mask"], trim=True)
        with pytest.raises(HostSyncError):
            ragged.indices_from_mask(inputs["mask"], trim=True)
        with pytest.raises(HostSyncError):
            inputs["data"].to_list()


READS: dict[str, Callable[[torch.Tensor], object]] = {
    "item": lambda t: t.item(),
    "tolist": lambda t: t.tolist(),
    "cpu": lambda t: t.cpu(),
    "numpy": lambda t: t.numpy(),
    "__bool__": lambda t: bool(t),
    "__int__": lambda t: int(t),
    "__float__": lambda t: float(t),
    "__index__": lambda t: operator.index(t),
}


@pytest.mark.parametrize("name", SYNC_METHODS)
def test_no_host_sync_patches_every_value_read_and_restores_it(name):
    t = torch.tensor(3)
    with no_host_sync(), pytest.raises(HostSyncError, match=name):
        READS[name](t)
    READS[name](t)  # restored on exit


def test_no_host_sync_restores_the_methods_after_an_error():
    with pytest.raises(ValueError, match="boom"), no_host_sync():
        raise ValueError("boom")
    assert torch.tensor(2.5).item() == 2.5 and bool(torch.tensor(True))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("device_checks", [False, True], ids=["no_device_checks", "device_checks"])
def test_ops_and_backward_never_synchronise_on_cuda(device_checks):
    gen = torch.Generator().manual_seed(1234)
    cpu_out = run_ops(make_inputs(gen))
    gen = torch.Generator().manual_seed(1234)
    inputs = make_inputs(gen, "cuda")  # from_list/to transfer: done before the sync check starts
    torch.cuda.synchronize()
    ragged.set_device_checks(device_checks)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        cuda_out = run_ops(inputs)
        with pytest.raises(RuntimeError, match="synchronizing"):  # proof that the debug mode sees syncs
            ragged.select(inputs["plain"], inputs["mask"], trim=True)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        ragged.set_device_checks(False)
    torch.cuda.synchronize()
    for key, expected in cpu_out.items():
        torch.testing.assert_close(cuda_out[key].cpu(), expected, equal_nan=True, msg=key)
