"""Pipelined blocks as XLA's cost analysis can count them. XLA counts the body of a loop once,
however many times the loop runs, and the GPipe schedule is loops (a lax.scan over the ticks, and
one over a stage's blocks) inside a shard_map whose body it sees as one stage's: its count of a
pipelined train step fell 2 to 10 times short of the same model's with separate blocks. Traced
inside `blocks_in_turn`, pipelined blocks (meshrun.pipeline.stack) run one after another with each
block's ops written out, as separate blocks run, and nothing recomputed (`pipeline.remat`), so the
count is the model's, as without stages; and each pipelined layer records the work its schedule
adds on the bubble ticks, where every stage computes on a microbatch whose result is thrown away."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

_counted_calls: ContextVar[list | None] = ContextVar("meshrun_counted_calls", default=None)


@dataclass(frozen=True)
class BubbleWork:
    """What one pipelined layer's schedule computes beyond its blocks' own work: `share` times the
    FLOPs of `forward_and_backward` on `args` (one block's forward pass on the whole batch and the
    backward pass a train step makes of it; shapes and dtypes only, to lower, not run). Each of the
    S stages runs its blocks on one microbatch at each of its RM + S - 1 ticks, and S - 1 of those
    are bubble ticks: the schedule computes (S - 1) / (RM) of its blocks' work more, so `share` is
    blocks x (S - 1) / (RM)."""

    forward_and_backward: Callable
    args: tuple
    share: float


@contextlib.contextmanager
def blocks_in_turn() -> Iterator[list[BubbleWork]]:
    """Pipelined blocks traced inside run one after another, unrolled, none recomputed, and record
    their schedule's bubble work in the list yielded (one entry per pipelined layer called with
    stages over a mesh axis of more than one device)."""
    calls: list[BubbleWork] = []
    token = _counted_calls.set(calls)
    try:
        yield calls
    finally:
        _counted_calls.reset(token)


def counted_calls() -> list[BubbleWork] | None:
    """Where pipelined blocks traced now record their bubble work; None outside blocks_in_turn
    (then they run as the schedule)."""
    return _counted_calls.get()
