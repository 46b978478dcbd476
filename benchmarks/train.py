"""The trainer's own step, measured: data wait, copy, forward, loss, backward, optimizer, other; host syncs per step.

Runs ``drivetrain train``'s trainer itself on ``--config`` (its ``base:`` chain and ``KEY=VALUE`` overrides, read as
``drivetrain train`` reads them) with everything the config sets — loader and workers, prefetcher, precision,
strategy, the model's path (``model.args.impl``) — in a temporary run directory that is deleted afterwards
(evaluation off; the one checkpoint the trainer always writes at the end follows the last timed step):
``--warmup`` steps, then ``--steps`` timed ones (:func:`drivetrain.engine.stepsplit.measure_steps`, which
``drivetrain doctor`` uses too).

Parts of the trainer's ``step`` region, medians and maxima over the timed steps (CUDA events on a GPU):

- **data wait**: blocked on the loader (with the prefetcher: waiting for its side stream too);
- **copy**: the host → device copy of the batch (a pass-through for a batch the prefetcher already copied);
- **forward** (the network), **loss**, **backward**, **optimizer** (unscale, clip, the skip decision
  on the device, the update, the read of the step's outcome, which keeps or undoes it);
- **other**: each step minus its parts (the median of those remainders; part medians need not add up exactly).

``overhead_share = 1 − (forward + backward) / step`` (medians): the share of the trainer's step that is not the
network's own work. Host syncs per step: on CUDA every synchronising call of the timed steps
(``torch.cuda.set_sync_debug_mode("warn")``); on the CPU the host reads of the last warm-up step, counted by
:mod:`drivetrain.profile.costmodel` with its kernels (counted on CUDA too). The trainer's host-clock log
(``metrics.jsonl``: step time, data wait including the copy) is reported beside them.

JSON: the standard rows (one path: each row's ``reference_ms`` and ``batched_ms`` are the same measurement; the
counts in the batched column) and the top-level keys ``train_device``, ``steps``, ``warmup``, ``step_ms``,
``step_max_ms``, ``parts`` ({part: ``median_ms``, ``max_ms``, ``share``, ``kernels``, ``syncs``}),
``data_wait_ms``, ``overhead_share``, ``skipped_steps`` (timed steps whose update was skipped: an fp16 loss scale
still settling: the update is taken and undone, so the optimizer's share is a little overstated), ``syncs_per_step``,
``syncs_source``, ``counted_syncs_per_step``, ``kernels_per_step``, ``region_syncs``, ``logged``, ``inner_ms``,
``gpu_solver`` (the GPU assignment solver's ``fallbacks`` to SciPy and ``wrapper_calls`` in this process); with
``--profile``, ``profile`` ({``steps``, ``file``, ``chrome_trace``, ``syncs_per_step``, ``gpu_idle_share``}).

``--profile N`` runs N more steps under ``torch.profiler`` (nothing timed there) — the JSON and Markdown of the timed
steps are written before their summary is made, then again with the ``profile`` entry — and writes
``profile-<model>-<size>-<device>.md`` beside the JSON (:mod:`drivetrain.profile.trace`: top 30 ops by device and by
CPU time, GPU idle time between kernels per step, each host sync with its Python call site) and the Chrome trace
(``.trace.json``) when it is at most 4 MB.

Every split also carries ``graph_breaks`` (dynamo's graph breaks over the run), ``compiles_in_steps`` (graphs dynamo
compiled during the timed steps: 0 once a compiled step is warm), ``cudagraph_skips`` (graphs inductor ran without CUDA
graphs although ``reduce-overhead`` asked for them, over the run: 0, or the step was not replayed as CUDA graphs) and
``batch_indices`` (the dataset indices of each timed step).

``--compare KEY=VALUE ...`` (last on the line: it takes every ``KEY=VALUE`` after it) measures the config a second
time in the same process with those overrides on top of the others — the same data, seed and steps, so the same
batches — and reports both splits side by side: the top level is the configured run's split as above, plus
``step_speedup`` (its median step / the compared run's), ``step_max_speedup`` (the same of the maxima),
``part_speedups`` ({part: median / compared median}), ``same_batches`` (both runs' timed steps trained on the same
dataset indices) and ``compare_overrides``; ``compared`` holds the compared run's full report (its own ``step_ms``,
``step_max_ms``, ``parts`` with kernels and syncs, ``syncs_per_step``, ``kernels_per_step``, ``graph_breaks``,
``compiles_in_steps``, ...). A speedup above 1 means the compared run is faster. Not with ``--profile``.

The two runs are timed one after the other by default, so a change of the machine's load between them moves the
ratio (on a shared CPU the same command has given ×0.52 and ×1.62). ``--interleave`` builds both trainers first and
then runs one iteration of each in turn (:func:`drivetrain.engine.stepsplit.measure_interleaved`): the load falls on
both alike. Each trainer gets back the process-wide state it set or draws from before its iteration (threads,
deterministic mode, cuDNN/TF32 flags, the CPU's and Python's and NumPy's generators), so on the CPU each trains
exactly as it would alone; on CUDA they share the device's generator. Both models are held at once (memory for
two), and each counts only its own steps' syncs and compilations. ``interleaved`` in the JSON says which was done.

Run: ``drivetrain bench train --config configs/streampetr_tiny.yaml [--steps N] [--warmup N] [--device cpu|cuda]
[--profile N] [KEY=VALUE ...] [--interleave] [--compare KEY=VALUE ...] [--save]``; ``--save`` writes
``benchmarks/results/train-<model>-<size>-<device>.{json,md}`` (size: the config's name after the model's, ``nus``
named ``full`` as ``bench iteration`` names it; ``train-<model>-<size>-compare-<device>`` with ``--compare``).

Examples::

    drivetrain bench train --config configs/smoke.yaml --steps 3 data.batch_size=4
    drivetrain bench train --config configs/pointpillars_tiny.yaml --steps 5 --compare "speed.compile=['']"
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from drivetrain.detector.spec import keywords
from drivetrain.engine import ConfigError, load_config
from drivetrain.engine.stepsplit import (
    LABELS,
    MIN_WARMUP,
    StepSplit,
    measure_interleaved,
    measure_steps,
    table_lines,
)
from drivetrain.match import gpu_solver_shapes
from drivetrain.profile import BenchResult, Row, add_bench_arguments, device_name, device_slug, emit, setup_bench, trace
from drivetrain.profile.bench import RESULTS_DIR, result_paths
from drivetrain.profile.costmodel import Cost
from drivetrain.profile.results import backend_flags
from drivetrain.profile.timer import Stats
from drivetrain.safeio.files import replace_text

DESCRIPTION = __doc__.splitlines()[0]
ROOT = Path(__file__).resolve().parents[1]
TRACE_KEEP_MB = 4  # a Chrome trace larger than this is not kept (the run book's tarball stays small)
SIZE_NAMES = {"nus": "full"}  # the published lidar configs (pointpillars_nus, ssn_nus): bench iteration's "full"


def result_name(config: Path, model: str) -> str:
    """``train-<model>-<size>``: the size is the config file's name after the model's (``streampetr_tiny`` →
    ``tiny``, ``pointpillars_nus`` → ``full``); a config not named after its model gives its whole name."""
    stem = config.stem
    size = stem.removeprefix(f"{model}_")
    if size == stem:
        return f"train-{stem.replace('_', '-')}"
    return f"train-{model}-{SIZE_NAMES.get(size, size).replace('_', '-')}"


def rows(split: StepSplit) -> list[Row]:
    """The step and its parts as rows, medians and maxima (one path: reference and batched are the same numbers)."""
    out = [_row("step", split.step, batched_cost=_cost(split))]
    for part, label in LABELS.items():
        out.append(_row(label, split.parts[part], parent="step", batched_cost=split.part_costs.get(part)))
    return out


def _row(name: str, stats: Stats, **kwargs: Any) -> Row:
    return Row(name, stats.median, stats.median, reference_max_ms=stats.max, batched_max_ms=stats.max, **kwargs)


def _cost(split: StepSplit) -> Cost | None:
    if split.kernels_per_step is None or split.counted_syncs_per_step is None:
        return None
    return Cost(split.kernels_per_step, split.counted_syncs_per_step)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=10, warmup=3)
    parser.set_defaults(seed=None)  # the config's run.seed unless --seed is given
    parser.add_argument("--config", type=Path, required=True, help="the run config (YAML; base: chains read)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: --repeat, 10)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="then N more steps under torch.profiler → profile-<model>-<size>-<device>.md beside the "
                        "JSON (and its Chrome trace when ≤ 4 MB); default 0: none")  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, as drivetrain train")
    parser.add_argument("--compare", nargs="+", default=None, metavar="KEY=VALUE",
                        help="measure again with these overrides on top (last on the line) and report both splits "
                        "and their ratio (step_speedup: first median / compared median)")  # fmt: skip
    parser.add_argument("--interleave", action="store_true",
                        help="with --compare: build both trainers, then alternate their iterations (one step of "
                        "each in turn), so a change of the machine's load falls on both; default: the configured "
                        "run, then the compared one")  # fmt: skip
    args = parser.parse_args(argv)
    device = setup_bench(args)
    steps = args.steps if args.steps is not None else args.repeat
    if steps < 1 or args.warmup < 1 or args.profile < 0:
        raise SystemExit("bench train: --steps and --warmup must be ≥ 1 (the last warm-up step is counted), "
                         "--profile ≥ 0")  # fmt: skip
    if args.compare is not None and args.profile:
        raise SystemExit("bench train: --compare and --profile: profile one configuration at a time")
    if args.interleave and args.compare is None:
        raise SystemExit("bench train: --interleave alternates the steps of two runs: give --compare KEY=VALUE ...")
    overrides = [*args.overrides, *([f"run.seed={args.seed}"] if args.seed is not None else [])]
    try:
        cfg = load_config(args.config, [*overrides, f"train.device={device}"])
    except ConfigError as err:
        raise SystemExit(f"bench train: --config: {err}") from None
    if args.compare is not None:
        try:
            load_config(args.config, [*overrides, *args.compare, f"train.device={device}"])
        except ConfigError as err:
            raise SystemExit(f"bench train: --compare: {err}") from None
    name = result_name(args.config, cfg.model.name) + ("-compare" if args.compare is not None else "")
    profile_md = _profile_path(name, device, args) if args.profile else None
    trace_file = profile_md.with_suffix(".trace.json") if profile_md is not None else None
    if trace_file is not None:
        trace_file.parent.mkdir(parents=True, exist_ok=True)
    traced = f", then {args.profile} under torch.profiler" if args.profile else ""
    warm = max(args.warmup, MIN_WARMUP)  # the counted step is never the run's first (measure_steps)
    print(f"bench train: {args.config}, {warm} warm-up + {steps} timed steps{traced} on {device} ...",
          flush=True)  # fmt: skip
    shown = args.config.resolve()
    shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else args.config
    config = {
        "config": str(shown), "overrides": overrides, "steps": steps, "warmup": warm,
        "model": cfg.model.name, "impl": keywords(cfg.model.args).get("impl"), "batch_size": cfg.data.batch_size,
        "num_workers": cfg.data.num_workers, "prefetch": cfg.data.prefetch, "pin_memory": cfg.data.pin_memory,
        "persistent_workers": cfg.data.persistent_workers, "precision": cfg.precision.mode,
        "accumulation": cfg.train.accumulation,
    }  # fmt: skip

    def write_timed(timed: StepSplit) -> None:
        """The timed steps' result, written before the trace is summarised (a run cut there keeps it)."""
        early = _result(name, device, config, timed)
        early.notes.append(f"The {args.profile} profiled steps are still being summarised.")
        early.config.setdefault("backends", backend_flags())
        early.config.setdefault("malloc", args.malloc)
        written = early.write(*result_paths(early, args))
        _append_step_table(written, table_lines(timed.as_dict()))
        for path in written:
            print(f"wrote {path} (the timed steps; the profile follows)", flush=True)

    if args.interleave:
        print(f"bench train: alternating its steps with those of a run with {' '.join(args.compare)} ...", flush=True)
        split, other = measure_interleaved(args.config, overrides, args.compare, steps=steps, warmup=args.warmup,
                                           device=str(device), nvtx=args.nvtx)  # fmt: skip
    else:
        split = measure_steps(args.config, overrides, steps=steps, warmup=args.warmup, device=str(device),
                              nvtx=args.nvtx, trace_steps=args.profile, trace_file=trace_file,
                              on_timed=write_timed)  # fmt: skip
    result = _result(name, device, config, split)
    if split.trace is not None:
        result.extra["profile"] = _write_profile(split, result, profile_md, trace_file)
    lines = table_lines(split.as_dict())
    if args.compare is not None:
        if not args.interleave:
            print(f"bench train: again with {' '.join(args.compare)} ...", flush=True)
            other = measure_steps(args.config, [*overrides, *args.compare], steps=steps, warmup=args.warmup,
                                  device=str(device), nvtx=args.nvtx)  # fmt: skip
        compared = _result(name, device, {**config, "overrides": [*overrides, *args.compare]}, other)
        result.extra.update(comparison(split, other, args.compare, interleaved=args.interleave))
        result.extra["compared"] = compared.as_dict()
        result.notes.append("--compare: the top-level split is the configured run's; `compared` is the run with "
                            f"{' '.join(args.compare)} on top; step_speedup = step_ms / compared step_ms.")  # fmt: skip
        lines += ["", f"### With {' '.join(args.compare)}", "", *table_lines(other.as_dict()), "",
                  *comparison_lines(result.extra)]  # fmt: skip
    written = emit(result, args, chart=False)
    print("\n".join(lines))
    _append_step_table(written, lines)
    return 0


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def comparison(first: StepSplit, other: StepSplit, compare: list[str], *, interleaved: bool = False) -> dict[str, Any]:
    """The top-level keys ``--compare`` adds: the ratios of ``first``'s times to ``other``'s, whether both trained
    on the same batches and whether their steps alternated (``--interleave``)."""
    return {
        "compare_overrides": list(compare),
        "interleaved": interleaved,
        "step_speedup": _ratio(first.step.median, other.step.median),
        "step_max_speedup": _ratio(first.step.max, other.step.max),
        "part_speedups": {part: _ratio(s.median, other.parts[part].median) for part, s in first.parts.items()},
        "same_batches": first.batch_indices == other.batch_indices,
    }


def comparison_lines(extra: dict[str, Any]) -> list[str]:
    """Markdown lines of a comparison: the step's and each part's median, both runs, and their ratio."""
    other = extra["compared"]
    lines = ["| part | median ms | compared median ms | speedup |", "|---|---:|---:|---:|",
             f"| step | {extra['step_ms']:.2f} | {other['step_ms']:.2f} | {extra['step_speedup']} |"]  # fmt: skip
    for part, ratio in extra["part_speedups"].items():
        ms, cms = extra["parts"][part]["median_ms"], other["parts"][part]["median_ms"]
        lines.append(f"| {LABELS[part]} | {ms:.2f} | {cms:.2f} | {ratio} |")
    lines.append(f"\n- step max: {extra['step_max_ms']:.2f} → {other['step_max_ms']:.2f} ms "
                 f"(speedup {extra['step_max_speedup']}); same batches: {extra['same_batches']}; steps "
                 f"{'alternated' if extra.get('interleaved') else 'one run after the other'}; graph breaks "
                 f"{extra['graph_breaks']} → {other['graph_breaks']}; compiles in the timed steps "
                 f"{extra['compiles_in_steps']} → {other['compiles_in_steps']}; cudagraph skips "
                 f"{extra['cudagraph_skips']} → {other['cudagraph_skips']}; host syncs per step "
                 f"{extra['syncs_per_step']} → {other['syncs_per_step']}")  # fmt: skip
    return lines


def _append_step_table(written: list[Path], lines: list[str]) -> None:
    """Append the step's table (:func:`~drivetrain.engine.stepsplit.table_lines`) to the Markdown among ``written``."""
    for path in written:
        if path.suffix == ".md":
            with open(path, "a") as f:
                f.write("\n## The trainer's step\n\n" + "\n".join(lines) + "\n")


def _result(name: str, device: torch.device, config: dict[str, Any], split: StepSplit) -> BenchResult:
    """The benchmark's result of one split: its rows, the split's numbers as top-level keys, the solver's counts."""
    result = BenchResult(name, device_name(device), dict(config))
    for row in rows(split):
        result.add(row)
    measured = split.as_dict()
    measured["train_device"] = measured.pop("device")  # the top-level "device" is the device's name
    result.extra.update(measured)
    solver = gpu_solver_shapes()
    result.extra["gpu_solver"] = {"fallbacks": solver["fallbacks"], "wrapper_calls": solver["wrapper_calls"],
                                  "compiled": len(solver["compiled"])}  # fmt: skip
    result.notes += [
        "One path (the config's model.args.impl): the trainer runs it alone, so each row's reference_ms and "
        "batched_ms hold the same measurement (speedup 1 by construction); the counts of the counted step are in "
        "the batched column ('other': the step's minus its parts'). The numbers to read are the top-level keys "
        "(step_ms, parts, overhead_share, ...).",
        "Parts: medians over the timed steps; 'other' is the median of each step minus its parts, so the part "
        "medians need not add up to the step's median exactly.",
        "overhead_share = 1 - (forward + backward) / step, from the medians.",
    ]
    if split.skipped_steps:
        result.notes.append(f"{split.skipped_steps} of the {split.steps} timed steps skipped the optimizer's update "
                            "(non-finite gradients, e.g. an fp16 loss scale still settling): taken and undone, "
                            "their optimizer part is a little overstated.")  # fmt: skip
    return result


def _profile_path(name: str, device: torch.device, args: argparse.Namespace) -> Path | None:
    """Where ``--profile`` writes: ``profile-<model>-<size>-<device>.md`` beside the JSON (or the Markdown), named as
    it is with ``train-`` replaced; None when no result file is written (the summary is printed alone)."""
    target = args.json or args.md or (RESULTS_DIR / f"{name}-{device_slug(device)}.json" if args.save else None)
    if target is None:
        return None
    stem = Path(target).stem
    return Path(target).with_name(f"profile-{stem.removeprefix('train-')}.md")


def _write_profile(split: StepSplit, result: BenchResult, md: Path | None, trace_file: Path | None) -> dict[str, Any]:
    """Print (and write to ``md``) the traced steps' summary; keep the Chrome trace only up to ``TRACE_KEEP_MB``.
    Returns the JSON's ``profile`` entry."""
    summary = split.trace
    assert summary is not None
    notes = [f"device: {result.device}", f"config: {result.config['config']} {' '.join(result.config['overrides'])}",
             f"the {summary['steps']} steps after bench train's {split.warmup} warm-up and {split.steps} timed steps",
             f"torch {torch.__version__}; {result.date}"]  # fmt: skip
    kept = None
    if trace_file is not None and trace_file.is_file():
        size_mb = trace_file.stat().st_size / 2**20
        if size_mb <= TRACE_KEEP_MB:
            kept = trace_file.name
            notes.append(f"Chrome trace: {kept} ({size_mb:.1f} MB; chrome://tracing or ui.perfetto.dev)")
        else:
            trace_file.unlink()  # ours, written just now
            notes.append(f"the Chrome trace ({size_mb:.0f} MB) was over {TRACE_KEEP_MB} MB and is not kept")
    text = trace.render(summary, f"Profile of `{result.benchmark}`: the trainer's steps", notes=notes)
    if md is not None:
        md.parent.mkdir(parents=True, exist_ok=True)
        replace_text(md, text)  # a link at the name is replaced, its target never written
        print(f"wrote {md}")
    else:
        print(text)
    gpu = summary["gpu"]
    return {"steps": summary["steps"], "file": md.name if md is not None else None, "chrome_trace": kept,
            "syncs_per_step": summary["syncs_per_step"],
            "gpu_idle_share": None if gpu is None else round(gpu["idle_share"], 4)}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
