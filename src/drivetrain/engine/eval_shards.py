"""Prediction over every rank of a run: each rank detects its share of the frames, rank 0 gets them all.

An evaluation during training (:mod:`drivetrain.engine.eval_hook`) or ``drivetrain eval --checkpoint``
under torchrun has each rank predict about 1/world_size of the frames, and no rank waits alone in a collective while
another predicts the whole split (the process group's ``distributed.timeout_s`` bounds such a wait).

- :func:`frame_shares`: the frames of each rank, contiguous and in order. A model with streaming state (a temporal
  memory) gets whole scenes: its share starts where a scene starts, where the memory is cleared (``prev_exists``
  False) just as in a pass over every frame, so each frame's detections are the one-process ones. Other models detect
  frame by frame (or ``batch_size`` frames at a time), so the cut may fall at any frame (batch) of the pass.
- :func:`predict_shared`: the detections of this rank's share (``batch_size`` frames per ``detect`` call: 1 during
  training, as :func:`~drivetrain.engine.eval_run.evaluate_model`), gathered in frame order on rank 0. After every
  call the ranks agree in one small collective whether a stop signal arrived (:class:`EvaluationStopped`) or a frame
  could not be read (:class:`EvaluationFailed`) anywhere; a rank whose share is shorter keeps joining those rounds
  until every share is done, so every rank calls the same collectives.
- :func:`agree_on_stop`: the same agreement once, after rank 0 has scored.

The model's buffers (a batch norm's running statistics, which each DDP rank updates in its own forward passes) are
rank 0's for the prediction, as the checkpoint of the step holds them, and each rank's own afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from drivetrain.data.errors import DataError
from drivetrain.engine.distributed import DistContext
from drivetrain.engine.eval_run import EvalFrames, FrameDetections, detect_frames, has_streaming_state

__all__ = ["EVAL_DELAY_ENV", "EvaluationFailed", "EvaluationStopped", "agree_on_stop", "frame_shares", "predict_shared"]

# Test hook: seconds to wait after every evaluated frame (cut short by a stop signal), so a test can signal mid-way.
EVAL_DELAY_ENV = "DRIVETRAIN_TEST_EVAL_DELAY_S"


class EvaluationStopped(Exception):
    """A stop signal arrived on some rank during the prediction; every rank raises it at the same frame."""

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.signal = signal  # its name ("SIGTERM"), or "a stop signal (on another rank)"


class EvaluationFailed(Exception):
    """A frame could not be read on some rank; every rank raises it, with that rank's one-line reason."""


def frame_shares(dataset: EvalFrames, world_size: int, *, whole_scenes: bool, batch_size: int = 1) -> list[range]:
    """Each rank's frames: contiguous, in order, together every frame once, as equal in length as the cut points allow.

    Args:
        dataset: the frames (their index's ``frame_in_scene`` marks where scenes start).
        world_size: number of ranks.
        whole_scenes: cut only where a scene starts (a model with streaming state).
        batch_size: frames per ``detect`` call; cuts fall on multiples of it, so every rank's batches are batches
            of the one-process pass.

    Returns:
        ``world_size`` ranges; rank 0's holds the first scene (or frame), later ones may be empty.
    """
    n = len(dataset)
    if whole_scenes:  # balanced in frames, cut where scenes start
        starts = np.flatnonzero(np.asarray(dataset.index.arrays["frame_in_scene"]) == 0)  # (S,) frames
        cuts, total, unit = np.unique(np.append(starts, n)).astype(np.int64), n, 1  # (S + 1,) cut points in frames
    else:  # balanced in detect calls, cut between batches
        total, unit = -(-n // batch_size), batch_size
        cuts = np.arange(total + 1, dtype=np.int64)  # (⌈n / batch_size⌉ + 1,) cut points in batches
    bounds = [0]
    for k in range(1, world_size):
        nearest = int(cuts[np.argmin(np.abs(cuts - k * total / world_size))])  # the first of two equally near ones
        bounds.append(max(nearest, bounds[-1], int(cuts[cuts > 0].min()) if n else 0))  # rank 0: ≥ one scene
    bounds = [min(b * unit, n) for b in [*bounds, total]]  # frames
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


class _Agreement:
    """One round after every ``detect`` call: the ranks' stop signal and read failure flags, max-reduced (one
    collective)."""

    def __init__(self, ctx: DistContext, stop_signal: Callable[[], str | None], delay_s: float) -> None:
        self.ctx, self.stop_signal, self.delay_s = ctx, stop_signal, delay_s
        self.failure: str | None = None  # this rank's reason, once a frame could not be read
        self.rounds = 0

    def after_frame(self) -> None:
        """The round after a ``detect`` call (the test hook's wait first)."""
        end = time.monotonic() + self.delay_s
        while time.monotonic() < end and self.stop_signal() is None:
            time.sleep(min(0.05, self.delay_s))
        self()

    def __call__(self) -> None:
        """One round; raises :class:`EvaluationStopped` or :class:`EvaluationFailed` on every rank alike."""
        self.rounds += 1
        stop, failed = self.stop_signal(), self.failure is not None
        stop_any, failed_any = bool(stop), failed
        if self.ctx.initialized:
            flags = torch.tensor([stop is not None, failed], dtype=torch.int64, device=self.ctx.device)  # (2,)
            stop_any, failed_any = self.ctx.all_reduce_max(flags).tolist()  # sync: every rank takes the same exit
        if stop_any:
            raise EvaluationStopped(stop or "a stop signal (on another rank)")
        if failed_any:
            reasons = self.ctx.gather_to_main(self.failure)  # each rank's reason, None where it read every frame
            raise EvaluationFailed(next(r for r in reasons if r is not None))


@contextlib.contextmanager
def _main_rank_buffers(model: nn.Module, ctx: DistContext) -> Iterator[None]:
    """Rank 0's buffers on every rank for the block, each rank's own back after it (nothing without a group)."""
    if not ctx.initialized:
        yield
        return
    buffers = list(model.buffers())
    saved = [b.detach().clone() for b in buffers] if not ctx.is_main else []
    with torch.no_grad():
        for b in buffers:
            dist.broadcast(b, src=0)
    try:
        yield
    finally:
        with torch.no_grad():
            for b, s in zip(buffers, saved, strict=False):  # rank 0 kept its own
                b.copy_(s)


def predict_shared(
    model: nn.Module,
    dataset: EvalFrames,
    ctx: DistContext,
    *,
    stop_signal: Callable[[], str | None],
    progress: bool = False,
    transform: Callable | None = None,
    on_frame: Callable | None = None,
    batch_size: int = 1,
    label: str = "eval",
) -> list[FrameDetections] | None:
    """Detect this rank's share of ``dataset`` (:func:`frame_shares`) and gather every rank's on rank 0 (collective).

    Args:
        model: the run's model (the same weights on every rank; its buffers are taken from rank 0).
        dataset: the frames to evaluate (the same on every rank).
        ctx: this process's place in the process group (its ``device`` runs the model).
        stop_signal: the name of a stop signal this process received, or None (read after every frame).
        progress: show a progress bar of this rank's share.
        transform: the per-frame batch transform (see :func:`~drivetrain.engine.eval_run.predict`).
        on_frame: the per-frame callback, with the frame's place in ``dataset`` (see
            :func:`~drivetrain.engine.eval_run.predict`).
        batch_size: frames per ``detect`` call (1 for a model with streaming state); the agreement follows each.
        label: the progress bar's label.

    Returns:
        On rank 0 every frame's detections in frame order; None on the other ranks.

    Raises:
        EvaluationStopped: a stop signal arrived on some rank (on every rank, at the same frame).
        EvaluationFailed: a frame could not be read on some rank (on every rank, with its reason).
    """
    shares = frame_shares(dataset, ctx.world_size, whole_scenes=has_streaming_state(model), batch_size=batch_size)
    rounds = max(-(-len(share) // batch_size) for share in shares)  # detect calls of the longest share
    agreement = _Agreement(ctx, stop_signal, float(os.environ.get(EVAL_DELAY_ENV, "0") or 0))
    mine: list[FrameDetections] = []
    with _main_rank_buffers(model, ctx):
        try:
            mine = detect_frames(
                model, dataset, ctx.device, frames=shares[ctx.rank], progress=progress, transform=transform,
                on_frame=on_frame, batch_size=batch_size, label=label, after_batch=agreement.after_frame,
            )  # fmt: skip
        except DataError as err:  # the other ranks learn it in the next round
            agreement.failure = str(err)
        while agreement.rounds < rounds or agreement.failure is not None:
            agreement()  # a shorter share (or a failed one) keeps joining the rounds until every share is done
    if not ctx.initialized:
        return mine
    gathered: list[list[FrameDetections]] | None = [[] for _ in range(ctx.world_size)] if ctx.is_main else None
    dist.gather_object(mine, gathered, dst=0)  # detections as NumPy arrays, between this run's own ranks
    return [d for share in gathered for d in share] if gathered is not None else None


def agree_on_stop(ctx: DistContext, stop_signal: Callable[[], str | None]) -> str | None:
    """Whether a stop signal arrived on any rank: its name here, the generic one for another rank's, else None
    (collective; in one process, this process's signal)."""
    stop = stop_signal()
    if not ctx.initialized:
        return stop
    flag = torch.tensor([stop is not None], dtype=torch.int64, device=ctx.device)  # (1,)
    any_stop = ctx.all_reduce_max(flag).item()  # sync: every rank takes the same exit
    return stop or ("a stop signal (on another rank)" if any_stop else None)
