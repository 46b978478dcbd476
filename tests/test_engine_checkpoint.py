"""Atomic checkpoints, keep-k pruning, skipping of partial/corrupt ones; RNG states; the dynamic loss scaler;
schedules."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from drivetrain.engine import Checkpointer, CheckpointError, CheckpointWarning, LossScaler, lr_factor
from drivetrain.engine.build import one_cycle
from drivetrain.engine.checkpoint import MARKER
from drivetrain.engine.config import PrecisionConfig, ScheduleConfig
from drivetrain.engine.state import capture_rng, restore_rng


def state(step: int) -> dict:
    return {"step": step, "weights": torch.full((3,), float(step))}


def test_keep_k_prunes_only_after_commit(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        ck.save(step, state(step))
    assert [s for s, _ in ck.committed()] == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]
    assert all((p / MARKER).is_file() for _, p in ck.committed())


def test_partial_and_corrupt_checkpoints_are_skipped_with_a_warning(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=5)
    for step in (1, 2, 3):
        ck.save(step, state(step))
    (tmp_path / "step-00000003" / MARKER).unlink()  # killed between rename and marker
    truncated = tmp_path / "step-00000002" / "state.pt"
    truncated.write_bytes(truncated.read_bytes()[:100])
    with pytest.warns(CheckpointWarning) as caught:
        path, loaded = ck.load_latest()
    messages = " ".join(str(w.message) for w in caught)
    assert "no COMMITTED marker" in messages and "SHA-256 differs" in messages
    assert path.name == "step-00000001" and torch.equal(loaded["weights"], state(1)["weights"])
    with pytest.raises(CheckpointError, match="SHA-256 differs"):
        ck.load(tmp_path / "step-00000002")


def test_leftovers_of_interrupted_saves_are_removed_by_the_next_save(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=5)
    (tmp_path / ".step-00000009.tmp-123").mkdir(parents=True)
    (tmp_path / "step-00000008").mkdir()  # renamed but never committed
    ck.save(1, state(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]


def test_checkpoint_loads_with_weights_only_and_a_marker_checksum(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path)
    path = ck.save(7, {"rng": capture_rng(), "nested": {"list": [1, 2.5, "x", None]}})
    loaded = ck.load(path)
    assert loaded["nested"] == {"list": [1, 2.5, "x", None]}
    assert isinstance(loaded["rng"]["torch"], torch.Tensor)


def test_rng_states_round_trip() -> None:
    saved = capture_rng()
    before = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    restore_rng(saved)
    after = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    assert before[:3] == after[:3] and torch.equal(before[3], after[3])


def scaler(**kw: float) -> LossScaler:
    return LossScaler(PrecisionConfig(mode="fp16", **kw), torch.device("cpu"))


def test_loss_scaler_hysteresis_backoff_growth_and_floor() -> None:
    s = scaler(init_scale=16.0, hysteresis=2, growth_interval=3, min_scale=4.0)
    inf, ok = torch.tensor(True), torch.tensor(False)
    s.update(inf)
    assert s.scale.item() == 16.0  # first overflow uses up hysteresis
    s.update(inf)
    assert s.scale.item() == 8.0
    s.update(inf)
    assert s.scale.item() == 4.0
    s.update(inf)
    assert s.scale.item() == 4.0  # never below min_scale
    for _ in range(3):
        s.update(ok)
    assert s.scale.item() == 8.0 and s.hysteresis_left.item() == 2  # growth refills hysteresis
    restored = scaler(init_scale=16.0)
    restored.load_state_dict(s.state_dict())
    assert restored.state_dict().keys() == s.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(), s.state_dict().values(), strict=True))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_scaler_unscales_gradients_kept_on_the_host_by_the_scale_it_holds() -> None:
    """FSDP CPU offload keeps the gradients on the host while the scale lives on the GPU: the host multiplies them by
    the scale's inverse once it has arrived there, not by what its pinned buffer held before (the scale is written
    behind a busy stream, so a copy not waited for lands after the multiplication read it)."""
    from drivetrain.engine.precision import unscale_clip_

    s = LossScaler(PrecisionConfig(mode="fp16", init_scale=2.0**10), torch.device("cuda"))
    p = torch.nn.Parameter(torch.ones(64))
    p.grad = torch.full((64,), 2.0**12)
    torch.cuda._sleep(200_000_000)  # the current stream is busy (~0.1 s) ...
    s.scale.mul_(2.0)  # ... then writes the scale: 2**11
    norm, found_inf = unscale_clip_([p], s, None)
    assert torch.equal(p.grad, torch.full((64,), 2.0))  # exact: powers of two
    assert norm.item() == 16.0 and not found_inf.item()  # sqrt(64 · 2²)


def test_schedules_are_pure_functions_matching_torch_onecycle() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=50, cycle_momentum=False)
    for step in range(50):
        assert one_cycle(step, 50, 0.3, 25.0, 1e4) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9)
        opt.step()
        sched.step()
    cos = ScheduleConfig(kind="warmup_cosine", warmup_steps=5, min_lr_ratio=0.1)
    assert lr_factor(cos, 5, 100) == 1.0 and lr_factor(cos, 100, 100) == pytest.approx(0.1)
    assert lr_factor(cos, 0, 100) < lr_factor(cos, 4, 100) < 1.0
    const = ScheduleConfig(kind="warmup_constant", warmup_steps=3)
    assert [lr_factor(const, s, 10) for s in (0, 3, 9)] == [0.25, 1.0, 1.0]


def test_pruning_counts_only_checkpoints_up_to_the_one_just_saved(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=2)
    for step in (110, 120):  # newer checkpoints of another continuation (e.g. corrupt, not yet set aside)
        ck.save(step, state(step))
    for step in (10, 20, 30):
        ck.save(step, state(step))
    assert [s for s, _ in ck.committed()] == [20, 30, 110, 120]  # the new ones are kept, the newer left alone


def test_set_aside_moves_a_checkpoint_out_of_pruning_and_resume(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=1)
    ck.save(1, state(1))
    ck.save(2, state(2))
    moved = ck.set_aside(tmp_path / "step-00000002", "corrupt")
    assert moved == tmp_path / "corrupt" / "step-00000002" and (moved / MARKER).is_file()
    ck.save(3, state(3))
    ck.save(2, state(2))
    again = ck.set_aside(tmp_path / "step-00000002", "corrupt")  # a second one of that name is kept too
    assert again.name == "step-00000002.1" and moved.is_dir()
    assert [s for s, _ in ck.committed()] == [3]
    assert ck.load_latest()[0].name == "step-00000003"
