"""``drivetrain bench train --compare``: the configured run and the run with the compare overrides on top, in one
process on the same batches, side by side; compilations inside the timed steps are counted (issue 46,
deliverable 4)."""

from __future__ import annotations

import json
import tempfile

import pytest
import torch

from drivetrain.cli.main import main
from drivetrain.engine import Trainer
from drivetrain.engine.stepsplit import PARTS
from helpers.engine import FAST, SMOKE

SMALL = [*FAST, "data.batch_size=4"]
MS_ROUNDING = 5e-7  # the JSON's ms have 6 decimals
SPLIT_KEYS = {"step_ms", "step_max_ms", "parts", "syncs_per_step", "kernels_per_step", "region_syncs",
              "graph_breaks", "compiles_in_steps", "cudagraph_skips", "batch_indices"}  # fmt: skip
STEPS, WARMUP = 2, 2


@pytest.mark.parametrize("interleave", [[], ["--interleave"]], ids=["one-after-the-other", "interleaved"])
def test_compare_reports_both_splits_on_the_same_batches_and_counts_compiles_in_steps(
    tmp_path, monkeypatch, interleave
):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    iteration = Trainer._iteration

    def first_timed_step_recompiles(self, log):  # every compiled graph compiles again in the first timed step
        if self.state.iteration == WARMUP:
            torch._dynamo.reset_code_caches()
        return iteration(self, log)

    monkeypatch.setattr(Trainer, "_iteration", first_timed_step_recompiles)
    out = tmp_path / "r.json"
    argv = ["bench", "train", "--config", str(SMOKE), "--steps", str(STEPS), "--warmup", str(WARMUP), "--json",
            str(out), "--md", str(tmp_path / "r.md"), *interleave, *SMALL, "--compare",
            "speed.compile=['backbone']"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(out.read_text())
    compared = data["compared"]
    assert set(data) >= SPLIT_KEYS | {"step_speedup", "step_max_speedup", "part_speedups", "same_batches"}
    assert set(compared) >= SPLIT_KEYS and set(compared["parts"]) == {*PARTS, "other"}
    assert data["compare_overrides"] == ["speed.compile=['backbone']"]
    assert data["interleaved"] is bool(interleave)
    assert compared["config"]["overrides"] == [*SMALL, "speed.compile=['backbone']"]
    # the same batches: the timed steps' dataset indices, one list of batch_size per step, equal in both runs
    assert len(data["batch_indices"]) == STEPS and all(len(b) == 4 for b in data["batch_indices"])
    assert data["batch_indices"] == compared["batch_indices"] and data["same_batches"] is True
    # the ratios from the JSON's own numbers: each ms rounded to 6 decimals moves a / b by ≤ (1 + a / b)·0.5e-6 / b,
    # each ratio rounded to 4 decimals
    pairs = [("step", data["step_speedup"], data["step_ms"], compared["step_ms"]),
             ("step max", data["step_max_speedup"], data["step_max_ms"], compared["step_max_ms"])]  # fmt: skip
    pairs += [(part, ratio, data["parts"][part]["median_ms"], compared["parts"][part]["median_ms"])
              for part, ratio in data["part_speedups"].items()]  # fmt: skip
    for name, ratio, first, other in pairs:
        if other > 1e-5:  # a part of no measurable time has no meaningful ratio (None when it was 0)
            assert ratio == pytest.approx(first / other, abs=5e-5 + (1 + first / other) * MS_ROUNDING / other), name
    # eager compiles nothing; the compiled backbone once more, in the step that dropped its code (interleaved: each
    # run counts only what was compiled in its own steps, though the eager run's step dropped the code too)
    assert (data["compiles_in_steps"], compared["compiles_in_steps"]) == (0, 1)
    assert data["graph_breaks"] == compared["graph_breaks"] == 0
    assert data["step_graph"] is None and compared["step_graph"] is None  # no speed.compile_step: no buckets
    assert compared["syncs_per_step"] == data["syncs_per_step"] == 1  # the iteration's one read, in both
    assert "| step |" in (tmp_path / "r.md").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--compare", "optim.nope=1"], "bench train: --compare: override optim.nope=1: optim.nope: unknown key"),
        (["--profile", "1", "--compare", "optim.lr=0.002"], "bench train: --compare and --profile"),
        (["--interleave"], "bench train: --interleave alternates the steps of two runs: give --compare"),
    ],
)
def test_compare_misuse_is_one_line(extra, message):
    with pytest.raises(SystemExit, match=message) as raised:
        main(["bench", "train", "--config", str(SMOKE), *SMALL, *extra])
    assert "\n" not in str(raised.value)
