"""``drivetrain tune loader --config FILE [key=value ...]``: measure data wait against step time for a grid of
loader settings on the real training step, print a table and the recommended setting, optionally write it.

Every grid point trains the config (with the overrides) for ``--warmup`` + ``--steps`` steps in a fresh run
directory under a temporary folder (nothing of the run is kept) and reads the trainer's own per-step timers:
the median step time and the median data wait (the time ``next(batch)`` blocked) over the timed steps, and the
CPU cores the process tree used. The grid: ``--workers`` × ``--prefetch`` × ``--persistent`` × ``--pin`` ×
``--loaders`` (prefetch and persistence only where there are workers, pinning only with CUDA; ``dali`` only when
NVIDIA DALI is installed). The recommendation is the fastest step among the settings whose data wait stays
below ``--max-wait`` of the step (the field's rule: the loader keeps up when the step hardly waits for it),
fewer workers on a tie within 3 %; ``--write-config OUT.yaml`` writes the whole config (with the overrides) with
that setting in its ``data`` section, ready for ``drivetrain train --config OUT.yaml``. Beside it, the worker-count
rule (``drivetrain.engine.batches.suggest_num_workers``, docs/data.md) applied to the ``workers=0`` setting's
measurements: its data wait is the loader's cost per batch, its step time less that wait the step's own.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

EPILOG = """\
examples:
  drivetrain tune loader --config configs/my_camera_run.yaml
  drivetrain tune loader --config configs/my_camera_run_full.yaml --workers 2,4,8 --loaders torch,dali \\
      --write-config runs/loader.yaml
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``tune`` (with its ``loader`` subcommand) on ``sub``."""
    parser = sub.add_parser(
        "tune",
        help="measure settings on the real training step and recommend one (tune loader)",
        description="Measure settings on the real training step and recommend one.",
    )
    what = parser.add_subparsers(dest="what", metavar="WHAT", required=True)
    loader = what.add_parser(
        "loader",
        help="data wait vs step time over a grid of loader settings; prints the table and a recommendation",
        description=__doc__.split("\n\n", 1)[1].replace("``", "`"),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    loader.add_argument("--config", required=True, metavar="FILE", help="the training config to tune")
    loader.add_argument(
        "--print-config", action="store_true", help="print the config resolved and exit (measures nothing)"
    )
    cpus = os.cpu_count() or 1
    default_workers = ",".join(str(w) for w in sorted({0, min(2, cpus), min(4, cpus)}))
    loader.add_argument("--workers", default=default_workers, help=f"num_workers values (default: {default_workers})")
    loader.add_argument("--prefetch", default="2", help="prefetch_factor values, with workers (default: 2)")
    loader.add_argument("--persistent", default="true", help="persistent_workers values, with workers (default: true)")
    loader.add_argument("--pin", default="true,false", help="pin_memory values, CUDA only (default: true,false)")
    loader.add_argument("--loaders", default="torch,dali", help="backends (default: torch,dali where DALI is there)")
    loader.add_argument("--steps", type=int, default=8, help="timed steps per setting (default: 8)")
    loader.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    loader.add_argument("--max-wait", type=float, default=0.1, help="data wait / step time to count as keeping up")
    loader.add_argument("--write-config", type=Path, default=None, metavar="OUT.yaml", help="write the recommendation")
    loader.add_argument("--json", type=Path, default=None, help="write every measurement as JSON here")
    loader.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. data.batch_size=4")
    loader.set_defaults(run=run)


def _values(text: str, kind: type, name: str) -> list[Any]:
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if kind is bool:
            if part.lower() not in ("true", "false"):
                raise SystemExit(f"tune loader: --{name}: expected true/false values, got {part!r}")
            out.append(part.lower() == "true")
        else:
            try:
                out.append(int(part))
            except ValueError:
                raise SystemExit(f"tune loader: --{name}: expected integers, got {part!r}") from None
    if not out:
        raise SystemExit(f"tune loader: --{name}: no values")
    return out


def grid(args: argparse.Namespace, cuda: bool, dali: bool) -> list[dict[str, Any]]:
    """The loader settings to measure (``data.*`` keys), duplicates removed."""
    workers = _values(args.workers, int, "workers")
    if min(workers) < 0:
        raise SystemExit("tune loader: --workers: values must be ≥ 0")
    prefetch, persistent = _values(args.prefetch, int, "prefetch"), _values(args.persistent, bool, "persistent")
    pins = _values(args.pin, bool, "pin") if cuda else [False]
    loaders = [name.strip() for name in args.loaders.split(",") if name.strip()]
    unknown = sorted(set(loaders) - {"torch", "dali"})
    if unknown:
        raise SystemExit(f"tune loader: --loaders: unknown {unknown} (torch, dali)")
    if not dali and "dali" in loaders:
        print("tune loader: NVIDIA DALI is not installed; measuring the torch loader only", flush=True)
        loaders = [name for name in loaders if name != "dali"]
    settings: list[dict[str, Any]] = []
    for loader, count, pin in itertools.product(loaders, workers, pins):
        if count == 0 or loader == "dali":
            extra = [{"prefetch_factor": None, "persistent_workers": False}] if count == 0 else [
                {"prefetch_factor": p, "persistent_workers": False} for p in prefetch
            ]  # fmt: skip
        else:
            extra = [
                {"prefetch_factor": p, "persistent_workers": k} for p, k in itertools.product(prefetch, persistent)
            ]
        for more in extra:
            setting = {"loader": loader, "num_workers": count, "pin_memory": pin, **more}
            if loader == "dali" and count == 0:
                setting["num_workers"] = 1  # DALI runs its source in at least one process
            if setting not in settings:
                settings.append(setting)
    return settings


def measure(
    config: str, overrides: list[str], setting: dict[str, Any], steps: int, warmup: int, folder: Path
) -> dict[str, float]:
    """Train ``warmup + steps`` steps with ``setting``; medians over the timed steps."""
    from drivetrain.engine import Trainer, load_config
    from drivetrain.profile import ResourceMonitor
    from drivetrain.safeio.files import remove_path
    from drivetrain.safeio.json_files import jsonl_records

    out = folder / "run"
    data = [f"data.{key}={'null' if value is None else json.dumps(value)}" for key, value in setting.items()]
    run_keys = [
        f"run.out_dir={out}", "log.progress=false", "log.tensorboard=false", "log.every=1", "eval.every=0",
        "eval.at_start=false", f"train.steps={warmup + steps}", f"checkpoint.every={warmup + steps}",
        "checkpoint.keep=1",
    ]  # fmt: skip
    cfg = load_config(config, [*overrides, *run_keys, *data])
    trainer = Trainer(cfg)
    try:
        with ResourceMonitor("cpu") as monitor:
            trainer.fit()
    finally:
        trainer.close()
    records = [r for _, _, r in jsonl_records((out / "metrics.jsonl").read_text(), source=out / "metrics.jsonl")]
    timed = [r for r in records if "step_time_s" in r][warmup:]
    assert monitor.result is not None
    remove_path(out, ignore_errors=True)  # our scratch run (under a temporary folder we made)
    return {
        "step_ms": statistics.median(r["step_time_s"] for r in timed) * 1e3,
        "wait_ms": statistics.median(r["data_wait_s"] for r in timed) * 1e3,
        "cpu_cores": monitor.result.cpu_cores,
    }


def recommend(rows: list[tuple[dict[str, Any], dict[str, float]]], max_wait: float) -> tuple[dict[str, Any], bool]:
    """The setting to use and whether it keeps the loader ahead (``wait ≤ max_wait · step``)."""
    keeping_up = [(s, m) for s, m in rows if m["wait_ms"] <= max_wait * m["step_ms"]]
    pool = keeping_up or rows
    fastest = min(m["step_ms"] for _, m in pool)
    close = [(s, m) for s, m in pool if m["step_ms"] <= fastest * 1.03]  # within the timers' noise: fewer workers
    best = min(close, key=lambda sm: (sm[0]["num_workers"], sm[1]["step_ms"]))
    return best[0], bool(keeping_up)


def run(args: argparse.Namespace) -> int:
    """Measure the grid, print the table and the recommendation; 0, or 2 on a config error."""
    import torch
    import yaml

    from drivetrain.engine import ConfigError, load_config
    from drivetrain.engine.config import config_to_dict
    from drivetrain.engine.registry import canonical_name, lookup
    from drivetrain.pipeline.dali import dali_available

    if args.print_config:
        from drivetrain.cli.configs import print_resolved

        return print_resolved(args.config, args.overrides, "tune loader")
    try:
        base = load_config(args.config, args.overrides)
        lookup("model", base.model.name)  # an unregistered name is one config error, not one per setting
        lookup("data", base.data.name)
    except ConfigError as err:
        print(f"drivetrain tune loader: config error: {err}", file=sys.stderr)
        return 2
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("tune loader: --steps must be ≥ 1 and --warmup ≥ 0")
    cuda = base.train.device != "cpu" and torch.cuda.is_available()
    dali = dali_available() and canonical_name("data", base.data.name) in ("frames", "synthetic")
    settings = grid(args, cuda, dali)
    print(f"tune loader: {len(settings)} settings × {args.warmup}+{args.steps} steps of {args.config}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, setting in enumerate(settings, 1):
            label = _label(setting)
            try:
                measured = measure(args.config, args.overrides, setting, args.steps, args.warmup, Path(tmp))
            except ConfigError as err:
                print(f"  [{i}/{len(settings)}] {label}: skipped ({err})", flush=True)
                continue
            rows.append((setting, measured))
            print(f"  [{i}/{len(settings)}] {label}: step {measured['step_ms']:.1f} ms, data wait "
                  f"{measured['wait_ms']:.1f} ms, {measured['cpu_cores']:.2f} CPU cores", flush=True)  # fmt: skip
    if not rows:
        print("drivetrain tune loader: no setting could be measured", file=sys.stderr)
        return 2
    best, keeps_up = recommend(rows, args.max_wait)
    print()
    print("| loader setting | step ms | data wait ms | wait / step | CPU cores |")
    print("|---|---:|---:|---:|---:|")
    for setting, m in sorted(rows, key=lambda sm: sm[1]["step_ms"]):
        mark = " ← recommended" if setting == best else ""
        print(f"| {_label(setting)}{mark} | {m['step_ms']:.1f} | {m['wait_ms']:.1f} | "
              f"{m['wait_ms'] / m['step_ms']:.2f} | {m['cpu_cores']:.2f} |")  # fmt: skip
    print()
    verdict = "the step hardly waits for data" if keeps_up else (
        f"no setting brings the data wait under {args.max_wait:.0%} of the step: the loader is the bottleneck "
        "(more CPU cores, the device augmentation or DALI would help)"
    )  # fmt: skip
    print(f"recommended: {_label(best)} — {verdict}")
    rule = worker_rule(rows, _cores())
    if rule is not None:
        print(f"worker rule (docs/data.md): {rule['workers']} worker(s) for {rule['cores']} cores, a loader cost of "
              f"{rule['worker_ms_per_batch']:.1f} ms a batch and a {rule['step_ms']:.1f} ms step; expected data wait "
              f"{rule['wait_ms']:.1f} ms")  # fmt: skip
    print("as overrides: " + " ".join(f"data.{k}={'null' if v is None else json.dumps(v)}" for k, v in best.items()))
    # A link at either name is replaced by the file, its target never written (drivetrain.safeio.files).
    if args.write_config is not None:
        tuned = config_to_dict(base)
        tuned["data"].update(best)
        _write(args.write_config, "--write-config",
               f"# {args.config} with the loader setting of `drivetrain tune loader` (fastest step with data wait "
               f"≤ {args.max_wait:.0%} of it): {_label(best)}\n" + yaml.safe_dump(tuned, sort_keys=False))  # fmt: skip
        print(f"wrote {args.write_config}")
    if args.json is not None:
        _write(args.json, "--json", json.dumps({"config": args.config, "recommended": best, "keeps_up": keeps_up,
                                                "worker_rule": rule, "rows": [{**s, **m} for s, m in rows]},
                                               indent=1))  # fmt: skip
    return 0


def _write(path: Path, option: str, text: str) -> None:
    """Write ``text`` as ``path`` (its folder made; a link at the name replaced); one SystemExit line on failure."""
    from drivetrain.safeio.files import replace_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, text)
    except OSError as err:
        raise SystemExit(f"tune loader: {option}: cannot write {err.filename or path} ({err.strerror})") from None


def worker_rule(rows: list[tuple[dict[str, Any], dict[str, float]]], cores: int) -> dict[str, float] | None:
    """The worker-count rule on the torch loader's ``workers=0`` measurement (the loader's cost per batch is its
    data wait, the step's own time the rest): ``{"workers", "worker_ms_per_batch", "step_ms", "wait_ms", "cores"}``
    with the wait the rule predicts; None without that measurement."""
    from drivetrain.engine.batches import loader_wait_ms, suggest_num_workers

    serial = [m for s, m in rows if s["loader"] == "torch" and s["num_workers"] == 0]
    if not serial:
        return None
    worker_ms = min(m["wait_ms"] for m in serial)
    step_ms = max(min(m["step_ms"] for m in serial) - worker_ms, 1e-3)  # the step without its data wait
    workers = suggest_num_workers(cores, worker_ms, step_ms)
    return {"workers": workers, "worker_ms_per_batch": round(worker_ms, 3), "step_ms": round(step_ms, 3),
            "wait_ms": round(loader_wait_ms(workers, worker_ms, step_ms), 3), "cores": cores}  # fmt: skip


def _cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _label(setting: dict[str, Any]) -> str:
    parts = [setting["loader"], f"workers={setting['num_workers']}"]
    if setting.get("prefetch_factor") is not None:
        parts.append(f"prefetch={setting['prefetch_factor']}")
    if setting.get("persistent_workers"):
        parts.append("persistent")
    if setting.get("pin_memory"):
        parts.append("pinned")
    return " ".join(parts)
