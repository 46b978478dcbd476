"""Normalisation across ranks as the original StreamPETR heads do it, checked under torchrun (2 gloo ranks)
against the one-process terms of each rank's own batch: classification terms (and the focal head's IoU term)
divide by the rank's own count unless ``sync_cls_avg_factor``; box terms by the count averaged over ranks."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from drivetrain.losses.term_weights import base_name
from drivetrain.models.streampetr.loss_3d import DN_BALL_FRACTION
from helpers.engine import torchrun
from helpers.heads import RANK_GT_2D, RANK_GT_3D, path, rank_cases

WORKER = Path(__file__).parent / "losses_dist_worker.py"
GROUPS, SPLIT = 2, 0.75  # rank_cases: 2 DN groups, the default split radius

# Term → (count it is divided by, averaged over ranks when sync_cls_avg_factor is False / True).
STREAMPETR = {
    "loss_cls": ("pos", False, True),
    "loss_bbox": ("pos", True, True),
    "dn_loss_cls": ("dn_cls", False, True),
    "dn_loss_bbox": ("dn", True, True),
}
FOCAL_HEAD = {
    "enc_loss_cls": ("pos", False, True),
    "enc_loss_iou": ("pos", False, False),  # the original divides it before the count is all-reduced
    "enc_loss_bbox": ("pos", True, True),
    "centers2d_loss": ("pos", True, True),
    "centerness_loss": ("pos", True, True),
}


def counts(name: str, rank: int) -> dict[str, float]:
    if name == "streampetr":
        pos = float(sum(RANK_GT_3D[rank]))
        return {"pos": pos, "dn": GROUPS * pos, "dn_cls": GROUPS * pos * DN_BALL_FRACTION * SPLIT**3}
    return {"pos": float(sum(sum(row) for row in RANK_GT_2D[rank]))}


def test_each_term_is_normalised_by_the_local_or_the_mean_count_as_the_original(tmp_path: Path) -> None:
    proc = torchrun(str(WORKER), str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    checked = 0
    for rank in range(2):
        for name, (loss_of, outputs, targets) in rank_cases(rank).items():
            rules = STREAMPETR if name == "streampetr" else FOCAL_HEAD
            local = counts(name, rank)
            mean = {k: (v + counts(name, 1 - rank)[k]) / 2 for k, v in local.items()}
            for sync in (False, True):
                for impl in ("reference", "batched"):
                    single = path(loss_of(sync), impl)(outputs, targets)  # no process group: local counts
                    got = results[rank][f"{name}/{impl}/sync={sync}"]
                    assert set(got) == set(single)
                    for term, value in single.items():
                        count, averaged_plain, averaged_sync = rules[base_name(term)]
                        averaged = averaged_sync if sync else averaged_plain
                        divisor = mean[count] if averaged else local[count]
                        expected = float(value) * max(local[count], 1.0) / max(divisor, 1.0)
                        # Two float32 divisions and a product differ from one division by a few roundings
                        # of 2^-24 each: 1e-6 relative bounds them with room.
                        assert math.isclose(got[term], expected, rel_tol=1e-6, abs_tol=1e-12), (
                            name, impl, sync, rank, term, got[term], expected,
                        )  # fmt: skip
                        checked += 1
    assert checked > 60
    # The counts do differ between ranks, so the check can tell a local count from a mean one.
    assert all(counts(n, 0)["pos"] != counts(n, 1)["pos"] for n in ("streampetr", "focal_head"))


def test_both_paths_hand_the_counts_to_the_reduction_on_the_predictions_device(monkeypatch) -> None:
    """NCCL all-reduces CUDA tensors only ("No backend type associated with device type cpu" for a CPU one): every
    count a loss averages over ranks reaches ``average_factor`` as a tensor on the predictions' device, or as a number
    with that device to make it on, on both paths (the reference path once made CPU tensors of Python numbers there)."""
    import drivetrain.losses.focal_head as focal_head_module
    import drivetrain.models.streampetr.loss_3d as loss_3d_module
    from drivetrain.losses.normalize import average_factor

    seen: list[tuple[object, object]] = []  # (count, the device a number is made on)

    def recording(count, **kwargs):
        seen.append((count, kwargs.get("device")))
        return average_factor(count, **kwargs)

    monkeypatch.setattr(focal_head_module, "average_factor", recording)
    monkeypatch.setattr(loss_3d_module, "average_factor", recording)
    checked = 0
    for _, (loss_of, outputs, targets) in rank_cases(0).items():
        device = outputs["cls_logits"].device
        for impl in ("reference", "batched"):
            seen.clear()
            path(loss_of(True), impl)(outputs, targets)
            assert seen, impl
            for count, made_on in seen:
                on_device = count.device if isinstance(count, torch.Tensor) else made_on
                assert on_device == device, (impl, count, made_on)
                checked += 1
    assert checked >= 12
