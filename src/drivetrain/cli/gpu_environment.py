"""What a GPU run's numbers depend on, one line each, for the run book's ``environment.txt``.

``python -m drivetrain.cli.gpu_environment`` prints: Python, NumPy, torch, its CUDA and cuDNN and the NVIDIA
driver (from ``nvidia-smi``); the GPU torch sees and its compute capability; whether the GPU assignment solver is
usable, with the versions of torch-linear-assignment and Triton (:func:`drivetrain.match.gpu_solver_status`); and the
TF32 and ``cudnn.benchmark`` settings a new process starts with, beside those every benchmark sets
(:data:`drivetrain.profile.bench.BENCH_TF32`), so a reader knows which math the timings ran.
"""

from __future__ import annotations

import platform
import shutil
import subprocess

import numpy
import torch

from drivetrain.match import gpu_solver_status
from drivetrain.profile.bench import BENCH_CUDNN_BENCHMARK, BENCH_TF32
from drivetrain.profile.results import backend_flags

__all__ = ["driver_version", "lines"]


def driver_version() -> str:
    """The NVIDIA driver's version from ``nvidia-smi``, or why there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none (no nvidia-smi)"
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unknown (nvidia-smi: {err})"
    first = done.stdout.strip().splitlines()[:1]
    return first[0].strip() if done.returncode == 0 and first else f"unknown (nvidia-smi exit {done.returncode})"


def _on_off(flag: object) -> str:
    return "on" if flag else "off"


def lines() -> list[str]:
    """The lines of ``environment.txt`` this module writes (see the module docstring)."""
    cudnn = str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "none"
    out = [
        f"python {platform.python_version()} | numpy {numpy.__version__} | torch {torch.__version__} | CUDA "
        f"{torch.version.cuda or 'none (a CPU build)'} | cuDNN {cudnn} | NVIDIA driver {driver_version()}"
    ]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        out.append(f"GPU: {torch.cuda.get_device_name()} (compute capability {major}.{minor})")
    else:
        out.append("GPU: none visible to torch")
    out.append(f"GPU solver: {gpu_solver_status('cuda')}")
    flags = backend_flags()
    out.append(
        f"TF32 at start: matmul {_on_off(flags['tf32_matmul'])}, cuDNN {_on_off(flags['tf32_cudnn'])}; "
        f"cudnn.benchmark {_on_off(flags['cudnn_benchmark'])}; float32 matmul precision "
        f"{flags['float32_matmul_precision']}. Every benchmark sets TF32 {_on_off(BENCH_TF32)} (matmul and cuDNN) "
        f"and cudnn.benchmark {_on_off(BENCH_CUDNN_BENCHMARK)}, the trainer's defaults, and records the settings in "
        "effect in its JSON (config.backends)"
    )
    return out


if __name__ == "__main__":
    print("\n".join(lines()))
