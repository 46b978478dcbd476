"""The set-up and GPU-check scripts parse, and their --help explains them (the GPU check itself runs on a
machine with a GPU: `bash scripts/gpu_check.sh OUT --device cpu` is its dry run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize("name", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_script_parses(name: str) -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPTS / name)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("name", "words"), [("gpu_check.sh", ["OUT_DIR", "--wheels", "--save", "--device"]),
                                             ("gpu_wheels.sh", ["--python-version", "--out"])])  # fmt: skip
def test_gpu_scripts_explain_themselves(name: str, words: list[str]) -> None:
    proc = subprocess.run(["bash", str(SCRIPTS / name), "--help"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert all(word in proc.stdout for word in words), proc.stdout
