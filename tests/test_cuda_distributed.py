"""The distributed paths on CUDA that gloo on the CPU cannot show: NCCL reduces CUDA tensors only, and a copy to the
host must have landed before the host reads it.

- FSDP2 with CPU offload under torchrun on NCCL: the gradient norm of the CPU shards is reduced over the process
  group's gloo half (``cuda:nccl,cpu:gloo``, :func:`drivetrain.engine.distributed.process_group_backend`); with NCCL
  alone the first step failed with "No backend type associated with device type cpu". One rank on one GPU shows it
  (a world of one still reduces the norm's partial DTensor through the group).
- The fp16 loss scale, kept on the GPU, unscales gradients kept on the host (FSDP CPU offload) only once its copy
  to the host has landed.
- A rank's CUDA generator is restored onto the rank's device, from the saving rank's device: a rank's device index
  changes with the node layout, and a node with fewer GPUs than the saving one has no generator at the later indices.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from drivetrain.engine.config import PrecisionConfig
from drivetrain.engine.precision import LossScaler, unscale_clip_
from drivetrain.engine.state import capture_rng, restore_rng
from helpers.engine import SMOKE, losses, overrides, torchrun

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
]


def test_host_gradients_are_unscaled_by_the_landed_scale_behind_a_busy_stream() -> None:
    scaler = LossScaler(PrecisionConfig(mode="fp16", init_scale=2.0**12), torch.device("cuda"))
    params = [torch.nn.Parameter(torch.ones(1 << 16)) for _ in range(4)]  # on the host, as under CPU offload
    for p in params:
        p.grad = torch.full_like(p, 2.0**12)  # scaled gradients of 1.0
    busy = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):  # keep the stream busy, so that a copy queued behind it lands well after it is queued
        busy = busy @ busy / 64
    unscale_clip_(params, scaler, None)
    for p in params:
        assert torch.equal(p.grad, torch.ones_like(p)), p.grad[:4]


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
