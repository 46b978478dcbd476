"""``drivetrain bench iteration``: one tiny run of both loss paths writes the shared result format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drivetrain.cli.main import main

# The first 4 scenes of the tiny preset hold the 2 mini_train scenes (batch ≤ 2); generated into tmp_path.
TINY = ["--model", "streampetr", "--size", "tiny", "--batch", "2", "--repeat", "1", "--warmup", "0", "--scenes", "4"]
TOP_ROWS = {
    "iteration",
    "iteration/forward",
    "iteration/forward/network",
    "iteration/forward/loss",
    "iteration/forward/loss/streampetr head",
    "iteration/forward/loss/focal head",
    "iteration/optimisation",
    "iteration/optimisation/backward",
    "iteration/optimisation/clip",
    "iteration/optimisation/step",
    "iteration/remaining (data wait)",
}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """Where the first test generates the 4 scenes; the others reuse them."""
    return tmp_path_factory.mktemp("bench-iteration") / "synth"


def test_bench_iteration_times_both_paths_and_writes_json_md_png(tmp_path, data_root, capsys):
    out = tmp_path / "out"
    argv = ["bench", "iteration", *TINY, "--data-root", str(data_root)]
    argv[argv.index("--repeat") + 1] = "3"  # three timed iterations: a max to report beside each median
    argv += ["--json", str(out / "r.json"), "--md", str(out / "r.md"), "--png", str(out / "r.png")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "iteration/forward/loss" in printed and "| training iteration |" in printed

    data = json.loads((out / "r.json").read_text())
    assert {"benchmark", "device", "torch", "date", "config", "rows"} <= set(data)
    assert data["benchmark"] == "iteration" and data["device"].startswith("CPU")
    assert data["config"]["model"] == "streampetr" and data["config"]["size"] == "tiny"
    assert data["config"]["batch"] == 2 and data["config"]["repeat"] == 3
    # every timed iteration trained on a batch of its own: its padded ground-truth counts, as the data gives them
    timed, per_sample = data["config"]["gt_counts_timed"], data["config"]["gt_per_sample"]
    assert timed["batches"] == 3 and set(timed) == {"batches", "max_gt_per_sample", "max_gt_per_image"}
    assert len(timed["max_gt_per_sample"]["per_batch"]) == 3
    assert all(per_sample["min"] <= g <= per_sample["max"] for g in timed["max_gt_per_sample"]["per_batch"])
    for counts in (timed["max_gt_per_sample"], timed["max_gt_per_image"]):
        assert counts["distinct"] == len(set(counts["per_batch"])) == counts["not_in_warmup"]  # no warm-up here
    rows = {row["name"]: row for row in data["rows"]}
    assert set(rows) >= TOP_ROWS
    assert {"iteration/forward/loss/streampetr head/main", "iteration/forward/loss/streampetr head/dn"} <= set(rows)
    assert data["rows"][0]["name"] == "iteration" and data["rows"][-1]["name"] == "iteration/remaining (data wait)"
    seen = set()
    for row in data["rows"]:
        assert row["parent"] is None or row["parent"] in seen  # parents come first and exist
        assert row["parent"] == (row["name"].rsplit("/", 1)[0] if "/" in row["name"] else None)
        assert row["reference_ms"] > 0 and row["batched_ms"] > 0
        assert row["reference_max_ms"] >= row["reference_ms"] and row["batched_max_ms"] >= row["batched_ms"]
        assert row["max_over_median"] == bool(row["max_over_median_paths"])
        # speedup is rounded to 4 decimals (≤ 5e-5 off) and each ms to 6 (≤ 5e-7 ms off, relative 5e-7 / ms)
        ratio = row["reference_ms"] / row["batched_ms"]
        ms_rounding = ratio * (5e-7 / row["reference_ms"] + 5e-7 / row["batched_ms"])
        assert abs(row["speedup"] - ratio) <= 5e-5 + ms_rounding + 1e-12, row
        seen.add(row["name"])
    assert rows["iteration/forward"]["parent"] == "iteration"  # structure, not times: timings vary with the load

    published = data["published"]["rows"]
    assert published["iteration"]["reference_ms"] == 760 and published["iteration"]["batched_ms"] == 615
    assert published["iteration/forward/loss"]["speedup"] == pytest.approx(4.46, abs=0.01)
    assert set(data["host_syncs_per_iteration"]) == {"reference", "batched"}
    assert data["host_syncs_per_iteration"]["reference"].startswith("n/a")  # the CPU has no sync to count

    md = (out / "r.md").read_text()
    assert md.startswith("# Benchmark `iteration`")
    assert "| region | reference ms (max) | batched ms (max) | speedup |" in md
    assert "## Published layout" in md and "| training iteration |" in md and "| 760 → 615 (×1.24) |" in md
    pytest.importorskip("matplotlib")
    assert (out / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--model", "petr", "unknown model 'petr'; available: streampetr, pointpillars, ssn"),
        ("--size", "huge", "unknown size 'huge'"),
    ],
)
def test_bench_iteration_names_unknown_model_or_size(option, value, message):
    with pytest.raises(SystemExit, match=message):
        main(["bench", "iteration", option, value])


def test_bench_iteration_batch_larger_than_the_scenes_is_a_clear_error(data_root):
    argv = ["bench", "iteration", *TINY, "--data-root", str(data_root)]
    argv[argv.index("--batch") + 1] = "3"
    with pytest.raises(SystemExit, match=r"--batch 3: .*2 scenes"):
        main(argv)


def test_bench_iteration_reads_a_config_with_its_base_chain(data_root, tmp_path):
    # A child config holds only what it changes; the bench merges its base as `drivetrain train` does (it read the
    # file alone before, and a child without its own model/data/optim sections was refused).
    (tmp_path / "base.yaml").write_text(Path("configs/streampetr_tiny.yaml").read_text())
    (tmp_path / "child.yaml").write_text("base: base.yaml\nmodel:\n  args:\n    num_query: 33\n")
    argv = ["bench", "iteration", *TINY, "--data-root", str(data_root), "--config", str(tmp_path / "child.yaml")]
    argv[argv.index("--batch") + 1] = "3"
    with pytest.raises(SystemExit, match=r"--batch 3: .*2 scenes"):  # past the config: merged, all sections there
        main(argv)
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(SystemExit, match=r"--config: .*loop\.yaml: base: the chain loops"):
        main([*argv[:-1], str(tmp_path / "loop.yaml")])


LIDAR_ROWS = {
    "iteration/forward/input",
    "iteration/forward/encoder",
    "iteration/forward/backbone + neck",
    "iteration/forward/head",
    "iteration/loss/assignment",
    "iteration/loss/targets + loss",
    "iteration/optimisation/backward",
    "iteration/remaining (data wait)",
}


@pytest.mark.parametrize("model", ["pointpillars", pytest.param("ssn", marks=pytest.mark.slow)])
def test_bench_iteration_of_the_lidar_detectors(model, tmp_path, data_root, capsys):
    """The tiny lidar configs on 4 generated scenes: both paths checked equal, the library's regions as rows."""
    out = tmp_path / "out"
    argv = ["bench", "iteration", "--model", model, "--size", "tiny", "--batch", "2", "--repeat", "1"]
    argv += ["--warmup", "0", "--scenes", "4", "--data-root", str(data_root.parent / "lidar")]
    argv += ["--json", str(out / "r.json"), "--md", str(out / "r.md")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| assignment + targets + loss |" in printed and "≥ ×10" in printed
    data = json.loads((out / "r.json").read_text())
    assert data["config"]["model"] == model and data["config"]["anchors"] > 0
    assert data["config"]["points_per_sample"]["min"] > 1000  # key frame + 2 sweeps of the 16-beam lidar
    assert set(data["config"]["gt_counts_timed"]) == {"batches", "max_gt_per_sample"}  # no 2D head to count for
    rows = {row["name"]: row for row in data["rows"]}
    assert set(rows) >= LIDAR_ROWS
    assert all(r["reference_ms"] > 0 and r["batched_ms"] > 0 for r in data["rows"])
    assert "identically" in (out / "r.md").read_text()  # the equality checks ran and are reported


@pytest.mark.parametrize("model", ["streampetr", "pointpillars"])
def test_bench_iteration_compile_needs_a_warmup_iteration(model):
    with pytest.raises(SystemExit, match="--compile needs --warmup ≥ 1"):
        main(["bench", "iteration", "--model", model, "--compile", "--warmup", "0"])


@pytest.mark.slow
def test_bench_iteration_compile_adds_the_compiled_copy_as_a_variant(tmp_path, data_root):
    """``--compile``: a third copy with its loss under torch.compile; rows it shares carry all three variants."""
    out = tmp_path / "out"
    argv = ["bench", "iteration", "--model", "pointpillars", "--size", "tiny", "--batch", "2", "--repeat", "1"]
    argv += ["--warmup", "1", "--scenes", "4", "--data-root", str(data_root.parent / "lidar"), "--compile"]
    argv += ["--json", str(out / "r.json"), "--md", str(out / "r.md")]
    assert main(argv) == 0
    data = json.loads((out / "r.json").read_text())
    assert data["config"]["compile"] == {} and data["compile_seconds"] > 0
    rows = {row["name"]: row for row in data["rows"]}
    for name in ("iteration", "iteration/loss", "iteration/optimisation"):
        assert set(rows[name]["variants"]) == {"reference", "batched", "compiled"}, name
        assert rows[name]["variants"]["compiled"] > 0 and rows[name]["baseline"] == "reference"
    assert "variants" not in rows["iteration/loss/assignment"]  # inside the compiled graph: not timed apart
    assert "compiled: a third copy" in (out / "r.md").read_text()
