"""drivetrain.profile.bench: every benchmark times under the same TF32 and cuDNN settings, the trainer's defaults, and
records those in effect; a benchmark that trains records what its config set."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import pytest
import torch

from drivetrain.engine.config import SpeedConfig
from drivetrain.profile import BenchResult, Row, emit, setup_bench
from drivetrain.profile.bench import BENCH_CUDNN_BENCHMARK, BENCH_TF32


@pytest.fixture
def backends() -> Iterator[None]:
    """torch's defaults now (cuDNN TF32 on, matmul TF32 off, no autotuner), and the flags restored afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
    torch.backends.cudnn.benchmark = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


def _args(tmp_path) -> argparse.Namespace:
    return argparse.Namespace(device="cpu", malloc="default", json=tmp_path / "r.json", md=None, save=False, png=None)


def test_every_benchmark_starts_from_the_trainers_tf32_and_cudnn_defaults_and_records_them(backends, tmp_path):
    assert (SpeedConfig().tf32, SpeedConfig().cudnn_benchmark) == (BENCH_TF32, BENCH_CUDNN_BENCHMARK)
    args = _args(tmp_path)
    setup_bench(args)
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cudnn.benchmark is BENCH_CUDNN_BENCHMARK
    result = BenchResult("demo", "CPU test", {})
    result.add(Row("x", 2.0, 1.0))
    emit(result, args, chart=False)
    recorded = json.loads((tmp_path / "r.json").read_text())["config"]["backends"]
    assert recorded == {"tf32_matmul": False, "tf32_cudnn": False, "cudnn_benchmark": False,
                        "float32_matmul_precision": torch.get_float32_matmul_precision()}  # fmt: skip


def test_the_record_is_of_the_settings_in_effect_when_the_result_is_written(backends, tmp_path):
    """A benchmark that trains applies its config's speed section after the set-up: the record says what ran."""
    args = _args(tmp_path)
    setup_bench(args)
    torch.backends.cudnn.benchmark = True  # as the trainer does for speed.cudnn_benchmark: true
    result = BenchResult("demo", "CPU test", {})
    result.add(Row("x", 2.0, 1.0))
    emit(result, args, chart=False)
    assert json.loads((tmp_path / "r.json").read_text())["config"]["backends"]["cudnn_benchmark"] is True
