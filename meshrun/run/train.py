"""A training run from start to end: `train(config, context)` passes through each phase once."""

from __future__ import annotations

import time
from dataclasses import dataclass

from meshrun.config import RunConfig
from meshrun.placement import distribution
from meshrun.placement.plan import Plan
from meshrun.run.collect import Ending, collect
from meshrun.run.execute import execute
from meshrun.run.metrics import RunMetrics
from meshrun.run.prepare import RunContext, prepare

__all__ = ["RunContext", "TrainedRun", "train"]


@dataclass(frozen=True)
class TrainedRun:
    """What a finished run hands back: its metrics (metrics.json) and the plan it was checked
    against (plan.json)."""

    metrics: RunMetrics
    plan: Plan


def train(config: RunConfig, context: RunContext) -> TrainedRun:
    """Checks, builds, trains, evaluates and measures the configured run. Raises ConfigError for
    anything wrong with the config, before anything is built."""
    try:
        setup = prepare(config, context)
        outcome = execute(setup)
    except BaseException:
        distribution.reset()
        raise
    ending = teardown(context)
    return TrainedRun(metrics=collect(setup, outcome, ending), plan=setup.plan)


def teardown(context: RunContext) -> Ending:
    """Clears the run's distribution and Keras' session for the next run of this process (a
    multirun's next job); a process that ends right after the run skips it, since clearing can take
    seconds (collecting tf.data's graphs). Counted in the run's wall time: the metrics are written
    after it."""
    started = time.time()
    if not context.process_ends_after:
        distribution.reset()
    ended = time.time()
    return Ending(teardown_s=ended - started, ended_at=ended)
