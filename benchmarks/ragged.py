"""Ragged-batch ops (gather, scatter, write, map_pairs, masks, select, reductions): batched vs per-sample loop.

Shapes follow a StreamPETR loss at batch 8: L = 6 decoder layers × B = 8 samples, Q = 900 predictions with
a 10-dim box code, 0–60 ground-truth boxes per sample, every box matched to a distinct prediction in each
layer. The reference path is what loss code without ragged ops does: a Python loop over layers and
samples on per-sample tensors. Both paths run on the same data in one process; before timing, each
op's outputs are checked equal.

Run: ``drivetrain bench ragged [--device cpu|cuda] [--repeat N] [--save]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from drivetrain import ragged
from drivetrain.profile import (
    BenchResult,
    Row,
    add_bench_arguments,
    compare,
    device_name,
    emit,
    setup_bench,
)
from drivetrain.profile.timer import Stats

DESCRIPTION = __doc__.splitlines()[0]


def make_data(L: int, B: int, Q: int, D: int, max_gt: int, seed: int, device: torch.device) -> dict[str, Any]:
    """Random predictions, ground truth and matches; both the ragged and the per-sample (list) form."""
    gen = torch.Generator().manual_seed(seed)
    num_gt = torch.randint(0, max_gt + 1, (B,), generator=gen).tolist()
    pred = torch.randn(L, B, Q, D, generator=gen)  # (L, B, Q, D)
    gt_list = [torch.randn(n, D, generator=gen) for n in num_gt]
    pred_idx = [[torch.randperm(Q, generator=gen)[:n] for n in num_gt] for _ in range(L)]
    gt_idx = [[torch.randperm(n, generator=gen) for n in num_gt] for _ in range(L)]
    values = [[torch.randn(n, D, generator=gen) for n in num_gt] for _ in range(L)]
    score_mask = pred[..., 0] > 1.0  # (L, B, Q), ~16% selected

    to = {"device": device}
    return {
        "dims": (L, B, Q, D),
        "num_gt": num_gt,
        "pred": pred.to(**to).requires_grad_(),
        "score_mask": score_mask.to(**to),
        "gt": ragged.RaggedBatch.from_list(gt_list, device=device),  # (B, G, D)
        "pred_index": ragged.RaggedBatch.from_list(pred_idx, device=device),  # (L, B, G)
        "gt_index": ragged.RaggedBatch.from_list(gt_idx, device=device),  # (L, B, G)
        "values": ragged.RaggedBatch.from_list(values, device=device),  # (L, B, G, D)
        "base": torch.randn(L, B, Q, D, generator=gen).to(**to),  # (L, B, Q, D)
        "list": {
            "gt": [t.to(**to) for t in gt_list],
            "pred_idx": [[t.to(**to) for t in row] for row in pred_idx],
            "gt_idx": [[t.to(**to) for t in row] for row in gt_idx],
            "values": [[t.to(**to) for t in row] for row in values],
        },
    }


U32 = 2.0**-24  # float32's unit roundoff


def reordered_sum_bounds(terms: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """How far two float32 sums over dim 0 of each ``(n, D)`` tensor of ``terms`` (and the means, the sums divided by
    ``max(n, 1)``) may lie apart when they add the same terms in different orders: float64 ``(len(terms), D)`` each.

    The per-sample loop and the batched reduction run different kernels, which add in different orders (on CUDA a
    reduction splits its dim across threads as its launch shape decides). A float32 sum of ``n`` terms, in any order,
    is within ``γ_{n−1}·Σ|x|`` of the exact sum (Higham, *Accuracy and Stability of Numerical Algorithms*, (4.4);
    ``γ_k = k·u / (1 − k·u)``, ``u`` = 2⁻²⁴), so two such sums are within twice that. A mean divides both sums ``a``,
    ``b`` by the same count ``m`` (exact in float32), each division rounded once:
    ``|fl(a/m) − fl(b/m)| ≤ (|a − b| + u·(|a| + |b|)) / m ≤ (|a − b| + u·(2|a| + |a − b|)) / m``, with
    ``|a| ≤ |Σx| + |a − b|``.
    """
    sums, means = [], []
    for t in terms:
        n = t.shape[0]
        gamma = (n - 1) * U32 / (1 - (n - 1) * U32) if n > 1 else 0.0
        exact = t.double().sum(0)  # (D,): its own float64 rounding, (n − 1)·2⁻⁵³·Σ|x|, far below the bound
        bound = 2 * gamma * t.double().abs().sum(0)  # (D,)
        sums.append(bound)
        means.append((bound + U32 * (2 * (exact.abs() + bound) + bound)) / max(n, 1))
    return torch.stack(sums).cpu(), torch.stack(means).cpu()


def cases(d: dict[str, Any]) -> list[tuple[str, Callable[[], Any], Callable[[], Any], Callable[[Any, Any], None]]]:
    """(name, reference, batched, check) per op; ``check(ref_out, batched_out)`` raises on a mismatch."""
    L, B, Q, D = d["dims"]
    pred, base, mask = d["pred"], d["base"], d["score_mask"]
    gt, pred_index, gt_index, values = d["gt"], d["pred_index"], d["gt_index"], d["values"]
    lst = d["list"]
    pairs = [(layer, b) for layer in range(L) for b in range(B)]
    gt_per_layer = gt.expand_batch(L, B)  # (L, B, G, D) view, no copy

    def ref_gather() -> list[torch.Tensor]:
        return [pred[layer, b][lst["pred_idx"][layer][b]] for layer, b in pairs]

    def ref_scatter() -> torch.Tensor:
        out = []
        for layer, b in pairs:
            t = pred.new_zeros(Q, D)
            t[lst["pred_idx"][layer][b]] = lst["values"][layer][b]
            out.append(t)
        return torch.stack(out).view(L, B, Q, D)

    def ref_write() -> torch.Tensor:
        out = []
        for layer, b in pairs:
            t = base[layer, b].clone()
            t[lst["pred_idx"][layer][b]] = lst["values"][layer][b]
            out.append(t)
        return torch.stack(out).view(L, B, Q, D)

    def ref_map_pairs() -> torch.Tensor:
        out = []
        for layer, b in pairs:
            t = base[layer, b].clone()
            t[lst["pred_idx"][layer][b]] = lst["gt"][b][lst["gt_idx"][layer][b]]
            out.append(t)
        return torch.stack(out).view(L, B, Q, D)

    def ref_mask() -> torch.Tensor:
        out = []
        for layer, b in pairs:
            m = torch.zeros(Q, dtype=torch.bool, device=pred.device)
            m[lst["pred_idx"][layer][b]] = True
            out.append(m)
        return torch.stack(out).view(L, B, Q)

    def ref_select() -> list[torch.Tensor]:
        return [pred[layer, b][mask[layer, b]] for layer, b in pairs]

    def ref_indices() -> list[torch.Tensor]:
        return [mask[layer, b].nonzero().squeeze(1) for layer, b in pairs]

    def ref_sum() -> torch.Tensor:
        return torch.stack([lst["values"][layer][b].sum(0) for layer, b in pairs]).view(L, B, D)

    def ref_mean() -> torch.Tensor:
        sums = [lst["values"][layer][b].sum(0) / max(len(lst["values"][layer][b]), 1) for layer, b in pairs]
        return torch.stack(sums).view(L, B, D)

    def ref_loss() -> torch.Tensor:
        total = pred.new_zeros(())
        for layer, b in pairs:
            matched = pred[layer, b][lst["pred_idx"][layer][b]]
            target = lst["gt"][b][lst["gt_idx"][layer][b]]
            n = max(len(target), 1)
            total = total + (matched - target).abs().sum() / n
        (grad,) = torch.autograd.grad(total, pred)
        return grad

    def bat_loss() -> torch.Tensor:
        matched = ragged.gather(pred, pred_index)  # (L, B, G, D)
        target = ragged.gather(gt_per_layer, gt_index)  # (L, B, G, D)
        per_sample = ragged.sum(matched.apply(lambda t: (t - target.tensor).abs()))  # (L, B, D)
        total = (per_sample.sum(-1) / pred_index.sizes.clamp(min=1)).sum()
        (grad,) = torch.autograd.grad(total, pred)
        return grad

    def same_list(ref: list[torch.Tensor], bat: ragged.RaggedBatch) -> None:
        flat = [t for row in bat.to_list() for t in row]
        if len(flat) != len(ref) or not all(torch.equal(a, b) for a, b in zip(ref, flat, strict=True)):
            raise AssertionError("batched output differs from the per-sample loop")

    def same(ref: torch.Tensor, bat: torch.Tensor) -> None:
        if not torch.equal(ref, bat):
            raise AssertionError("batched output differs from the per-sample loop")

    def close(ref: torch.Tensor, bat: torch.Tensor) -> None:
        torch.testing.assert_close(bat, ref, rtol=1e-5, atol=1e-6)

    sum_bound, mean_bound = reordered_sum_bounds([lst["values"][layer][b] for layer, b in pairs])  # (L·B, D) each

    def within(bound: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], None]:
        def check(ref: torch.Tensor, bat: torch.Tensor) -> None:
            excess = (bat.double() - ref.double()).abs() - bound.view_as(ref).to(ref.device)
            if bool((excess > 0).any()):
                raise AssertionError("batched output differs from the per-sample loop by more than summing the same "
                                     "float32 terms in another order can")  # fmt: skip

        return check

    nograd = [
        ("gather", ref_gather, lambda: ragged.gather(pred, pred_index), same_list),
        ("scatter", ref_scatter, lambda: ragged.scatter(values, pred_index, Q), same),
        ("write", ref_write, lambda: ragged.write(base, pred_index, values), same),
        ("map_pairs", ref_map_pairs, lambda: ragged.map_pairs(gt_per_layer, gt_index, pred_index, base), same),
        ("mask_from_indices", ref_mask, lambda: ragged.mask_from_indices(pred_index, Q), same),
        ("select (trim, 1 sync)", ref_select, lambda: ragged.select(pred, mask), same_list),
        ("select (trim=False, no sync)", ref_select, lambda: ragged.select(pred, mask, trim=False), same_list),
        ("indices_from_mask", ref_indices, lambda: ragged.indices_from_mask(mask), same_list),
        ("sum", ref_sum, lambda: ragged.sum(values), within(sum_bound)),
        ("mean", ref_mean, lambda: ragged.mean(values), within(mean_bound)),
    ]
    return [*nograd, ("L1 loss forward+backward", ref_loss, bat_loss, close)]


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_bench_arguments(parser, repeat=30, warmup=5)
    parser.add_argument("--layers", type=int, default=6, help="decoder layers L (default: 6)")
    parser.add_argument("--batch", type=int, default=8, help="samples B (default: 8)")
    parser.add_argument("--queries", type=int, default=900, help="predictions Q per sample (default: 900)")
    parser.add_argument("--max-gt", type=int, default=60, help="targets per sample drawn from 0..N (default: 60)")
    args = parser.parse_args(argv)
    device = setup_bench(args)
    torch.manual_seed(args.seed)
    data = make_data(args.layers, args.batch, args.queries, 10, args.max_gt, args.seed, device)
    config = {
        "layers": args.layers,
        "batch": args.batch,
        "queries": args.queries,
        "box_code": 10,
        "gt_per_sample": data["num_gt"],
        "repeat": args.repeat,
        "warmup": args.warmup,
        "seed": args.seed,
    }
    result = BenchResult("ragged", device_name(device), config)
    spread: dict[str, list[float]] = {}
    for name, reference, batched, check in cases(data):
        grad_ctx = torch.enable_grad() if "backward" in name else torch.no_grad()
        with grad_ctx:
            check(reference(), batched())
            ref_ms, bat_ms = compare(reference, batched, device=device, repeat=args.repeat, warmup=args.warmup)
        r, b = Stats.of(ref_ms), Stats.of(bat_ms)
        result.add(Row.from_samples(name, ref_ms, bat_ms, reference_cost=ref_ms.cost, batched_cost=bat_ms.cost))
        spread[name] = [round(r.min, 4), round(r.max, 4), round(b.min, 4), round(b.max, 4)]
    result.extra["min_max_ms"] = {"order": ["reference min", "reference max", "batched min", "batched max"], **spread}
    result.notes.append(
        "Each op's batched output was checked equal to the per-sample loop before timing (exact for copies; sums and "
        "means within what adding the same float32 terms in another order allows, reordered_sum_bounds; the L1 "
        "loss's gradient to 1e-5); reference and batched repeats are interleaved; times are medians."
    )
    emit(result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
