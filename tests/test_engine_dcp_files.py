"""Sharded checkpoints (issue 45): the model and optimizer go through ``torch.distributed.checkpoint`` as shards whose
index is JSON parsed here — nothing read from a checkpoint is unpickled, a pickle payload in place of the index is
refused without running — every file is covered by the ``COMMITTED`` marker, and an asynchronous save writes a
staged copy in the background, one at a time, committed only once it is written."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from drivetrain.engine import dcp_files
from drivetrain.engine.checkpoint import DELAY_ENV, MARKER, STATE_FILE, Checkpointer, CheckpointError
from drivetrain.engine.config import TrainConfig
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.state import StrategyState, TrainState
from drivetrain.engine.strategy import Strategy

META = {"world_size": 1, "config": {"a": 1}, "versions": {"drivetrain": "0.1.0"}}


def strategy(seed: int) -> Strategy:
    """A one-process strategy over a small model (a BatchNorm: buffers too) whose AdamW has taken a step."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 3))
    ctx = DistContext(0, 1, 0, torch.device("cpu"), "none", False)
    run = Strategy(model, TrainConfig(), ctx, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    model(torch.randn(4, 5)).square().sum().backward()
    run.optimizer.step()
    run.optimizer.zero_grad()
    return run


def components(run: Strategy, iteration: int = 3) -> dict[str, Any]:
    weights = StrategyState(run)
    return {"model": weights.model, "optimizer": weights.optimizer, "train": TrainState(iteration=iteration)}


def assert_same_state(a: Strategy, b: Strategy) -> None:
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for key in sa["state"]:
        for field in sa["state"][key]:
            assert torch.equal(sa["state"][key][field], sb["state"][key][field]), (key, field)


def save(root: Path, run: Strategy, step: int = 3, **kwargs: Any) -> tuple[Checkpointer, Path]:
    ck = Checkpointer(root)
    return ck, ck.save_state(step, components(run), META, **kwargs)


def remark(path: Path) -> None:
    """Rewrite ``path``'s marker to match its files as they are now (what someone handing over a checkpoint can
    do): the checks that follow are the parser's, not the checksum's."""
    marker = json.loads((path / MARKER).read_text())
    for entry in marker["files"]:
        data = (path / entry["file"]).read_bytes()
        entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (path / MARKER).write_text(json.dumps(marker))


# ---------------------------------------------------------------------------------------------- layout and round trip
def test_a_sharded_save_writes_shards_a_json_index_and_a_marker_covering_every_file(tmp_path: Path) -> None:
    run = strategy(0)
    _, path = save(tmp_path, run)
    assert sorted(p.name for p in (path / dcp_files.SHARDS).iterdir()) == [".metadata.json", "__0_0.distcp"]
    marker = json.loads((path / MARKER).read_text())
    assert marker["file"] == STATE_FILE and marker["step"] == 3
    listed = {e["file"]: e for e in marker["files"]}
    assert set(listed) == {"weights/.metadata.json", "weights/__0_0.distcp"}
    for name, entry in listed.items():
        data = (path / name).read_bytes()
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    small = torch.load(path / STATE_FILE, weights_only=True)
    assert small["shards"] == "weights" and small["train"]["iteration"] == 3
    assert not any(isinstance(v, torch.Tensor) for v in dcp_files.split_tensors(small["model"], "m")[1].values())
    assert json.loads((path / "weights/.metadata.json").read_text())["format"] == dcp_files.INDEX_FORMAT


def test_a_sharded_checkpoint_restores_model_and_optimizer_exactly_into_a_fresh_run(tmp_path: Path) -> None:
    saved = strategy(0)
    ck, path = save(tmp_path, saved)
    fresh = strategy(1)
    lazy = Checkpointer(tmp_path, shards="lazy").load(path)
    assert isinstance(lazy["model"], dcp_files.Shards) and isinstance(lazy["optimizer"], dcp_files.Shards)
    target = components(fresh, iteration=0)
    Checkpointer.restore({"format_version": 2, **lazy}, target, path)
    assert_same_state(saved, fresh)
    assert target["train"].iteration == 3
    full = ck.load(path)  # read whole in this process: the same tensors, parameters named
    assert torch.equal(full["model"]["0.weight"], saved.model[0].weight.detach())
    numbered = saved.optimizer.state_dict()["state"]  # earlier versions' layout: parameters by number
    assert torch.equal(full["optimizer"]["state"]["2.bias"]["exp_avg"], numbered[5]["exp_avg"])


def test_an_optimizer_that_has_not_stepped_is_saved_and_restored_without_state(tmp_path: Path) -> None:
    """``get_state_dict`` would give it a state with a step at lr 0 (AdamW's ``step`` 1): a save must not change the
    run, and a resume must leave the optimizer as it was (its first step then counts from 0)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 3))
    ctx = DistContext(0, 1, 0, torch.device("cpu"), "none", False)
    run = Strategy(model, TrainConfig(), ctx, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    _, path = save(tmp_path, run)
    assert not run.optimizer.state  # the save took no step
    fresh = strategy(1)  # one that has stepped: its state must go
    Checkpointer.restore({"format_version": 2, **Checkpointer(tmp_path, shards="lazy").load(path)},
                         components(fresh, 0), path)  # fmt: skip
    assert not fresh.optimizer.state
    assert torch.equal(fresh.model[0].weight, run.model[0].weight)


# ---------------------------------------------------------------------------------------------- data, never code
class Payload:
    """Unpickling it creates a file: proof that a reader ran someone's code."""

    def __init__(self, witness: Path) -> None:
        self.witness = witness

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.witness,))


def test_a_pickle_payload_in_place_of_the_index_is_refused_without_running(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    _, path = save(tmp_path / "ck", strategy(0))
    witness = tmp_path / "ran"
    payload = pickle.dumps(Payload(witness))
    shards = path / dcp_files.SHARDS
    (shards / ".metadata").write_bytes(payload)  # where DCP's own reader looks
    with pytest.raises(Exception):  # noqa: B017 - the control: DCP's reader unpickles it, running the payload
        FileSystemReader(shards).read_metadata()
    assert witness.exists()
    witness.unlink()

    (shards / ".metadata.json").write_bytes(payload)  # and where ours looks, the marker rewritten to match
    remark(path)
    for shards_mode in ("full", "lazy"):
        with pytest.raises(CheckpointError, match=r"unreadable shard index|not a drivetrain shard index"):
            Checkpointer(tmp_path / "ck", shards=shards_mode).load(path)
    with pytest.raises(dcp_files.ShardError):
        dcp_files.read_full(shards)
    assert not witness.exists()


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda index: index["tensors"]["model/0.weight"].update(dtype="Tensor"), "has no dtype of torch"),
        (lambda index: index["tensors"].update(extra={"kind": "bytes"}), "'extra' is not a tensor entry"),
        (lambda index: index["storage"][0].__setitem__(3, "../../state.pt"), "not a shard file of the folder"),
        (lambda index: index["storage"][0].__setitem__(4, -1), "not a list of non-negative integers"),
        (lambda index: index.update(format="pickle"), "not a drivetrain shard index"),
    ],
    ids=["dtype", "bytes-entry", "path-outside", "negative-offset", "format"],
)
def test_an_index_that_is_not_ours_is_refused_in_one_line(tmp_path: Path, edit: Any, says: str) -> None:
    _, path = save(tmp_path, strategy(0))
    index_path = path / "weights/.metadata.json"
    index = json.loads(index_path.read_text())
    edit(index)
    index_path.write_text(json.dumps(index))
    remark(path)
    with pytest.raises(CheckpointError) as info:
        Checkpointer(tmp_path).load(path)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_every_shard_file_is_checked_against_the_marker(tmp_path: Path) -> None:
    ck, path = save(tmp_path, strategy(0), step=2)
    save(tmp_path, strategy(0), step=3)
    shard = path.parent / "step-00000003/weights/__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp: size or SHA-256 differs from the COMMITTED marker"):
        ck.load(shard.parent.parent)
    with pytest.warns(match="skipping checkpoint"):
        found = ck.load_latest()
    assert found is not None and found[0] == path  # the corrupt newest is skipped, the older one loads
    marker = json.loads((path / MARKER).read_text())
    marker["files"] = [e for e in marker["files"] if e["file"] != "weights/__0_0.distcp"]
    (path / MARKER).write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp: a shard the COMMITTED marker does not cover"):
        ck.load(path)


def test_a_tensor_slice_that_would_inflate_is_refused_before_loading(tmp_path: Path) -> None:
    _, path = save(tmp_path, strategy(0))
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data/0", bytes(64 << 20))  # 64 MiB of zeros, deflated to ~64 KiB
    (path / "weights/__0_1.distcp").write_bytes(bomb.getvalue())
    index_path = path / "weights/.metadata.json"
    index = json.loads(index_path.read_text())
    index["storage"][0][3:6] = ["__0_1.distcp", 0, len(bomb.getvalue())]
    index_path.write_text(json.dumps(index))
    marker = json.loads((path / MARKER).read_text())
    marker["files"].append({"file": "weights/__0_1.distcp", "size": 0, "sha256": ""})
    (path / MARKER).write_text(json.dumps(marker))
    remark(path)
    with pytest.raises(CheckpointError, match=r"__0_1\.distcp: the tensor at byte 0: its members declare 64\.0 MiB"):
        Checkpointer(tmp_path).load(path)


class Memory(nn.Module):
    """A module whose extra state holds a tensor only once it ran (as a streaming model's memory): a fresh run's
    live state has no tensor to load it into."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept = x.detach()[:2].clone()  # (2, 3)
        return x

    def get_extra_state(self) -> dict[str, torch.Tensor]:
        return {} if self.kept is None else {"kept": self.kept.clone()}

    def set_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        self.kept = state.get("kept")


def memory_run(seed: int, ran: bool) -> Strategy:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 3), Memory())
    ctx = DistContext(0, 1, 0, torch.device("cpu"), "none", False)
    run = Strategy(model, TrainConfig(), ctx, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    if ran:
        model(torch.randn(4, 5)).square().sum().backward()
        run.optimizer.step()
    return run


def test_extra_state_that_exists_only_once_the_module_ran_restores_into_a_fresh_run(tmp_path: Path) -> None:
    saved = memory_run(0, ran=True)
    _, path = save(tmp_path, saved)
    fresh = memory_run(1, ran=False)
    assert fresh.model[1].kept is None
    lazy = Checkpointer(tmp_path, shards="lazy").load(path)
    Checkpointer.restore({"format_version": 2, **lazy}, components(fresh, iteration=0), path)
    assert torch.equal(fresh.model[1].kept, saved.model[1].kept)
    assert torch.equal(fresh.model[0].weight, saved.model[0].weight)


def test_an_extra_tensor_declared_larger_than_the_shards_hold_is_refused_before_allocating(tmp_path: Path) -> None:
    _, path = save(tmp_path, memory_run(0, ran=True))
    index_path = path / "weights/.metadata.json"
    index = json.loads(index_path.read_text())
    (key,) = [k for k in index["tensors"] if "_extra_state" in k]
    index["tensors"][key].update(size=[1 << 20, 1 << 20], chunks=[[[0, 0], [1 << 20, 1 << 20]]])  # 4 TiB
    index_path.write_text(json.dumps(index))
    remark(path)
    lazy = Checkpointer(tmp_path, shards="lazy").load(path)
    with pytest.raises(dcp_files.ShardError, match=r"declares \d+ bytes of tensors beyond this run's, the shards hold"):
        Checkpointer.restore({"format_version": 2, **lazy}, components(memory_run(1, ran=False), iteration=0), path)


# ---------------------------------------------------------------------------------------------- asynchronous saves
def test_an_async_save_writes_a_staged_copy_in_the_background_and_commits_at_wait(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(DELAY_ENV, "0.5")  # the background write sleeps twice: after state.pt, after the rename
    real_stage = dcp_files.stage
    step_reached = threading.Event()  # the copy starts when the next step is reached, however long the forward took

    def slow_stage(tensors, into=None):  # the background thread's copy takes 0.3 s: the step must wait for it
        if threading.current_thread() is not threading.main_thread():
            step_reached.wait(timeout=60)
            time.sleep(0.3)
        return real_stage(tensors, into)

    monkeypatch.setattr(dcp_files, "stage", slow_stage)
    run = strategy(0)
    expected = {k: v.clone() for k, v in run.model.state_dict().items()}
    moments = {k: v["exp_avg"].clone() for k, v in run.optimizer.state_dict()["state"].items()}
    ck = Checkpointer(tmp_path)
    path = ck.save_state(3, components(run), META, asynchronous=True)
    assert ck.in_flight and not (path / MARKER).exists()  # training goes on while it is written
    assert ck.last_stall_s < 0.5 and ck.pop_stall() is None  # its stall is known once the next step ran
    run.model(torch.randn(4, 5)).square().sum().backward()  # the next step: the forward writes the buffers,
    step_reached.set()
    run.optimizer.step()  # the step (held until the parameters and moments are copied) the rest, in place
    assert not torch.equal(run.model[0].weight, expected["0.weight"])
    step, stall = ck.pop_stall()
    assert step == 3 and 0.25 < stall < 0.3 + 0.5  # the step waited for the copy (0.3 s), not for the write (1 s)
    ck.wait()
    assert not ck.in_flight and (path / MARKER).is_file()
    saved = ck.load(path)
    assert all(torch.equal(saved["model"][k], v) for k, v in expected.items())  # the values at the save
    numbered = dict(enumerate(n for n, _ in run.model.named_parameters()))
    assert all(torch.equal(saved["optimizer"]["state"][numbered[i]]["exp_avg"], m) for i, m in moments.items())


def test_staging_keeps_a_shard_of_a_cuda_mesh_on_the_cpu_and_reuses_its_copy(tmp_path: Path) -> None:
    """FSDP2 with CPU offload on CUDA hands out DTensors whose local shard is on the CPU and whose mesh is ``cuda``;
    their staged copies stay on the CPU (``DTensor.from_local`` would move them to a GPU: without CUDA, it fails)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cuda", [0], _init_backend=False)  # FSDP's mesh on CUDA; nothing here runs on it
        local = torch.arange(6.0).reshape(3, 2)
        meta = TensorMeta(local.shape, local.stride(), local.dtype)
        shard = DTensor(local, DTensorSpec(mesh, (Shard(0),), meta), requires_grad=False)
        into: dict[str, torch.Tensor] = {}
        first = dcp_files.stage({"w": shard}, into)["w"]
        assert isinstance(first, DTensor) and first.to_local().device.type == "cpu"
        assert first.device_mesh is mesh and first.placements == (Shard(0),) and first.shape == shard.shape
        assert torch.equal(first.to_local(), local) and first.to_local().data_ptr() != local.data_ptr()
        local.add_(1)  # the next step changes the live shard in place: the next save's copy reuses the staged one
        second = dcp_files.stage({"w": shard}, into)["w"]
        assert second.to_local().data_ptr() == first.to_local().data_ptr() and torch.equal(second.to_local(), local)
    finally:
        dist.destroy_process_group()


def test_the_next_save_waits_for_the_one_in_flight_and_counts_the_wait_as_its_stall(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(DELAY_ENV, "0.4")
    run = strategy(0)
    ck = Checkpointer(tmp_path)
    first = ck.save_state(2, components(run), META, asynchronous=True)
    second = ck.save_state(3, components(run), META, asynchronous=True)
    assert (first / MARKER).is_file()  # committed before the second started
    assert ck.last_stall_s >= 0.5  # the first sleeps 2 × 0.4 s in the background: the second waited for it
    ck.wait()
    assert [s for s, _ in ck.committed()] == [2, 3] and (second / MARKER).is_file()


def test_an_async_save_that_fails_raises_at_wait_and_keeps_the_committed_ones(tmp_path, monkeypatch) -> None:
    run = strategy(0)
    ck = Checkpointer(tmp_path)
    ck.save_state(2, components(run), META)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == f"{MARKER}.tmp":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ck.save_state(3, components(run), META, asynchronous=True)
    with pytest.raises(CheckpointError, match=rf"^cannot write a checkpoint in {tmp_path} \(the disk is full; "):
        ck.wait()
    assert [s for s, _ in ck.committed()] == [2]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".step-")]
    ck.wait()  # raised once
