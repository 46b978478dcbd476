"""``drivetrain bench loss``: every repeat takes a batch of its own, so the timed repeats see the ground-truth counts
vary as training does, and the config says how they varied; each row has its max beside its median."""

from __future__ import annotations

import json

import torch

from drivetrain.cli.bench import available, load

SMALL = ["--batch", "2", "--layers", "1", "--queries", "64", "--dn-groups", "2", "--repeat", "3", "--warmup", "2"]


class Recording(torch.nn.Module):
    """A criterion that records the padded ground-truth count of every call, then calls the real one."""

    def __init__(self, inner: torch.nn.Module, key: str, seen: list[tuple[str, int]]) -> None:
        super().__init__()
        self.inner, self.key, self.seen = inner, key, seen

    def forward(self, outputs, targets):
        self.seen.append(("batched", int(targets[self.key].sizes.max())))
        return self.inner(outputs, targets)

    def reference(self, outputs, targets):
        self.seen.append(("reference", int(targets[self.key].sizes.max())))
        return self.inner.reference(outputs, targets)

    @property
    def weights(self):
        return self.inner.weights


def test_bench_loss_times_a_batch_of_its_own_per_repeat_and_reports_its_counts(tmp_path, monkeypatch):
    module = load(available()["loss"])
    seen: dict[str, list[tuple[str, int]]] = {"streampetr": [], "focal_head": []}
    for name, key in (("streampetr", "gt_boxes"), ("focal_head", "gt_boxes_2d")):
        build = getattr(module, f"{name}_loss")
        monkeypatch.setattr(module, f"{name}_loss", lambda build=build, key=key, name=name, **kw: Recording(
            build(**kw), key, seen[name]))  # fmt: skip
    assert module.main([*SMALL, "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md")]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    timed = data["config"]["gt_counts_timed"]
    assert timed["batches"] == 3
    for name, count in (("streampetr", "max_gt_per_sample"), ("focal_head", "max_gt_per_image")):
        calls = seen[name][2:]  # after the two calls of the equality check on the first batch
        for impl in ("reference", "batched"):
            per_repeat = [g for i, g in calls if i == impl]
            assert len(per_repeat) == 5  # 2 warm-up + 3 timed repeats, each path once per repeat
            assert per_repeat[2:] == timed[count]["per_batch"]  # the timed repeats ran on the batches reported
        assert timed[count]["distinct"] == len(set(timed[count]["per_batch"]))
    # seed 0 draws warm-up batches padded to 44 and 46 ground truths and timed ones to 37, 34 and 54: three shapes
    # no warm-up repeat had, where one batch for every repeat had one shape, compiled in the warm-up
    assert timed["max_gt_per_sample"]["distinct"] == timed["max_gt_per_sample"]["not_in_warmup"] == 3
    assert data["config"]["gt_per_sample"] == [21, 44]  # the first batch: the one every repeat used before
    for row in data["rows"]:
        assert row["reference_max_ms"] >= row["reference_ms"] and row["batched_max_ms"] >= row["batched_ms"]
        assert row["max_over_median"] == bool(row["max_over_median_paths"])
    assert "| region | reference ms (max) | batched ms (max) | speedup |" in (tmp_path / "r.md").read_text()
    # the labels say what was timed: --batch 2 is 2 samples × 6 cameras of heatmaps
    assert "heatmap drawing (12 images, 0-20 boxes each)" in [row["name"] for row in data["rows"]]
