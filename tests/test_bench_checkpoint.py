"""``drivetrain bench checkpoint``: the synchronous sharded save (reference) against the asynchronous save's stall
(batched), the single-file save of earlier versions beside them, the write time and the ratio against the target;
nothing left in the folder it wrote into."""

from __future__ import annotations

import json

from drivetrain.cli.bench import available, load
from helpers.engine import SMOKE


def test_bench_checkpoint_times_the_three_saves_and_leaves_nothing(tmp_path):
    module = load(available()["checkpoint"])
    out = tmp_path / "c.json"
    args = ["--config", str(SMOKE), "--repeat", "2", "--warmup", "1", "--compute-ms", "20", "--dir", str(tmp_path),
            "--json", str(out)]  # fmt: skip
    assert module.main(args) == 0
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert set(row["variants"]) == {module.SINGLE, module.SYNC, module.ASYNC} and row["baseline"] == module.SYNC
    assert row["reference_ms"] == row["variants"][module.SYNC] and row["batched_ms"] == row["variants"][module.ASYNC]
    assert row["batched_max_ms"] >= row["batched_ms"] > 0
    assert data["async_over_sync"] == round(row["batched_ms"] / row["reference_ms"], 4)
    assert data["target"]["async_over_sync_at_most"] == 0.1 and data["write_ms"]["median"] > 0
    assert data["config"]["state_mib"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]  # its checkpoints removed
