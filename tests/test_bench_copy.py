"""``drivetrain bench copy``: one row per tensor count with both per-tensor baselines (pageable blocking, and pinned
non-blocking: the reference) beside the copier (batched), the forced packing below the copier's leaf count, and the
copier's ratio over ACCV-Lab's baseline."""

from __future__ import annotations

import json

from drivetrain.cli.bench import available, load
from drivetrain.pipeline.transfer import PACK_MIN_LEAVES


def test_bench_copy_reports_both_baselines_per_tensor_count(tmp_path):
    module = load(available()["copy"])
    small, large = PACK_MIN_LEAVES - 1, PACK_MIN_LEAVES + 8
    args = ["--tensors", f"{small},{large}", "--repeat", "2", "--warmup", "1", "--json", str(tmp_path / "c.json")]
    assert module.main(args) == 0
    data = json.loads((tmp_path / "c.json").read_text())
    rows = data["rows"]
    assert [row["name"].split(" (")[0] for row in rows] == [f"copy {small} tensors", f"copy {large} tensors"]
    for row, count in zip(rows, (small, large), strict=True):
        expected = {module.PAGEABLE, module.PINNED, module.COPIER} | ({module.FORCED} if count == small else set())
        assert set(row["variants"]) == expected and row["baseline"] == module.PINNED
        assert row["reference_ms"] == row["variants"][module.PINNED]
        assert row["batched_ms"] == row["variants"][module.COPIER]
    assert rows[0]["batched_kernels"] == small  # below the leaf count: one copy per tensor
    assert rows[1]["batched_kernels"] < large  # packed: per dtype, not per tensor
    assert set(data["copier_speedup_over_pageable"]) == {row["name"] for row in rows}
