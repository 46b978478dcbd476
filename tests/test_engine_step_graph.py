"""``speed.compile_step`` (:mod:`drivetrain.engine.build`): PointPillars' forward and loss as one compiled graph
per bucket, every bucket compiled before step 1, none inside the steps, exact resume; the one-line refusals.

The runs use ``torch.compile``'s ``aot_eager`` backend (``speed.compile_step_backend``): the same graph capture, the
forward and backward graphs, without code generation (inductor's minutes per bucket belong in the benchmarks), and
the dense assignment at one ground-truth bucket (``window=false``, ``max_targets=64``) and one voxel bucket at
``max_voxels`` (``step_voxels=8000``): one bucket to compile."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from drivetrain.cli.main import main
from drivetrain.engine import batches as batches_module
from drivetrain.engine.build import StepGraph, dynamo_graphs
from drivetrain.engine.config import ConfigError, load_config
from drivetrain.engine.trainer import Trainer
from helpers.engine import final_state, losses, metrics
from helpers.nosync import allow_host_sync
from helpers.streampetr import SMALL
from test_engine_step_syncs import _watched

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "pointpillars_tiny.yaml"
QUIET = ["run.threads=1", "log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.at_start=false"]
STEP_GRAPH = ["speed.compile_step=true", "speed.compile_step_backend=aot_eager", "model.args.window=false",
              "model.args.max_targets=64", "model.args.step_voxels=8000"]  # fmt: skip


def _argv(out: Path, synth_root: Path, *extra: str) -> list[str]:
    data = {"index": str(synth_root / "drivetrain_index.npz"), "split": "mini_train", "load_images": False,
            "load_points": True, "num_sweeps": 1, "use_dim": [0, 1, 2, 4]}  # fmt: skip
    return ["train", "--config", str(TINY), f"run.out_dir={out}", *QUIET, "data.name=frames",
            f"data.args={json.dumps(data)}", "data.batch_size=2", "checkpoint.every=2", "train.device=cpu",
            "run.deterministic=true", *extra]  # fmt: skip


def _train(capfd, argv: list[str]) -> str:
    capfd.readouterr()
    assert main(argv) == 0
    return capfd.readouterr().err


def test_the_compiled_step_compiles_before_step_one_and_resumes_exactly(synth_root, synth_index, tmp_path, capfd):
    straight, split, eager = tmp_path / "straight", tmp_path / "split", tmp_path / "eager"
    err = _train(capfd, _argv(straight, synth_root, "train.steps=4", *STEP_GRAPH))
    buckets = [line for line in err.splitlines() if line.startswith("speed.compile_step: bucket ")]
    assert len(buckets) == 1 and buckets[0].endswith(" s"), err  # one line per bucket, with its seconds
    assert "speed.compile_step: 1 bucket compiled in " in err  # then their total
    assert "inside steps" not in err  # no graph compiled during the 4 steps
    first = _train(capfd, _argv(split, synth_root, "train.steps=2", *STEP_GRAPH))
    resumed = _train(capfd, [*_argv(split, synth_root, "train.steps=4", *STEP_GRAPH), "--resume", "auto"])
    assert "inside steps" not in first + resumed
    assert losses(split) == losses(straight)
    want, got = final_state(straight), final_state(split)
    assert all(torch.equal(got["model"][key], value) for key, value in want["model"].items())
    assert "speed.compile_step: optimizer update compiled in " in err  # the update too: before step 1
    want_state, got_state = want["optimizer"]["state"], got["optimizer"]["state"]  # moments and step counters
    assert want_state.keys() == got_state.keys()
    assert all(torch.equal(got_state[p][k], v) for p, entry in want_state.items() for k, v in entry.items())
    # the compiled step computes the eager forward + loss: the first step's loss (same weights, same batch) within
    # float32 summation over the loss's B·A anchors (2 samples × a 64 × 64 map × 6 anchors)
    _train(capfd, _argv(eager, synth_root, "train.steps=1", "model.args.window=false"))
    rtol = 2 * 64 * 64 * 6 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(losses(straight)[0], losses(eager)[0], rtol=rtol, atol=0.0)


def test_a_checkpoint_of_the_eager_step_resumes_with_the_compiled_update(synth_root, synth_index, tmp_path, capfd):
    """An eager run's checkpoint (float lr, CPU step counters) continues with speed.compile_step on: the update
    compiles before its first step and nothing inside, and the checkpoint it writes is in the eager form again, every
    parameter updated twice."""
    run = tmp_path / "run"
    _train(capfd, _argv(run, synth_root, "train.steps=1", *STEP_GRAPH[2:]))  # the model's args of the resumed run
    err = _train(capfd, [*_argv(run, synth_root, "train.steps=2", *STEP_GRAPH), "--resume", "auto"])
    assert "speed.compile_step: optimizer update compiled in " in err and "inside steps" not in err, err
    optimizer = final_state(run)["optimizer"]
    assert all(isinstance(group["lr"], float) and not group["capturable"] for group in optimizer["param_groups"])
    steps = [state["step"] for state in optimizer["state"].values()]
    assert steps and all(step.device.type == "cpu" and step.item() == 2 for step in steps)


@pytest.mark.slow  # ~25 s (two runs of 4 steps, one compiling its bucket and update)
def test_fp16_through_the_compiled_step_skips_and_scales_as_the_eager_step(synth_root, synth_index, tmp_path, capfd):
    """fp16 with the loss scaler (the run book's part 6 precision) through the compiled step and update: autocast at
    the call as at the trace, the scale multiplying the loss outside the graph, unscaling, the overflow decision, the
    scaler and the undo of a skipped update outside it too. From a scale of 2**40, backing off by 2**-8 on each
    overflow, the first three steps overflow and skip, the fourth updates: the same steps, scales and update count as
    the eager step, and every loss within the float32 summation bound of the first test (aot_eager runs the ATen ops
    of the eager forward on the same fp16 values; steps 2-4 start from weights every skip put back)."""
    fp16 = ["precision.mode=fp16", "precision.init_scale=1099511627776", "precision.backoff_factor=0.00390625",
            "precision.hysteresis=1", "train.steps=4", "log.every=1"]  # fmt: skip
    eager, graph = tmp_path / "eager", tmp_path / "graph"
    _train(capfd, _argv(eager, synth_root, *fp16, *STEP_GRAPH[2:]))  # the compiled run's model args, eager
    err = _train(capfd, _argv(graph, synth_root, *fp16, *STEP_GRAPH))
    assert "inside steps" not in err, err
    decisions = {
        name: [(m["skipped_steps"], m["opt_step"], m["loss_scale"]) for m in metrics(run)]
        for name, run in (("eager", eager), ("graph", graph))
    }
    assert decisions["graph"] == decisions["eager"] == [(1, 0, 2.0**40), (2, 0, 2.0**32), (3, 0, 2.0**24),
                                                         (3, 1, 2.0**16)]  # fmt: skip
    rtol = 2 * 64 * 64 * 6 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(losses(graph), losses(eager), rtol=rtol, atol=0.0)


def test_the_compiled_dense_step_adds_no_host_read(synth_root, synth_index, tmp_path):
    """With the dense assignment the bucket is the batch's shapes: the iteration keeps its one read, after the update
    (the windowed step reads its pair total once more, before the graph)."""
    argv = _argv(tmp_path, synth_root, "train.steps=4", *STEP_GRAPH)
    trainer = Trainer(load_config(TINY, argv[3:]))
    seen = _watched(trainer)
    trainer.fit()
    trainer.close()
    # every iteration is watched, the first too: the compiled update's optimizer state exists before step 1
    assert len(seen) == 4 and trainer.step_graph.compiles_in_steps == 0
    assert all(len(record["passed"]) == 1 and record["before_update"] == 0 for record in seen), seen


def _bounded_as_on_a_gpu(monkeypatch) -> None:
    """Make the trainer take a GPU run's path on this CPU: the prefetcher bounds each batch's bucket on the host
    before the device augmentation (:func:`~drivetrain.engine.batches._augmented_shapes` given a CUDA device, which it
    only reads for its type and its matmul roundoff: float32 here)."""
    original = batches_module._augmented_shapes
    monkeypatch.setattr(
        batches_module, "_augmented_shapes", lambda cfg, model, augment, device: original(cfg, model, augment, CUDA)
    )


CUDA = torch.device("cuda")


def test_with_device_augmentation_the_bucket_is_bounded_on_the_host_before_it(
    synth_root, synth_index, tmp_path, monkeypatch
):
    """``data.augment_on=device`` (the default) on a GPU: the prefetcher bounds each batch's bucket from the host batch
    and the augmentation's parameters (the model's ``step_shapes_augmented``), the step takes it and reads nothing
    before the update; on a CPU run the augmented batch is on the host and counted there."""
    on_cpu = Trainer(load_config(TINY, _argv(tmp_path / "cpu", synth_root, "train.steps=1", *STEP_GRAPH)[3:]))
    assert on_cpu.step_graph.host_batches and on_cpu.step_graph.handed_shapes is None  # the host's own batch
    on_cpu.close()
    _bounded_as_on_a_gpu(monkeypatch)
    trainer = Trainer(load_config(TINY, _argv(tmp_path / "bound", synth_root, "train.steps=4", *STEP_GRAPH)[3:]))
    assert trainer.step_graph.handed_shapes is not None
    bounded, augmented = [], trainer.model.step_shapes_augmented

    def recorded(*args):
        bounded.append(augmented(*args))
        return bounded[-1]

    trainer.model.step_shapes_augmented = recorded
    trainer.model.step_shapes = None  # the device count would fail the step: the bound must be the one taken
    trainer.model.step_shapes_on_host = None
    seen = _watched(trainer)
    trainer.fit()
    trainer.close()
    assert len(bounded) == 4 and all(shapes is not None for shapes in bounded)
    assert len(seen) == 4 and trainer.step_graph.compiles_in_steps == 0
    assert all(len(record["passed"]) == 1 and record["before_update"] == 0 for record in seen), seen


# the windowed assignment at one voxel bucket: the pairs' bucket and the overflow one (2 buckets)
WINDOWED = ["speed.compile_step=true", "speed.compile_step_backend=aot_eager", "model.args.max_targets=64",
            "model.args.step_voxels=8000"]  # fmt: skip


@pytest.mark.slow  # ~25 s (two runs: two buckets compiled, 4 steps each); the default set checks the host choice
def test_with_host_batches_the_compiled_step_reads_the_device_once_after_the_update(
    synth_root, synth_index, tmp_path, monkeypatch
):
    """``data.augment_on=worker``: the loader hands out final batches on the host, the bucket (the windows' pair
    count) is chosen there before the copy, and the iteration's one read stays after the update; with the
    augmentation on the device (the default, as on a GPU) the bucket is bounded on the host before it, and the one
    read stays after the update too."""
    trainer = Trainer(
        load_config(TINY, _argv(tmp_path, synth_root, "train.steps=4", *WINDOWED, "data.augment_on=worker")[3:])
    )
    assert trainer.step_graph.host_batches
    chosen, on_host = [], trainer.model.step_shapes_on_host

    def counted(batch):
        with allow_host_sync():  # host work on the loader's CPU batch (the engine runs it under host_work)
            chosen.append(on_host(batch))
        return chosen[-1]

    trainer.model.step_shapes_on_host = counted
    seen = _watched(trainer)
    trainer.fit()
    trainer.close()
    assert len(chosen) == 4 and all(shapes.pairs > 0 for shapes in chosen)
    # every iteration is watched, the first too: the compiled update's optimizer state exists before step 1
    assert len(seen) == 4 and trainer.step_graph.compiles_in_steps == 0
    assert all(len(record["passed"]) == 1 and record["before_update"] == 0 for record in seen), seen

    # data.augment_on=device as on a GPU: the windows' pairs and the voxels bounded on the host before the augmentation
    _bounded_as_on_a_gpu(monkeypatch)
    bound = Trainer(load_config(TINY, _argv(tmp_path / "bound", synth_root, "train.steps=4", *WINDOWED)[3:]))
    bounded, augmented = [], bound.model.step_shapes_augmented

    def recorded(*args):
        with allow_host_sync():  # host work on the loader's CPU batch (a helper thread's on a GPU)
            bounded.append(augmented(*args))
        return bounded[-1]

    bound.model.step_shapes_augmented = recorded
    seen = _watched(bound)
    bound.fit()
    bound.close()
    assert len(bounded) == 4 and all(shapes is not None and shapes.pairs > 0 for shapes in bounded)
    assert len(seen) == 4 and bound.step_graph.compiles_in_steps == 0
    assert all(len(record["passed"]) == 1 and record["before_update"] == 0 for record in seen), seen


class _TenBuckets(torch.nn.Module):
    """A static step of ten buckets (more than dynamo's default ``recompile_limit`` of 8 graphs per function): one
    linear layer over a ``(B, S, 1)`` input, ``S`` the bucket."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)

    def step_buckets(self, batch_size: int) -> tuple[int, ...]:
        return tuple(range(1, 11))

    def step_shapes(self, batch) -> int:
        return 10

    def step_inputs(self, batch, shapes: int, batch_size: int, device: torch.device) -> tuple[torch.Tensor]:
        return (torch.ones(batch_size, shapes, 1, device=device),)

    def step_loss(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.linear(x).sum()}


def test_every_bucket_compiles_before_step_one_past_dynamos_recompile_limit():
    torch._dynamo.reset()
    model = _TenBuckets()
    graph = StepGraph(model, "eager", 2, torch.device("cpu"))
    lines: list[str] = []
    graph.compile_all(lines.append, contextlib.nullcontext)
    assert len(lines) == 11 and lines[-1].startswith("speed.compile_step: 10 buckets compiled in "), lines
    assert graph.compile_seconds > 0
    before = dynamo_graphs()
    for shapes in graph.buckets:  # every bucket runs from its compiled graph: nothing compiles again
        with graph._limit():
            graph.fn(*model.step_inputs(None, shapes, 2, torch.device("cpu")))
    assert dynamo_graphs() == before


def test_compile_step_without_the_capability_is_one_line_naming_the_model(tmp_path):
    cfg = load_config(ROOT / "configs" / "smoke.yaml", [f"run.out_dir={tmp_path}", *QUIET, "speed.compile_step=true"])
    with pytest.raises(ConfigError, match=r"^speed\.compile_step: model 'smoke' has no static training step") as err:
        Trainer(cfg)
    assert "\n" not in str(err.value) and not any(tmp_path.iterdir())  # nothing written


def test_compile_step_names_the_argument_a_model_cannot_compile_with(tmp_path):
    cfg = load_config(ROOT / "configs" / "voxelnet_tiny.yaml", [f"run.out_dir={tmp_path}", *QUIET, *STEP_GRAPH])
    with pytest.raises(ConfigError, match=r"^speed\.compile_step: model\.args\.middle: the static step covers "):
        Trainer(cfg)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["distributed.strategy=fsdp"],
            r"speed\.compile_step: needs distributed\.strategy none or ddp, got fsdp: FSDP2 gathers each unit's ",
        ),
        (["speed.compile=['']"], r"speed\.compile_step: not with speed\.compile: "),
        (["speed.encoder_overlap=true"], r"speed\.encoder_overlap: not with speed\.compile_step: the compiled step "),
        (["speed.compile_step_backend="], r"speed\.compile_step_backend: must name a torch\.compile backend$"),
        (["speed.compile_step_mode=fast"], r"speed\.compile_step_mode: expected one of 'default', 'reduce-overhead'"),
        (
            ["speed.compile_step_mode=reduce-overhead", "speed.compile_step_backend=aot_eager"],
            r"speed\.compile_step_mode: reduce-overhead needs speed\.compile_step_backend inductor, got aot_eager$",
        ),
        (
            ["speed.compile_step_mode=reduce-overhead", "train.accumulation=2"],
            r"speed\.compile_step_mode: reduce-overhead needs train\.accumulation 1, got 2: ",
        ),
    ],
)
def test_compile_step_refuses_what_it_cannot_do_yet_in_one_line(extra, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(TINY, ["speed.compile_step=true", *extra])
    assert "\n" not in str(err.value)


def test_compile_step_refuses_deepspeed_in_one_line(monkeypatch):
    """Whether or not deepspeed is installed here (the config's check of the package, answered yes)."""
    monkeypatch.setattr("drivetrain.engine.config.module_available", lambda name: True)
    with pytest.raises(
        ConfigError, match=r"speed\.compile_step: needs distributed\.strategy none or ddp, got deepspeed: DeepSpeed's "
    ) as err:
        load_config(TINY, ["speed.compile_step=true", "distributed.strategy=deepspeed"])
    assert "\n" not in str(err.value)


def test_reduce_overhead_needs_the_compiled_step():
    with pytest.raises(
        ConfigError, match=r"speed\.compile_step_mode: reduce-overhead replays the compiled step: "
    ) as err:
        load_config(TINY, ["speed.compile_step_mode=reduce-overhead"])
    assert "\n" not in str(err.value)


def test_reduce_overhead_on_a_cpu_run_is_one_line_naming_the_mode(tmp_path):
    """CUDA graphs replay on a CUDA device only: a CPU run with the mode stops before it writes anything."""
    cfg = load_config(TINY, [f"run.out_dir={tmp_path}", *QUIET, "train.device=cpu", "speed.compile_step=true",
                             "speed.compile_step_mode=reduce-overhead"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"^speed\.compile_step_mode: reduce-overhead replays CUDA graphs, ") as err:
        Trainer(cfg)
    assert "\n" not in str(err.value) and not any(tmp_path.iterdir())


def test_reduce_overhead_refuses_an_accumulation_derived_from_the_global_batch():
    """``train.global_batch`` sets the accumulation on each start (ranks known): the same line then."""
    from drivetrain.engine.config import with_global_batch

    cfg = load_config(TINY, ["speed.compile_step=true", "speed.compile_step_mode=reduce-overhead",
                             "data.batch_size=2", "train.global_batch=8"])  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"speed\.compile_step_mode: reduce-overhead needs train\.accumulation 1, got 4"
    ):
        with_global_batch(cfg, 1)


# ------------------------------------------------------------------------------------------------------ StreamPETR
SPETR = ROOT / "configs" / "streampetr_tiny.yaml"
SPETR_GRAPH = {**SMALL, "static_targets": True, "step_images": [6, 90, 160], "step_targets": [64]}  # one bucket


def _spetr_argv(out: Path, synth_root: Path, *extra: str, compiled: bool = True) -> list[str]:
    data = {"index": str(synth_root / "drivetrain_index.npz"), "split": "mini_train"}
    step = ["speed.compile_step=true", "speed.compile_step_backend=aot_eager"] if compiled else []
    return ["train", "--config", str(SPETR), f"run.out_dir={out}", *QUIET, "data.name=frames",
            f"data.args={json.dumps(data)}", f"model.args={json.dumps(SPETR_GRAPH)}", "data.batch_size=2",
            "checkpoint.every=2", "train.device=cpu", "run.deterministic=true", *step, *extra]  # fmt: skip


@pytest.mark.slow  # ~60 s: four trainer runs, three compiles (the step itself: test_models_streampetr_static.py)
def test_streampetrs_compiled_step_carries_its_memory_and_resumes_exactly(synth_root, synth_index, tmp_path, capfd):
    """StreamPETR through ``speed.compile_step`` (its memory bank passed into the graph and written back in place):
    its one bucket compiled before step 1, nothing inside the 4 steps (their memory, their scene starts), 2 + 2 steps
    bit-equal to 4 (weights and every stream's memory), and the first step's loss the eager static path's."""
    straight, split, eager = tmp_path / "straight", tmp_path / "split", tmp_path / "eager"
    err = _train(capfd, _spetr_argv(straight, synth_root, "train.steps=4"))
    buckets = [line for line in err.splitlines() if line.startswith("speed.compile_step: bucket ")]
    assert len(buckets) == 1 and "targets=64" in buckets[0], err
    assert "inside steps" not in err
    first = _train(capfd, _spetr_argv(split, synth_root, "train.steps=2"))
    resumed = _train(capfd, [*_spetr_argv(split, synth_root, "train.steps=4"), "--resume", "auto"])
    assert "inside steps" not in first + resumed
    assert losses(split) == losses(straight)
    want, got = final_state(straight)["model"], final_state(split)["model"]
    memory = want["memory._extra_state"]  # the bank's tensors, (B, K+M, ·) each
    assert memory and all(torch.equal(got["memory._extra_state"][name], value) for name, value in memory.items())
    assert all(torch.equal(got[key], value) for key, value in want.items() if isinstance(value, torch.Tensor))
    # The same first step eagerly (same weights, batch and random draws): the terms differ only where the compiled
    # step pads the 2D boxes further (to 64 per image, the eager static path to their own bucket), a reordered float32
    # sum of at most n = B·N·64 non-negative elements in the focal head's box terms: rtol 2n·u.
    _train(capfd, _spetr_argv(eager, synth_root, "train.steps=1", compiled=False))
    rtol = 2 * 2 * 6 * 64 * torch.finfo(torch.float32).eps / 2
    torch.testing.assert_close(losses(straight)[0], losses(eager)[0], rtol=rtol, atol=0.0)


class _Dropping(torch.nn.Module):
    """A StaticStep model with one bucket whose step is a linear layer under dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, batch):
        return torch.nn.functional.dropout(self.linear(batch), 0.5, self.training)

    def loss(self, outputs, batch):
        return {"loss": outputs.square().mean()}

    def step_buckets(self, batch_size):
        return (0,)

    def step_shapes(self, batch):
        return 0

    def step_inputs(self, batch, shapes, batch_size, device):
        return (torch.ones(batch_size, 64, device=device) if batch is None else batch,)

    def step_loss(self, batch):
        return self.loss(self(batch), batch)


def test_the_inductor_step_draws_dropout_as_the_eager_step_does():
    """With inductor the step graph draws its random numbers with torch's generator in the eager order
    (``fallback_random``): from the same RNG state, the compiled step's loss is the eager step's (inductor's own
    generator would draw other masks, of the same distribution)."""
    from drivetrain.engine.build import StepGraph

    torch.manual_seed(0)
    model = _Dropping().train()
    graph = StepGraph(model, "inductor", 8, torch.device("cpu"))
    graph.compile_all(lambda line: None, contextlib.nullcontext)
    batch = torch.randn(8, 64)
    state = torch.get_rng_state()
    compiled = graph(batch)["loss"]
    torch.set_rng_state(state)
    eager = model.step_loss(batch)["loss"]
    # the same masks and the same sums, up to the order inductor sums 8·64 squares in: rtol 2n·u
    torch.testing.assert_close(compiled, eager, rtol=2 * 8 * 64 * torch.finfo(torch.float32).eps / 2, atol=0.0)
    assert graph.compiles_in_steps == 0


class _Asking(_Dropping):
    """:class:`_Dropping` asking for inductor's own random numbers on a CPU (StepCompileOptions)."""

    def step_compile_options(self, device):
        return {"fallback_random": False} if device.type == "cpu" else {}


def test_a_models_own_inductor_options_go_on_top_of_the_engines():
    from drivetrain.engine.build import step_compile_options
    from drivetrain.engine.protocol import StepCompileOptions

    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # a device object: no CUDA needed
    assert isinstance(_Asking(), StepCompileOptions) and not isinstance(_Dropping(), StepCompileOptions)
    assert step_compile_options(_Dropping(), cpu) == {"fallback_random": True, "cpp_wrapper": True}
    assert step_compile_options(_Asking(), cpu) == {"fallback_random": False, "cpp_wrapper": True}
    assert step_compile_options(_Asking(), cuda, "reduce-overhead") == {
        "triton.cudagraphs": True, "fallback_random": True, "cpp_wrapper": False}  # fmt: skip
    # the step graph compiles with them (torch.compile is lazy: nothing compiles here)
    assert StepGraph(_Asking(), "inductor", 8, cpu).options["fallback_random"] is False
    assert StepGraph(_Asking(), "aot_eager", 8, cpu).options is None


def test_streampetr_asks_for_contiguous_layouts_on_a_cpu_where_its_groupnorm_groups_are_narrow():
    """The tiny backbone's GroupNorm(8) at width 32 holds 4 channels a group (inductor's channels-last kernels fill 4
    of 16 lanes): layout optimisation off on a CPU. At width 128 (16 and 32 a group) with the focal head's
    GroupNorm(32) over 512 channels (16 a group), and on CUDA, nothing is asked."""
    from drivetrain.models.streampetr import StreamPETR

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    narrow = StreamPETR(**{**SMALL, "backbone_args": {"width": 32}, "static_targets": True})
    assert narrow.step_compile_options(cpu) == {"layout_optimization": False}
    assert narrow.step_compile_options(cuda) == {}
    wide = StreamPETR(**{**SMALL, "backbone_args": {"width": 128}, "embed_dims": 512, "static_targets": True})
    assert wide.step_compile_options(cpu) == {}
    graph = StepGraph(narrow, "inductor", 2, cpu)
    assert graph.options["layout_optimization"] is False and graph.options["fallback_random"] is True


class _TwoBuckets(_Dropping):
    """:class:`_Dropping` with two buckets (rows 8 and 16 of the batch)."""

    def step_buckets(self, batch_size):
        return (8, 16)

    def step_inputs(self, batch, shapes, batch_size, device):
        return (torch.ones(shapes, 64, device=device),)


def test_every_bucket_compiles_from_no_gradient():
    """Each bucket's warm-up backward starts from no gradient: under CUDA graphs the gradients one bucket's backward
    leaves are outputs in the pool, freed when the next bucket's iteration begins, so accumulating into them fails."""
    model = _TwoBuckets().train()
    graph = StepGraph(model, "aot_eager", 2, torch.device("cpu"))
    seen = []

    def call(*inputs):
        seen.append([p.grad is None for p in model.parameters()])
        return graph.fn(*inputs)

    graph.compile_all(lambda line: None, contextlib.nullcontext, call)
    assert seen == [[True, True], [True, True]]
    assert all(p.grad is None for p in model.parameters())
