"""``measure_interleaved`` (``bench train --compare --interleave``): two trainers built, then one iteration of each
in turn; each trains as it would alone (the process-wide state it set or draws from is given back before its
iteration), counts only its own warnings and compilations, and the process's signal handlers end as they began."""

from __future__ import annotations

import signal
import tempfile
import warnings

import pytest
import torch

from drivetrain.engine import Trainer
from drivetrain.engine.stepsplit import _Ledger, measure_interleaved, measure_steps
from helpers.engine import FAST, SMOKE

BASE = [*[k for k in FAST if not k.startswith("run.threads=")], "run.threads=2", "data.batch_size=4"]
COMPARE = ["run.seed=1", "run.threads=1"]  # another seed and thread count: what the trainer sets process-wide
STEPS, WARMUP = 2, 2


@pytest.fixture
def seen(tmp_path, monkeypatch):
    """Per iteration, in the order run: (seed, iteration, threads, RNG state at its start, weights after it)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    records: list[tuple[int, int, int, torch.Tensor, float]] = []
    iteration = Trainer._iteration

    def noting(self, log):
        rng, threads = torch.get_rng_state(), torch.get_num_threads()
        stop = iteration(self, log)
        weights = sum(float(p.detach().double().sum()) for p in self.model.parameters())
        records.append((self.cfg.run.seed, self.state.iteration, threads, rng, weights))
        return stop

    monkeypatch.setattr(Trainer, "_iteration", noting)
    return records


def test_interleaved_runs_alternate_and_each_trains_as_alone(seen):
    first, other = measure_interleaved(SMOKE, BASE, COMPARE, steps=STEPS, warmup=WARMUP)
    interleaved = list(seen)
    seen.clear()
    alone = {0: measure_steps(SMOKE, BASE, steps=STEPS, warmup=WARMUP)}
    by_seed = {0: list(seen)}
    seen.clear()
    alone[1] = measure_steps(SMOKE, [*BASE, *COMPARE], steps=STEPS, warmup=WARMUP)
    by_seed[1] = list(seen)
    total = STEPS + WARMUP
    assert [(r[0], r[1]) for r in interleaved] == [(seed, i) for i in range(1, total + 1) for seed in (0, 1)]
    for seed, threads in ((0, 2), (1, 1)):
        mine = [r for r in interleaved if r[0] == seed]
        assert [r[2] for r in mine] == [threads] * total  # its own torch thread count in each of its iterations
        for (_, i, _, rng, weights), (_, j, _, rng_alone, weights_alone) in zip(mine, by_seed[seed], strict=True):
            assert i == j and torch.equal(rng, rng_alone)  # the generator where the run alone had it
            assert weights == weights_alone  # and so the same training, bit for bit (deterministic on the CPU)
    assert first.batch_indices == alone[0].batch_indices and other.batch_indices == alone[1].batch_indices
    assert first.steps == other.steps == STEPS and first.warmup == other.warmup == WARMUP


def test_interleaved_measure_puts_the_signal_handlers_back(seen):
    def mine(signum, frame):  # a handler of the caller's: each trainer's fit sets its own and restores what it met
        raise AssertionError("not called")

    before = {s: signal.signal(s, mine) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        measure_interleaved(SMOKE, BASE, ["optim.lr=0.002"], steps=1, warmup=WARMUP)
        assert all(signal.getsignal(s) is mine for s in before)
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_ledgers_keep_each_runs_warnings_apart():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a, b = _Ledger(caught), _Ledger(caught)
        for ledger, tag in ((a, "a1"), (b, "b1"), (a, "a2"), (b, "b2")):
            ledger.resume()
            warnings.warn(tag, stacklevel=1)
            assert ledger.warnings() == len(ledger.own) + 1  # the one caught while it runs counts already
            ledger.pause()
        warnings.warn("between", stacklevel=1)  # while neither runs: no one's
    assert [str(w.message) for w in a.own] == ["a1", "a2"] and [str(w.message) for w in b.own] == ["b1", "b2"]
    assert a.warnings() == b.warnings() == 2 and len(caught) == 5


def test_ledgers_count_each_runs_cudagraph_skips_apart():
    # inductor's counter of graphs run without the CUDA graphs asked for (reduce-overhead), bumped as inductor does
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    a, b = _Ledger([]), _Ledger([])
    seen = {id(a): [], id(b): []}
    for ledger, skips in ((a, 1), (b, 2), (a, 3)):
        ledger.resume()
        seen[id(ledger)].append(ledger.counts()[2])
        for _ in range(skips):
            log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to this test")
        seen[id(ledger)].append(ledger.counts()[2])
        ledger.pause()
    (a0, a1, a2, a3), (b0, b1) = seen[id(a)], seen[id(b)]
    assert (a1 - a0, a2 - a1, a3 - a2, b1 - b0) == (1, 0, 3, 2)  # b's skips while a was paused are not a's
