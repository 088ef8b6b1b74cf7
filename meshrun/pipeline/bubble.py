"""The idle share of a pipeline schedule, plain arithmetic (no jax), for plans, reports and
benchmarks: the formula, and the share measured by fitting step times across microbatch counts."""

import itertools
from dataclasses import dataclass


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The share of a step each stage waits idle: (S - 1) / (M + S - 1) for GPipe, (S - 1) / (RM + S - 1)
    for the circular schedule, whose stages are R times shorter."""
    return (stages - 1) / (repeats * microbatches + stages - 1)


def stage_of_block(block: int, blocks: int, stages: int, repeats: int = 1) -> int:
    """The stage (device along the stage axis) that holds block `block` of `blocks`: contiguous runs
    of blocks / (S R) blocks go to stages 0, 1, ..., S - 1, then round again R times."""
    return block // (blocks // (stages * repeats)) % stages


@dataclass(frozen=True)
class BubbleFit:
    """Step times across microbatch counts fitted to the schedule: step(M) = fixed + T(M) (work / RM
    + per_tick) over its T(M) = RM + S - 1 ticks (fixed: a cost outside the ticks, work: the whole
    batch's, per_tick: a tick's hand-on), and at each M the fitted step and the share of it the
    S - 1 extra ticks take (the measured bubble)."""

    fixed: float
    work: float
    per_tick: float
    fitted: dict[int, float]
    shares: dict[int, float]


def fit_bubble(stages: int, repeats: int, step_times: dict[int, float]) -> BubbleFit | None:
    """The BubbleFit of `step_times` (microbatch count -> time a step, of runs alike but for M), no
    term negative; None with fewer than two microbatch counts or one stage. With one device per
    stage the shares are the measured bubble; with stages sharing cores (emulated CPU devices) they
    measure the schedule's overhead."""
    if stages < 2 or len(step_times) < 2:
        return None
    import numpy as np

    micro = np.array(sorted(step_times), dtype=float)
    ticks = repeats * micro + stages - 1
    columns = [np.ones_like(micro), ticks / (repeats * micro), ticks][: min(3, len(micro))]
    times = np.array([step_times[int(m)] for m in micro])
    fixed, work, per_tick = (*least_squares_nonnegative(np.stack(columns, axis=1), times), 0.0, 0.0)[:3]
    fitted, shares = {}, {}
    for m in map(int, micro):
        tick = work / (repeats * m) + per_tick
        fitted[m] = fixed + (repeats * m + stages - 1) * tick
        shares[m] = (stages - 1) * tick / fitted[m] if fitted[m] > 0 else 0.0
    return BubbleFit(fixed, work, per_tick, fitted, shares)


def least_squares_nonnegative(design, target) -> tuple[float, ...]:
    """The least-squares coefficients of `design`'s columns for `target`, none of them negative (a
    cost below zero means nothing): the best plain fit over the subsets of columns whose
    coefficients all come out non-negative, the others zero (few columns: every subset is tried)."""
    import numpy as np

    best, best_residual = (0.0,) * design.shape[1], float(np.sum(target**2))
    for size in range(1, design.shape[1] + 1):
        for subset in itertools.combinations(range(design.shape[1]), size):
            coef = np.linalg.lstsq(design[:, subset], target, rcond=None)[0]
            residual = float(np.sum((design[:, subset] @ coef - target) ** 2))
            if (coef >= 0).all() and residual < best_residual:
                full = np.zeros(design.shape[1])
                full[list(subset)] = coef
                best, best_residual = tuple(float(value) for value in full), residual
    return best
