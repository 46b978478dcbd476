"""drivetrain.cli.gpu_environment: environment.txt says whether the GPU solver is usable, the TF32 and
cudnn.benchmark settings, and the torch, CUDA and driver versions — on a machine without a GPU too."""

from __future__ import annotations

import pytest
import torch

from drivetrain.cli import gpu_environment
from drivetrain.match import gpu_solver_status


def test_the_lines_name_versions_gpu_solver_and_math_settings():
    lines = gpu_environment.lines()
    text = "\n".join(lines)
    assert lines[0].startswith("python ") and f"torch {torch.__version__}" in lines[0]
    assert "| CUDA " in lines[0] and "| cuDNN " in lines[0] and "| NVIDIA driver " in lines[0]
    assert f"GPU solver: {gpu_solver_status('cuda')}" in lines
    assert "TF32 at start: matmul " in text and "cudnn.benchmark " in text and "config.backends" in text
    if not torch.cuda.is_available():
        assert "GPU: none visible to torch" in lines
        assert "GPU solver: not usable: no CUDA device (torch-linear-assignment " in text


def test_the_driver_version_says_why_it_is_unknown_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(gpu_environment.shutil, "which", lambda name: None)
    assert gpu_environment.driver_version() == "none (no nvidia-smi)"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_lines_name_it_and_its_compute_capability():
    major, minor = torch.cuda.get_device_capability()
    lines = gpu_environment.lines()
    assert f"GPU: {torch.cuda.get_device_name()} (compute capability {major}.{minor})" in lines
    assert f"| CUDA {torch.version.cuda} |" in lines[0] and "GPU: none visible to torch" not in lines
