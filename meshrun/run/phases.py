"""A training run from start to end: `train(config, context)` passes through each phase once:
prepare (every check, nothing built), the float-base comparison (a quantized base's float model
built, evaluated and freed: meshrun.run.float_base), execute (build, fit, evaluate, export) and
collect (metrics.json's figures)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from meshrun.config.schema import RunConfig
from meshrun.errors import ConfigError
from meshrun.placement import distribution
from meshrun.placement.plan import Plan
from meshrun.run import float_base
from meshrun.run.collect import Ending, collect
from meshrun.run.execute import execute
from meshrun.run.prepare import RunContext, prepare
from meshrun.specs.metrics import RunMetrics
from meshrun.system import signals
from meshrun.system.process import collectable_again, kept_to_the_end
from meshrun.training.checkpoint import UnreadableCheckpoint

log = logging.getLogger("meshrun")

__all__ = ["RunContext", "TrainedRun", "train"]


@dataclass(frozen=True)
class TrainedRun:
    """What a finished run hands back: its metrics (metrics.json) and the plan it was checked
    against (plan.json)."""

    metrics: RunMetrics
    plan: Plan


def train(config: RunConfig, context: RunContext) -> TrainedRun:
    """Checks, builds, trains, evaluates and measures the configured run. Raises ConfigError for
    anything wrong with the config, before anything is built. A checkpoint to resume from that
    turns out unreadable (its files changed after it was saved) is passed over by resume=auto in a
    one-process run, which then starts again from the newest one before it, saying so."""
    while True:
        try:
            _keep_to_the_end(context)  # the imports
            setup = prepare(config, context)
            _keep_to_the_end(context)  # the model and its data
            stop_signals = signals.StopSignals()  # caught by both steps: one signal stops the training
            compared = float_base.compare(setup, stop_signals)
            outcome = execute(setup, compared, stop_signals)
            break
        except UnreadableCheckpoint as err:
            collectable_again()  # the model built for the checkpoint passed over goes
            distribution.reset()
            context = _passing_over(err, config, context)
        except BaseException:
            distribution.reset()
            raise
    ending = teardown(context)
    return TrainedRun(metrics=collect(setup, outcome, ending), plan=setup.plan)


def _keep_to_the_end(context: RunContext) -> None:
    """In a process that ends after this run, keeps what lives now out of the garbage collector's
    walks (a run in a process with more to do leaves them all to it)."""
    if context.process_ends_after:
        kept_to_the_end()


def _passing_over(err: UnreadableCheckpoint, config: RunConfig, context: RunContext) -> RunContext:
    """The context of the run's next try without the unreadable checkpoint; a ConfigError where
    meshrun cannot fall back (a checkpoint named by path, or several processes, which would have
    to agree on it)."""
    if config.resume_mode(context.requeued) != "auto" or context.identity.num_processes > 1:
        raise ConfigError(
            "resume",
            f"{err}: its files were changed after it was saved; resume from another of its steps "
            "(resume=<dir>/<step>) or start again (resume=never)",
        ) from None
    log.warning(f"{err}; passing over it to the newest checkpoint before it (a fresh start if there is none)")
    return dataclasses.replace(
        context, unreadable_checkpoints=context.unreadable_checkpoints | {err.point.step}
    )


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
