"""The CPU no-sync harness (``tests/helpers/nosync.py``) itself: it raises on every kind of host sync DESIGN principle
3 forbids — value reads, ``nonzero`` in all its spellings, ``masked_select`` and boolean-mask indexing, forward and
backward — lets sync-free spellings of the same ops through, and lets through exactly the counted number of syncs
that the code documents with ``# sync:``."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import helpers.nosync as nosync
from helpers.nosync import HostSyncError, allow_host_sync, count_host_syncs, no_host_sync

X = torch.arange(15.0).reshape(5, 3) - 7  # (5, 3)
MASK = X[:, 0] > 0  # (5,) bool
INDEX = torch.tensor([0, 2])  # (2,) int64

# Each spelling of a sync and the name the harness reports it under.
SYNCS: dict[str, tuple[Callable[[], object], str]] = {
    "torch.nonzero": (lambda: torch.nonzero(MASK), "nonzero"),
    "Tensor.nonzero": (lambda: MASK.nonzero(), "nonzero"),
    "nonzero(as_tuple=True)": (lambda: MASK.nonzero(as_tuple=True), "nonzero"),
    "torch.where(cond)": (lambda: torch.where(MASK), "nonzero"),
    "torch.argwhere": (lambda: torch.argwhere(MASK), "nonzero"),
    "masked_select": (lambda: X.masked_select(MASK[:, None]), "masked_select"),
    "x[mask]": (lambda: X[MASK], "index (bool mask)"),
    "x[mask] = v": (lambda: X.clone().__setitem__(MASK, 0.0), "index_put_ (bool mask)"),
    "x[:, mask]": (lambda: X.T[:, MASK], "index (bool mask)"),
    "unique": (lambda: torch.unique(INDEX), "_unique2"),
    "repeat_interleave(tensor)": (
        lambda: X.repeat_interleave(torch.ones(5, dtype=torch.long), dim=0),
        "repeat_interleave",
    ),
    "torch.equal": (lambda: torch.equal(X, X), "equal"),
    "item": (lambda: X.sum().item(), "item"),
    "if t:": (lambda: bool(X.sum() > 0), "__bool__"),
}

# Sync-free spellings of the same intents.
SYNC_FREE: dict[str, Callable[[], object]] = {
    "integer index": lambda: X[INDEX],
    "integer index_put": lambda: X.clone().index_put_((INDEX,), torch.zeros(2, 3)),
    "torch.where(cond, a, b)": lambda: torch.where(MASK[:, None], X, 0.0),
    "masked_fill": lambda: X.masked_fill(MASK[:, None], 0.0),
    "repeat_interleave(output_size=)": lambda: X.repeat_interleave(
        torch.ones(5, dtype=torch.long), dim=0, output_size=5
    ),
    "count_nonzero": lambda: MASK.count_nonzero(),
}


@pytest.mark.parametrize("name", SYNCS)
def test_every_spelling_of_a_sync_raises_and_is_counted(name):
    fn, reported = SYNCS[name]
    with pytest.raises(HostSyncError, match=reported.split(" ")[0]), no_host_sync():
        fn()
    with count_host_syncs() as calls:
        fn()
    assert len(calls) == 1 and calls[0].startswith(reported), calls
    fn()  # everything is restored on exit


@pytest.mark.parametrize("name", SYNC_FREE)
def test_sync_free_spellings_pass(name):
    with count_host_syncs() as calls:
        SYNC_FREE[name]()
    assert calls == []
    with no_host_sync():
        SYNC_FREE[name]()


def test_boolean_indexing_syncs_in_backward_too():
    x = torch.randn(5, requires_grad=True)
    with count_host_syncs() as calls:
        x[MASK].sum().backward()
    assert calls == ["index (bool mask)", "index_put (bool mask)"]
    y = torch.randn(5, requires_grad=True)
    with count_host_syncs() as calls:
        torch.where(MASK, y, 0.0).sum().backward()  # the sync-free spelling, forward and backward
    assert calls == [] and torch.equal(y.grad, MASK.double().to(y.dtype))


def test_allow_host_sync_lets_a_block_through_and_the_check_resumes_after():
    with no_host_sync():
        with allow_host_sync():
            X[MASK]
            X.sum().item()
        with pytest.raises(HostSyncError, match="nonzero"):
            MASK.nonzero()


def test_the_harness_does_not_nest():
    with no_host_sync(), pytest.raises(RuntimeError, match="do not nest"), count_host_syncs():
        pass
    X.sum().item()  # the outer block restored everything


SOURCE = """
def documented(t):
    return t.sum().item()  # sync: the test's documented read


def documented_above(t):
    # sync: said on the line above, for a statement that spans lines
    return int(
        t.sum()
    )


def undocumented(t):
    return t.nonzero()
"""


@pytest.fixture
def fake_source(tmp_path, monkeypatch):
    """A module in a folder the harness takes for ``src/drivetrain`` (where it looks for ``# sync:``)."""
    folder = tmp_path / "drivetrain"
    folder.mkdir()
    path = folder / "fake_hot.py"
    path.write_text(SOURCE)
    monkeypatch.setattr(nosync, "SOURCE", folder)
    spec = importlib.util.spec_from_file_location("fake_hot", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "fake_hot", module)
    return module


def test_documented_syncs_pass_up_to_the_allowed_count(fake_source):
    with no_host_sync(documented=2) as passed:
        fake_source.documented(X)
        fake_source.documented_above(X)
    assert [(s.what, s.site, s.documented) for s in passed] == [
        ("item", "drivetrain/fake_hot.py:3", True),
        ("__int__", "drivetrain/fake_hot.py:8", True),
    ]
    with pytest.raises(HostSyncError, match=r"documented, but 1 allowed and 1 passed"), no_host_sync(documented=1):
        fake_source.documented(X)
        fake_source.documented(X)
    with pytest.raises(HostSyncError, match=r"nonzero of shape \(5, 3\) at drivetrain/fake_hot.py:14$"):
        with no_host_sync(documented=5):
            fake_source.undocumented(X)
    with pytest.raises(HostSyncError, match="item"), no_host_sync():
        fake_source.documented(X)  # documented, but none allowed


def test_a_documented_sync_in_the_library_is_found_by_its_comment():
    """``ragged.select(trim=True)`` reads the longest selection back, marked ``# sync:`` in ragged/select.py."""
    from drivetrain import ragged

    with no_host_sync(documented=1) as passed:
        out = ragged.select(X, X > 0, trim=True)
    assert len(passed) == 1 and passed[0].site.startswith("drivetrain/ragged/select.py:")
    assert out.max_size == int((X > 0).sum(-1).max())


def test_source_points_at_the_package_under_test():
    import drivetrain

    assert Path(drivetrain.__file__).resolve().parent == nosync.SOURCE
