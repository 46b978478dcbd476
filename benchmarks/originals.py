"""Ports of the original implementations' op sequences, for counting their kernels beside our reference paths.

Each ``reference`` path mirrors the original code (docs/design.md, "Two paths"), so that "reference → batched" is a
ratio over the original. To check that it also *costs* what the original costs, this module ports the original's
operations, call by call, onto our tensors, and counts them with the same counter as the reference and batched
paths (:mod:`drivetrain.profile.costmodel`): the kernels and host syncs of one call. The ports are for counting
only; each computes real values, and :mod:`tests.test_reference_costs` checks them against our reference, so that
every data-dependent branch (matches, positives, boxes kept by NMS) takes the same turn in both.

The originals, at the versions StreamPETR and mmdetection3d v1.0 pin (mmdet 2.28.2, mmcv-full 1.6.0), are ported
one module per original under ``benchmarks/_originals/``, each naming the original's files and functions it
mirrors: ``streampetr.py`` (exiawsh/StreamPETR: the 3D head's and the focal head's losses, assigners, heatmaps),
``mmdet.py`` (mmdet 2.28.2: box transforms, IoU, losses, match costs, sampler), ``mmdet3d.py`` (mmdetection3d
v1.0.0rc6: the anchor heads, max-IoU assignment, decoding and NMS) and ``mmcv.py`` (mmcv 1.6.0: the sigmoid focal
loss and rotated NMS ops). This script loads them as one package and counts them; the names the tests use
(``original_*``, ``*_inputs``, ``FOCAL_HEAD_WEIGHTS``) are bound here as well.

**What runs as on a GPU.** The counts model the GPU run, as the cost model does: mmdet's ``FocalLoss`` takes the
mmcv CUDA op ``sigmoid_focal_loss`` when the logits are on a GPU (the CPU branch, ``py_sigmoid_focal_loss``, is
"only for debugging"), so the ports run it; mmcv's C++ kernels (``sigmoid_focal_loss_forward``/``_backward``, the
``nms_rotated`` kernel) are one custom operator each (:data:`LIBRARY`), which the counter sees as one kernel, with
the ATen ops the C++ wrapper around them dispatches (``nms_rotated_cuda``: the mask copied to the host, the kept
indices copied back, one ``index``). ``Tensor.new_tensor`` of Python numbers dispatches nothing the counter sees
(on a GPU it is a small blocking copy), in the ports as in our code.

**Inputs.** Each port takes the original's inputs, made from ours by a ``*_inputs`` function outside the counted
call, as the original's data pipeline and forward pass hand them to its loss: per-image lists of ground truth,
bottom-centre 3D boxes (StreamPETR's loss lifts them to gravity centres itself), the denoising targets its
``prepare_for_dn`` builds in the forward pass, the anchors ``get_anchors`` makes. Layout copies the original makes
in its head's forward or loss (``permute(0, 2, 3, 1).reshape``) are views here: our heads emit that layout.

Run ``drivetrain bench originals`` for the table of docs/benchmarks.md ("Do the reference paths cost what the
originals cost?").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch

from drivetrain.profile.costmodel import Cost, CostCounter, count_call
from drivetrain.safeio.files import replace_text


def _load_ports() -> ModuleType:
    """The ports (``benchmarks/_originals/``) as a package, loaded once per process: its modules import each other,
    and mmcv's kernels are custom operators, defined once."""
    name = "drivetrain_bench_originals_ports"
    if name in sys.modules:
        return sys.modules[name]
    folder = Path(__file__).parent / "_originals"
    init = folder / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        del sys.modules[name]
        raise
    return module


_PORTS = _load_ports()
FOCAL_HEAD_WEIGHTS = _PORTS.streampetr.FOCAL_HEAD_WEIGHTS
draw_heatmap_gaussian = _PORTS.streampetr.draw_heatmap_gaussian
focal_head_inputs = _PORTS.streampetr.focal_head_inputs
original_focal_head_loss = _PORTS.streampetr.original_focal_head_loss
streampetr_inputs = _PORTS.streampetr.streampetr_inputs
original_streampetr_loss = _PORTS.streampetr.original_streampetr_loss
anchor_head_inputs = _PORTS.mmdet3d.anchor_head_inputs
original_anchor_head_loss = _PORTS.mmdet3d.original_anchor_head_loss
nms_inputs = _PORTS.mmdet3d.nms_inputs
original_multiclass_nms = _PORTS.mmdet3d.original_multiclass_nms
decode_inputs = _PORTS.mmdet3d.decode_inputs
original_decode = _PORTS.mmdet3d.original_decode


# ============================================================================ counting: references beside originals
class PathCost(NamedTuple):
    """Kernels and host syncs of one reference path, its original's port and the batched path, in one call each.

    Attributes:
        name: the path.
        inputs: what it ran on.
        reference: the reference path's cost.
        original: the port's.
        batched: the batched path's (None where there is none to compare).
        loops: the loop counts the two counts' relation depends on (``tests/test_reference_costs.py``).
    """

    name: str
    inputs: str
    reference: Cost
    original: Cost
    batched: Cost | None
    loops: dict[str, int]

    @property
    def ratio(self) -> float:
        """Reference kernels over the original's."""
        return self.reference.kernels / max(self.original.kernels, 1)


def _count(fn: Callable[[], Any]) -> Cost:
    """``fn``'s cost after one call that warms the caches the counter would see once (cached constants)."""
    fn()
    return count_call(fn)


def _count_region(fn: Callable[[], Any], region: str) -> tuple[Cost, Cost]:
    """``fn``'s cost, and that of its region ``region`` (after one warm-up call)."""
    fn()
    counter = CostCounter()
    with counter.counting():
        fn()
    whole, part = counter.cost(), counter.cost(region)
    assert whole is not None
    return whole, part or Cost(0, 0)


def _bench_module(name: str) -> Any:
    """A sibling benchmark script as a module (for its input builders)."""
    path = Path(__file__).parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"drivetrain_bench_originals_{name}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def camera_cases(batch: int = 8, layers: int = 6, queries: int = 900, min_gt: int = 20, max_gt: int = 60,
                 dn_groups: int = 10, seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """``bench loss``'s inputs (its defaults: B 8, L 6, Q 900, 20–60 ground truths, 10 denoising groups; the focal
    head over 6 cameras × 16×44 tokens with 0–20 ground truths per image), by its own builders."""
    loss_bench = _bench_module("loss")
    args = argparse.Namespace(
        batch=batch, layers=layers, queries=queries, min_gt=min_gt, max_gt=max_gt, dn_groups=dn_groups
    )
    gen = torch.Generator().manual_seed(seed)
    device = torch.device("cpu")
    return loss_bench.streampetr_inputs(args, gen, device), loss_bench.focal_head_inputs(args, gen, device)


def _leaves(outputs: dict[str, Any]) -> dict[str, Any]:
    """Fresh leaf copies of the floating outputs that require grad (as the loss benchmark runs them)."""
    return {
        k: v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in outputs.items()
    }


def count_streampetr(data: dict[str, Any]) -> PathCost:
    """StreamPETR's 3D loss (main head and denoising): our reference and batched paths, the original's port."""
    from drivetrain.models.streampetr.loss import streampetr_loss

    loss = streampetr_loss(backend="scipy")
    outputs, targets = data["outputs"], data["targets"]
    leaves = _leaves(outputs)  # made before counting, as the port's inputs are
    inputs = streampetr_inputs(leaves, targets, loss.code_weights, loss.dn_split)
    layers, batch = outputs["cls_logits"].shape[:2]
    num_gt = targets["gt_boxes"].sizes.tolist()
    return PathCost(
        "StreamPETR loss (3D head + denoising), forward",
        f"B {batch}, L {layers}, Q {outputs['cls_logits'].shape[2]}, ground truths {num_gt}, "
        f"{outputs.get('dn_groups', 0)} denoising groups",
        _count(lambda: loss.reference(leaves, targets)),
        _count(lambda: original_streampetr_loss(inputs)),
        _count(lambda: loss(leaves, targets)),
        {
            "layers": layers,
            "samples": batch,
            "samples_with_gt": sum(n > 0 for n in num_gt),
            "samples_without_gt": sum(n == 0 for n in num_gt),
            "denoising": int("dn_cls_logits" in outputs),
        },
    )


def count_focal_head(data: dict[str, Any]) -> PathCost:
    """StreamPETR's 2D focal head loss: our reference and batched paths, the original's port."""
    from drivetrain.losses.focal_head import focal_head_loss

    loss = focal_head_loss(backend="scipy")
    outputs, targets = data["outputs"], data["targets"]
    leaves = _leaves(outputs)  # made before counting, as the port's inputs are
    inputs = focal_head_inputs(leaves, targets)
    sizes = targets["gt_boxes_2d"].sizes.flatten().tolist()
    batch, cams, num_tokens = outputs["cls_logits"].shape[:3]
    return PathCost(
        "focal head loss (2D), forward",
        f"{batch * cams} images of {num_tokens} tokens, {sum(sizes)} ground truths ({min(sizes)}–{max(sizes)} each)",
        _count(lambda: loss.reference(leaves, targets)),
        _count(lambda: original_focal_head_loss(inputs)),
        _count(lambda: loss(leaves, targets)),
        {"images": len(sizes), "images_with_gt": sum(n > 0 for n in sizes), "boxes": sum(sizes),
         "positives": sum(min(n, num_tokens) for n in sizes)},
    )  # fmt: skip


def _original_heatmaps(cells: list[torch.Tensor], radii: list[torch.Tensor], shape: tuple[int, int]) -> torch.Tensor:
    """The drawing part of StreamPETR's ``_get_heatmap_single`` per image (a zero map, the radii read on the host,
    ``draw_heatmap_gaussian`` per box at its cell), stacked as ``FocalHead.loss_single`` stacks them."""
    maps = []
    for image_cells, image_radii in zip(cells, radii, strict=True):
        heatmap = torch.zeros(shape, device=image_cells.device)
        if len(image_cells) != 0:
            for center, r in zip(image_cells, image_radii.cpu().numpy().tolist(), strict=True):
                heatmap = draw_heatmap_gaussian(heatmap, center, radius=int(r), k=1)
        maps.append(heatmap)
    return torch.stack(maps, dim=0)


def count_heatmap(data: dict[str, Any]) -> PathCost:
    """``bench loss``'s heatmap-drawing row: every box of every image drawn, per-box loop vs one scatter."""
    from drivetrain.geometry.heatmap import draw_gaussians, focal_head_radius, reference_draw_gaussians

    targets = data["targets"]
    centres, boxes = targets["centers_2d"], targets["gt_boxes_2d"]
    batch, cams = centres.batch_shape
    hf, wf = data["outputs"]["centerness"].shape[-2:]
    cells = centres.apply(lambda t: (t / 16).long())
    radii = centres.with_tensor(focal_head_radius(centres.tensor, boxes.tensor, 16))
    heat = torch.zeros(batch, cams, hf, wf)
    cell_list = [c for row in cells.to_list() for c in row]
    radius_list = [r for row in radii.to_list() for r in row]
    sizes = centres.sizes.flatten().tolist()
    return PathCost(
        "heatmap drawing",
        f"{batch * cams} images {hf}×{wf}, {sum(sizes)} boxes",
        _count(lambda: reference_draw_gaussians(heat.view(-1, hf, wf), cell_list, radius_list)),
        _count(lambda: _original_heatmaps(cell_list, radius_list, (hf, wf))),
        _count(lambda: draw_gaussians(heat, cells, radii)),
        {"images": len(sizes), "images_with_gt": sum(n > 0 for n in sizes), "boxes": sum(sizes)},
    )


def lidar_case(model_name: str, batch: int = 4, min_gt: int = 21, max_gt: int = 40, seed: int = 0,
               feature_size: tuple[int, int] = (64, 64)) -> dict[str, Any]:  # fmt: skip
    """A PointPillars / SSN model from ``configs/<model>_tiny.yaml`` (``bench iteration``'s default), its anchors on
    the tiny grid's neck map, random head outputs, and per sample ``min_gt``–``max_gt`` ground truths made from
    random anchors (jittered centre, size and yaw; SSN: labelled with their anchor's class), so that the assigner
    finds positives, low-quality matches and ignored anchors as on real data."""
    from drivetrain.engine import load_config
    from drivetrain.engine.build import build_model
    from drivetrain.ragged import RaggedBatch

    config = Path(__file__).resolve().parents[1] / "configs" / f"{model_name}_tiny.yaml"
    torch.manual_seed(seed)
    model = build_model(load_config(config, []).model).train()
    model.set_path(impl="reference")
    gen = torch.Generator().manual_seed(seed)
    anchors, classes, _ = model.anchor_set(feature_size, torch.device("cpu"))
    num_anchors, dim = anchors.shape
    boxes, labels = [], []
    for n in torch.randint(min_gt, max_gt + 1, (batch,), generator=gen).tolist():
        index = torch.randint(0, num_anchors, (n,), generator=gen)
        box = anchors[index].clone()
        box[:, :2] += torch.randn(n, 2, generator=gen) * 0.4
        box[:, 3:6] *= torch.rand(n, 3, generator=gen) * 0.4 + 0.8
        box[:, 6] += torch.randn(n, generator=gen) * 0.3
        boxes.append(box)
        labels.append(
            classes[index] if classes is not None else torch.randint(0, model.num_classes, (n,), generator=gen)
        )
    outputs = {
        "cls_logits": torch.randn(batch, num_anchors, model.num_classes, generator=gen) - 4.0,  # ~14 % over 0.05
        "box_preds": torch.randn(batch, num_anchors, dim, generator=gen) * 0.1,
        "dir_logits": torch.randn(batch, num_anchors, 2, generator=gen),
        "anchors": anchors,
        "feature_size": feature_size,
    }
    gt_boxes, gt_labels = RaggedBatch.from_list(boxes), RaggedBatch.from_list(labels)
    return {"model": model, "outputs": outputs, "gt_boxes": gt_boxes, "gt_labels": gt_labels, "classes": classes}


def count_anchor_head(case: dict[str, Any]) -> tuple[PathCost, PathCost]:
    """PointPillars / SSN: the max-IoU assignment and the targets + loss (the two regions of the model's loss):
    our reference and batched paths, and the original's ``Anchor3DHead.loss`` / ``ShapeAwareHead.loss`` (whose
    assigner calls are its ``assignment`` region)."""
    from drivetrain.models.pointpillars.paths import BatchedPath, ReferencePath

    model, outputs, gt_boxes, gt_labels = case["model"], case["outputs"], case["gt_boxes"], case["gt_labels"]
    name = "SSN" if case["classes"] is not None else "PointPillars"

    def assign(impl: str) -> torch.Tensor:
        model.set_path(impl=impl)
        return model.assign(outputs["feature_size"], gt_boxes, gt_labels)

    paths = {"reference": ReferencePath(), "batched": BatchedPath()}

    def targets_loss(impl: str, assigned: torch.Tensor, pairs: Any = None) -> dict[str, torch.Tensor]:
        return paths[impl].terms(model, outputs, assigned, pairs, gt_boxes, gt_labels)

    assigned = assign("reference")  # the model is left on its reference path (as lidar_case builds it)
    inputs = anchor_head_inputs(model, outputs, gt_boxes, gt_labels)
    whole, part = _count_region(lambda: original_anchor_head_loss(inputs), "assignment")
    sizes = gt_boxes.sizes.tolist()
    described = f"{outputs['anchors'].shape[0]} anchors, B {len(sizes)}, ground truths {sizes}"
    positive = assigned > 0  # (B, A)
    loops = {
        "samples": len(sizes),
        "samples_with_gt": sum(n > 0 for n in sizes),
        "samples_with_positives": int(positive.any(1).sum()),
        "any_positive": int(positive.any()),
        "boxes": sum(sizes),
    }
    if case["classes"] is not None:  # (sample, class) pairs with ground truth, and with positive anchors
        loops["class_samples_with_gt"] = sum(len(set(t.tolist())) for t in gt_labels.to_list())
        blocks = torch.bincount(case["classes"], minlength=model.num_classes).tolist()
        loops["class_samples_with_positives"] = sum(int(block.any(1).sum()) for block in positive.split(blocks, dim=1))
    batched_assignment = _count(lambda: assign("batched"))
    _, pairs = model.path.assign(model, outputs["feature_size"], gt_boxes, gt_labels)  # as the model's loss runs it
    model.set_path(impl="reference")
    return (
        PathCost(f"{name} max-IoU assignment", described, _count(lambda: assign("reference")), part,
                 batched_assignment, loops),
        PathCost(f"{name} anchor-head targets + loss, forward", described,
                 _count(lambda: targets_loss("reference", assigned)), Cost(whole.kernels - part.kernels,
                 whole.syncs - part.syncs), _count(lambda: targets_loss("batched", assigned, pairs)), loops),
    )  # fmt: skip


def decode_case(case: dict[str, Any]) -> dict[str, Any]:
    """The decoding inputs of a :func:`lidar_case`: its head outputs, anchors and the model's test settings."""
    return {**{k: case["outputs"][k] for k in ("cls_logits", "box_preds", "dir_logits", "anchors")},
            "cfg": case["model"].decode_config}  # fmt: skip


def count_decode(data: dict[str, Any]) -> tuple[PathCost, PathCost]:
    """The multi-class rotated NMS alone (on the decoded top-``nms_pre`` boxes) and the whole decoding: our
    reference and batched paths, the original's ``box3d_multiclass_nms`` and ``get_bboxes``."""
    from drivetrain.geometry.delta_coder import decode_delta_xyzwlhr
    from drivetrain.geometry.rotated_nms import multiclass_rotated_nms, reference_multiclass_rotated_nms
    from drivetrain.models.pointpillars.postprocess import decode, reference_decode

    cfg, head = data["cfg"], (data["cls_logits"], data["box_preds"], data["dir_logits"], data["anchors"])
    scores = data["cls_logits"].sigmoid()  # (B, A, C)
    _, top = scores.max(dim=2)[0].topk(min(cfg.nms_pre, scores.shape[1]), dim=1)  # (B, N)
    boxes = decode_delta_xyzwlhr(data["anchors"][top], data["box_preds"].gather(1, top[..., None].expand(-1, -1, 9)))
    scores = scores.gather(1, top[..., None].expand(-1, -1, scores.shape[-1]))  # (B, N, C)
    valid = torch.ones(boxes.shape[:2], dtype=torch.bool)
    nms = (boxes, scores, valid, cfg.score_threshold, cfg.nms_threshold, cfg.max_num)
    candidates = (scores > cfg.score_threshold).sum(1)  # (B, C) candidates of each NMS call
    calls = int((candidates > 0).sum())
    loops = {
        "samples": boxes.shape[0],
        "samples_with_calls": int((candidates > 0).any(1).sum()),
        "nms_calls": calls,
        "most_candidates": int(candidates.max()),
    }
    described = f"B {boxes.shape[0]}, {data['anchors'].shape[0]} anchors, top {boxes.shape[1]}, {calls} NMS calls"
    nms_inputs_ = nms_inputs(boxes, scores, cfg)
    decode_inputs_ = decode_inputs(*head, cfg)
    return (
        PathCost("rotated multi-class NMS", described, _count(lambda: reference_multiclass_rotated_nms(*nms)),
                 _count(lambda: original_multiclass_nms(nms_inputs_)), _count(lambda: multiclass_rotated_nms(*nms)),
                 loops),
        PathCost("PointPillars decoding (top-k, NMS, yaw)", described, _count(lambda: reference_decode(*head, cfg)),
                 _count(lambda: original_decode(decode_inputs_)), _count(lambda: decode(*head, cfg, compact=True)),
                 loops),
    )  # fmt: skip


def count_all(seed: int = 0) -> list[PathCost]:
    """Every reference path beside its original, at the benchmarks' default inputs (as docs/benchmarks.md)."""
    streampetr, focal_head = camera_cases(seed=seed)
    rows = [count_streampetr(streampetr), count_focal_head(focal_head), count_heatmap(focal_head)]
    for model_name in ("pointpillars", "ssn"):
        case = lidar_case(model_name, seed=seed)
        rows += count_anchor_head(case)
        if model_name == "pointpillars":
            rows += count_decode(decode_case(case))
    return rows


def _table(rows: list[PathCost]) -> str:
    lines = [
        "| reference path | inputs | kernels ref / original (ratio) | syncs ref / original | kernels batched |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        batched = "–" if r.batched is None else f"{r.batched.kernels:,.0f}"
        lines.append(
            f"| {r.name} | {r.inputs} | {r.reference.kernels:,.0f} / {r.original.kernels:,.0f} (×{r.ratio:.2f}) | "
            f"{r.reference.syncs:,.0f} / {r.original.syncs:,.0f} | {batched} |"
        )
    return "\n".join(lines)


def _row_json(row: PathCost) -> dict[str, Any]:
    batched = None if row.batched is None else row.batched.as_dict()
    return {"name": row.name, "inputs": row.inputs, "reference": row.reference.as_dict(),
            "original": row.original.as_dict(), "batched": batched, "loops": row.loops}  # fmt: skip


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``drivetrain bench originals``: the kernels of each reference path beside its original's (no timing)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    parser.add_argument("--json", type=Path, default=None, help="write the counts as JSON here")
    args = parser.parse_args(argv)
    rows = count_all(args.seed)
    print(_table(rows))
    print(f"\n*Counted on the CPU as a GPU runs them (drivetrain.profile.costmodel), one call each; torch "
          f"{torch.__version__}.*")  # fmt: skip
    if args.json is not None:
        data = {
            "benchmark": "originals",
            "torch": torch.__version__,
            "seed": args.seed,
            "rows": [_row_json(r) for r in rows],
        }
        replace_text(args.json, json.dumps(data, indent=1))  # a link at the name is replaced, never written through
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
