"""Host syncs of the trainer's iteration: none inside the step (forward, loss, backward, unscale, clip, the skip
decision, the update), one read after the update (issue 46, deliverable 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from drivetrain.engine import NonFiniteLossError, Trainer, load_config
from helpers.engine import SMOKE, metrics, overrides
from helpers.nosync import allow_host_sync, no_host_sync

SMALL = ["data.args={num_samples: 16, channels: 3, size: 16, dims: 2, seed: 0}", "data.batch_size=4"]


def _watched(trainer: Trainer) -> list[dict]:
    """Run every iteration of ``trainer`` after its first update under ``no_host_sync(documented=1)`` (the loader's
    host work and ``optimizer.step``'s reads of its host-side step counters allowed; the first update makes the
    optimizer's state, with ``torch.tensor`` of those counters);
    returns, per watched iteration, the documented syncs that passed and how many had passed when the optimizer
    stepped."""
    seen: list[dict] = []
    iteration, fetch, update = trainer._iteration, trainer.data.next, trainer.optimizer.step

    def next_batch():
        with allow_host_sync():  # the loader decodes and collates on the host: not the step's
            return fetch()

    def step(*args, **kwargs):
        if seen and seen[-1]["before_update"] is None:  # a watched iteration's update
            seen[-1]["before_update"] = len(seen[-1]["passed"])
        with allow_host_sync():  # AdamW reads its step counters, CPU tensors on any device (capturable=False)
            return update(*args, **kwargs)

    def watched(log):
        if not trainer.optimizer.state:
            return iteration(log)
        with no_host_sync(documented=1) as passed:  # an undocumented read, or a second one, raises
            seen.append({"passed": passed, "before_update": None})
            return iteration(log)

    trainer._iteration, trainer.data.next, trainer.optimizer.step = watched, next_batch, step
    return seen


# fp16 whose scale doubles after every update overflows every other step here: skipped steps are watched too
FP16 = ["precision.mode=fp16", "precision.init_scale=65536", "precision.growth_interval=1", "precision.hysteresis=1"]


@pytest.mark.parametrize("extra", [[], FP16])
def test_an_iteration_reads_the_device_once_after_the_update(tmp_path: Path, extra: list[str]) -> None:
    trainer = Trainer(load_config(SMOKE, overrides(tmp_path, "train.steps=6", "optim.clip_norm=1.0", *SMALL, *extra)))
    seen = _watched(trainer)
    trainer.fit()
    trainer.close()
    assert len(seen) == 5  # every iteration after the first update
    for record in seen:
        assert len(record["passed"]) == 1, record  # ≤ 1 host sync per step: the outcome's read
        assert record["before_update"] == 0, record  # ... and it comes after the update, not inside the step
        assert record["passed"][0].site.startswith("drivetrain/engine/step_outcome.py"), record
    if extra:  # skipped steps among the watched ones made no other read
        assert metrics(tmp_path)[-1]["skipped_steps"] >= 2, metrics(tmp_path)


def test_a_nonfinite_loss_that_stops_the_run_leaves_the_weights_from_before_the_step(tmp_path: Path) -> None:
    # the update is taken before the read that raises: it is undone first
    cfg = load_config(SMOKE, overrides(tmp_path, "train.steps=2", "precision.nonfinite=stop",
                                       "model.loss_weights.cls=1.0e+39", *SMALL))  # fmt: skip
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step 1"):
        trainer.fit()
    trainer.close()
    after = trainer.model.state_dict()
    assert all(torch.equal(value, after[key]) for key, value in before.items() if key != "memory")
    assert trainer.optimizer.state_dict()["state"] == {}
