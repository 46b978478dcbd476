"""Fuzzed predictions and checkpoints. A mutated submission either scores through the devkit or fails with a
DataError naming the file (and the entry); a mutated checkpoint (state file, marker, missing files) either
loads exactly what was saved or is refused with a CheckpointError — never loaded silently altered."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from nuscenes.utils.splits import mini_val

from drivetrain.data import DataError
from drivetrain.data.formats.nuscenes.metric import evaluate
from drivetrain.data.formats.nuscenes.submission import ground_truth_submission
from drivetrain.engine import Checkpointer, CheckpointError, CheckpointWarning, Trainer, load_config
from drivetrain.engine.checkpoint import MARKER, STATE_FILE
from helpers.engine import SMOKE, overrides
from helpers.fuzz import BUDGETS, Tally, fuzz_settings, mutated_bytes, mutated_document


@pytest.mark.parametrize("examples", BUDGETS)
def test_mutated_predictions(synth_root, synth_index, tmp_path: Path, examples: int) -> None:
    tally = Tally("predictions")
    submission = ground_truth_submission(synth_index, list(mini_val))
    original = json.dumps(submission).encode()
    path = tmp_path / "predictions.json"

    @fuzz_settings(examples)
    @given(st.one_of(mutated_document(submission).map(lambda d: json.dumps(d).encode()), mutated_bytes(original)))
    def case(data):
        path.write_bytes(data)
        try:
            metrics = evaluate(path, synth_root, out_dir=tmp_path / "eval")
        except DataError as err:
            assert err.path, err
            tally("DataError")
        else:
            assert 0.0 <= metrics["mean_ap"] <= 1 + 1e-9 and 0.0 <= metrics["nd_score"] <= 1 + 1e-9  # devkit rounding
            tally("scored")

    case()
    tally.report()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's checkpoint (model, AdamW state, RNG, sampler, config)."""
    out = tmp_path_factory.mktemp("ckpt-run")
    Trainer(load_config(SMOKE, overrides(out, "train.steps=2", "checkpoint.every=2"))).fit()
    return Checkpointer(out / "checkpoints").committed()[-1][1]


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("examples", BUDGETS)
def test_mutated_checkpoints(checkpoint: Path, tmp_path: Path, examples: int) -> None:
    tally = Tally("checkpoints")
    expected = Checkpointer(checkpoint.parent).load(checkpoint)
    state_bytes = (checkpoint / STATE_FILE).read_bytes()
    marker = json.loads((checkpoint / MARKER).read_text())

    @fuzz_settings(examples)
    @given(st.sampled_from(["state", "marker-bytes", "marker-fields", "missing"]), st.data())
    def case(target, data):
        root = tmp_path / "checkpoints"
        shutil.rmtree(root, ignore_errors=True)
        copy = root / checkpoint.name
        shutil.copytree(checkpoint, copy)
        if target == "state":
            (copy / STATE_FILE).write_bytes(data.draw(mutated_bytes(state_bytes)))
        elif target == "marker-bytes":
            (copy / MARKER).write_bytes(data.draw(mutated_bytes(json.dumps(marker).encode())))
        elif target == "marker-fields":
            (copy / MARKER).write_text(json.dumps(data.draw(mutated_document(marker))))
        else:
            (copy / data.draw(st.sampled_from([STATE_FILE, MARKER]))).unlink()
        checkpointer = Checkpointer(root)
        try:
            loaded = checkpointer.load(copy)
        except CheckpointError as err:
            assert str(copy) in str(err), err
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert checkpointer.load_latest() is None  # resume skips it, with a warning
            assert any(issubclass(w.category, CheckpointWarning) for w in caught)
            tally("CheckpointError")
        else:
            assert same(loaded, expected), "a mutated checkpoint loaded with other contents"
            tally("loaded unchanged")

    case()
    tally.report()
