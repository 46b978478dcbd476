"""Checkpointed state as a dict of stateful components: the checkpointer saves exactly the mapping's components
beside the metadata and the format version, restores each once in order, and refuses another format version or
a missing/extra component in one line before loading anything. Checkpoints of HEAD's layout (``format: 1``,
batch positions) still resume bit-exactly; the sample-counted sampler position of version 1 is refused."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import drivetrain
from drivetrain.engine import Checkpointer, CheckpointError, ConfigError, Trainer, load_config
from drivetrain.engine.config import config_to_dict
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.protocol import StreamMemory
from drivetrain.engine.state import (
    FORMAT_VERSION,
    FixedState,
    RngState,
    ScheduleState,
    Stateful,
    StrategyState,
    StreamState,
    TrainState,
    capture_rng,
    format_version,
    restore_rng,
)
from drivetrain.models.streampetr.detector import StreamPETR
from drivetrain.models.streampetr.memory import MemoryBank
from helpers.engine import SMOKE, assert_same_weights, final_state, losses, overrides

META = {"world_size": 1, "config": {"a": 1}, "versions": {"drivetrain": "0.1.0"}}


class Recording:
    """A component that records every call: its state is ``{"value": tensor}``."""

    def __init__(self, name: str, calls: list[tuple[str, str]], value: float) -> None:
        self.name, self.calls, self.value = name, calls, torch.tensor([value])
        self.loaded: list[Any] = []

    def state_dict(self) -> dict[str, Any]:
        self.calls.append(("state_dict", self.name))
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.calls.append(("load_state_dict", self.name))
        self.loaded.append(state_dict)


def components(calls: list[tuple[str, str]]) -> dict[str, Recording]:
    return {name: Recording(name, calls, float(i)) for i, name in enumerate(("model", "optimizer", "data", "rng"))}


def saved(tmp_path: Path) -> dict[str, Any]:
    calls: list[tuple[str, str]] = []
    path = Checkpointer(tmp_path).save_state(3, components(calls), META)
    return Checkpointer(tmp_path).load(path)


def test_save_state_writes_exactly_the_components_beside_the_metadata_and_version(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []
    parts = components(calls)
    assert all(isinstance(c, Stateful) for c in parts.values())
    path = Checkpointer(tmp_path).save_state(3, parts, META)
    assert path == tmp_path / "step-00000003"
    state = Checkpointer(tmp_path).load(path)
    assert list(state) == ["format_version", *META, *parts]
    assert state["format_version"] == FORMAT_VERSION == 2
    assert calls == [("state_dict", name) for name in parts]  # each read once, in the mapping's order
    for i, name in enumerate(parts):
        assert torch.equal(state[name]["value"], torch.tensor([float(i)]))


def test_save_state_without_write_reads_every_component_and_writes_nothing(tmp_path: Path) -> None:
    """Ranks other than 0 read their (possibly collective) components and write nothing."""
    calls: list[tuple[str, str]] = []
    path = Checkpointer(tmp_path / "ck").save_state(5, components(calls), META, write=False)
    assert path == tmp_path / "ck" / "step-00000005" and not (tmp_path / "ck").exists()
    assert [name for _, name in calls] == ["model", "optimizer", "data", "rng"]


def test_save_state_refuses_unknown_metadata_and_components_named_like_metadata(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []
    with pytest.raises(ValueError, match=r"^checkpoint meta: 'step' is none of world_size, config, versions$"):
        Checkpointer(tmp_path).save_state(1, components(calls), {**META, "step": 3})
    with pytest.raises(ValueError, match=r"^checkpoint components: 'config' is the name of a metadata field$"):
        Checkpointer(tmp_path).save_state(1, {"config": Recording("config", calls, 0.0)}, META)
    assert calls == [] and not tmp_path.joinpath("step-00000001").exists()


def test_restore_loads_each_component_once_in_order(tmp_path: Path) -> None:
    state = saved(tmp_path)
    calls: list[tuple[str, str]] = []
    parts = components(calls)
    Checkpointer.restore(state, parts, "here")
    assert calls == [("load_state_dict", name) for name in parts]
    for i, component in enumerate(parts.values()):
        assert len(component.loaded) == 1 and torch.equal(component.loaded[0]["value"], torch.tensor([float(i)]))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"format_version": 1},
            "checkpoint runs/x/step-00000200: format version 1, this drivetrain reads version 2; resume it with "
            "drivetrain 0.1.0, which wrote it, or start a new run",
        ),
        (
            {"format_version": 3},
            "checkpoint runs/x/step-00000200: format version 3, this drivetrain reads version 2; resume it with "
            "drivetrain 0.1.0, which wrote it, or a newer one",
        ),
    ],
)
def test_another_format_version_is_refused_in_one_line_before_anything_loads(
    tmp_path: Path, change: dict[str, int], message: str
) -> None:
    state = {**saved(tmp_path), **change}
    calls: list[tuple[str, str]] = []
    with pytest.raises(CheckpointError) as info:
        Checkpointer.restore(state, components(calls), "runs/x/step-00000200")
    assert str(info.value) == message
    assert calls == []


def test_a_checkpoint_without_a_version_is_refused_in_one_line(tmp_path: Path) -> None:
    state = saved(tmp_path)
    del state["format_version"]
    with pytest.raises(
        CheckpointError, match=r"^checkpoint c: no format version \(neither format_version nor format\)"
    ):
        Checkpointer.restore(state, components([]), "c")


def test_format_version_tells_the_two_layouts_that_said_format_1_apart() -> None:
    """drivetrain wrote ``format: 1`` for version 1 (sampler position in samples) and version 2 (in batches)."""
    assert format_version({"format": 1, "data": {"epoch": 1, "position": 32, "num_replicas": 1}}) == 1
    assert format_version({"format": 1, "data": {"epoch": 1, "step": 4, "batch_size": 8, "world_size": 1}}) == 2
    assert format_version({"format_version": 2, "format": 1, "data": {"position": 0}}) == 2  # the field wins
    assert format_version({"model": {}}) is None


@pytest.mark.parametrize(("drop", "add"), [("data", None), (None, "ema")])
def test_a_missing_or_extra_component_is_refused_in_one_line_naming_it(
    tmp_path: Path, drop: str | None, add: str | None
) -> None:
    state = saved(tmp_path)
    if drop is not None:
        del state[drop]
    if add is not None:
        state[add] = {"value": torch.zeros(1)}
    calls: list[tuple[str, str]] = []
    with pytest.raises(CheckpointError) as info:
        Checkpointer.restore(state, components(calls), "c")
    line = str(info.value)
    expected = (
        "checkpoint c: no 'data' state, which this run restores (it holds model, optimizer, rng)"
        if drop
        else "checkpoint c: holds 'ema' state, which this run has no component for (it restores model, optimizer, "
        "data, rng)"
    )
    assert line == expected
    assert calls == []  # nothing half-restored


class CountingStrategy:
    """The two calls of a strategy that StrategyState makes, counted."""

    def __init__(self) -> None:
        self.full_state_calls, self.loaded = 0, []

    def full_state(self) -> tuple[dict, dict]:
        self.full_state_calls += 1
        return {"w": torch.ones(2)}, {"state": {}, "param_groups": []}

    def load_full_state(self, model_sd: dict, optim_sd: dict) -> None:
        self.loaded.append((model_sd, optim_sd))


def test_strategy_state_reads_model_and_optimizer_with_one_full_state_and_loads_them_together() -> None:
    strategy = CountingStrategy()
    weights = StrategyState(strategy)
    model_sd, optim_sd = weights.model.state_dict(), weights.optimizer.state_dict()
    assert strategy.full_state_calls == 1  # one collective gather per save under FSDP / DeepSpeed
    assert torch.equal(model_sd["w"], torch.ones(2)) and optim_sd == {"state": {}, "param_groups": []}
    with pytest.raises(RuntimeError, match="read 'model' first"):
        weights.optimizer.state_dict()  # handed over once
    weights.model.load_state_dict(model_sd)
    assert strategy.loaded == []  # waits for the optimizer's dict
    weights.optimizer.load_state_dict(optim_sd)
    assert strategy.loaded == [(model_sd, optim_sd)]


def test_schedule_state_is_checked_against_the_restored_counters_and_the_run() -> None:
    train = TrainState(iteration=5, step=4)
    schedule = ScheduleState("warmup_cosine", train)
    assert schedule.state_dict() == {"step": 4, "kind": "warmup_cosine"}
    schedule.load_state_dict({"step": 4, "kind": "warmup_cosine"})
    with pytest.raises(ValueError, match=r"^schedule\.kind: 'one_cycle' in the checkpoint, 'warmup_cosine' in this"):
        schedule.load_state_dict({"step": 4, "kind": "one_cycle"})
    with pytest.raises(ValueError, match=r"^schedule\.step: 3 in the checkpoint, but its train counters say 4$"):
        schedule.load_state_dict({"step": 3, "kind": "warmup_cosine"})
    fixed = FixedState({"epoch": 0, "step": 2})
    assert fixed.state_dict() == {"epoch": 0, "step": 2}


# ---------------------------------------------------------------- the trainer's components

RUN = ["checkpoint.every=3", "checkpoint.keep=5"]


def smoke(out: Path, steps: int) -> Any:
    return load_config(SMOKE, overrides(out, *RUN, f"train.steps={steps}"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 6-step smoke run (checkpoints at steps 3 and 6)."""
    out = tmp_path_factory.mktemp("reference")
    Trainer(smoke(out, 6)).fit()
    return out


def rewrite(run: Path, step: int, edit: Any) -> None:
    """Replace the checkpoint of ``step`` in ``run`` by ``edit(its state)`` (committed like any save)."""
    ck = Checkpointer(run / "checkpoints")
    state = ck.load(run / "checkpoints" / Checkpointer.name(step))
    ck.save(step, edit(state))


def at_step_3(reference: Path, out: Path) -> Path:
    """A copy of the reference run whose newest checkpoint is step 3 (a resume drops the later metrics)."""
    shutil.copytree(reference, out)
    shutil.rmtree(out / "checkpoints" / "step-00000006")
    return out


def test_the_trainer_checkpoints_its_named_components(reference: Path) -> None:
    state = final_state(reference)
    components = ["model", "optimizer", "scaler", "train", "schedule", "data", "rng"]
    assert list(state) == ["format_version", "world_size", "config", "versions", *components]
    assert state["format_version"] == FORMAT_VERSION
    assert state["train"] == {"iteration": 6, "step": 6, "skipped": 0, "nonfinite_losses": 0}
    assert state["schedule"] == {"step": 6, "kind": "warmup_cosine"}
    assert set(state["data"]) >= {"epoch", "step", "batch_size", "world_size"} and len(state["rng"]) == 1


def test_a_checkpoint_in_heads_layout_still_resumes_bit_exactly(reference: Path, tmp_path: Path) -> None:
    """Checkpoints written before ``format_version`` (``format: 1``, batch positions) are version 2 and resume."""

    def head_layout(state: dict[str, Any]) -> dict[str, Any]:
        return {"format": 1, **{k: v for k, v in state.items() if k != "format_version"}}

    run = at_step_3(reference, tmp_path / "head")
    rewrite(run, 3, head_layout)
    trainer = Trainer(smoke(run, 6), resume="auto")
    assert trainer.state.iteration == 3
    trainer.fit()
    assert losses(run) == losses(reference) and len(losses(run)) == 6
    a, b = final_state(run), final_state(reference)
    assert a["train"] == b["train"] and a["data"] == b["data"]
    assert_same_weights(a["model"], b["model"])
    assert a["model"]["_extra_state"] == b["model"]["_extra_state"]


def test_a_single_file_checkpoint_of_earlier_versions_resumes_bit_exactly(reference: Path, tmp_path: Path) -> None:
    """Before sharded saves a checkpoint was one ``state.pt``: the full ``model.state_dict()`` and the optimizer's
    ``state_dict()`` (parameters numbered) beside the other components. Written here as that code wrote it."""
    run = at_step_3(reference, tmp_path / "single")
    trainer = Trainer(smoke(run, 6), resume="auto")  # restored from the sharded step 3
    state = {"format_version": FORMAT_VERSION, "world_size": 1, "config": config_to_dict(trainer.cfg),
             "versions": {"drivetrain": drivetrain.__version__}}  # fmt: skip
    state.update({name: component.state_dict() for name, component in trainer.components.items()})
    trainer.close()
    assert isinstance(next(iter(state["optimizer"]["state"])), int)  # numbered parameters, as before
    step_3 = run / "checkpoints" / "step-00000003"
    shutil.rmtree(step_3)
    Checkpointer(run / "checkpoints").save(3, state)
    assert sorted(p.name for p in step_3.iterdir()) == ["COMMITTED", "state.pt"]
    trainer = Trainer(smoke(run, 6), resume="auto")
    assert trainer.resumed_from == step_3 and trainer.state.iteration == 3
    trainer.fit()
    assert losses(run) == losses(reference) and len(losses(run)) == 6
    assert_same_weights(final_state(run)["model"], final_state(reference)["model"])
    assert (run / "checkpoints" / "step-00000006" / "weights").is_dir()  # the run goes on with sharded saves


def test_a_version_1_checkpoint_is_refused_in_one_line_naming_its_version(reference: Path, tmp_path: Path) -> None:
    """The older sampler format (position counted in samples) is no longer converted: resume says why, once."""

    def version_1(state: dict[str, Any]) -> dict[str, Any]:
        state = {"format": 1, **{k: v for k, v in state.items() if k != "format_version"}}
        data = state["data"]
        state["data"] = {"epoch": data["epoch"], "position": data["step"] * data["batch_size"], "num_replicas": 1}
        return state

    run = at_step_3(reference, tmp_path / "v1")
    rewrite(run, 3, version_1)
    with pytest.raises(ConfigError) as info:
        Trainer(smoke(run, 6), resume="auto")
    line = str(info.value)
    assert line == (
        f"--resume: checkpoint {run / 'checkpoints' / 'step-00000003'}: format version 1, this drivetrain reads "
        f"version 2; resume it with drivetrain {drivetrain.__version__}, which wrote it, or start a new run"
    )
    assert (run / "checkpoints" / "step-00000003").is_dir()  # refused, not moved aside as corrupt


def test_a_checkpoint_missing_a_component_is_refused_on_resume_naming_it(reference: Path, tmp_path: Path) -> None:
    run = at_step_3(reference, tmp_path / "missing")
    rewrite(run, 3, lambda state: {k: v for k, v in state.items() if k != "schedule"})
    with pytest.raises(ConfigError, match=r"^--resume: checkpoint .*step-00000003: no 'schedule' state, which this"):
        Trainer(smoke(run, 6), resume="auto")


def test_rng_states_of_another_number_of_ranks_are_re_derived_per_rank_and_iteration() -> None:
    """One process restores its own state from a list of one; from a list of two (an elastic resume) it re-seeds
    Python, NumPy and torch from (run seed, rank, iteration): the same draws on every such resume, other draws at
    another iteration, seed or rank, and not the draws of the saved state."""

    def draws_after(states: list, seed: int = 3, iteration: int = 8, rank: int = 0, ranks: int = 1) -> list:
        ctx = DistContext(rank, ranks, rank, torch.device("cpu"), "none", False)  # no process group: nothing gathered
        RngState(ctx, seed, TrainState(iteration=iteration)).load_state_dict(states)
        return [random.random(), float(np.random.rand()), *torch.rand(2).tolist()]

    saved = capture_rng()
    own = draws_after([saved])
    assert own == draws_after([saved])  # restored
    first = draws_after([saved, saved])  # a 2-rank checkpoint resumed by one process
    assert first == draws_after([saved, saved]) and first != own
    assert draws_after([saved, saved], iteration=9) != first and draws_after([saved, saved], seed=4) != first
    three = [saved] * 3  # ranks 0 and 1 of 2 resuming a 3-rank run
    assert draws_after(three, ranks=2) == first and draws_after(three, rank=1, ranks=2) != first
    restore_rng(saved)  # leave the global RNGs as the test found them


def test_an_optimizer_state_keyed_by_number_or_name_loads_under_every_strategy() -> None:
    """none/ddp number the optimizer's parameters, fsdp names them: a state in either form is rekeyed onto this
    optimizer's (by place for numbers, by name for names); a name the model lacks is one ValueError line."""
    from drivetrain.engine.strategy import _param_names, _rekeyed

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    numbered = optimizer.state_dict()
    names = _param_names(model, optimizer)
    named = _rekeyed(numbered, names, names)
    assert list(named["state"]) == ["0.weight", "0.bias", "1.weight", "1.bias"] == named["param_groups"][0]["params"]
    back = _rekeyed(named, names, list(range(len(names))))
    assert back["param_groups"] == numbered["param_groups"]
    for key, state in numbered["state"].items():
        assert all(torch.equal(value, back["state"][key][k]) for k, value in state.items())
    with pytest.raises(ValueError, match=r"^optimizer: the checkpoint holds parameter '2\.weight', which this model"):
        _rekeyed({**named, "param_groups": [{**named["param_groups"][0], "params": ["2.weight"]}]}, names, names)


class _Streams(torch.nn.Module):
    """A streaming model's state alone: StreamPETR's memory bank behind the StreamMemory protocol."""

    def __init__(self) -> None:
        super().__init__()
        self.memory = MemoryBank(embed_dims=4, memory_len=6, topk=2, num_propagated=2)

    def stream_state(self) -> dict[str, torch.Tensor]:
        return self.memory.get_extra_state()

    def load_stream_state(self, state: dict[str, torch.Tensor]) -> None:
        self.memory.set_extra_state(state)

    def walk(self, streams: list[int]) -> None:
        """One frame of each of these streams (stream ``s``'s memory is filled with ``s``)."""
        b = len(streams)
        self.memory.pre_update(torch.zeros(b), torch.zeros(b, dtype=torch.float64), torch.eye(4).expand(b, 4, 4))
        self.memory.embedding = torch.tensor(streams, dtype=torch.float32).view(b, 1, 1).expand(b, 6, 4).clone()


def test_every_ranks_streams_are_checkpointed_and_dealt_to_any_split_of_them() -> None:
    """Two ranks × 2 streams saved; resumed as 1 rank × 4 and as 4 ranks × 1, each rank holds its streams' memory
    (not rank 0's, which the model state alone would give every rank); another number of streams is one line."""
    assert isinstance(StreamPETR, type) and issubclass(StreamPETR, StreamMemory)
    saved = []
    for rank in range(2):
        model = _Streams()
        model.walk([2 * rank, 2 * rank + 1])
        ctx = DistContext(rank, 2, rank, torch.device("cpu"), "ddp", False)  # no group: what each rank gathers
        saved += StreamState(ctx, model, 2).state_dict()
    for batch_size, ranks in ((4, 1), (1, 4), (2, 2)):
        for rank in range(ranks):
            model = _Streams()
            ctx = DistContext(rank, ranks, rank, torch.device("cpu"), "ddp", False)
            StreamState(ctx, model, batch_size).load_state_dict(saved)
            expected = torch.arange(rank * batch_size, (rank + 1) * batch_size, dtype=torch.float32)
            assert torch.equal(model.memory.embedding[:, 0, 0], expected)
    model = _Streams()
    model.walk([9])
    StreamState(DistContext(0, 1, 0, torch.device("cpu"), "none", False), model, 1).load_state_dict(None)
    assert model.memory.embedding[0, 0, 0] == 9  # an older checkpoint: the model state's memory stays
    with pytest.raises(ValueError, match=r"^streams: .* 4 scene streams, this run walks 2 × 1; set data\.batch_size=4"):
        StreamState(DistContext(0, 1, 0, torch.device("cpu"), "none", False), _Streams(), 2).load_state_dict(saved)
