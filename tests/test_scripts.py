"""The set-up and GPU-check scripts parse, and their --help explains them (the GPU check itself runs on a
machine with a GPU: `bash scripts/gpu_check.sh OUT --device cpu --budget 90` is its dry run, run here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize("name", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_script_parses(name: str) -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPTS / name)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("name", "words"), [("gpu_check.sh", ["OUT_DIR", "--budget", "--part", "--wheels", "--save",
                                                              "--device"]),
                                             ("gpu_results.sh", ["TARBALL", "--dest"]),
                                             ("gpu_wheels.sh", ["--python-version", "--out"])])  # fmt: skip
def test_gpu_scripts_explain_themselves(name: str, words: list[str]) -> None:
    proc = subprocess.run(["bash", str(SCRIPTS / name), "--help"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert all(word in proc.stdout for word in words), proc.stdout


# The default set's budget is the run book's reserve (RESERVE_S): every step is skipped and named, and the script
# still writes the environment, packs the tarball and the summary. The slow set's 90 s runs whichever steps fit.
@pytest.mark.parametrize("budget", [20, pytest.param(90, marks=pytest.mark.slow)])
def test_gpu_check_dry_run_packs_one_tarball_and_a_summary_naming_every_step(tmp_path, budget):
    """The CPU dry run within ``budget`` s: whichever steps fit on this machine run, the rest are skipped and named;
    the assertions hold however slow the machine is (a step cut by its cap is recorded as timed out)."""
    from drivetrain.profile.runbook import RESERVE_S, plan

    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    cmd = ["bash", str(SCRIPTS / "gpu_check.sh"), str(out), "--device", "cpu", "--budget", str(budget)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, timeout=400)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu-results.tar.gz", "summary.md"]
    assert not list(tmp_path.glob("gpu-check.*"))  # the work folder is gone: everything is in the tarball

    with tarfile.open(out / "gpu-results.tar.gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert all(name.startswith("gpu-check/") and m.isfile() for name, m in members.items())
        record = json.load(tar.extractfile("gpu-check/steps.json"))
        packed_summary = tar.extractfile("gpu-check/summary.md").read().decode()
        environment = tar.extractfile("gpu-check/environment.txt").read().decode()
    summary = (out / "summary.md").read_bytes().decode()
    assert packed_summary == summary and "torch" in environment and environment.splitlines()[0] in summary
    assert "GPU solver: " in environment and "NVIDIA driver " in environment and "cudnn.benchmark " in environment

    names = [s.name for s in plan("cpu", sys.executable, tmp_path)]
    assert record["device"] == "cpu" and record["budget_s"] == budget
    assert [s["name"] for s in record["steps"]] == names
    skipped = [s for s in record["steps"] if s["status"] == "skipped"]
    ran = [s for s in record["steps"] if s["status"] != "skipped"]
    if budget <= RESERVE_S:
        assert not ran and len(skipped) == len(names)
    assert {s["name"] for s in skipped} >= {"iteration-streampetr-full", "iteration-ssn-full"}  # GPU only
    assert all(s["reason"] for s in skipped)
    assert f"Skipped: {', '.join(s['name'] for s in skipped)}." in summary
    for s in ran:
        assert s["status"] in ("ok", "failed", "timed out") and 0 < s["cap_s"] <= budget
        assert f"gpu-check/{s['name']}.log" in members
    for s in record["steps"]:
        assert f"| {s['name']} | " in summary
