"""Full training iterations of StreamPETR, PointPillars or SSN: reference vs batched path, same weights, batches.

``--model pointpillars|ssn`` runs ``_iteration_lidar.py`` (anchor assignment and losses; see its docstring);
the rest of this text is about StreamPETR.

One process builds the model once from ``configs/streampetr_{size}.yaml`` (``model.args``, read with its ``base:``
chain as ``drivetrain train`` reads it) and the engine's AdamW (``optim``: peak lr × each group's ``lr_mult``,
weight decay, no schedule; gradients clipped to ``optim.clip_norm``), then deep-copies model and optimizer: the two
paths run on **identical copies**, alternating repeat by repeat (``reference`` then ``batched``), each copy walking
the same batches in the same order with its own memory bank and optimizer state. Each copy is given its path
(``model.path``, a :class:`~drivetrain.models.streampetr.loss.Path`: both losses' entry points and the
denoising-query builder, ``make_dn_queries`` / ``reference_make_dn_queries``), as ``model.args.impl`` picks it at
build. Before every iteration the global RNG is reseeded
with ``seed + 1 + i``, so both copies draw the same denoising noise and dropout masks.

Data: the synthetic nuScenes-format set (``drivetrain.data.sources.synthetic``, the config's
``data.args``; ``full`` is rendered at 704×256 into ``data/synth-full-704``, generated on first use with a
progress bar). Batches are ``--batch`` slots of consecutive frames in scene order (``SequenceSampler``
without shuffling, epochs repeated as needed), so the memory bank streams as in training (``prev_exists``
as in the data). Every iteration, warm-up and timed, trains on a batch of its own, so the timed iterations see the
ground-truth counts the data gives, as training does: the config's ``gt_counts_timed`` records the padded count of
each timed batch (the largest per sample, and per image for the focal head: the shape the matcher solves), how
many distinct values they took and how many of them no warm-up batch had (a kernel compiled per shape compiles
there, inside a timed iteration: the row's max shows it). Every batch the run needs is read once before timing
(warming the OS file cache, so neither path pays for cold reads). **remaining (data wait)** is then timed inside
each iteration as what a loader without workers costs: read and decode the frames (``ds[(frame, prev_exists)]``),
``ds.collate``, pin (CUDA) and copy to the device (the trainer's ``to_device``). It is the same work for both paths.

Rows (medians over ``--repeat`` after ``--warmup``, each with its slowest timed iteration; CUDA events on a GPU,
no sync inside an iteration):
iteration → forward (network, with its denoising queries; loss → StreamPETR head (main: cost, transfer,
solve, targets, losses; dn: targets, losses) and focal head (cost, transfer, solve, targets, heatmap,
losses)) → optimisation (backward, clip, step) → remaining (data wait). The ``main``/``dn``/``dn queries``
rows come from wrapping the loss's and model's per-part methods of each copy in timed regions here (the
library has no region for them). Before timing, a throw-away copy checks that the loss computed here (the
two criteria called as ``StreamPETR.loss`` calls them) equals ``model.loss``, and that both paths give the
same loss terms; the first iteration's totals of the two copies are compared too.

With ``--compile`` a third copy, ``compiled``, trains with the batched losses under ``torch.compile`` (the
criteria's ``compile=`` option, ``--compile-mode`` for e.g. ``reduce-overhead``); its rows add
``"variants": {"reference", "batched", "compiled"}`` where it has them (inside a compiled loss only the solver's
transfer and solve are timed), its first iteration (compiling the losses) is timed apart, and its first total
loss is checked against the batched copy's. The lidar models take the same option (``compile_loss``).

Host syncs per iteration (training step, data excluded) are counted on CUDA in one extra untimed
iteration per path with ``torch.cuda.set_sync_debug_mode("warn")`` (one warning per synchronising call);
on the CPU there is no device to wait for and they are reported as n/a. The published breakdown
(StreamPETR, nuScenes mini, batch 8, A100, fp16) is written beside this run's.

Run: ``drivetrain bench iteration --model streampetr --size tiny|full --batch 8 [--device cpu|cuda] [--save]``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import importlib.util
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from drivetrain.batch import Batch
from drivetrain.data.sampler import SequenceSampler
from drivetrain.data.sources import synthetic
from drivetrain.engine import registry
from drivetrain.engine.build import build_optimizer
from drivetrain.engine.config import ConfigError, OptimConfig, from_dict
from drivetrain.engine.config_files import read_config_file
from drivetrain.losses.term_weights import resolve_weights, weighted_total
from drivetrain.match import gpu_solver_shapes, warm_pending
from drivetrain.models.streampetr import StreamPETR
from drivetrain.models.streampetr.loss import path_of
from drivetrain.pipeline.transfer import to_device
from drivetrain.profile import (
    BenchResult,
    Profiler,
    Row,
    active,
    add_bench_arguments,
    device_name,
    device_slug,
    emit,
    region,
    rows_from_profilers,
    setup_bench,
    synchronize,
)
from drivetrain.profile.bench import RESULTS_DIR, count_variation
from drivetrain.profile.costmodel import host_work
from drivetrain.safeio.files import save_figure

DESCRIPTION = __doc__.splitlines()[0]

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"streampetr": "streampetr"}  # --model → config stem
SIZES = ("tiny", "full")
PATHS = ("reference", "batched")
TOP = "iteration"
DATA = f"{TOP}/remaining (data wait)"
CHECK_RTOL = 1e-4  # loss terms of the two paths on the same outputs (float32 sums in another order)

# The published breakdown (StreamPETR, nuScenes mini, batch 8 per GPU, A100, fp16), milliseconds.
PUBLISHED_SOURCE = "StreamPETR, nuScenes mini, batch 8, A100 (fp16): the published per-iteration breakdown"
PUBLISHED = {
    TOP: ("training iteration", 760.0, 615.0),
    f"{TOP}/forward": ("forward incl. loss", 363.0, 221.0),
    f"{TOP}/forward/network": ("network", None, None),
    f"{TOP}/forward/loss": ("loss", 183.0, 41.0),
    f"{TOP}/forward/loss/streampetr head": ("StreamPETR head", 82.0, 25.0),
    f"{TOP}/forward/loss/focal head": ("focal head", 100.0, 16.0),
    f"{TOP}/optimisation": ("optimisation (backward + clip + step)", 318.0, 314.0),
    DATA: ("remaining (data wait)", 79.0, 80.0),
}


# ------------------------------------------------------------------------------------------ setup
def load_config(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The run config of ``--model``/``--size`` (or ``--config``) with its ``base:`` chain merged, as ``drivetrain
    train`` reads it (:func:`~drivetrain.engine.config_files.read_config_file`: the bounded safe loader per file)."""
    path = args.config or ROOT / "configs" / f"{MODELS[args.model]}_{args.size}.yaml"
    try:
        raw = read_config_file(path).data
    except ConfigError as err:
        raise SystemExit(f"--config: {err}") from None
    for key in ("model", "data", "optim"):
        if not isinstance(raw, dict) or not isinstance(raw.get(key), dict):
            raise SystemExit(f"{path}: needs a '{key}' section")
    return Path(path), raw


def build_dataset(args: argparse.Namespace, data_args: dict[str, Any]):
    """The synthetic dataset of the config's ``data.args`` (``--data-root``/``--scenes`` override)."""
    kwargs = dict(data_args)
    kwargs["root"] = str(args.data_root or ROOT / kwargs.get("root", f"data/synth-{args.size}"))
    if args.scenes is not None:
        kwargs["scenes"] = args.scenes
    if "image_size" in kwargs and kwargs["image_size"] is not None:
        kwargs["image_size"] = tuple(kwargs["image_size"])
    if not (Path(kwargs["root"]) / "drivetrain_index.npz").is_file():
        print(f"generating the synthetic '{kwargs.get('size')}' dataset into {kwargs['root']} (once) ...", flush=True)
    return synthetic(generate=True, **kwargs), kwargs


def batch_keys(ds: Any, batch: int, steps: int, seed: int) -> list[list[Any]]:
    """``steps`` batches of ``(frame, prev_exists)`` keys: each slot walks consecutive frames of its scenes."""
    try:
        sampler = SequenceSampler(ds.frames.scene_lengths(), batch, seed=seed, shuffle=False)
    except ValueError as err:
        raise SystemExit(f"--batch {batch}: {err} (the split has {len(ds.frames.scene_lengths())} scenes)") from None
    keys: list[list[Any]] = []
    while len(keys) < steps:  # epochs repeat; each starts every slot at a scene's first frame (prev_exists False)
        keys.extend(iter(sampler))
    return keys[:steps]


def fetch(ds: Any, keys: list[Any], device: torch.device) -> Any:
    """Read, decode and collate one batch and move it to ``device``, as a loader without workers does (host work:
    not counted as kernels or syncs)."""
    with host_work():
        batch = ds.collate([ds[k] for k in keys])
        if device.type == "cuda":
            batch = batch.pin_memory()
        return to_device(batch, device)


def wrap_in_region(obj: Any, attr: str, name: str) -> bool:
    """Make ``obj.attr`` (a method of this instance only) a timed region ``name`` of the active profiler."""
    method = getattr(obj, attr, None)
    if not callable(method):
        return False

    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with region(name):
            return method(*args, **kwargs)

    setattr(obj, attr, timed)
    return True


def instrument(model: StreamPETR) -> list[str]:
    """Timed regions for the parts the library does not mark (per instance); returns those missing."""
    missing = []
    for obj, attrs, name in (
        (model, ("_dn_queries",), "dn queries"),
        (model.criterion, ("_batched_main", "_reference_main"), "main"),
        (model.criterion, ("_batched_dn", "_reference_dn"), "dn"),
    ):
        for attr in attrs:
            if not wrap_in_region(obj, attr, name):
                missing.append(f"{type(obj).__name__}.{attr}")
    return missing


def add_compile_arguments(parser: argparse.ArgumentParser) -> None:
    """``--compile`` and ``--compile-mode`` (shared with the lidar iteration benchmark)."""
    parser.add_argument("--compile", action="store_true", help="add a copy whose batched loss runs under torch.compile")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode of --compile (e.g. reduce-overhead)")


def compile_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``torch.compile`` arguments of ``--compile`` / ``--compile-mode``."""
    return {"mode": args.compile_mode} if args.compile_mode else {}


def add_compiled_variant(rows: list[Row], compiled: Profiler) -> None:
    """Give every row the compiled copy also timed ``"variants": {reference, batched, compiled}`` and their maxima
    (its kernels are not counted: a compiled graph's kernels are not ATen ops)."""
    times = compiled.summary()
    for row in rows:
        if row.name in times:
            row.variants = {"reference": row.reference_ms, "batched": row.batched_ms}
            row.variants["compiled"] = times[row.name].median
            row.variants_max = {"reference": row.reference_max_ms, "batched": row.batched_max_ms}
            row.variants_max["compiled"] = times[row.name].max
            row.baseline = "reference"
            row.variant_costs = {"reference": row.reference_cost, "batched": row.batched_cost}


def padded_gt_counts(batch: Batch, *, images: bool) -> dict[str, int]:
    """The padded ground-truth counts of ``batch`` (the matchers' target dimension G): the largest count per sample
    and, with ``images`` (a head matching 2D boxes), per image. Read before timing (host reads)."""
    counts = {"max_gt_per_sample": int(batch.gt_boxes.sizes.max())}
    if images:
        counts["max_gt_per_image"] = int(batch.gt_boxes_2d.sizes.max())
    return counts


def compiled_note(options: dict[str, Any], seconds: float, diff: float) -> str:
    """The result's note on the compiled copy."""
    return (
        f"compiled: a third copy trained with its batched losses under torch.compile({options or ''}) (one graph per "
        "loss, a Hungarian solver inside it as a custom operator); its first iteration, a warm-up one, took "
        f"{seconds:.1f} s with the compiling; its first total loss matched the batched copy's within {diff:.1e}. "
        "Inside a compiled loss only the solver's transfer and solve are timed; its kernels are not counted (not "
        "ATen ops)."
    )


# ------------------------------------------------------------------------------------------ the iteration
class Trainee:
    """One path's copy: model, optimizer, what the loss needs, and the detached total of each iteration.

    (A plain class: ``drivetrain bench`` imports this script without a ``sys.modules`` entry, which
    ``@dataclass`` needs.)
    """

    def __init__(
        self, model: StreamPETR, optimizer: torch.optim.Optimizer, weights: dict[str, float], clip: float | None
    ) -> None:
        self.model, self.optimizer, self.weights, self.clip = model, optimizer, weights, clip
        self.totals: list[torch.Tensor] = []


def loss_terms(model: StreamPETR, outputs: dict[str, Any], batch: Batch, timed: Callable[[str], Any]) -> dict:
    """``model.loss(outputs, batch)``, one region per criterion (the same calls as ``StreamPETR.loss``)."""
    with timed("streampetr head"):
        terms = model.path.loss_3d(model.criterion, outputs, batch)
    if model.focal_criterion is not None:
        with timed("focal head"):
            padded = dataclasses.replace(batch, image_size=outputs["padded_size"])  # the original's pad_shape
            terms.update(model.path.loss_focal_head(model.focal_criterion, outputs["focal"], padded))
    return terms


def iteration(t: Trainee, ds: Any, keys: list[Any], device: torch.device, timed: Callable[[str], Any]) -> None:
    """One training iteration: data, forward, loss, backward, clip, step (each a region of ``timed``)."""
    with timed(TOP):
        with timed("remaining (data wait)"):
            batch = fetch(ds, keys, device)
        with timed("forward"):
            with timed("network"):
                outputs = t.model(batch)
            with timed("loss"):
                terms = loss_terms(t.model, outputs, batch, timed)
                total = weighted_total(terms, t.weights)
        optimise(t, total, timed)
    t.totals.append(total.detach())


def optimise(t: Any, total: torch.Tensor, timed: Callable[[str], Any]) -> None:
    """The ``optimisation`` region of an iteration: backward, clip to ``t.clip``, optimizer step."""
    with timed("optimisation"):
        with timed("backward"):
            total.backward()
        with timed("clip"):
            if t.clip is not None:
                torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.clip, foreach=True)
        with timed("step"):
            t.optimizer.step()
            t.optimizer.zero_grad(set_to_none=True)


class SyncCounter:
    """Counts CUDA host syncs per region from ``torch.cuda.set_sync_debug_mode('warn')`` warnings."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._stack: list[str] = []
        self._caught: list[warnings.WarningMessage] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self._caught = caught
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode("default")

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        path = "/".join([*self._stack, name])
        self._stack.append(name)
        start = len(self._caught)
        try:
            yield
        finally:
            self._stack.pop()
            syncs = sum("synchroniz" in str(w.message) for w in self._caught[start:])
            self.counts[path] = self.counts.get(path, 0) + syncs


# ------------------------------------------------------------------------------------------ checks
def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs() / torch.maximum(a.abs(), b.abs()).clamp(min=1e-6))


def check_loss(model: StreamPETR, batch: Batch, seed: int) -> float:
    """On a throw-away copy: the loss here equals ``model.loss`` bit for bit, per path; return the worst
    relative difference between the paths' terms (SystemExit above ``CHECK_RTOL``)."""
    probe = copy.deepcopy(model).train()
    torch.manual_seed(seed)
    with torch.no_grad():
        outputs = probe(batch)
        per_path = {}
        for impl in PATHS:
            probe.path = path_of(impl)  # a copy's path, switched: the benchmark's identical copies
            ours = loss_terms(probe, outputs, batch, lambda _: contextlib.nullcontext())
            theirs = probe.loss(outputs, batch)
            if ours.keys() != theirs.keys() or any(not torch.equal(ours[k], theirs[k]) for k in ours):
                raise SystemExit(f"the benchmark's loss differs from StreamPETR.loss ({impl}): update loss_terms()")
            per_path[impl] = ours
    worst = max(relative_difference(per_path["reference"][k], per_path["batched"][k]) for k in per_path["reference"])
    if worst > CHECK_RTOL:
        raise SystemExit(f"the batched loss terms differ from the reference by {worst:.1e} (relative) > {CHECK_RTOL}")
    return worst


# ------------------------------------------------------------------------------------------ output
def shown(path: str | Path) -> str:
    """``path`` relative to the checkout when inside it (results are committed), else as given."""
    path = Path(path)
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def fmt_pair(ref: float | None, bat: float | None) -> str:
    if ref is None or bat is None:
        return "—"
    speedup = ref / bat if bat > 0 else math.inf
    digits = 0 if max(ref, bat) >= 100 else 1 if max(ref, bat) >= 10 else 2
    return f"{ref:.{digits}f} → {bat:.{digits}f} (×{speedup:.2f})"


def published_table(rows: dict[str, Row], syncs: dict[str, Any]) -> list[str]:
    """The published layout: each row "reference → batched (×speedup)", this run beside the A100 numbers."""
    lines = ["| row | this run (ms) | published, A100 (ms) |", "|---|---|---|"]
    for name, (label, pref, pbat) in PUBLISHED.items():
        ours = fmt_pair(rows[name].reference_ms, rows[name].batched_ms) if name in rows else "—"
        lines.append(f"| {label} | {ours} | {fmt_pair(pref, pbat)} |")
    ref, bat = syncs["reference"], syncs["batched"]
    if isinstance(ref, dict):
        lines.append(f"| host syncs per iteration (data excluded) | {ref['step']} → {bat['step']} | — |")
    else:
        lines.append(f"| host syncs per iteration | {ref} | — |")
    return lines


class IterationResult(BenchResult):
    """The shared Markdown, with the published layout as a table instead of a JSON line."""

    def to_markdown(self) -> str:
        extra = self.extra
        self.extra = {k: v for k, v in extra.items() if k not in ("published", "published_layout")}
        try:
            text = super().to_markdown()
        finally:
            self.extra = extra
        layout = extra.get("published_layout", [])
        return text + "\n## Published layout (reference → batched, ×speedup; medians)\n\n" + "\n".join(layout) + "\n"


def write_png(result: BenchResult, path: Path) -> Path | None:
    """Horizontal bars, reference vs batched per row (log scale); None (with a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: matplotlib is not installed; no chart written to {path} (pip install 'drivetrain[viz]')")
        return None
    rows = result.rows
    depth: dict[str, int] = {}
    for r in rows:  # parents come before their children
        depth[r.name] = 0 if r.parent is None else depth[r.parent] + 1
    labels = ["· " * depth[r.name] + r.name.rsplit("/", 1)[-1] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(rows) + 1.6))
    ys = list(range(len(rows)))
    h = 0.38
    ax.barh([y - h / 2 for y in ys], [r.reference_ms for r in rows], height=h, label="reference", color="#d62728")
    ax.barh([y + h / 2 for y in ys], [r.batched_ms for r in rows], height=h, label="batched", color="#1f77b4")
    for y, r in zip(ys, rows, strict=True):
        ax.text(max(r.reference_ms, r.batched_ms) * 1.08, y, f"×{r.speedup:.2f}", va="center", fontsize=8)
    ax.set_yticks(ys, labels, fontsize=8, family="monospace")
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("median ms per iteration (log scale)")
    lo = min(min(r.reference_ms, r.batched_ms) for r in rows)
    hi = max(max(r.reference_ms, r.batched_ms) for r in rows)
    ax.set_xlim(max(lo / 2, 1e-3), hi * 4)
    cfg = result.config
    title = f"{cfg['model']} {cfg['size']}, batch {cfg['batch']}: training iteration on {result.device}"
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)  # a link at the name is replaced, its target never written
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ main
def is_lidar_model(name: str) -> bool:
    """Whether ``name`` is a registered model whose batches carry lidar points only (its spec's modalities): the
    models ``--model`` hands to ``_iteration_lidar.py``."""
    try:
        return registry.model_spec(name).modalities == frozenset({"lidar"})
    except ConfigError:  # not a registered name
        return False


def lidar_models() -> list[str]:
    """The registered lidar models (:func:`is_lidar_model`), by name."""
    return [name for name in registry.known_names("model") if is_lidar_model(name)]


def _lidar_main(argv: list[str], prog: str | None) -> int:
    """``--model`` a lidar model (:func:`is_lidar_model`): the lidar detectors' iteration benchmark
    (``_iteration_lidar.py``)."""
    path = Path(__file__).parent / "_iteration_lidar.py"
    spec = importlib.util.spec_from_file_location("drivetrain_bench_iteration_lidar", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.main(argv, prog)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--model", default="streampetr")
    if is_lidar_model(peek.parse_known_args(argv)[0].model):
        return _lidar_main(argv, prog)
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=10, warmup=3)
    parser.add_argument(
        "--model", default="streampetr", help="streampetr, or pointpillars / ssn (see --model ssn --help)"
    )
    parser.add_argument("--size", default="tiny", help="config size: tiny or full (default: tiny)")
    parser.add_argument("--batch", type=int, default=8, help="batch slots B (default: 8)")
    parser.add_argument("--config", type=Path, default=None, help="run config (default: configs/<model>_<size>.yaml)")
    parser.add_argument("--data-root", type=Path, default=None, help="dataset folder (default: the config's root)")
    parser.add_argument("--scenes", type=int, default=None, help="only the first N scenes of the preset (quick runs)")
    add_compile_arguments(parser)
    args = parser.parse_args(argv)
    if args.model not in MODELS:
        raise SystemExit(f"--model: unknown model {args.model!r}; available: {', '.join([*MODELS, *lidar_models()])}")
    if args.size not in SIZES:
        raise SystemExit(f"--size: unknown size {args.size!r}; available: {', '.join(SIZES)}")
    if args.batch < 1 or args.repeat < 1 or args.warmup < 0:
        raise SystemExit("--batch and --repeat must be ≥ 1, --warmup ≥ 0")
    if args.compile and args.warmup < 1:
        raise SystemExit("--compile needs --warmup ≥ 1: the first iteration compiles the losses")
    device = setup_bench(args)
    config_path, raw = load_config(args)

    ds, data_args = build_dataset(args, raw["data"].get("args", {}))
    count_syncs = device.type == "cuda"
    steps = args.warmup + args.repeat
    keys = batch_keys(ds, args.batch, steps + int(count_syncs), args.seed)
    print(f"reading {len(keys)} batches of {args.batch} frames once (warming the file cache) ...", flush=True)
    t0, gt_counts, padded = time.perf_counter(), [], []
    first = None
    for i, k in enumerate(keys):
        batch = fetch(ds, k, device)
        gt_counts.extend(batch.gt_boxes.sizes.tolist())
        padded.append(padded_gt_counts(batch, images=True))
        first = batch if i == 0 else first
        print(f"\r  {i + 1}/{len(keys)} batches ({time.perf_counter() - t0:.1f} s)", end="", flush=True)
    print(flush=True)
    images = tuple(first.images.shape[1:])  # (N, 3, H, W)

    torch.manual_seed(args.seed)
    model = StreamPETR(**raw["model"].get("args", {})).to(device).train()
    optim_cfg = from_dict(OptimConfig, raw["optim"], "optim")
    optimizer = build_optimizer(model, optim_cfg)
    for group in optimizer.param_groups:  # peak lr, no schedule: the trainer sets lr × lr_mult × schedule(step)
        group["lr"] = optim_cfg.lr * group.get("lr_mult", 1.0)
    weights = resolve_weights(model.loss_weights, raw["model"].get("loss_weights") or {})
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"checking the two loss paths on the first batch ({num_params / 1e6:.1f} M trainable parameters) ...")
    worst_terms = check_loss(model, first, args.seed)
    del first

    variants = (*PATHS, "compiled") if args.compile else PATHS
    trainees: dict[str, Trainee] = {}
    missing: list[str] = []
    for impl in variants:  # identical copies of the one model and optimizer (same weights, same moments)
        m, opt = copy.deepcopy((model, optimizer))  # one deepcopy: the copy's optimizer holds the copy's params
        if impl == "compiled":  # the batched path, its losses compiled; no per-part regions (they would break it)
            m.path = path_of("batched")
            for criterion in (m.criterion, m.focal_criterion):
                if criterion is not None:
                    criterion.compile_options = compile_options(args)
        else:
            m.path = path_of(impl)
            missing = instrument(m)
        trainees[impl] = Trainee(m, opt, weights, optim_cfg.clip_norm)
    del model, optimizer

    profilers = {  # the compiled copy's kernels are not ATen ops: not counted
        impl: Profiler(device, warmup=args.warmup, nvtx=args.nvtx, count=impl != "compiled") for impl in variants
    }
    t0, compile_seconds = time.perf_counter(), None
    # The GPU solver (backend auto on CUDA) compiles a kernel per target bucket; the checks above met both heads'
    # shapes: their buckets are compiled now, and what the warm-up iterations meet beyond them after the warm-up,
    # so no timed iteration compiles (a shape still new there is solved by SciPy and counted).
    solver_warmups = [warm_pending()]
    fallbacks_before = gpu_solver_shapes()["fallbacks"]
    for i in range(steps):
        if i == args.warmup and i > 0:
            solver_warmups.append(warm_pending())
            fallbacks_before = gpu_solver_shapes()["fallbacks"]
        for impl in variants:
            torch.manual_seed(args.seed + 1 + i)  # same denoising noise and dropout for both paths
            synchronize(device)
            prof = profilers[impl]
            start = time.perf_counter()
            with active(prof):
                iteration(trainees[impl], ds, keys[i], device, prof.region)
            synchronize(device)
            if impl == "compiled" and i == 0:  # a warm-up iteration: the losses compile here
                compile_seconds = time.perf_counter() - start
            prof.step()
        done = "warm-up" if i < args.warmup else "timed"
        print(f"\r  iteration {i + 1}/{steps} ({done}) {time.perf_counter() - t0:.1f} s", end="", file=sys.stderr)
    print(file=sys.stderr)

    syncs: dict[str, Any] = {}
    for impl in variants:
        if not count_syncs:
            syncs[impl] = "n/a (CPU: no device to wait for)"
            continue
        counter = SyncCounter()
        torch.manual_seed(args.seed + 1 + steps)
        synchronize(device)
        with counter.recording():
            iteration(trainees[impl], ds, keys[steps], device, counter.region)
        synchronize(device)
        c = counter.counts
        syncs[impl] = {
            "step": c[TOP] - c[DATA],
            "network": c[f"{TOP}/forward/network"],
            "loss": c[f"{TOP}/forward/loss"],
            "optimisation": c[f"{TOP}/optimisation"],
            "data": c[DATA],
        }

    totals = {impl: torch.stack(trainees[impl].totals).double().cpu() for impl in variants}
    first_diff = relative_difference(totals["reference"][0], totals["batched"][0])
    if first_diff > CHECK_RTOL:
        raise SystemExit(f"first iteration: batched total loss differs from the reference by {first_diff:.1e}")
    compiled_diff = relative_difference(totals["compiled"][0], totals["batched"][0]) if args.compile else 0.0
    if compiled_diff > CHECK_RTOL:
        raise SystemExit(f"first iteration: compiled total loss differs from the batched one by {compiled_diff:.1e}")
    all_diff = max(relative_difference(a, b) for a, b in zip(totals["reference"], totals["batched"], strict=True))

    rows = rows_from_profilers(profilers["reference"], profilers["batched"])
    rows = [r for r in rows if not r.name.startswith(DATA)] + [r for r in rows if r.name.startswith(DATA)]
    if args.compile:
        add_compiled_variant(rows, profilers["compiled"])
    n, _, h, w = images
    config = {
        "model": args.model,
        "size": args.size,
        "config": shown(config_path),
        "batch": args.batch,
        "images": f"{n} cameras x {w}x{h}",
        "data": f"synthetic {data_args.get('size')} ({data_args.get('split')}), root {shown(data_args['root'])}",
        "gt_per_sample": {"min": min(gt_counts), "median": statistics.median(gt_counts), "max": max(gt_counts)},
        "gt_counts_timed": count_variation(padded[:steps], args.warmup),
        "trainable_params": num_params,
        "optimizer": f"AdamW lr {optim_cfg.lr:g} (x lr_mult per group), weight decay {optim_cfg.weight_decay:g}, "
        f"clip {optim_cfg.clip_norm}",
        "precision": "fp32",
        "gpu_solver": {
            "kernels_compiled_before_timing": sum(len(w.shapes) for w in solver_warmups),
            "compile_seconds": round(sum(w.seconds for w in solver_warmups), 3),
            "scipy_fallbacks_timed": gpu_solver_shapes()["fallbacks"] - fallbacks_before,
            "wrapper_calls": gpu_solver_shapes()["wrapper_calls"],  # through the package's public wrapper: 2 syncs
        },
        "compile": compile_options(args) if args.compile else False,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "seed": args.seed,
    }
    result = IterationResult("iteration", device_name(device), config)
    for row in rows:
        result.add(row)
    by_name = {r.name: r for r in result.rows}
    result.extra["host_syncs_per_iteration"] = syncs
    result.extra["published"] = {
        "source": PUBLISHED_SOURCE,
        "rows": {
            name: {"label": label, "reference_ms": ref, "batched_ms": bat, "speedup": round(ref / bat, 2)}
            for name, (label, ref, bat) in PUBLISHED.items()
            if ref is not None
        },
    }
    result.extra["published_layout"] = published_table(by_name, syncs)
    result.notes += [
        "Both paths ran on identical deep copies of one model and optimizer, alternating iteration by iteration "
        "on the same batches (RNG reseeded per iteration: same denoising noise and dropout); the path is "
        "model.path (the losses' entry points and the denoising-query builder), as model.args.impl picks it.",
        f"Before timing, the loss terms of the two paths on the same outputs matched (worst relative difference "
        f"{worst_terms:.1e}); the first iteration's total loss matched within {first_diff:.1e}, and every "
        f"iteration's within {all_diff:.1e} (the copies drift apart only by rounding).",
        "remaining (data wait) = reading, decoding and collating the batch in the loop, pinning and copying it "
        "to the device (a loader without workers; every batch was read once before timing). The published "
        "number is a 4-worker loader's wait and overlaps with compute.",
        "fp32 without autocast, constant peak lr; the published run used fp16 with loss scaling on an A100, so "
        "compare ratios, not absolute times.",
        "Host syncs: counted on CUDA in one extra iteration per path with torch.cuda.set_sync_debug_mode('warn'); "
        "n/a on the CPU.",
    ]
    if missing:
        result.notes.append(f"No main/dn/dn-queries regions: these methods are missing: {', '.join(missing)}.")
    if args.compile:
        result.extra["compile_seconds"] = round(compile_seconds, 1)
        result.notes.append(compiled_note(compile_options(args), compile_seconds, compiled_diff))
    if args.save:
        stem = f"iteration-{args.model}-{args.size}-{device_slug(device)}"
        args.json = args.json or RESULTS_DIR / f"{stem}.json"
        args.md = args.md or RESULTS_DIR / f"{stem}.md"
        args.png = args.png or RESULTS_DIR / f"{stem}.png"
    emit(result, args, chart=False)
    print("\n".join(result.extra["published_layout"]))
    if args.png is not None and (path := write_png(result, args.png)) is not None:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
