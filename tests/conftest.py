"""Fixtures shared by the tests: a seeded generator, restored torch globals, and the small synthetic
nuScenes-format dataset (generated once per session). Helpers live in named modules under ``tests/helpers``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from helpers.synth import SYNTH_TEST_CONFIG


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded CPU generator: every test sees the same random data on every run."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(autouse=True)
def _restore_torch_globals() -> Iterator[None]:
    """Engine runs in-process set threads, deterministic mode and the TF32/cuDNN flags from their config (and
    benchmarks the flags); undo that per test."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = flags


@pytest.fixture
def gpu_solver_required() -> None:
    """A test that needs the GPU solver where it is not usable, while the run book requires it: a failure naming why
    (tests/helpers/gpu_solver.py)."""
    from drivetrain.match import gpu_solver_status
    from helpers.gpu_solver import REQUIRE_ENV

    pytest.fail(f"{REQUIRE_ENV}=1 requires the GPU solver, but it is {gpu_solver_status('cuda')}", pytrace=False)


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory: pytest.TempPathFactory):
    from drivetrain.data.synth import SynthConfig, generate

    root = tmp_path_factory.mktemp("synth")
    generate(root, SynthConfig(**SYNTH_TEST_CONFIG), progress=False)
    return root


@pytest.fixture(scope="session")
def synth_index(synth_root):
    from drivetrain.data.index import build_index, save_index

    index = build_index(synth_root, progress=False)
    save_index(index, synth_root / "drivetrain_index.npz")
    return index


@pytest.fixture(scope="session")
def nusc(synth_root):
    from nuscenes import NuScenes

    return NuScenes(version="v1.0-mini", dataroot=str(synth_root), verbose=False)
