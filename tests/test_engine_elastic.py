"""Elastic resume (DESIGN.md principle 9): a run continues on another number of ranks, batch size, accumulation or
strategy when it keeps the global batch, and matches the uninterrupted run — the same rows in every optimizer step
(none skipped or repeated), the same losses, grad norms and final weights up to float64 rounding.

Runs: the smoke model in float64 without dropout or batch memory (helpers.engine: FLOAT64, NO_BATCH_COUPLING), a
global batch of 16 of 64 samples (an epoch is 4 optimizer steps), 6 steps; legs on 2 ranks (gloo, torchrun) and in
this process. The tolerance is the float64 equivalence one (helpers.engine.assert_same_training): a step's gradient
summed in another order (two ranks' means averaged vs one rank's micro-batches accumulated) differs by a few ulps
per summed term, ≤ n·eps64 ≈ 1e-12 relative for the n ≤ 4096 terms of a reduction here, which F64_ATOL (1e-9) and
LOGGED_RTOL (one float32 ulp of the logged values) bound; a real difference (a row skipped, a step's data
repeated, the schedule or optimizer state off by one step) moves the weights by orders of magnitude more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.engine.config import config_to_dict, with_global_batch
from drivetrain.engine.resume import check_elastic
from helpers.elastic import ELASTIC, GLOBAL, GLOBAL_BATCH, STEPS, rows_per_step, split, streampetr_overrides, train_leg
from helpers.engine import ROOT, SMOKE, assert_same_training, final_state, overrides, torchrun

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
WORKER = str(ROOT / "tests" / "engine_elastic_worker.py")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run: one process × 16, 6 steps."""
    run = tmp_path_factory.mktemp("elastic") / "reference"
    train_leg(run, "a", STEPS, *split(GLOBAL_BATCH, 1))
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The resumed runs: first legs in this process, the 2-rank legs in one torchrun, second legs here."""
    root = tmp_path_factory.mktemp("elastic-runs")
    train_leg(root / "one_to_two", "a", 3, *split(8, 2))  # continued on 2 ranks × 8 by the worker
    train_leg(root / "same_command", "a", 3, *GLOBAL)  # train.global_batch: one process × 8 × 2, then 2 ranks × 8
    proc = torchrun(WORKER, str(root), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    train_leg(root / "two_to_one", "b", STEPS, *split(8, 2), resume=True)  # 2 FSDP ranks × 8 → one process × 8 × 2
    return root


def assert_continues_exactly(run: Path, reference: Path) -> None:
    """Every step read the reference's rows, and the training agrees up to float64 rounding."""
    steps = rows_per_step(run)
    assert list(steps) == list(range(1, STEPS + 1))
    assert steps == rows_per_step(reference)
    assert len(set(steps[1] + steps[2] + steps[3] + steps[4])) == 4 * GLOBAL_BATCH  # epoch 0: no row twice
    assert_same_training(run, reference)


@pytest.mark.parametrize("name", ["two_to_one", "one_to_two", "ddp_to_fsdp"])
def test_a_resume_on_another_split_continues_the_uninterrupted_run(runs: Path, reference: Path, name: str) -> None:
    """2 ranks × 8 under FSDP2 → 1 × 8 × accumulation 2 (strategy none), and 1 × 8 × 2 → 2 ranks × 8 under DDP
    (resumed mid-epoch at step 3); 2 ranks × 4 × 2 under DDP → 2 × 8 under FSDP2 (resumed mid-epoch 1 at step 5):
    every step reads the uninterrupted run's 16 rows, and the losses, grad norms and weights agree — the optimizer
    state numbered (none, ddp) and named (fsdp) loads both ways."""
    assert_continues_exactly(runs / name, reference)
    assert final_state(runs / name)["world_size"] == (1 if name == "two_to_one" else 2)


def test_one_command_continues_on_another_number_of_ranks_with_train_global_batch(runs: Path, reference: Path) -> None:
    """``train.global_batch=16 data.batch_size=8`` in one process (accumulation 2), then the same overrides on 2
    ranks (accumulation 1; DDP, since a process outside torchrun runs strategy none): what a torchrun
    ``--nnodes MIN:MAX`` restart with another number of nodes does with one command."""
    assert_continues_exactly(runs / "same_command", reference)
    assert final_state(runs / "same_command")["config"]["train"]["accumulation"] == 1  # derived on 2 ranks


def test_a_global_batch_that_does_not_split_into_the_ranks_micro_batches_is_one_line(tmp_path: Path) -> None:
    cfg = load_config(SMOKE, overrides(tmp_path / "run", "train.global_batch=12", "data.batch_size=8"))
    with pytest.raises(ConfigError, match=r"^train\.global_batch: 12 samples do not split .* 8 × 1;"):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()  # refused before anything is written
    derived = with_global_batch(load_config(SMOKE, ["train.global_batch=32", "data.batch_size=4"]), 4)
    assert derived.train.accumulation == 2


@pytest.mark.slow
def test_two_ranks_continue_on_four_at_an_epoch_boundary(tmp_path: Path, reference: Path) -> None:
    """2 ranks × 4 × 2 → 4 ranks × 4 (DDP), resumed at the end of epoch 0 (step 4)."""
    for nproc, scenario in ((2, "two_to_four"), (4, "four")):
        proc = torchrun(WORKER, str(tmp_path), scenario, nproc=nproc, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert_continues_exactly(tmp_path / "two_to_four", reference)
    assert len(final_state(tmp_path / "two_to_four")["rng"]) == 4  # the re-derived per-rank states, saved


def test_another_global_batch_is_refused_naming_the_accumulation_that_keeps_it(runs: Path) -> None:
    """one_to_two's last checkpoint (16 = 8 × 2 ranks × 1) resumed by one process × 8 × 1: one line naming
    train.accumulation=2; with batch 5 no accumulation keeps it on one rank, and the line names data.batch_size=16."""
    run = runs / "one_to_two"
    with pytest.raises(
        ConfigError,
        match=r"^--resume: checkpoint \S+ was written with a global batch of 16 \(8 × 2 rank\(s\) × 1\); this run "
        r"has 8 \(8 × 1 × 1\): set train\.accumulation=2 to keep it$",
    ):
        Trainer(load_config(SMOKE, overrides(run, *ELASTIC, "train.steps=8", *split(8, 1))), resume="auto")
    with pytest.raises(ConfigError, match=r"this run has 5 \(5 × 1 × 1\): set data\.batch_size=16 to keep it$"):
        Trainer(load_config(SMOKE, overrides(run, *ELASTIC, "train.steps=8", *split(5, 1))), resume="auto")
    saved = final_state(run)["config"]
    saved["distributed"]["strategy"] = "deepspeed"  # a DeepSpeed run's checkpoint, resumed under DDP
    cfg = load_config(SMOKE, overrides(run, *ELASTIC, *split(8, 1, "ddp")))
    with pytest.raises(ConfigError, match=r"written under distributed\.strategy 'deepspeed', this run has 'ddp'"):
        check_elastic(saved, 2, cfg, 2, run)


@pytest.mark.parametrize(
    ("batch_size", "accumulation", "ranks", "keep"),
    [
        (8, 1, 1, "set train.accumulation=2 to keep it"),
        (5, 2, 1, "set data.batch_size=8 to keep it"),
        (5, 3, 1, r"set data.batch_size × train.accumulation to 16 \(e.g. .*=1\) to keep it"),
        (2, 1, 3, "it does not divide among 3 ranks: resume on a number of ranks that divides 16"),
    ],
)
def test_the_refusal_names_what_keeps_the_global_batch(
    tmp_path: Path, batch_size: int, accumulation: int, ranks: int, keep: str
) -> None:
    """A checkpoint of 8 × 2 ranks × 1 = 16: the line names the accumulation, else the batch size, else their
    product, else that the ranks cannot share it."""
    saved = config_to_dict(load_config(SMOKE, overrides(tmp_path, *split(8, 1, "ddp"))))
    cfg = load_config(SMOKE, overrides(tmp_path, *split(batch_size, accumulation, "ddp")))
    now = batch_size * ranks * accumulation
    with pytest.raises(
        ConfigError, match=rf"global batch of 16 \(8 × 2 rank\(s\) × 1\); this run has {now} .*: {keep}$"
    ):
        check_elastic(saved, 2, cfg, ranks, tmp_path)
    check_elastic(saved, 2, load_config(SMOKE, overrides(tmp_path, *split(4, 2, "fsdp"))), 2, tmp_path)  # kept


@pytest.mark.slow  # ~7 s; another split: the smoke model's tests above
def test_a_streampetr_run_continues_every_stream_on_another_split(tmp_path: Path, synth_index, synth_root) -> None:
    """StreamPETR tiny on 2 ranks × 1 scene stream (DDP) for 2 steps, resumed in one process × 2 streams: each
    stream's memory continues in its slot (rank 1's in row 1, not rank 0's copy the model state holds), and the
    resumed run trains on."""
    index = str(synth_root / "drivetrain_index.npz")
    proc = torchrun(WORKER, str(tmp_path), "streampetr", index, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    saved = final_state(tmp_path)["streams"]
    assert len(saved) == 2 and not torch.equal(saved[0]["embedding"], saved[1]["embedding"])
    resumed = streampetr_overrides(tmp_path, index, "train.steps=3", "data.batch_size=2")  # one process × 2
    cfg = load_config(ROOT / "configs" / "streampetr_tiny.yaml", resumed)
    trainer = Trainer(cfg, resume="auto")
    memory = trainer.model.memory.get_extra_state()
    for name, value in memory.items():
        assert torch.equal(value, torch.cat([saved[0][name], saved[1][name]])), name
    trainer.fit()
    assert trainer.state.iteration == 3
