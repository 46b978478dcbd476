"""drivetrain.profile.runbook: the GPU check's budget, caps, skips, parts, summary and tarballs, with a fake step
runner and a fake clock (no benchmark runs here), plus scripts/gpu_results.sh on good and hostile tarballs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from drivetrain.profile.runbook import (
    PART_BUDGET_S,
    PARTS,
    RESERVE_S,
    SETUP_S,
    Step,
    collect,
    pack,
    plan,
    result_notes,
    run_book,
    select,
    subprocess_runner,
    summary,
)

ROOT = Path(__file__).resolve().parents[1]


class FakeMachine:
    """A clock and a runner: each step 'takes' its scripted seconds, or its cap if that is shorter."""

    def __init__(self, takes: dict[str, float], rc: dict[str, int] | None = None) -> None:
        self.now = 1000.0
        self.takes, self.rc = takes, rc or {}
        self.calls: list[tuple[str, float, float]] = []  # (name, cap, clock at start)

    def clock(self) -> float:
        return self.now

    def runner(self, step: Step, cap: float) -> tuple[int, float, bool]:
        self.calls.append((step.name, cap, self.now))
        seconds = min(self.takes[step.name], cap)
        self.now += seconds
        timed_out = self.takes[step.name] > cap
        return (124 if timed_out else self.rc.get(step.name, 0)), seconds, timed_out


def step(name: str, expected: float, cap: float, priority: int = 1, part: int = 1, skip: str = "") -> Step:
    return Step(name, priority, part, expected, cap, ("true",) if not skip else (), skip)


def test_a_step_that_does_not_fit_is_skipped_and_named_and_later_ones_still_run():
    steps = [step("a", 10, 30), step("big", 50, 100), step("c", 5, 10)]
    fake = FakeMachine({"a": 10, "big": 50, "c": 4})
    outcomes = run_book(steps, 60, fake.runner, clock=fake.clock, reserve_s=5)
    # After a: 60 - 10 - 5 = 45 s left, less than big's 50.
    assert [(o.step.name, o.status) for o in outcomes] == [("a", "ok"), ("big", "skipped"), ("c", "ok")]
    assert [name for name, _, _ in fake.calls] == ["a", "c"]
    assert outcomes[1].label() == "skipped (needs ~50 s, 45 s left)"
    text = summary(outcomes, title="t")
    assert "Skipped: big." in text and "| big | 1 | skipped (needs ~50 s, 45 s left) | – | – | 50 |" in text


def test_steps_run_in_priority_order_whatever_order_they_come_in():
    steps = [step("late", 1, 5, priority=6), step("first", 1, 5, priority=1), step("second", 1, 5, priority=2)]
    fake = FakeMachine({"late": 1, "first": 1, "second": 1})
    outcomes = run_book(steps, 100, fake.runner, clock=fake.clock)
    assert [o.step.name for o in outcomes] == ["first", "second", "late"]


@pytest.mark.parametrize("seed", range(20))
def test_caps_never_exceed_the_step_cap_or_what_remains_of_the_budget(seed):
    rng = random.Random(seed)
    steps = [step(f"s{i}", rng.uniform(1, 60), rng.uniform(60, 200), priority=rng.randint(1, 6)) for i in range(12)]
    fake = FakeMachine({s.name: rng.uniform(0, 250) for s in steps})
    budget, reserve, started = rng.uniform(50, 600), rng.uniform(0, 30), fake.now - rng.uniform(0, 40)
    outcomes = run_book(steps, budget, fake.runner, clock=fake.clock, started=started, reserve_s=reserve)
    by_name = {s.name: s for s in steps}
    for name, cap, at in fake.calls:
        left = budget - (at - started) - reserve
        assert cap <= by_name[name].cap_s and cap <= left + 1e-9
        assert by_name[name].expected_s <= left  # it was expected to fit
    # With every step held to its cap, the run ends inside the budget, leaving the reserve for packing.
    if fake.calls:
        assert fake.now - started <= budget - reserve + 1e-9
    assert len(outcomes) == len(steps)
    assert {o.status for o in outcomes} <= {"ok", "timed out", "skipped"}


def test_a_timed_out_step_is_recorded_with_its_seconds_and_a_failed_one_with_its_rc():
    steps = [step("slow", 10, 30), step("bad", 1, 10)]
    fake = FakeMachine({"slow": 500, "bad": 2}, rc={"bad": 3})
    outcomes = run_book(steps, 1000, fake.runner, clock=fake.clock)
    assert outcomes[0].status == "timed out" and outcomes[0].label() == "timed out after 30 s"
    assert outcomes[1].status == "failed" and outcomes[1].label() == "failed (3)"
    text = summary(outcomes, title="t", tails={"slow": "step 3 of 10"})
    assert "| slow | 1 | timed out after 30 s | 30 | 30 | 10 |" in text
    assert "| bad | 1 | failed (3) | 2 | 10 | 1 |" in text
    assert "## slow: last lines of slow.log" in text and "step 3 of 10" in text


def test_progress_is_told_before_each_step_that_runs_and_at_the_end():
    steps = [step("a", 10, 30), step("big", 500, 600), step("c", 5, 10)]
    fake = FakeMachine({"a": 10, "c": 4})
    seen = []

    def progress(outcomes, running, after):
        seen.append(([o.step.name for o in outcomes], running and running.name, [s.name for s in after]))
        if running is not None:  # told before the step starts: the machine has not run it yet
            assert running.name not in [name for name, _, _ in fake.calls]

    run_book(steps, 100, fake.runner, clock=fake.clock, reserve_s=5, progress=progress)
    assert seen == [([], "a", ["big", "c"]), (["a", "big"], "c", []), (["a", "big", "c"], None, [])]


def test_a_summary_written_during_the_run_names_the_running_step_and_those_not_reached():
    steps = [step("a", 10, 30), step("b", 20, 40), step("c", 5, 10, skip="GPU only")]
    outcomes = run_book(steps[:1], 100, FakeMachine({"a": 10}).runner)
    text = summary(outcomes, title="t", running=steps[1], after=steps[2:])
    assert "| a | 1 | ok | 10 | 30 | 10 |" in text
    assert "| b | 1 | running | – | – | 20 |" in text and "| c | 1 | not reached | – | – | – |" in text
    assert "In progress: 1 steps done, b running, 1 not reached yet" in text
    assert "In progress" not in summary(outcomes, title="t")


def test_the_summary_notes_timed_steps_that_skipped_the_optimizer_and_solver_fallbacks(tmp_path):
    train, solve = step("train-x", 1, 5), step("solve", 1, 5)
    (tmp_path / "train-x-cuda.json").write_text(json.dumps({"steps": 8, "skipped_steps": 5}))
    (tmp_path / "solve-cuda.json").write_text(
        json.dumps({"config": {"gpu_solver": {"fallbacks": 2, "wrapper_calls": 0}}})
    )
    outcomes = run_book([train, solve], 100, FakeMachine({"train-x": 1, "solve": 1}).runner)
    notes = result_notes(tmp_path, outcomes, "cuda")
    assert notes[0].startswith("train-x: 5 of its 8 timed steps skipped the optimizer")
    assert notes[1].startswith("solve: the GPU solver fell back to SciPy 2 times")
    (tmp_path / "train-x-cuda.json").write_text(json.dumps({"steps": 8, "skipped_steps": 0}))
    (tmp_path / "solve-cuda.json").write_text("{not json")
    assert result_notes(tmp_path, outcomes, "cuda") == []


def test_the_summary_notes_graphs_run_without_the_cuda_graphs_asked_for(tmp_path):
    # bench train --compare speed.compile_step_mode=reduce-overhead: the compiled step is the compared run's; inductor
    # skipping CUDA graphs says so only in a log that is off by default
    train = step("train-graph-x", 1, 5)
    result = {"steps": 12, "cudagraph_skips": 0, "compared": {"steps": 12, "cudagraph_skips": 2}}
    (tmp_path / "train-graph-x-cuda.json").write_text(json.dumps(result))
    outcomes = run_book([train], 100, FakeMachine({"train-graph-x": 1}).runner)
    (note,) = result_notes(tmp_path, outcomes, "cuda")
    assert note.startswith("train-graph-x: inductor ran 2 graph(s) without CUDA graphs")
    result["compared"]["cudagraph_skips"] = 0
    (tmp_path / "train-graph-x-cuda.json").write_text(json.dumps(result))
    assert result_notes(tmp_path, outcomes, "cuda") == []


def test_the_cuda_tests_run_in_two_steps_that_stream_each_outcome():
    steps = {s.name: s for s in plan("cuda", "python3", Path("w"))}
    fast, heavy = steps["tests-cuda"], steps["tests-cuda-trainer"]
    assert (fast.priority, fast.part, heavy.part) == (1, 1, 1)
    assert list(steps).index("tests-cuda") < list(steps).index("tests-cuda-trainer")
    for s, marks in ((fast, "cuda and not heavy"), (heavy, "cuda and heavy and not compiles")):
        argv = list(s.argv)
        assert argv[len(argv) - 1 - argv[::-1].index("-m") + 1] == marks  # the last -m (the first: -m pytest)
        assert {"-v", "-rA", "--durations=15"} <= set(argv)
        assert "-q" not in argv and dict(s.env) == {"DRIVETRAIN_REQUIRE_GPU_SOLVER": "1"}
    assert all(not s.env for s in plan("cpu", "python3", Path("w")))  # the dry run has no solver to require


def test_every_cuda_test_that_trains_or_compiles_is_in_the_second_test_step():
    """The fast step must not meet a trainer run, a CLI training or an inductor compile (what the second step's
    expected seconds are sized for): every cuda test whose body does one is marked heavy."""
    import ast

    heavy_calls = ("Trainer(", "run_cli(", "subprocess.run(", "torch.compile", "fresh_dynamo", "_bench(")
    unmarked = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        module_marks = next((ast.get_source_segment(source, n) for n in tree.body if isinstance(n, ast.Assign)
                             and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)), "")  # fmt: skip
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
                continue
            marks = module_marks + " ".join(ast.get_source_segment(source, d) for d in node.decorator_list)
            body = ast.get_source_segment(source, node)
            if "mark.cuda" in marks and "mark.heavy" not in marks and any(c in body for c in heavy_calls):
                unmarked.append(f"{path.name}::{node.name}")
    assert unmarked == []


# What compiles with inductor (or replays CUDA graphs) in a test's body, or in a fixture or module name it uses
COMPILE_CALLS = ("torch.compile", "fresh_dynamo", "compile_step=true", "OptimizerGraph(", "replays_in_checkpointed")


def _compiling_cuda_tests() -> dict[str, bool]:
    """``file::test`` of every cuda test that compiles → whether it is marked ``compiles``."""
    import ast

    found = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        module_marks = next((ast.get_source_segment(source, n) for n in tree.body if isinstance(n, ast.Assign)
                             and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)), "")  # fmt: skip
        named = {}  # module-level functions (fixtures) and constants, by name
        for n in tree.body:
            if isinstance(n, ast.FunctionDef):
                named[n.name] = ast.get_source_segment(source, n)
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    named[getattr(t, "id", "")] = ast.get_source_segment(source, n)
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
                continue
            marks = module_marks + " ".join(ast.get_source_segment(source, d) for d in node.decorator_list)
            body = ast.get_source_segment(source, node)
            texts, seen = [body], {node.name}  # the body, then every module name it uses, and the names they use
            while new := [n for n in named if n and n not in seen and any(re.search(rf"\b{n}\b", t) for t in texts)]:
                seen.update(new)
                texts += [named[n] for n in new]
            if "mark.cuda" in marks and any(c in text for text in texts for c in COMPILE_CALLS):
                found[f"{path.name}::{node.name}"] = "mark.compiles" in marks
    return found


def test_every_cuda_test_that_compiles_runs_in_a_step_of_its_own_outside_part_1():
    """Inductor's cold compiles (a detector's step, forward and backward, per bucket; the compiled losses and update)
    take tens of seconds each on a GPU: with the trainer runs they overran the second test step's 240 s cap (and the
    130 s part 1 plans for it), so every cuda test that compiles is marked ``compiles`` and runs in part 7's step,
    a lease of its own; the second step leaves them out."""
    compiling = _compiling_cuda_tests()
    assert len(compiling) >= 13 and [name for name, marked in compiling.items() if not marked] == []
    steps = {s.name: s for s in plan("cuda", "python3", Path("w"))}
    heavy, compiled = steps["tests-cuda-trainer"], steps["tests-cuda-compile"]
    assert (heavy.part, compiled.part, compiled.priority) == (1, 7, 1)
    for s, marks in ((heavy, "cuda and heavy and not compiles"), (compiled, "cuda and compiles")):
        argv = list(s.argv)
        assert argv[len(argv) - 1 - argv[::-1].index("-m") + 1] == marks
        assert {"-v", "-rA", "--durations=15"} <= set(argv) and dict(s.env) == {"DRIVETRAIN_REQUIRE_GPU_SOLVER": "1"}


def test_a_test_module_that_does_not_import_there_does_not_stop_a_test_steps_other_tests(tmp_path):
    """pytest imports every test module to select by mark: one that does not import on the GPU machine (a package
    its image lacks, an API its own torch lacks) interrupted the whole step before any test ran. Each test step's
    options, on a folder of one such module and one cuda test: the test runs, the module is named as an error."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_absent.py").write_text("import drivetrain_absent_package  # noqa\n")
    (tmp_path / "tests" / "test_present.py").write_text("import pytest\n\n\n@pytest.mark.cuda\ndef test_ran():\n"
                                                       "    pass\n")  # fmt: skip
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    cuda: x\n    heavy: x\n    compiles: x\n")
    for name in ("tests-cuda", "tests-cuda-trainer", "tests-cuda-compile"):
        (s,) = [s for s in plan("cuda", sys.executable, tmp_path) if s.name == name]
        argv = list(s.argv)  # ends with "tests": the folder here
        if name != "tests-cuda":  # the marks of the other two steps: the test is heavy and compiles there
            (tmp_path / "tests" / "test_present.py").write_text(
                "import pytest\n\n\n@pytest.mark.cuda\n@pytest.mark.heavy\n@pytest.mark.compiles\ndef test_ran():\n"
                "    pass\n" if name == "tests-cuda-compile" else
                "import pytest\n\n\n@pytest.mark.cuda\n@pytest.mark.heavy\ndef test_ran():\n    pass\n"
            )  # fmt: skip
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
        assert "test_present.py::test_ran PASSED" in done.stdout, (name, done.stdout[-2000:])
        assert "1 passed" in done.stdout and "test_absent.py" in done.stdout and done.returncode != 0, name


def test_a_step_marked_not_for_this_device_is_skipped_with_its_reason_without_running():
    fake = FakeMachine({})
    outcomes = run_book([step("full", 0, 0, skip="GPU only: not in the CPU dry run")], 100, fake.runner,
                        clock=fake.clock)  # fmt: skip
    assert fake.calls == [] and outcomes[0].label() == "skipped (GPU only: not in the CPU dry run)"


def test_the_subprocess_runner_stops_a_step_at_its_cap_and_keeps_its_partial_log(tmp_path):
    slow = Step("slow", 1, 1, 1, 1, ("bash", "-c", "echo started; sleep 60"))
    rc, seconds, timed_out = subprocess_runner(tmp_path)(slow, 2)
    log = (tmp_path / "slow.log").read_text()
    assert timed_out and rc == 124 and 1.5 < seconds < 20
    assert "started" in log and "timed out after" in log and "the log above is partial" in log
    # A step that ignores SIGTERM is killed with its process group once the grace after the cap is over.
    deaf = Step("deaf", 1, 1, 1, 1, ("bash", "-c", "trap '' TERM; echo deaf; sleep 60"))  # its sleep ignores TERM too
    rc, seconds, timed_out = subprocess_runner(tmp_path, kill_after=1)(deaf, 1)
    assert timed_out and rc == -9 and seconds < 20 and "deaf" in (tmp_path / "deaf.log").read_text()
    assert "timed out after" in (tmp_path / "deaf.log").read_text()
    bad = Step("bad", 1, 1, 1, 1, (sys.executable, "-c", "import sys; print('oops'); sys.exit(3)"))
    rc, _, timed_out = subprocess_runner(tmp_path)(bad, 30)
    assert (rc, timed_out) == (3, False) and "oops" in (tmp_path / "bad.log").read_text()


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("full", [False, True])
def test_parts_partition_the_steps_exactly_once_each(device, full, tmp_path):
    steps = plan(device, "python3", tmp_path, full=full)
    names = [s.name for s in steps]
    assert len(set(names)) == len(names)
    per_part = [s.name for part in PARTS for s in select(steps, part)]
    assert sorted(per_part) == sorted(names)
    assert [s.name for s in select(steps, None)] == names
    with pytest.raises(ValueError, match="part"):
        select(steps, 9)


def test_the_steps_keep_the_issue_priority_order():
    names = [s.name for s in plan("cuda", "python3", Path("w"))]
    order = [
        "tests-cuda",
        "tests-cuda-trainer",
        "synth-full-704",
        "solve",
        "train-streampetr-full",
        "iteration-streampetr-full",
        "iteration-streampetr-tiny",
        "copy",
        "augment",
        "precision-ssn-full",
        "sweeps-ssn",
    ]
    assert [names.index(n) for n in order] == sorted(names.index(n) for n in order)
    priorities = [s.priority for s in plan("cuda", "python3", Path("w"))]
    assert priorities == sorted(priorities)


def test_part_1_measures_the_three_published_configs_in_the_trainer_and_in_the_iteration():
    """Issue 38 item 8: CUDA tests, bench solve, bench train with its profile and bench iteration --size full for
    StreamPETR, PointPillars and SSN, all in part 1 (one command of at most 9 minutes)."""
    part1 = {s.name: s.argv for s in select(plan("cuda", "python3", Path("w")), 1)}
    assert {"tests-cuda", "synth-full-704", "solve"} <= set(part1)
    for config in ("streampetr_full", "pointpillars_nus", "ssn_nus"):
        (train,) = [argv for argv in part1.values() if "train" in argv and f"configs/{config}.yaml" in argv]
        assert "--profile" in train
    for model in ("streampetr", "pointpillars", "ssn"):
        assert f"iteration-{model}-full" in part1
    assert PART_BUDGET_S[1] <= 540 and PART_BUDGET_S[1] + PART_BUDGET_S[2] <= 810  # with a 1.5-min start: 15 min


@pytest.mark.parametrize("part", sorted(PARTS))
def test_each_part_is_sized_for_one_device_command_of_at_most_nine_minutes(part):
    steps = select(plan("cuda", "python3", Path("w")), part)
    assert PART_BUDGET_S[part] <= 540
    assert SETUP_S + sum(s.expected_s for s in steps) <= PART_BUDGET_S[part] - RESERVE_S
    assert all(s.cap_s >= s.expected_s for s in steps)


def test_the_cpu_dry_run_uses_tiny_sizes_small_batches_and_the_cpu(tmp_path):
    for s in plan("cpu", "python3", tmp_path):
        argv = list(s.argv)
        if s.skip:
            assert argv == []
            continue
        if "--size" in argv:
            assert argv[argv.index("--size") + 1] == "tiny", s.name
        if "--batch" in argv:
            assert max(int(b) for b in argv[argv.index("--batch") + 1].split(",")) <= 2, s.name
        if "bench" in argv:
            assert argv[argv.index("--device") + 1] == "cpu" and str(tmp_path) in argv[argv.index("--json") + 1]
    skipped = {s.name for s in plan("cpu", "python3", tmp_path) if s.skip}
    full = ("streampetr", "pointpillars", "ssn")
    gpu_only = {"synth-full-704", *(f"iteration-{m}-full" for m in full), *(f"train-{m}-full" for m in full),
                "synth-full-704-graph", "train-graph-pointpillars-full", "train-graph-ssn-full",
                "synth-full-704-graph-camera", "train-graph-streampetr-full"}  # fmt: skip
    assert skipped == gpu_only
    assert {s.name for s in plan("cuda", "python3", tmp_path) if s.skip} == {"train-streampetr-tiny"}


def test_part_5_compares_the_eager_step_with_the_replayed_compiled_step_at_the_static_step_configs():
    """Issue 46: eager vs the compiled step replayed as CUDA graphs (bench train --compare), same process, for the
    lidar published configs with the StaticStep capability (PointPillars, SSN; StreamPETR: part 6), with
    the full synthetic set rendered in the part itself (a fresh lease has none)."""
    part5 = select(plan("cuda", "python3", Path("w")), 5)
    assert part5[0].argv[:2] == ("bash", "-c") and "synth-full-704" in part5[0].argv[2]
    compared = {}
    for s in part5[1:]:
        argv = list(s.argv)
        assert argv[3:5] == ["bench", "train"] and argv[argv.index("--device") + 1] == "cuda"
        tail = argv[argv.index("--compare") + 1 : argv.index("--json")]
        assert tail == ["speed.compile_step=true", "speed.compile_step_mode=reduce-overhead"]
        compared[argv[argv.index("--config") + 1]] = s
    assert set(compared) == {"configs/pointpillars_nus.yaml", "configs/ssn_nus.yaml"}
    assert min(s.priority for s in part5) > max(s.priority for s in select(plan("cuda", "python3", Path("w")), 1))


def test_part_6_compares_streampetrs_eager_static_step_with_its_replayed_compiled_step():
    """StreamPETR's published config, a lease of its own: the full synthetic set rendered first, then the static path
    (both sides) eager against the compiled step replayed as CUDA graphs."""
    part6 = select(plan("cuda", "python3", Path("w")), 6)
    assert part6[0].argv[:2] == ("bash", "-c") and "synth-full-704" in part6[0].argv[2]
    (compare,) = part6[1:]
    argv = list(compare.argv)
    assert argv[argv.index("--config") + 1] == "configs/streampetr_full.yaml"
    assert "model.args.static_targets=true" in argv[: argv.index("--compare")]
    tail = argv[argv.index("--compare") + 1 : argv.index("--json")]
    assert tail == ["speed.compile_step=true", "speed.compile_step_mode=reduce-overhead"]


def test_the_host_loader_result_is_named_for_the_gpu_host_only_on_cuda(tmp_path):
    cuda = {s.name: s.argv for s in plan("cuda", "python3", tmp_path)}["data-host"]
    cpu = {s.name: s.argv for s in plan("cpu", "python3", tmp_path)}["data-host"]
    assert str(tmp_path / "data-gpu-host.json") in cuda and cuda[cuda.index("--device") + 1] == "cpu"
    assert str(tmp_path / "data-host-cpu.json") in cpu


def _work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    rng = random.Random(0)
    (work / "chart.png").write_bytes(rng.randbytes(60_000))  # incompressible
    (work / "bench.log").write_text("".join(f"line {i} {rng.random()}\n" for i in range(20_000)))
    (work / "copy-cuda.json").write_text(json.dumps({"rows": []}))
    (work / "sub").mkdir()  # generated data lives in sub-folders: never packed
    (work / "sub" / "frame.bin").write_bytes(b"x" * 1000)
    return work


def _members(tarball: Path) -> dict[str, bytes]:
    with tarfile.open(tarball) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_pack_keeps_everything_when_it_fits(tmp_path):
    work = _work(tmp_path)
    note = pack(work, tmp_path / "t.tar.gz", write_summary=lambda notes: (work / "summary.md").write_text("s\n"))
    assert note == ""
    expected = {f"gpu-check/{n}" for n in ("chart.png", "bench.log", "copy-cuda.json", "summary.md")}
    assert set(_members(tmp_path / "t.tar.gz")) == expected


def test_pack_drops_pngs_then_cuts_logs_to_stay_under_the_limit_and_says_so(tmp_path):
    work = _work(tmp_path)
    seen = []

    def write_summary(notes):
        seen.append(notes)
        (work / "summary.md").write_text("packing: " + "; ".join(notes) + "\n")

    limit = 40_000  # the PNG alone is 60 kB; the log compresses to more than this
    tarball = tmp_path / "t.tar.gz"
    note = pack(work, tarball, limit=limit, write_summary=write_summary)
    assert tarball.stat().st_size <= limit
    members = _members(tarball)
    assert "gpu-check/chart.png" not in members and "gpu-check/copy-cuda.json" in members
    log = members["gpu-check/bench.log"]
    assert len(log) < (work / "bench.log").stat().st_size and log.endswith((work / "bench.log").read_bytes()[-1000:])
    assert "PNG" in note and "logs cut" in note and note in members["gpu-check/summary.md"].decode()
    assert seen[0] == [] and seen[-1] == [note]


def test_pack_refuses_when_even_the_results_are_over_the_limit(tmp_path):
    work = _work(tmp_path)
    (work / "huge-cuda.json").write_bytes(random.Random(1).randbytes(50_000))
    with pytest.raises(RuntimeError, match="limit"):
        pack(work, tmp_path / "t.tar.gz", limit=20_000, write_summary=lambda notes: None)


def _tarball(path: Path, files: dict[str, bytes], device: str = "cuda", extra: list[tarfile.TarInfo] = ()) -> Path:
    files = {"gpu-check/steps.json": json.dumps({"device": device, "part": 1, "steps": [
        {"name": "copy", "status": "ok", "seconds": 12.3}]}).encode(), **files}  # fmt: skip
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return path


def _gpu_results(*args: str) -> subprocess.CompletedProcess:
    cmd = ["bash", str(ROOT / "scripts" / "gpu_results.sh"), *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, check=False, env={**os.environ, "PYTHON": sys.executable}
    )


def test_gpu_results_copies_the_cuda_results_and_prints_what_it_wrote(tmp_path):
    files = {f"gpu-check/copy-cuda.{ext}": b"r" for ext in ("json", "md", "png")}
    files |= {"gpu-check/data-gpu-host.json": b"h", "gpu-check/copy.log": b"l", "gpu-check/tests-cuda.xml": b"x",
              "gpu-check/copy-cpu.json": b"c", "gpu-check/summary.md": b"s"}  # fmt: skip
    tarball = _tarball(tmp_path / "a.tar.gz", files)
    proc = _gpu_results(str(tarball), "--dest", str(tmp_path / "dest"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == [
        "copy-cuda.json", "copy-cuda.md", "copy-cuda.png", "data-gpu-host.json"]  # fmt: skip
    assert f"wrote {tmp_path / 'dest' / 'copy-cuda.json'}" in proc.stdout and "copy ok 12 s" in proc.stdout


def test_gpu_results_takes_nothing_from_a_cpu_dry_run(tmp_path):
    tarball = _tarball(tmp_path / "a.tar.gz", {"gpu-check/copy-cuda.json": b"r"}, device="cpu")
    written = collect([tarball], tmp_path / "dest")
    assert written == [] and not (tmp_path / "dest").exists()


@pytest.mark.parametrize("bad", ["../x", "gpu-check/../../x", "/tmp/x", "link"])
def test_gpu_results_refuses_a_hostile_tarball_and_writes_nothing(tmp_path, bad):
    good = _tarball(tmp_path / "good.tar.gz", {"gpu-check/copy-cuda.json": b"r"})
    if bad == "link":
        info = tarfile.TarInfo("gpu-check/loss-cuda.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    else:
        info = tarfile.TarInfo(bad)
        info.size = 3
    hostile = _tarball(tmp_path / "hostile.tar.gz", {"gpu-check/ragged-cuda.json": b"r"}, extra=[info])
    (tmp_path / "run").mkdir()
    proc = _gpu_results(str(good), str(hostile), "--dest", str(tmp_path / "run" / "dest"))
    assert proc.returncode == 1
    assert "refusing member" in proc.stderr and "nothing written" in proc.stderr
    assert not (tmp_path / "run" / "dest").exists() and not (tmp_path / "x").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.tar.gz", "hostile.tar.gz", "run"]


def _help(what: str, model: str | None, capsys) -> str:
    from drivetrain.cli.bench import available, load

    module = load(available()[what])
    with pytest.raises(SystemExit):
        module.main([*(["--model", model] if model else []), "--help"], prog=f"drivetrain bench {what}")
    return capsys.readouterr().out


def test_every_option_a_step_passes_is_one_its_benchmark_takes(tmp_path, capsys):
    helps: dict[tuple[str, str | None], str] = {}
    for device in ("cuda", "cpu"):
        for s in plan(device, "python3", tmp_path):
            if "bench" not in s.argv:
                continue
            what = s.argv[s.argv.index("bench") + 1]
            model = s.argv[s.argv.index("--model") + 1] if what == "iteration" else None
            key = (what, model if model in ("pointpillars", "ssn") else None)
            if key not in helps:
                helps[key] = _help(what, key[1], capsys)
            flags = [a for a in s.argv if a.startswith("--")]
            assert all(flag in helps[key] for flag in flags), (s.name, [f for f in flags if f not in helps[key]])


def test_every_override_a_train_step_passes_is_one_its_config_takes(tmp_path):
    """``bench train``'s KEY=VALUE overrides, before ``--compare`` and after it, load with the step's config and
    device (a key the schema lacks or a value it refuses would end the step in its first seconds on a lease; the
    test above checks only the ``--`` options)."""
    from drivetrain.engine.config import load_config

    checked = 0
    for device in ("cuda", "cpu"):
        for s in plan(device, "python3", tmp_path):
            argv = list(s.argv)
            if "bench" not in argv or argv[argv.index("bench") + 1] != "train":
                continue
            end = argv.index("--compare") if "--compare" in argv else argv.index("--json")
            overrides = [a for a in argv[argv.index("train") + 1 : end] if "=" in a and not a.startswith("-")]
            compare = argv[end + 1 : argv.index("--json")] if "--compare" in argv else []
            config = ROOT / argv[argv.index("--config") + 1]
            for extra in ([], compare) if compare else ([],):
                load_config(config, [*overrides, *extra, f"train.device={device}"])  # a ConfigError fails the test
            checked += len(overrides) + len(compare)
    assert checked >= 10  # the compared runs' overrides among them


def test_the_full_set_is_rendered_once_with_the_settings_the_full_configs_read(tmp_path, capsys):
    """The synth steps render configs/streampetr_full.yaml's set (the lidar configs read the same root) unless its
    index is there, with options `drivetrain data synth` and `data index` take."""
    from drivetrain.cli.main import main
    from drivetrain.engine.config_files import read_config_file

    steps = {s.name: s for s in plan("cuda", "python3", tmp_path)}
    script = steps["synth-full-704"].argv[2]
    assert script.startswith("test -f data/synth-full-704/drivetrain_index.npz || ")
    for name in ("streampetr_full", "pointpillars_nus", "ssn_nus"):
        data = read_config_file(ROOT / "configs" / f"{name}.yaml").data["data"]["args"]  # with its base chain
        assert (data["root"], data["size"], data["image_size"], data["seed"]) == ("data/synth-full-704", "full",
                                                                                  [704, 256], 0)  # fmt: skip
    for action, end in (("synth", "&&"), ("index", ";")):
        with pytest.raises(SystemExit):
            main(["data", action, "--help"])
        flags = [w for w in re.search(f"data {action} (.*?){end}", script).group(1).split() if w.startswith("--")]
        printed = capsys.readouterr().out
        assert len(flags) >= 2 and all(flag in printed for flag in flags), (action, flags)


# ---------------------------------------------------------------------- a run cut by SIGKILL
def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc (Linux)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL the run as a lease ends it: its session (``proc`` started one) and the process group of every step
    (``timeout`` puts each step in a group of its own), each by its id."""
    groups = {proc.pid}
    for pid in _descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, 9)
    proc.wait(timeout=30)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


_DRIVER = """
import sys
from drivetrain.profile import runbook

def plan(device, python, work, *, full=False):
    first = f"echo measured > {work}/first-cpu.json; echo first done"
    return [runbook.Step("first", 1, 1, 1.0, 60.0, ("bash", "-c", first)),
            runbook.Step("second", 2, 1, 1.0, 120.0, ("sleep", "120")),
            runbook.Step("third", 3, 1, 1.0, 60.0, ("true",))]

runbook.plan = plan
sys.exit(runbook.main(["run", "--work", sys.argv[1], "--out", sys.argv[2], "--device", "cpu", "--budget", "600"]))
"""


def test_a_run_killed_during_a_step_has_every_finished_step_in_out(tmp_path):
    """SIGKILL while the second of three steps runs: OUT already holds the summary (first ok, second running, third
    not reached) and a tarball with the first step's result and log."""
    work, out, driver = tmp_path / "work", tmp_path / "out", tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, str(driver), str(work), str(out)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.time() + 120
        while not ("| second | 1 | running |" in _text(out / "summary.md") and _descendants(proc.pid)):
            assert proc.poll() is None and time.time() < deadline, _text(out / "summary.md")
            time.sleep(0.1)
    finally:
        _kill_run(proc)
    text = (out / "summary.md").read_text()
    assert "| first | 1 | ok |" in text and "| third | 1 | not reached |" in text
    assert "In progress: 1 steps done, second running, 1 not reached yet" in text
    members = _members(out / "gpu-results.tar.gz")
    assert members["gpu-check/first-cpu.json"] == b"measured\n" and b"first done" in members["gpu-check/first.log"]
    assert members["gpu-check/summary.md"].decode() == text
    record = json.loads(members["gpu-check/steps.json"])
    assert [(s["name"], s["status"]) for s in record["steps"]] == [("first", "ok")]
    assert record["running"] == "second" and record["not_reached"] == ["third"]


@pytest.mark.slow
def test_the_cpu_dry_run_killed_part_way_has_every_finished_steps_result_in_out(tmp_path):
    """The whole dry run (scripts/gpu_check.sh --device cpu), SIGKILLed after its fourth finished step: every step
    that finished is in OUT's summary and tarball, with its log and, for a benchmark that ended ok, its JSON."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    cmd = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--device", "cpu", "--budget", "1800"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    finished = re.compile(r"^\| (\S+) \| \d \| (ok|failed \(-?\d+\)|timed out after \d+ s) \|", re.MULTILINE)
    try:
        deadline = time.time() + 900
        while len(finished.findall(_text(out / "summary.md"))) < 4:
            assert proc.poll() is None and time.time() < deadline, _text(out / "summary.md")
            time.sleep(1)
    finally:
        _kill_run(proc)
    text = (out / "summary.md").read_text()
    done = dict(finished.findall(text))
    assert len(done) >= 4 and "In progress:" in text
    members = _members(out / "gpu-results.tar.gz")
    record = json.loads(members["gpu-check/steps.json"])
    assert {s["name"] for s in record["steps"] if s["status"] != "skipped"} == set(done)
    benchmarks = [name for name, status in done.items() if status == "ok" and not name.startswith(("tests-", "synth"))]
    assert benchmarks  # the fourth finished step at the latest is a benchmark (solve), after the 3 test steps
    for name, status in done.items():
        assert f"gpu-check/{name}.log" in members, name
        if status == "ok" and not name.startswith(("tests-", "synth")):  # a benchmark: its result was written
            assert json.loads(members[f"gpu-check/{name}-cpu.json"])["rows"], name
