"""The distributed paths on CUDA that gloo on the CPU cannot show: NCCL reduces CUDA tensors only, and a rank's device
index is not the saving rank's. (The fp16 scale unscaling gradients kept on the host:
``tests/test_engine_checkpoint.py``.)

- FSDP2 with CPU offload under torchrun on NCCL: the gradient norm of the CPU shards is reduced over the process
  group's gloo half (``cuda:nccl,cpu:gloo``, :func:`drivetrain.engine.distributed.process_group_backend`); with NCCL
  alone the first step failed with "No backend type associated with device type cpu". One rank on one GPU shows it
  (a world of one still reduces the norm's partial DTensor through the group).
- A rank's CUDA generator is restored onto the rank's device, from the saving rank's device: a rank's device index
  changes with the node layout, and a node with fewer GPUs than the saving one has no generator at the later indices.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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
