"""The drivetrain command line and the ragged benchmark script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from drivetrain.cli.main import main

SMALL = ["--repeat", "2", "--warmup", "1", "--layers", "2", "--batch", "3", "--queries", "40", "--max-gt", "6"]


def test_help_lists_the_bench_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "bench" in capsys.readouterr().out


def test_bench_help_lists_the_available_benchmarks(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "ragged" in out and "--save" in out


def test_unknown_benchmark_is_a_clear_error():
    with pytest.raises(SystemExit, match=r"unknown benchmark 'nope'.*ragged"):
        main(["bench", "nope"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_device_without_gpu_is_a_clear_error():
    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["bench", "ragged", "--device", "cuda", *SMALL])


def test_bench_ragged_checks_both_paths_and_writes_results(tmp_path, capsys):
    json_path, md_path = tmp_path / "r.json", tmp_path / "r.md"
    assert main(["bench", "ragged", *SMALL, "--json", str(json_path), "--md", str(md_path)]) == 0
    out = capsys.readouterr().out
    assert "gather" in out and "speedup" in out
    data = json.loads(json_path.read_text())
    assert data["benchmark"] == "ragged" and data["device"].startswith("CPU")
    names = [row["name"] for row in data["rows"]]
    assert {"gather", "scatter", "write", "map_pairs", "mean", "sum", "L1 loss forward+backward"} <= set(names)
    for row in data["rows"]:
        assert row["reference_ms"] > 0 and row["batched_ms"] > 0
        # the JSON keeps 4 decimals of the speedup (±5e-5) and 6 of the times: a small speedup is only that close
        assert row["speedup"] == pytest.approx(row["reference_ms"] / row["batched_ms"], rel=1e-3, abs=5e-5)
    assert data["config"]["layers"] == 2 and len(data["config"]["gt_per_sample"]) == 3
    assert "| gather |" in md_path.read_text()


def test_console_script_is_installed():
    exe = sys.executable.replace("python", "drivetrain").rsplit("/", 1)
    completed = subprocess.run(
        [f"{exe[0]}/drivetrain", "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert completed.stdout.startswith("drivetrain ")


def test_no_benchmark_script_shadows_a_standard_library_module():
    """A script runs with benchmarks/ first on sys.path (precision and sweeps start their variants that way):
    a file named like a standard module (copy.py) would replace it for torch and everything else."""
    import sys
    from pathlib import Path

    from drivetrain.cli.bench import available

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    stems = {path.stem for path in folder.glob("*.py")}
    assert not stems & set(sys.stdlib_module_names)
    assert "copy" in available() and available()["copy"].name == "copy_bench.py"
