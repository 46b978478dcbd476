"""drivetrain.profile.costmodel: kernels and host syncs counted on the CPU, per region, and the GPU estimate."""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from drivetrain.profile import BenchResult, Profiler, Row, compare, costmodel, device_name, rows_from_profilers
from drivetrain.profile.charts import load_result
from drivetrain.profile.costmodel import (
    CALIBRATION,
    LABEL,
    Cost,
    CostCounter,
    calibrate,
    count_call,
    gpu_estimate_ms,
    host_work,
)

ROOT = Path(__file__).resolve().parents[1]
DEVICE = torch.device("cpu")  # stands for the device: tensors are told apart by how they were made


@pytest.fixture
def x() -> torch.Tensor:
    return torch.arange(12.0).reshape(3, 4)  # made before counting: a device tensor


def test_add_then_sum_is_two_kernels_and_no_sync(x):
    assert count_call(lambda: (x + x).sum()) == Cost(2, 0)


def test_views_and_allocations_launch_no_kernel(x):
    def views():
        y = x.view(12).reshape(3, 4).t().permute(1, 0).unsqueeze(0).squeeze(0).expand(2, 3, 4)[1][0, 1:]
        return y.detach(), x.split(2), x.unbind(0), x.narrow(1, 0, 2), x.flatten(), torch.empty(5), x.new_empty(3)

    assert count_call(views) == Cost(0, 0)
    assert count_call(lambda: x.t().contiguous()) == Cost(1, 0)  # a copy is a kernel


def test_boolean_mask_indexing_and_assignment_sync(x):
    mask = x > 5
    assert count_call(lambda: x[mask]) == Cost(1, 1)
    assert count_call(lambda: x[torch.arange(2, device=DEVICE)]) == Cost(2, 0)  # integer index: no sync

    def assign():
        y = x.clone()
        y[mask] = 0.0

    assert count_call(assign) == Cost(2, 1)  # clone, index_put_ with a boolean index


def test_every_host_read_of_a_device_tensor_is_one_sync(x):
    assert count_call(lambda: x.sum().item()) == Cost(1, 1)
    assert count_call(lambda: bool((x > 0).any())) == Cost(2, 1)
    assert count_call(lambda: int(x[0, 0])) == Cost(0, 1)
    for read in (lambda: x.tolist(), lambda: x.numpy(), lambda: x.cpu(), lambda: x.to("cpu")):
        assert count_call(read) == Cost(0, 1)


def test_reads_of_host_tensors_are_free(x):
    def to_host_then_read():
        host = x.cpu()  # the one sync
        return (host + 1).tolist(), host.numpy(), float(host[0, 0]), host.sum().item()

    assert count_call(to_host_then_read) == Cost(0, 1)
    assert torch.Tensor.cpu(x) is x  # the patches are gone: the CPU's .cpu() is the tensor itself again


def test_tensor_from_python_data_syncs_when_it_goes_to_the_device(x):
    assert count_call(lambda: torch.tensor([1, 2], device=DEVICE)) == Cost(0, 1)
    assert count_call(lambda: torch.as_tensor([1.0, 2.0], device=DEVICE)) == Cost(0, 1)
    assert count_call(lambda: torch.tensor([1, 2], device="cpu")) == Cost(0, 0)  # kept on the host
    assert count_call(lambda: torch.tensor([1, 2])) == Cost(0, 0)  # a host tensor until it is used
    assert count_call(lambda: torch.tensor([1.0, 2.0, 3.0, 4.0]) + x) == Cost(1, 1)  # copied over first
    assert count_call(lambda: torch.tensor(2.0) * x) == Cost(1, 0)  # a scalar goes by value


def test_copies_from_host_memory(x):
    array = np.ones((3, 4), dtype=np.float32)
    assert count_call(lambda: torch.from_numpy(array).to(DEVICE)) == Cost(0, 1)
    assert count_call(lambda: torch.from_numpy(array).to(DEVICE, non_blocking=True)) == Cost(1, 0)
    assert count_call(lambda: torch.from_numpy(array).sum()) == Cost(0, 0)  # on the host
    assert count_call(lambda: torch.as_tensor(array, device=DEVICE)) == Cost(0, 1)


def test_ops_with_data_dependent_sizes_sync(x):
    mask = x > 5
    assert count_call(lambda: torch.nonzero(mask)) == Cost(1, 1)
    assert count_call(lambda: torch.where(mask)) == Cost(1, 1)
    assert count_call(lambda: torch.unique(x)) == Cost(1, 1)
    assert count_call(lambda: torch.masked_select(x, mask)) == Cost(1, 1)
    repeats = torch.tensor([1, 2, 3])
    assert count_call(lambda: torch.repeat_interleave(repeats)) == Cost(1, 1)
    assert count_call(lambda: torch.repeat_interleave(repeats, output_size=6)) == Cost(1, 0)


def test_backward_ops_are_counted(x):
    weight = torch.nn.Parameter(torch.ones(4, 5))

    def forward_backward():
        (x @ weight).sum().backward()

    # forward: mm, sum; backward: ones_like (the seed), the gradient's expand (a view), mm for the weight
    assert count_call(forward_backward) == Cost(4, 0)


def test_the_backward_runs_in_the_counting_thread_while_counting(x):
    # On a GPU the autograd engine runs the backward on a device thread, whose ops the counter does not count (the
    # recorded H200 iterations counted 1 backward kernel for the CPU's 142): while counting, it runs in this thread.
    assert torch._C._is_multithreading_enabled()
    seen = []
    with CostCounter().counting():
        seen.append(torch._C._is_multithreading_enabled())
        other = threading.Thread(target=lambda: seen.append(torch._C._is_multithreading_enabled()))
        other.start()
        other.join()
    assert seen == [False, True]  # this thread's switch only (another thread, not counted, is left alone)
    assert torch._C._is_multithreading_enabled()  # put back


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_backward_ops_are_counted_on_cuda_as_on_the_cpu(x):
    def forward_backward(device: str) -> Cost:
        inputs, weight = x.to(device), torch.nn.Parameter(torch.ones(4, 5, device=device))  # made before counting
        return count_call(lambda: (inputs @ weight).sum().backward())

    # forward: mm, sum; backward: ones_like (the seed), mm for the weight — on CUDA on autograd's device thread
    assert forward_backward("cuda") == forward_backward("cpu") == Cost(4, 0)


def test_compiled_code_counts_as_its_eager_ops(x):
    compiled = torch.compile(lambda t: (t.sin() + t.cos() * 2).sum(), fullgraph=True)
    assert count_call(lambda: compiled(x)) == Cost(5, 0)  # no graph is traced while counting, none is required


def test_foreach_ops_count_the_launches_of_multi_tensor_apply():
    tensors = [torch.ones(10) for _ in range(200)]
    assert count_call(lambda: torch._foreach_add_(tensors, 1.0)) == Cost(2, 0)  # ≤ 110 tensors a launch
    assert count_call(lambda: torch._foreach_add(tensors, tensors)) == Cost(5, 0)  # 3 lists: ≤ 48
    big = [torch.ones(65536 * 400)]
    assert count_call(lambda: torch._foreach_mul_(big, 2.0)) == Cost(2, 0)  # ≤ 320 chunks a launch


def test_optimizer_step_counts_as_foreach_with_host_step_counters_and_changes_nothing():
    params = [torch.nn.Parameter(torch.randn(10, generator=torch.Generator().manual_seed(i))) for i in range(5)]
    optimizer = torch.optim.AdamW(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()  # state exists: what follows is a steady step
    twin = copy.deepcopy(optimizer)
    twin_params = twin.param_groups[0]["params"]
    for p in twin_params:
        p.grad = torch.ones_like(p)
    cost = count_call(optimizer.step)
    twin.step()  # the CPU default (a loop over parameters), not counted
    # one launch per foreach op (the 5 step counters stay on the host); the per-parameter loop would be 5 × 8
    assert cost == Cost(8, 0)
    assert optimizer.param_groups[0]["foreach"] is None  # restored
    for counted, plain in zip(params, twin_params, strict=True):
        torch.testing.assert_close(counted, plain, rtol=0, atol=0)


def test_regions_attribute_ops_to_the_innermost_and_every_enclosing_region(x):
    counter = CostCounter()
    with counter.counting():
        x + 1  # outside every region: only the root
        with counter.region("outer"):
            x * 2
            with counter.region("inner"):
                x.sum().item()
            with counter.region("inner"):  # entered twice: adds up
                x - 1
        with counter.region("data"), host_work():
            torch.stack([x, x]).tolist()
    assert counter.costs() == {
        "": Cost(4, 1),
        "outer": Cost(3, 1),
        "outer/inner": Cost(2, 1),
        "data": None,  # host work only
    }


def test_counters_do_not_nest_and_other_threads_are_not_counted(x):
    counter = CostCounter()
    with counter.counting():
        with pytest.raises(RuntimeError, match="do not nest"):
            CostCounter().start()
        thread = threading.Thread(target=lambda: [x.sum().item() for _ in range(3)])
        thread.start()
        thread.join()
        x.tolist()
    assert counter.cost() == Cost(0, 1)
    assert count_call(lambda: x + 1) == Cost(1, 0)  # the first counter has let go


def test_profiler_counts_its_last_warmup_step_per_region(x):
    prof = Profiler("cpu", warmup=2, host_regions=("loss/fetch",))
    for step in range(4):
        with prof.region("loss"):
            with prof.region("fetch"):  # host work by the profiler's say-so: not counted
                torch.stack([x, x]).tolist()
            for _ in range(step + 1):  # 1, 2, 3, 4 additions: the counted step (index 1) has 2
                x + 1
            with prof.region("read"):
                x.sum().item()
        with prof.region("data"), host_work():  # host work by the code's say-so
            x * 3
        prof.step()
    assert prof.cost("loss") == Cost(3, 1) and prof.cost("loss/read") == Cost(1, 1)
    assert prof.cost("data") is None and prof.cost("loss/fetch") is None
    assert len(prof.samples("loss")) == 2  # timing is unchanged: the counted step is a warm-up step
    untimed = Profiler("cpu", warmup=0)
    with untimed.region("loss"):
        x + 1
    untimed.step()
    assert untimed.cost("loss") is None  # no warm-up step to count in


def test_compare_counts_each_path_in_one_extra_untimed_call(x):
    calls = {"reference": 0, "batched": 0}

    def reference():
        calls["reference"] += 1
        return [row.sum() for row in x]

    def batched():
        calls["batched"] += 1
        return x.sum(1)

    ref_ms, bat_ms = compare(reference, batched, device="cpu", repeat=3, warmup=1)
    assert len(ref_ms) == 3 and calls == {"reference": 5, "batched": 5}
    assert ref_ms.cost == Cost(3, 0) and bat_ms.cost == Cost(1, 0)
    plain_ref, _ = compare(reference, batched, device="cpu", repeat=1, warmup=0, count=False)
    assert plain_ref.cost is None


def test_estimate_is_the_documented_formula():
    assert gpu_estimate_ms(1000, 10) == pytest.approx(
        (1000 * costmodel.PER_KERNEL_US + 10 * costmodel.PER_SYNC_US) / 1e3
    )
    assert Cost(1000, 10).gpu_est_ms == gpu_estimate_ms(1000, 10)
    assert Cost(30, 6).per(3) == Cost(10, 2)
    assert LABEL == "GPU est. (launch-bound)"


def test_rows_json_markdown_and_console_carry_the_counts(tmp_path, x):
    ref, bat = Profiler("cpu", warmup=1), Profiler("cpu", warmup=1)
    for _ in range(2):
        for prof, loops in ((ref, 4), (bat, 1)):
            with prof.region("loss"):
                for _ in range(loops):
                    x + 1
            prof.step()
    result = BenchResult("demo", device_name("cpu"), {})
    for row in rows_from_profilers(ref, bat):
        result.add(row)
    result.add(Row("loader", 2.0, 1.0, variants={"a": 2.0, "b": 1.0}, baseline="a", variant_costs={"a": Cost(6, 2)}))
    result.write(tmp_path / "r.json", tmp_path / "r.md")

    data = json.loads((tmp_path / "r.json").read_text())
    loss, loader = data["rows"]
    assert (loss["reference_kernels"], loss["reference_syncs"], loss["batched_kernels"], loss["batched_syncs"]) == (
        4,
        0,
        1,
        0,
    )
    assert loss["reference_gpu_est_ms"] == pytest.approx(gpu_estimate_ms(4, 0), abs=1e-4)
    assert "reference_kernels" not in loader  # not counted: the old format
    assert loader["variants_cost"] == {"a": {"kernels": 6, "syncs": 2, "gpu_est_ms": round(gpu_estimate_ms(6, 2), 4)}}
    assert data["cost_model"]["per_kernel_us"] == costmodel.PER_KERNEL_US
    md = (tmp_path / "r.md").read_text()
    assert f"| speedup | kernels ref / bat | syncs ref / bat | {LABEL} ms ref / bat |" in md
    assert f"| 4 / 1 | 0 / 0 | {gpu_estimate_ms(4, 0):.3f} / {gpu_estimate_ms(1, 0):.3f} |" in md
    assert "| loader | 2.000 | 1.000 | ×2.00 | – / – | – / – | – / – |" in md
    assert f"| loader | 6 / 2 / {gpu_estimate_ms(6, 2):.3f} | – |" in md
    table = result.render_table()
    assert LABEL in table and "an estimate, a lower bound for launch-bound work" in table

    loaded = load_result(tmp_path / "r.json")  # counts survive a round trip; files without them read as not counted
    assert loaded.rows[0].reference_cost == Cost(4, 0) and loaded.rows[1].variant_costs == {"a": Cost(6, 2)}
    old = load_result(ROOT / "benchmarks" / "results" / "precision-cuda.json")  # recorded before counting existed
    assert old.rows[0].reference_cost is None and old.rows[0].reference_ms > 0


def test_constants_are_the_fit_of_the_committed_h200_loss_result():
    data = json.loads((ROOT / costmodel.CALIBRATION_RESULT).read_text())
    assert data["device"].startswith("NVIDIA H200")
    times = {row["name"]: row["reference_ms"] for row in data["rows"]}
    per_kernel, per_sync = calibrate(times, CALIBRATION)
    assert (round(per_kernel, 1), round(per_sync, 1)) == (costmodel.PER_KERNEL_US, costmodel.PER_SYNC_US)
    assert 15 <= per_kernel <= 20  # what eager PyTorch costs per op when the host, not the GPU, is the limit


@pytest.mark.slow
def test_calibration_counts_are_what_the_loss_benchmark_counts_today(tmp_path):
    from drivetrain.cli.main import main

    config = json.loads((ROOT / costmodel.CALIBRATION_RESULT).read_text())["config"]
    out = tmp_path / "loss.json"
    argv = ["bench", "loss", "--repeat", "1", "--warmup", "1", "--json", str(out), "--seed", str(config["seed"])]
    for key in ("batch", "layers", "queries", "dn_groups", "backend"):
        argv += [f"--{key.replace('_', '-')}", str(config[key])]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["config"]["gt_per_sample"] == config["gt_per_sample"]  # the same ground truth as on the H200
    counted = {row["name"]: (row["reference_kernels"], row["reference_syncs"]) for row in data["rows"]}
    assert {name: counted[name] for name in CALIBRATION} == CALIBRATION


def test_a_training_step_of_the_trainer_makes_its_one_host_sync():
    from drivetrain.engine.stepsplit import count_step

    small = ["data.args={num_samples: 16, channels: 3, size: 16, dims: 2, seed: 0}", "data.batch_size=4"]
    cost = count_step(ROOT / "configs" / "smoke.yaml", small, steps=2)
    # the trainer reads its skip/stop decision once a step (step_outcome.decide); logging reads at log intervals only
    assert cost is not None and cost.syncs == 1 and cost.kernels > 50
