"""The GPU check's run book: its steps in a fixed priority order, each capped to end inside a time budget.

A borrowed GPU comes for 15 minutes in all (its start included), so ``scripts/gpu_check.sh`` spends them highest
priority first: (1) the CUDA tests, in two steps: the device tests, then those that train or compile (``heavy``),
each test's outcome streamed into the log as it ends, (2) the solver's kernel shapes (``bench solve``) over the
synthetic full set, (3) the trainer's own step at the three published configs with a profile of each (``bench
train --profile``), (4) the full-size iterations, reference vs batched; part 2 the tiny iterations, copy, loss and
ragged ops; parts 3 and 4 the camera data path, precision, switches, sweeps and the rest, parts 5 (PointPillars,
SSN) and 6 (StreamPETR) the compiled step replayed as CUDA graphs against the eager one
(``speed.compile_step_mode=reduce-overhead``) and part 7 the CUDA tests that compile with inductor, each for a later
lease. Each step has the time it is expected to need and a cap; it runs under ``timeout`` with min(cap, what remains
of the budget − a reserve for packing), and a step expected to need more than what remains is skipped and named
rather than started and cut.
``--part N`` picks one group of steps sized for one device command (:data:`PART_BUDGET_S`); the parts partition
the steps. Everything a run writes goes into one ``gpu-results.tar.gz`` (kept under the 16 MiB a borrowed machine
hands back) beside ``summary.md``, both rewritten into ``--out`` before every step (the steps done, the one starting,
the ones not reached), so a run killed part-way — a lease ends with SIGKILL — has handed back every finished step;
:func:`collect` (``scripts/gpu_results.sh``) copies the results out of such tarballs into ``benchmarks/results``.

Only the standard library is used here, and :mod:`drivetrain.safeio.files` (standard library only) for every file
written, so that no output is written through a link planted at its name: collecting results needs no torch.
The expected seconds on CUDA are estimates until a borrowed run measures them: ``summary.md`` lists the measured
seconds beside them, to be copied into ``_BOOK``.

Run: ``python -m drivetrain.profile.runbook run --out OUT --work DIR [--budget S] [--part N] [--device cpu|cuda]``
or ``... collect TARBALL [TARBALL ...] [--dest benchmarks/results]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from drivetrain.safeio.files import open_output, replace_bytes, replace_text, replacing

__all__ = [
    "PARTS",
    "PART_BUDGET_S",
    "Outcome",
    "Step",
    "collect",
    "pack",
    "plan",
    "result_notes",
    "run_book",
    "select",
    "summary",
]

RESERVE_S = 20.0  # kept back from every cap: timeout's 10 s grace before SIGKILL, then packing
KILL_AFTER_S = 10
SETUP_S = 30.0  # wheels, environment.txt and this module's start, before the first step (CUDA estimate)
TARBALL = "gpu-results.tar.gz"
TARBALL_LIMIT = 16 * 1024 * 1024  # the largest file a borrowed machine hands back
# --budget of each part's device command, wheel install included. A borrowed GPU comes for 15 minutes in all, its
# start (1–2 min) included: part 1 (9 min) then part 2 (4.5 min) fit one lease; parts 3 and 4 are for a later one.
PART_BUDGET_S = {1: 540, 2: 270, 3: 540, 4: 540, 5: 540, 6: 540, 7: 540}
PARTS = {
    1: "CUDA tests, bench solve, bench train (with its profile) and full-size iterations of the three published "
    "configs",
    2: "tiny iterations of the three models, copy, loss, ragged",
    3: "camera augmentation (+ side stream, encoder ahead, DALI), precision (SSN full), switches (PointPillars), "
    "sweeps (SSN)",
    4: "spare: lidar-data, switches (StreamPETR, VoxelNet), the loader on the host CPU; --full: the whole suite",
    5: "the compiled step replayed as CUDA graphs vs eager (bench train --compare) at the PointPillars and SSN "
    "published configs",
    6: "the compiled step replayed as CUDA graphs vs eager (bench train --compare) at the StreamPETR published config",
    7: "the CUDA tests that compile with inductor: the compiled step and update replayed as CUDA graphs, the compiled "
    "losses",
}
RESULT = re.compile(r"[a-z0-9][a-z0-9-]*-cuda\.(json|md|png)|data-gpu-host\.(json|md)")


@dataclass(frozen=True)
class Step:
    """One command of the run book.

    Args:
        name: the step's name, also its log's (``<name>.log``).
        priority: lower runs first; steps of one priority keep their order.
        part: the device command (``--part``) it belongs to.
        expected_s: the least time it needs to finish; with less left it is skipped.
        cap_s: the longest it may run.
        argv: the command; empty when the step does not run on this device (``skip`` says why).
        skip: why the step never runs here (e.g. a GPU-only size in the CPU dry run), or "".
        env: environment variables the command runs with, besides the caller's.
    """

    name: str
    priority: int
    part: int
    expected_s: float
    cap_s: float
    argv: tuple[str, ...]
    skip: str = ""
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Outcome:
    """What became of one step: ``ok``, ``failed``, ``timed out`` or ``skipped`` (with its reason)."""

    step: Step
    status: str
    seconds: float = 0.0
    cap_s: float = 0.0
    rc: int | None = None
    reason: str = ""

    def label(self) -> str:
        """The status as the summary writes it, e.g. ``timed out after 120 s`` or ``skipped (GPU only)``."""
        if self.status == "failed":
            return f"failed ({self.rc})"
        if self.status == "timed out":
            return f"timed out after {self.seconds:.0f} s"
        if self.status == "skipped":
            return f"skipped ({self.reason})"
        return self.status


# The runner runs one step under a cap; it returns (exit status, seconds taken, whether the cap stopped it).
Runner = Callable[[Step, float], tuple[int, float, bool]]
# Told where the run stands before each step that runs and once at the end: the outcomes so far, the step about to
# run (None at the end) and the steps after it.
Progress = Callable[[list[Outcome], Step | None, list[Step]], None]


FULL_ROOT = "data/synth-full-704"  # the root of configs/{streampetr_full,pointpillars_nus,ssn_nus}.yaml

# The run book, highest priority first: name, priority, part, benchmark (None: pytest), then (expected s, cap s,
# options) on CUDA and in the CPU dry run (None: not in the dry run). {data} is the work folder's data/: the dry
# run generates 4 scenes there instead of the presets under the checkout's data/.
# Expected CUDA seconds: the first H200 run of the run book (its steps.json; the seconds are in docs/benchmarks.md,
# "On a borrowed GPU", and its results in benchmarks/results/*-cuda.*) where a step ran then, with a margin; the
# new steps (solve, train) are estimates until a run measures them.
# The CUDA tests, from that run's 16 tests: 31 s in all, of which 8.3 s in the tests, so ~22 s to start, import and
# collect; the first CUDA call 2.6 s; a device test ~0.13 s (the median ones 0.006–0.74 s); 2 trainer runs 3.9 s.
# Step 1, the device tests (85 now; `cuda and not heavy`): 22 + 2.6 + 85 × 0.13 + ~10 cold solver kernels × 0.75 s
# (the slowest bucket compile then) ≈ 45 s. Step 2, the tests that train or compile (13 now; `heavy`): 22 + 2.6 +
# ~10 trainer runs × 2 s + 2 CLI trainings × ~12 s (a process of its own: start, import, CUDA) + 3 cold inductor
# compiles × ~20 s (an estimate: no inductor compile was timed on the H200) ≈ 130 s. Caps: about twice that.
# Since then tests/test_cuda_step_graph.py added 4 heavy tests (17 now): 4 trainer runs + 2 cold inductor compiles
# (the tiny compiled step's two buckets) + 3 warm ones (dynamo and AOT again, inductor's cache hit) ≈ +65 s, so
# ≈ 195 s, inside the 240 s cap but above the 130 s planned: part 1 has no seconds left to plan for it (520 of 540),
# so the step keeps 130 until a run measures it, and a slow one costs the last part-1 steps (skipped and named).
# Two more compile (23 collected now, parametrised cases counted): the GPU solver's operator traced under a
# CUDA profiler and a 2-layer checkpointed decoder (small graphs: ~2 × 20 s cold, an estimate), on the same terms.
# With them 24 tests, 13 of which compile (~10 graphs cold, more than 300 s on these estimates), do not fit the
# step's 240 s cap: the tests that compile (marked `compiles`) run in part 7, a lease of its own, and the second step
# keeps the 11 that train (22 + 2.6 + 14 trainer runs × 2 s + 2 CLI trainings × ~12 s ≈ 80 s, inside its 130 s).
# Part 7: 22 + 2.6 + ~10 cold inductor graphs × ~20 s (PointPillars tiny's step at 2 buckets and StreamPETR's small
# one, forward and backward; 3 losses; the AdamW update; a decoder) + the resume's 3 runs on warm caches × ~10 s + 2
# more trainer runs and the CUDA graphs' recording ≈ 270 s; its cap what the part's budget leaves (540 − 30 − 20).
# Counted again after the CUDA-path reviews: 114 device tests (the evaluation and decoding on the device, the
# side-stream copies, ...; two devkit scorings ~3 s each): 22 + 2.6 + 114 × 0.13 + 7.5 + 6 ≈ 53 s, inside the 90 s cap;
# it keeps 45 (part 1 plans 520 of 540 − 20: nothing left) until a run measures it; 12 that train, one more a
# one-rank NCCL FSDP-offload torchrun training (~30 s): ≈ 110 s, inside the 130 s planned.
# All three stream each test's outcome into their log (-v) as it ends, then the slowest 15 and every outcome again.
_TESTS = {"fast": "-m 'cuda and not heavy'", "heavy": "-m 'cuda and heavy and not compiles'",
          "compiles": "-m 'cuda and compiles'"}  # fmt: skip
_BOOK: list[tuple[str, int, int, str | None, tuple, tuple | None]] = [
    ("tests-cuda", 1, 1, None, (45, 90, _TESTS["fast"]), (30, 90, _TESTS["fast"])),
    ("tests-cuda-trainer", 1, 1, None, (130, 240, _TESTS["heavy"]), (30, 90, _TESTS["heavy"])),
    ("tests-cuda-compile", 1, 7, None, (270, 490, _TESTS["compiles"]), (30, 90, _TESTS["compiles"])),
    # The published configs read the synthetic set at 704×256, which a benchmark would render on first use in one
    # process (~4 min); "synth" renders it with a process per core first (35 s on 16 cores then).
    ("synth-full-704", 2, 1, "synth", (40, 150, FULL_ROOT), None),
    ("solve", 2, 1, "solve", (20, 60, ""),
     (20, 60, "--config configs/streampetr_tiny.yaml --batch 2 --scenes 4 --repeat 2 --data-root {data}/camera")),
    # The trainer's own step at the published configs, each with a torch.profiler trace of 3 more steps. StreamPETR's
    # config is fp16 with the loss scale starting at 65536, where the first steps overflow and skip the optimizer
    # (halving the scale each time): it starts at 2^10 here, so the timed steps update (bench train reports
    # skipped_steps, and the summary names a step that skipped).
    ("train-streampetr-full", 3, 1, "train", (60, 150, "--config configs/streampetr_full.yaml --steps 8 --warmup 3 "
     "--profile 3 precision.init_scale=1024"), None),
    ("train-pointpillars-full", 3, 1, "train", (40, 120, "--config configs/pointpillars_nus.yaml --steps 8 --warmup 3 "
     "--profile 3"), None),
    ("train-ssn-full", 3, 1, "train", (40, 120, "--config configs/ssn_nus.yaml --steps 8 --warmup 3 --profile 3"),
     None),
    ("train-streampetr-tiny", 3, 1, "train", None,
     (40, 120, "--config configs/streampetr_tiny.yaml --steps 2 --warmup 1 --profile 1 data.args.root={data}/train "
      "data.args.scenes=4 data.batch_size=2")),
    # Reference vs batched iterations at the published sizes (StreamPETR batch 8: 50 s then; lidar batch 4: 25 s).
    ("iteration-streampetr-full", 4, 1, "iteration", (55, 150, "--model streampetr --size full --batch 8"), None),
    ("iteration-pointpillars-full", 4, 1, "iteration", (30, 90, "--model pointpillars --size full --batch 4"), None),
    ("iteration-ssn-full", 4, 1, "iteration", (30, 90, "--model ssn --size full --batch 4"), None),
    # Part 5: the compiled step (speed.compile_step) replayed as CUDA graphs against the eager step, same process,
    # same batches (bench train --compare), at the two lidar published configs (StreamPETR's: part 6). The dense
    # assignment (window=false) and one voxel bucket at max_voxels (step_voxels=30000, no ladder) on both sides: 2
    # buckets to compile instead of the windowed voxel ladder's 10. Unmeasured: no inductor compile of these graphs was
    # ever timed on a GPU; the estimate is the eager run (~40 s, as train-*-full) + 2 cold buckets × ~60 s + recording;
    # caps about twice that. A lease of its own (part 1's data are not there on a fresh machine: the synthetic set is
    # rendered again unless there).
    ("synth-full-704-graph", 5, 5, "synth", (40, 150, FULL_ROOT), None),
    ("train-graph-pointpillars-full", 5, 5, "train", (200, 400, "--config configs/pointpillars_nus.yaml --steps 12 "
     "--warmup 3 model.args.window=false model.args.step_voxels=30000 --compare speed.compile_step=true "
     "speed.compile_step_mode=reduce-overhead"), None),
    ("train-graph-ssn-full", 5, 5, "train", (220, 400, "--config configs/ssn_nus.yaml --steps 12 --warmup 3 "
     "model.args.window=false model.args.step_voxels=30000 --compare speed.compile_step=true "
     "speed.compile_step_mode=reduce-overhead"), None),
    # Part 6: the same compare at StreamPETR's published config, a lease of its own (its cold compiles do not fit
    # beside part 5's): the static path on both sides (model.args.static_targets), the ground-truth buckets 32 and 64
    # (model.args.step_targets; the synthetic frames hold 21-44 boxes; 8 and 16 would be two more cold compiles),
    # fp16 from a loss scale of 2^10 as train-streampetr-full. Unmeasured: the eager run (~60 s, as train-streampetr-
    # full) + 2 cold buckets of ResNet-50, 6 decoder layers and both losses, forward and backward (~90 s each, an
    # estimate) + the update graph's cold compile (capturable AdamW over ResNet-50's and the head's parameters, ~30 s,
    # an estimate) + recording; the cap about 1.4 times that, inside the part's budget.
    ("synth-full-704-graph-camera", 5, 6, "synth", (40, 150, FULL_ROOT), None),
    ("train-graph-streampetr-full", 5, 6, "train", (330, 460, "--config configs/streampetr_full.yaml --steps 12 "
     "--warmup 3 precision.init_scale=1024 model.args.static_targets=true model.args.step_targets=[32,64] "
     "--compare speed.compile_step=true speed.compile_step_mode=reduce-overhead"), None),
    # Part 2: the tiny sizes (35, 14 and 19 s then), the packed copy (11 s), the loss and ragged ops (13 s).
    ("iteration-streampetr-tiny", 5, 2, "iteration", (40, 100, "--model streampetr --size tiny --batch 8"),
     (25, 60, "--model streampetr --size tiny --batch 2 --repeat 1 --warmup 0 --scenes 4 --data-root {data}/camera")),
    ("iteration-pointpillars-tiny", 5, 2, "iteration", (20, 60, "--model pointpillars --size tiny --batch 4"),
     (10, 40, "--model pointpillars --size tiny --batch 2 --repeat 1 --warmup 0 --scenes 4 --data-root {data}/lidar")),
    ("iteration-ssn-tiny", 5, 2, "iteration", (25, 60, "--model ssn --size tiny --batch 4"),
     (10, 40, "--model ssn --size tiny --batch 2 --repeat 1 --warmup 0 --scenes 4 --data-root {data}/lidar")),
    ("copy", 6, 2, "copy", (15, 45, ""), (5, 30, "--repeat 3 --warmup 1")),
    ("loss", 6, 2, "loss", (40, 90, ""), (15, 60, "--repeat 2 --warmup 1")),
    ("ragged", 6, 2, "ragged", (15, 45, ""), (10, 40, "--repeat 3 --warmup 1")),
    # Part 3: the camera data path (worker vs device augmentation, + the prefetcher's side stream, + the frozen
    # ResNet-50 encoder run ahead, + DALI where installed: it timed out at 240 s then, the 1600×900 set took 40 s of
    # it), precision and switches, sweeps.
    ("augment", 7, 3, "augment", (240, 330, "--train --batch 8"),
     (80, 150, "--train --batch 1 --sizes tiny --repeat 2 --warmup 1 --data-dir {data}/augment")),
    ("precision-ssn-full", 8, 3, "precision", (150, 300, "--model ssn --size full --repeat 8 --warmup 3"),
     (40, 90, "--model ssn --size tiny --repeat 3 --warmup 1 --variants 'fp32,fp32 + act. ckpt'")),
    ("switches-pointpillars", 8, 3, "switches", (100, 180, "--model pointpillars {switches}"),
     (40, 90, "--model pointpillars {switches_cpu}")),
    # Part 4, spare: the lidar data path, the switches of the other two models and the loader on the host's CPU.
    ("sweeps-ssn", 9, 4, "sweeps", (90, 180, "--model ssn --steps 60"),
     (80, 150, "--model ssn --steps 6 --warmup 2 --sweeps 0,5 --scenes 4 --data-root {data}/sweeps")),
    ("lidar-data", 9, 4, "lidar-data", (60, 150, ""),
     (20, 60, "--repeat 1 --warmup 0 --points 30000 --skip-sweeps --data-dir {data}/lidar-data")),
    ("switches-streampetr", 10, 4, "switches", (100, 180, "--model streampetr {switches}"),
     (40, 90, "--model streampetr {switches_cpu}")),
    ("switches-voxelnet", 10, 4, "switches", (100, 180, "--model voxelnet {switches}"),
     (40, 90, "--model voxelnet {switches_cpu}")),
    ("data-host", 10, 4, "data", (120, 300, "--repeat 2"), (120, 240, "--repeat 1 --data-dir {data}/loader")),
]  # fmt: skip
_SWITCHES = {  # short: one process per variant, no DDP, schedule or channels table
    "switches": "--variants bf16,fp16,channels_last,cudnn_benchmark,tf32 --repeat 1 --no-ddp --no-schedule "
    "--no-channels-table",
    "switches_cpu": "--variants channels_last --steps 2 --warmup 1 --repeat 1 --no-ddp --no-schedule "
    "--no-channels-table",
}
_FULL = ("tests-all", 11, 4, None, (480, 1800, ""), None)  # --full: the whole suite on the GPU machine


def plan(device: str, python: str, work: Path, *, full: bool = False) -> list[Step]:
    """The run book's steps for ``device`` (``cuda``, or ``cpu`` for the dry run with tiny sizes and few repeats).

    Args:
        device: ``cuda`` or ``cpu``.
        python: the interpreter that runs pytest and ``drivetrain bench``.
        work: the folder each step writes its log and results into.
        full: also run the whole test suite (a part-4 step).

    Returns:
        The steps in priority order; a step with no CPU options is skipped in the dry run, named.
    """
    steps = []
    for name, priority, part, what, on_cuda, on_cpu in _BOOK + ([_FULL] if full else []):
        spec = on_cuda if device == "cuda" else on_cpu
        if spec is None:
            why = "GPU only: not in the CPU dry run" if device == "cpu" else "CPU dry run only"
            steps.append(Step(name, priority, part, 0.0, 0.0, (), skip=why))
            continue
        expected, cap, options = spec
        opts = shlex.split(options.format(data=shlex.quote(str(work / "data")), **_SWITCHES))
        argv = _command(name, what, opts, device, python, work)
        # On a GPU machine a test of the GPU solver fails where the solver is not usable (tests/helpers/gpu_solver.py)
        env = (("DRIVETRAIN_REQUIRE_GPU_SOLVER", "1"),) if what is None and device == "cuda" else ()
        steps.append(Step(name, priority, part, float(expected), float(cap), argv, env=env))
    return sorted(steps, key=lambda s: s.priority)


def _command(name: str, what: str | None, opts: list[str], device: str, python: str, work: Path) -> tuple[str, ...]:
    """pytest with each test's outcome in the log as it ends (``-v``), then the 15 slowest and every outcome again,
    and JUnit XML at the end, past a test module that does not import there (a package the GPU image lacks, an API its
    own torch lacks: named as an error, the other modules' tests run); the synthetic full set rendered and indexed
    unless there; or ``drivetrain bench WHAT`` writing ``<name>-<device>.{json,md,png}`` into ``work``."""
    if what is None:
        return (python, "-m", "pytest", "-v", "-rA", "--durations=15", "-p", "no:cacheprovider",
                "--continue-on-collection-errors", *opts, "--junitxml", str(work / f"{name}.xml"), "tests")  # fmt: skip
    if what == "synth":
        root, cli = shlex.quote(opts[0]), f"{shlex.quote(python)} -m drivetrain.cli.main data"
        workers = os.cpu_count() or 1  # one process per core: 35 s on the H200 machine's 16
        synth = f"{cli} synth --out {root} --size full --image-size 704x256 --workers {workers} --overwrite"
        index = f"{cli} index --root {root} --quiet"
        return ("bash", "-c", f"test -f {root}/drivetrain_index.npz || {{ {synth} && {index}; }}")
    # The loader runs on the host CPU: on a GPU machine recorded as its host, never as the CPU machine's results.
    host = what == "data"
    stem = ("data-gpu-host" if device == "cuda" else f"{name}-cpu") if host else f"{name}-{device}"
    files = ["--json", str(work / f"{stem}.json"), "--md", str(work / f"{stem}.md")]
    files += [] if host else ["--png", str(work / f"{stem}.png")]
    return (python, "-m", "drivetrain.cli.main", "bench", what, "--device", "cpu" if host else device, *opts, *files)


def select(steps: Iterable[Step], part: int | None) -> list[Step]:
    """The steps of ``part`` (all of them for None), in priority order."""
    if part is not None and part not in PARTS:
        raise ValueError(f"part: expected one of {sorted(PARTS)}, got {part}")
    return [s for s in steps if part is None or s.part == part]


def run_book(
    steps: Iterable[Step],
    budget_s: float,
    runner: Runner,
    *,
    clock: Callable[[], float] = time.time,
    started: float | None = None,
    reserve_s: float = RESERVE_S,
    progress: Progress | None = None,
) -> list[Outcome]:
    """Run ``steps`` in priority order within ``budget_s`` seconds counted from ``started`` (default: now).

    Each step runs with cap min(its cap, remaining − ``reserve_s``); a step that expects to need more than that
    is skipped and named, so nothing is cut half-way without a record. ``runner(step, cap)`` runs one step.
    ``progress(outcomes, running, after)`` is told where the run stands before each step that runs and once at the
    end (``running`` None), so that a run killed in a step has published every step before it.
    """
    start = clock() if started is None else started
    outcomes: list[Outcome] = []
    ordered = sorted(steps, key=lambda s: s.priority)
    for index, step in enumerate(ordered):
        left = budget_s - (clock() - start) - reserve_s
        if step.skip:
            outcomes.append(Outcome(step, "skipped", reason=step.skip))
        elif step.expected_s > left:
            reason = f"needs ~{step.expected_s:.0f} s, {max(left, 0):.0f} s left"
            outcomes.append(Outcome(step, "skipped", reason=reason))
        else:
            cap = float(int(min(step.cap_s, left)))  # whole seconds, as `timeout` takes them
            if progress is not None:
                progress(outcomes, step, ordered[index + 1 :])
            rc, seconds, timed_out = runner(step, cap)
            status = "timed out" if timed_out else "ok" if rc == 0 else "failed"
            outcomes.append(Outcome(step, status, seconds=seconds, cap_s=cap, rc=rc))
        print(f"gpu_check: {step.name}: {outcomes[-1].label()}", flush=True)
    if progress is not None:
        progress(outcomes, None, [])
    return outcomes


def subprocess_runner(work: Path, *, kill_after: int = KILL_AFTER_S) -> Runner:
    """A runner that runs each step under ``timeout`` (its process group killed at the cap), logging to
    ``work/<name>.log``; a step stopped by its cap keeps its partial log with a closing line saying so.

    ``timeout`` sends SIGTERM at the cap and SIGKILL ``kill_after`` seconds later; it exits 124 after the TERM,
    and the KILL, sent to its whole process group, ends ``timeout`` itself too (-9 here).
    """

    def run(step: Step, cap: float) -> tuple[int, float, bool]:
        log = work / f"{step.name}.log"
        limit = max(1, int(cap))  # whole seconds, never 0 (which would mean no limit)
        start = time.time()
        with open_output(log, "w") as f:  # a link at the name is replaced, never written through
            f.write(f"$ {shlex.join(step.argv)}\n(cap {limit} s)\n")
            f.flush()
            argv = ["timeout", f"--kill-after={kill_after}", str(limit), *step.argv]
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **dict(step.env)}  # the log is written as the step runs
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, check=False).returncode
        seconds = time.time() - start
        timed_out = rc in (124, 137, -9) and seconds >= limit - 1
        if timed_out:
            with open_output(log, "a") as f:
                f.write(f"\n[gpu_check] timed out after {seconds:.0f} s (cap {limit} s): the log above is partial\n")
        return rc, seconds, timed_out

    return run


def summary(outcomes: list[Outcome], *, title: str, environment: str = "", notes: Iterable[str] = (),
            tails: dict[str, str] | None = None, running: Step | None = None,
            after: Iterable[Step] = ()) -> str:  # fmt: skip
    """``summary.md``: the environment, the table (step, part, status, seconds, cap, expected), the skipped
    steps by name, ``notes`` (a sentence each) and the log tails of failed and timed-out steps. While the run is under
    way (``running``: the step now running; ``after``: the steps not reached yet) the table lists them too and a line
    says where the run stands: a run cut now leaves this summary."""
    lines = [f"# {title}", ""]
    lines += [f"    {line}" for line in environment.splitlines()] + ([""] if environment else [])
    lines += ["| step | part | status | seconds | cap (s) | expected (s) |", "|---|---:|---|---:|---:|---:|"]
    for o in outcomes:
        ran = (f"{o.seconds:.0f}", f"{o.cap_s:.0f}") if o.status != "skipped" else ("–", "–")
        expected = "–" if o.step.skip else f"{o.step.expected_s:.0f}"
        lines.append(f"| {o.step.name} | {o.step.part} | {o.label()} | {ran[0]} | {ran[1]} | {expected} |")
    after = list(after)
    if running is not None:
        lines.append(f"| {running.name} | {running.part} | running | – | – | {running.expected_s:.0f} |")
    for step in after:
        expected = "–" if step.skip else f"{step.expected_s:.0f}"
        lines.append(f"| {step.name} | {step.part} | not reached | – | – | {expected} |")
    skipped = [o.step.name for o in outcomes if o.status == "skipped"]
    lines += ["", f"Skipped: {', '.join(skipped)}." if skipped else "Skipped: none."]
    if running is not None or after:
        lines.append(
            f"In progress: {len(outcomes)} steps done, {running.name if running else 'none'} running, "
            f"{len(after)} not reached yet; a run cut now returns this summary and the tarball as they are."
        )
    lines += list(notes)
    for name, tail in (tails or {}).items():
        lines += ["", f"## {name}: last lines of {name}.log", "", "```", tail.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def result_notes(work: Path, outcomes: Iterable[Outcome], device: str) -> list[str]:
    """Sentences for the summary from the results of the steps that ran: timed steps that skipped the optimizer
    (``bench train``'s ``skipped_steps``: an fp16 loss scale still settling), graphs run without the CUDA graphs
    asked for (``cudagraph_skips``, its run's or its compared run's) and GPU-solver calls that fell back to SciPy or
    went through the package's public wrapper (``gpu_solver``), each named with its step."""
    notes = []
    for o in outcomes:
        path = work / f"{o.step.name}-{device}.json"
        try:
            result = json.loads(path.read_text()) if o.status != "skipped" and path.is_file() else {}
        except (OSError, ValueError):
            continue
        skipped = result.get("skipped_steps")
        if isinstance(skipped, int) and skipped > 0:
            notes.append(f"{o.step.name}: {skipped} of its {result.get('steps')} timed steps skipped the optimizer "
                         "(fp16 loss scale): its optimizer share is understated.")  # fmt: skip
        runs = [result, result.get("compared") or {}]  # bench train --compare: the compiled step is the compared run
        graphless = sum(r["cudagraph_skips"] for r in runs if isinstance(r.get("cudagraph_skips"), int))
        if graphless > 0:
            notes.append(f"{o.step.name}: inductor ran {graphless} graph(s) without CUDA graphs (cudagraph_skips; "
                         "why: TORCH_LOGS=cudagraphs): the step was not (wholly) replayed as CUDA graphs.")  # fmt: skip
        solver = result.get("config", {}).get("gpu_solver") or result.get("gpu_solver") or {}
        timed = [solver[key] for key in ("fallbacks_timed", "scipy_fallbacks_timed", "fallbacks") if key in solver]
        fallbacks, wrapper = (timed[0] if timed else 0), solver.get("wrapper_calls", 0)
        if fallbacks or wrapper:
            notes.append(f"{o.step.name}: the GPU solver fell back to SciPy {fallbacks} times and went through the "
                         f"package's public wrapper (two host syncs) {wrapper} times.")  # fmt: skip
    return notes


def _tail(path: Path, max_bytes: int) -> bytes:
    data = path.read_bytes()
    if len(data) <= max_bytes:
        return data
    return b"[... %d bytes cut: the last %d follow]\n" % (len(data) - max_bytes, max_bytes) + data[-max_bytes:]


# How much a log keeps at each packing level, and whether PNGs go in; the first level that fits is taken.
_LEVELS = [(None, True, ""), (None, False, "dropped the PNG charts"),
           (64 * 1024, False, "dropped the PNG charts; logs cut to their last 64 KiB"),
           (4 * 1024, False, "dropped the PNG charts; logs cut to their last 4 KiB")]  # fmt: skip


def pack(work: Path, tarball: Path, *, limit: int = TARBALL_LIMIT, write_summary: Callable[[list[str]], None]) -> str:
    """Pack every file of ``work`` into ``tarball`` under ``gpu-check/``, at most ``limit`` bytes.

    Over the limit, PNGs are dropped first, then the logs are cut to their tails. ``write_summary(notes)``
    rewrites ``work/summary.md`` with the packing notes before each try, so the packed summary says what was
    dropped. Returns the note for the level taken ("" when everything fits); raises ``RuntimeError`` when even
    the smallest level is over ``limit`` (the tarball is left in place).
    """
    for keep_log, with_png, note in _LEVELS:
        notes = [note] if note else []
        write_summary(notes)
        with replacing(tarball) as packed, tarfile.open(fileobj=packed, mode="w:gz") as tar:
            for path in sorted(p for p in work.iterdir() if p.is_file()):
                if path.suffix == ".png" and not with_png:
                    continue
                if path.suffix == ".log" and keep_log is not None:
                    data = _tail(path, keep_log)
                    info = tarfile.TarInfo(f"gpu-check/{path.name}")
                    info.size, info.mtime = len(data), int(path.stat().st_mtime)
                    tar.addfile(info, io.BytesIO(data))
                else:
                    tar.add(path, arcname=f"gpu-check/{path.name}", recursive=False)
        size = tarball.stat().st_size
        if size <= limit:
            return note
    raise RuntimeError(f"{tarball}: {size / 2**20:.1f} MiB even without PNGs and with logs cut (limit {limit} B)")


def _safe_members(tar: tarfile.TarFile, name: str) -> list[tarfile.TarInfo]:
    """The members of ``tar``, or ValueError naming the first one that could write outside the folder."""
    members = tar.getmembers()
    for m in members:
        path = PurePosixPath(m.name)
        if path.is_absolute() or ".." in path.parts or "\\" in m.name:
            raise ValueError(f"{name}: refusing member {m.name!r} (absolute or with '..')")
        if not (m.isfile() or m.isdir()):
            raise ValueError(f"{name}: refusing member {m.name!r} (a link or special file)")
    return members


def collect(tarballs: Iterable[Path], dest: Path) -> list[Path]:
    """Copy the CUDA results (``<what>-cuda.{json,md,png}``, ``data-gpu-host.{json,md}``) out of GPU-check
    tarballs into ``dest``; return the paths written.

    Every tarball is checked before anything is written: a member with an absolute path, a ``..`` part or a
    link makes the whole call refuse (ValueError) and write nothing. A dry run's tarball (device cpu) gives none.
    """
    written = []
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        checked = []
        for path in map(Path, tarballs):
            tar = stack.enter_context(tarfile.open(path, "r:gz"))
            checked.append((path, tar, _safe_members(tar, str(path))))
        folders = []
        for index, (path, tar, members) in enumerate(checked):
            folders.append((path, Path(tmp) / str(index)))
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(folders[-1][1], members=members, **kwargs)
        for path, folder in folders:
            record = _steps_record(folder)
            if record is not None and record.get("device") != "cuda":
                print(f"{path.name}: a {record.get('device')} dry run, no CUDA results to copy")
                continue
            for result in sorted(folder.rglob("*")):
                if result.is_file() and RESULT.fullmatch(result.name):
                    dest.mkdir(parents=True, exist_ok=True)
                    replace_bytes(dest / result.name, result.read_bytes())  # a link there replaced, not written
                    written.append(dest / result.name)
                    print(f"{path.name}: wrote {dest / result.name}")
            if record is not None:
                print(f"{path.name}: measured {_measured(record)}")
    return written


def _steps_record(folder: Path) -> dict | None:
    """The ``steps.json`` a run packed (device, part, each step's status and seconds), if any."""
    found = sorted(folder.rglob("steps.json"))
    return json.loads(found[0].read_text()) if found else None


def _measured(record: dict) -> str:
    """One line of measured seconds per step, to update the expected seconds in :func:`plan`."""
    parts = [f"{s['name']} {s['status']} {s['seconds']:.0f} s" for s in record["steps"] if s["status"] != "skipped"]
    return f"{record['device']} part {record['part'] or 'all'}: " + ("; ".join(parts) or "no step ran")


def _run(args: argparse.Namespace) -> int:
    work, out = args.work, args.out
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    steps = select(plan(args.device, args.python, work, full=args.full), args.part)
    budget = args.budget if args.budget is not None else SETUP_S + RESERVE_S + sum(s.cap_s for s in steps)
    started = time.time() if args.started is None else args.started
    setup = f"Setup (wheels, environment.txt) took {time.time() - started:.0f} s of the budget."
    env_path = work / "environment.txt"
    environment = env_path.read_text() if env_path.exists() else ""
    which = f"part {args.part} ({PARTS[args.part]})" if args.part else "all parts"
    title = f"GPU check — {which}, device {args.device}, budget {budget:.0f} s"
    tarball = out / TARBALL

    def publish(outcomes: list[Outcome], running: Step | None, after: list[Step]) -> bool:
        """steps.json, summary.md and the tarball as the run stands, into ``work`` and ``out``; whether it packed."""
        record = {"device": args.device, "part": args.part, "budget_s": budget, "steps": [
            {"name": o.step.name, "part": o.step.part, "priority": o.step.priority, "status": o.status, "rc": o.rc,
             "seconds": round(o.seconds, 1), "cap_s": round(o.cap_s, 1), "expected_s": o.step.expected_s,
             "reason": o.reason} for o in outcomes],
            "running": running.name if running else None, "not_reached": [s.name for s in after]}  # fmt: skip
        replace_text(work / "steps.json", json.dumps(record, indent=1) + "\n")
        tails = {}
        for o in outcomes:
            log = work / f"{o.step.name}.log"
            if o.status in ("failed", "timed out") and log.exists():
                text = _tail(log, 4096).decode(errors="replace")
                tails[o.step.name] = "\n".join(text.splitlines()[-15:])  # splitlines also splits progress bars' \r

        def write_summary(notes: list[str]) -> None:
            notes = [setup, *result_notes(work, outcomes, args.device),
                     *(f"Packing: {note} to stay under 16 MiB." for note in notes)]  # fmt: skip
            text = summary(outcomes, title=title, environment=environment, notes=notes, tails=tails,
                           running=running, after=after)  # fmt: skip
            replace_text(work / "summary.md", text)

        try:
            pack(work, tarball, write_summary=write_summary)
            packed = True
        except RuntimeError as err:
            print(f"gpu_check: {err}", file=sys.stderr)
            packed = False
        replace_bytes(out / "summary.md", (work / "summary.md").read_bytes())  # after the tarball: both agree
        return packed

    packs = [publish([], None, steps)]  # a run cut in its first step still returns the environment and the plan

    def progress(outcomes: list[Outcome], running: Step | None, after: list[Step]) -> None:
        packs.append(publish(outcomes, running, after))

    outcomes = run_book(steps, budget, subprocess_runner(work), started=started, progress=progress)
    print((out / "summary.md").read_text())
    print(f"gpu_check: {tarball} ({tarball.stat().st_size / 2**20:.2f} MiB) and {out / 'summary.md'}")
    packed = packs[-1]
    if args.save and args.device == "cuda" and packed:
        collect([tarball], Path("benchmarks") / "results")
    return 0 if packed and all(o.status in ("ok", "skipped") for o in outcomes) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drivetrain.profile.runbook", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the steps within a budget and pack OUT/gpu-results.tar.gz + summary.md")
    run.add_argument("--out", type=Path, required=True, help="where the tarball and summary.md go")
    run.add_argument("--work", type=Path, required=True, help="where the steps write their logs and results")
    run.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default: every cap)")
    run.add_argument("--started", type=float, default=None, help="epoch seconds the budget counts from (default: now)")
    run.add_argument("--part", type=int, default=None, choices=sorted(PARTS), help="run only this part's steps")
    run.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run, tiny sizes")
    run.add_argument("--python", default=sys.executable, help="interpreter of the steps (default: this one)")
    run.add_argument("--full", action="store_true", help="also run the whole test suite (part 4)")
    run.add_argument("--save", action="store_true", help="also copy the CUDA results to benchmarks/results")
    col = sub.add_parser("collect", help="copy the CUDA results of gpu-results tarballs to benchmarks/results")
    col.add_argument("tarballs", type=Path, nargs="+", metavar="TARBALL")
    col.add_argument("--dest", type=Path, default=Path("benchmarks") / "results", help="(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    try:
        written = collect(args.tarballs, args.dest)
    except (ValueError, OSError, tarfile.TarError) as err:
        print(f"gpu_results: {err}; nothing written", file=sys.stderr)
        return 1
    print(f"gpu_results: {len(written)} files written to {args.dest}" if written else "gpu_results: no CUDA results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
