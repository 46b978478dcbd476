"""models/streampetr/memory.py: the temporal memory keeps static objects fixed in the world while the ego
moves, resets at scene starts, keeps the newest entries, and survives a checkpoint round trip bit-exactly."""

from __future__ import annotations

import io
import math

import pytest
import torch

from drivetrain.models.streampetr import MemoryBank

E, C = 8, 3


def pose(x: float, y: float, yaw: float) -> torch.Tensor:
    """``(4, 4)`` float32 lidar → global: a yaw rotation and a translation."""
    m = torch.eye(4)
    m[:2, :2] = torch.tensor([[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]])
    m[:2, 3] = torch.tensor([x, y])
    return m


# The ego drives forward and turns; a parked car stands at a fixed global position.
POSES = [pose(10.0 + 4 * k, 5.0 + 0.5 * k * k, 0.1 * k) for k in range(4)]
TIMES = [1533.0 + 0.5 * k for k in range(4)]
CAR = torch.tensor([30.0, 12.0, 0.8, 1.0])


def frame_outputs(k: int, batch: int, queries: int = 6, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Last-layer outputs of frame ``k`` where query 2 is the car, detected at its true lidar-frame centre."""
    gen = torch.Generator().manual_seed(seed + k)
    logits = torch.randn(batch, queries, C, generator=gen) - 3
    logits[:, 2, 1] = 5.0  # the most confident query
    boxes = torch.randn(batch, queries, 10, generator=gen)
    boxes[:, 2, :3] = (torch.linalg.inv(POSES[k]) @ CAR)[:3]
    hidden = torch.randn(batch, queries, E, generator=gen)
    return logits, boxes, hidden


def step(memory: MemoryBank, k: int, prev_exists: torch.Tensor, seed: int = 0) -> None:
    batch = prev_exists.shape[0]
    times = torch.full((batch,), TIMES[k], dtype=torch.float64)
    memory.pre_update(prev_exists, times, torch.linalg.inv(POSES[k]).expand(batch, 4, 4))
    logits, boxes, hidden = frame_outputs(k, batch, seed=seed)
    memory.post_update(logits, boxes, hidden, times, POSES[k].expand(batch, 4, 4))


def test_a_static_object_keeps_its_world_position_while_the_ego_moves() -> None:
    memory = MemoryBank(embed_dims=E, memory_len=8, topk=2, num_propagated=2)
    yes = torch.ones(1, dtype=torch.bool)
    step(memory, 0, torch.zeros(1, dtype=torch.bool))
    for k in range(1, 4):
        times = torch.full((1,), TIMES[k], dtype=torch.float64)
        memory.pre_update(yes, times, torch.linalg.inv(POSES[k]).unsqueeze(0))
        # Every earlier detection of the car, now in frame k's lidar coordinates, is where the car is seen now.
        expected = (torch.linalg.inv(POSES[k]) @ CAR)[:3]
        for j in range(k):  # newest first: frame k-1 at entry 0, k-2 at entry 2, ...
            entry = 2 * j
            torch.testing.assert_close(memory.reference[0, entry], expected, rtol=0, atol=1e-4)
            age = TIMES[k] - TIMES[k - 1 - j]
            assert memory.age[0, entry, 0].item() == pytest.approx(age, abs=1e-9)
            lidar_then_to_now = torch.linalg.inv(POSES[k]) @ POSES[k - 1 - j]
            torch.testing.assert_close(memory.pose[0, entry], lidar_then_to_now, rtol=0, atol=1e-5)
        logits, boxes, hidden = frame_outputs(k, 1)
        memory.post_update(logits, boxes, hidden, times, POSES[k].unsqueeze(0))


def test_memory_resets_where_a_scene_starts_and_keeps_the_other_samples() -> None:
    memory = MemoryBank(embed_dims=E, memory_len=8, topk=2, num_propagated=3)
    step(memory, 0, torch.zeros(2, dtype=torch.bool))
    step(memory, 1, torch.ones(2, dtype=torch.bool))
    times = torch.full((2,), TIMES[2], dtype=torch.float64)
    memory.pre_update(torch.tensor([True, False]), times, torch.linalg.inv(POSES[2]).expand(2, 4, 4))
    assert memory.embedding[0].abs().sum() > 0 and memory.embedding[1].abs().sum() == 0
    assert memory.age[1].abs().sum() == 0 and memory.velocity[1].abs().sum() == 0
    pseudo = memory.pseudo_reference.weight * memory.pc_size + memory.pc_min  # (3, 3) metres
    torch.testing.assert_close(memory.reference[1, :3], pseudo)
    assert memory.reference[1, 3:].abs().sum() == 0
    assert torch.equal(memory.pose[1, :3], torch.eye(4).expand(3, 4, 4)) and memory.pose[1, 3:].abs().sum() == 0
    # The continuing sample keeps its entries; its first ones were not overwritten by pseudo points.
    assert not torch.allclose(memory.reference[0, :3], pseudo)
    assert not memory.pseudo_reference.weight.requires_grad


def test_the_newest_entries_are_kept_first_up_to_memory_len() -> None:
    memory = MemoryBank(embed_dims=E, memory_len=5, topk=2, num_propagated=0)
    yes = torch.ones(1, dtype=torch.bool)
    step(memory, 0, torch.zeros(1, dtype=torch.bool))
    step(memory, 1, yes)
    step(memory, 2, yes)
    assert memory.embedding.shape == (1, 5 + 2, E)  # post_update prepends; pre_update cuts
    times = torch.full((1,), TIMES[3], dtype=torch.float64)
    memory.pre_update(yes, times, torch.linalg.inv(POSES[3]).unsqueeze(0))
    assert memory.embedding.shape == (1, 5, E)
    _, _, hidden2 = frame_outputs(2, 1)
    newest = hidden2[0, 2]  # the car query of frame 2 is the best-scored one
    assert torch.equal(memory.embedding[0, 0], newest)
    ages = memory.age[0, :, 0]
    assert ages[0].item() == pytest.approx(0.5) and ages[2].item() == pytest.approx(1.0)


def test_memory_survives_a_checkpoint_round_trip_bit_exactly() -> None:
    torch.manual_seed(3)
    memory = MemoryBank(embed_dims=E, memory_len=6, topk=2, num_propagated=2)
    step(memory, 0, torch.zeros(2, dtype=torch.bool))
    step(memory, 1, torch.ones(2, dtype=torch.bool))
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    restored = MemoryBank(embed_dims=E, memory_len=6, topk=2, num_propagated=2)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for k in (2, 3):  # continue mid-scene in both
        step(memory, k, torch.tensor([True, k == 2]), seed=7)
        step(restored, k, torch.tensor([True, k == 2]), seed=7)
    for name in ("embedding", "reference", "age", "pose", "velocity"):
        assert torch.equal(getattr(memory, name), getattr(restored, name)), name
    empty = MemoryBank(embed_dims=E, memory_len=6, topk=2, num_propagated=2)
    restored.load_state_dict(empty.state_dict())  # an empty memory restores as empty
    assert restored.embedding is None


def test_misuse_is_named() -> None:
    memory = MemoryBank(embed_dims=E, memory_len=4, topk=2, num_propagated=2)
    with pytest.raises(RuntimeError, match="post_update before pre_update"):
        memory.post_update(*frame_outputs(0, 1), torch.zeros(1, dtype=torch.float64), torch.eye(4).unsqueeze(0))
    step(memory, 0, torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch of 3"):
        memory.pre_update(torch.ones(3), torch.zeros(3, dtype=torch.float64), torch.eye(4).expand(3, 4, 4))
    with pytest.raises(ValueError, match="topk"):
        MemoryBank(memory_len=4, topk=8)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_memory_moves_without_a_host_sync_as_on_the_cpu() -> None:
    """Four frames of two samples (the second restarts its scene at frame 2) on the CPU and, under CUDA's sync debug
    mode set to raise at any synchronising call, on the device. Copies (embeddings, velocities, the pseudo points)
    and the float64 ages (sums) are exact on both; references and poses go through one 4 × 4 float32 product per
    update (TF32 off: conftest's default), each device within γ₄·m of the exact product per coordinate (γ₄ ≈ 4·2⁻²⁴;
    m = Σ|M_ij||p_j| + |t_i| ≤ 90 here: the car 30 m out, the ego ≤ 22 m from the origin), so 2·γ₄·m ≈ 4.3e-5 apart,
    √3 times that as a vector, which the later rotations carry unchanged in norm: over the 8 products the oldest
    entries went through, 6e-4."""
    torch.manual_seed(0)
    cpu = MemoryBank(embed_dims=E, memory_len=8, topk=2, num_propagated=2)
    gpu = MemoryBank(embed_dims=E, memory_len=8, topk=2, num_propagated=2)
    gpu.load_state_dict(cpu.state_dict())
    gpu.to("cuda")
    for k in range(4):
        prev_exists = torch.tensor([k > 0, k > 0 and k != 2])
        step(cpu, k, prev_exists)
        times = torch.full((2,), TIMES[k], dtype=torch.float64)
        inputs = [prev_exists, times, torch.linalg.inv(POSES[k]).expand(2, 4, 4), *frame_outputs(k, 2)]
        inputs.append(POSES[k].expand(2, 4, 4))
        keep, times, pose_inv, logits, boxes, hidden, ego_pose = (t.to("cuda") for t in inputs)  # copies: before
        torch.cuda.set_sync_debug_mode("error")
        try:
            gpu.pre_update(keep, times, pose_inv)
            gpu.post_update(logits, boxes, hidden, times, ego_pose)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert gpu.embedding.device.type == "cuda"
    for name in ("embedding", "age", "velocity"):
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
    for name in ("reference", "pose"):
        torch.testing.assert_close(getattr(gpu, name).cpu(), getattr(cpu, name), rtol=0, atol=6e-4)
