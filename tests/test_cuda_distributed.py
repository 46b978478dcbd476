"""The distributed paths on CUDA that gloo on the CPU cannot show: NCCL reduces CUDA tensors only, and a rank's device
index is not the saving rank's. (The fp16 scale unscaling gradients kept on the host:
``tests/test_engine_checkpoint.py``.)

- FSDP2 with CPU offload under torchrun on NCCL: the gradient norm of the CPU shards is reduced over the process
  group's gloo half (``cuda:nccl,cpu:gloo``, :func:`drivetrain.engine.distributed.process_group_backend`); with NCCL
  alone the first step failed with "No backend type associated with device type cpu". One rank on one GPU shows it
  (a world of one still reduces the norm's partial DTensor through the group).
- A rank's CUDA generator is restored onto the rank's device, from the saving rank's device: a rank's device index
  changes with the node layout, and a node with fewer GPUs than the saving one has no generator at the later indices.
- An asynchronous save's staged copies of FSDP2's shards (DTensors on a ``cuda`` mesh) lie on the CPU, and its
  background thread runs on the rank's CUDA device, not on device 0 (the two-device test needs 2 GPUs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from drivetrain.engine.state import capture_rng, restore_rng
from helpers.engine import SMOKE, losses, overrides, torchrun

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
]


def test_a_ranks_cuda_generator_is_restored_onto_its_device_from_a_node_with_more_gpus() -> None:
    mine = torch.cuda.get_rng_state()
    expected = torch.rand(8, device="cuda")
    other = torch.cuda.get_rng_state()
    state = capture_rng()
    # saved by a rank on device 3 of a node with 4 GPUs (more than this node has, when it has fewer than 4)
    state["cuda"], state["cuda_device"] = [other, other, other, mine], 3
    restore_rng(state)
    assert torch.equal(torch.rand(8, device="cuda"), expected)


@pytest.mark.heavy  # a torchrun training run on the GPU (~30 s)
def test_fsdp_cpu_offload_trains_under_nccl(tmp_path: Path) -> None:
    args = overrides(
        tmp_path, "train.steps=3", "train.device=cuda", "distributed.strategy=fsdp",
        "distributed.fsdp_cpu_offload=true", "optim.clip_norm=1.0",
    )  # fmt: skip
    proc = torchrun("-m", "drivetrain.cli.main", "train", "--config", str(SMOKE), *args, nproc=1, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(losses(tmp_path)) == 3


@pytest.mark.parametrize("offload", [False, True], ids=["on-gpu", "cpu-offload"])
def test_an_async_saves_copies_of_fsdp_shards_on_cuda_are_on_the_cpu(tmp_path: Path, offload: bool) -> None:
    """What an asynchronous save stages of FSDP2's shards (a DTensor on a ``cuda`` mesh, its local shard on the GPU,
    or on the CPU under offload) lies on the CPU: ``DTensor.from_local`` moved each copy back to the current GPU."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    from drivetrain.engine import dcp_files

    torch.cuda.set_device(0)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("cuda:nccl,cpu:gloo", store=store, rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)).cuda()
        fully_shard(model, offload_policy=CPUOffloadPolicy(pin_memory=True) if offload else OffloadPolicy())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(torch.randn(2, 8, device="cuda")).square().sum().backward()
        optimizer.step()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        tensors = {**dcp_files.split_tensors(model_sd, "model")[1], **dcp_files.split_tensors(optim_sd, "optimizer")[1]}
        assert any(isinstance(t, DTensor) for t in tensors.values())
        staged = dcp_files.stage(tensors)
        for key, copy in staged.items():
            local = copy.to_local() if isinstance(copy, DTensor) else copy
            assert local.device.type == "cpu", key
            live = tensors[key].to_local() if isinstance(tensors[key], DTensor) else tensors[key]
            assert torch.equal(local, live.cpu()), key
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices: the thread's default is device 0")
def test_an_async_save_writes_from_a_thread_on_the_ranks_cuda_device(tmp_path: Path, monkeypatch) -> None:
    """The background thread of an asynchronous save runs on the saving thread's CUDA device (DCP's writer takes the
    current device's stream): a new thread's is device 0, where every rank would otherwise make a CUDA context."""
    from drivetrain.engine import dcp_files
    from drivetrain.engine.checkpoint import Checkpointer
    from drivetrain.engine.config import TrainConfig
    from drivetrain.engine.distributed import DistContext
    from drivetrain.engine.state import StrategyState, TrainState
    from drivetrain.engine.strategy import Strategy

    seen: list[int] = []
    real_write = dcp_files.write_shards

    def write_shards(*args, **kwargs):  # the writing thread's current device, then the real write
        seen.append(torch.cuda.current_device())
        return real_write(*args, **kwargs)

    monkeypatch.setattr(dcp_files, "write_shards", write_shards)
    before = torch.cuda.current_device()
    torch.cuda.set_device(1)
    try:
        ctx = DistContext(0, 1, 1, torch.device("cuda:1"), "none", False)
        run = Strategy(nn.Linear(5, 3), TrainConfig(), ctx, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
        weights = StrategyState(run)
        parts = {"model": weights.model, "optimizer": weights.optimizer, "train": TrainState(iteration=1)}
        meta = {"world_size": 1, "config": {}, "versions": {"drivetrain": "0"}}
        ck = Checkpointer(tmp_path)
        ck.save_state(1, parts, meta, asynchronous=True)
        ck.wait()
    finally:
        torch.cuda.set_device(before)
    assert seen == [1]
