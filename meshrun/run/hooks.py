"""The Keras callbacks of a run, made from its setup, and what they found out: step times, the
checkpoints saved, why training stopped early, where the step log and the profiler trace went,
whether the allocator's policy was put back after a generator pipeline changed it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from meshrun.compat.keras.callbacks import is_async_safe
from meshrun.logs import sinks
from meshrun.logs.progress import EpochProgress, progress_mode
from meshrun.logs.step_timer import StepTimer
from meshrun.run.feed import AllocatorGuard
from meshrun.run.prepare import RunSetup
from meshrun.specs.metrics import ProfileFigures
from meshrun.specs.rundir import PROFILE_DIR
from meshrun.system import signals
from meshrun.training import callbacks
from meshrun.training.checkpoint_callback import Checkpointing
from meshrun.training.steplog import StepLog


@dataclass
class RunHooks:
    """The Keras callbacks of a run, and what they found out."""

    timer: StepTimer
    checkpointing: Checkpointing
    guard: callbacks.StopOnNaN | None = None
    step_log: StepLog | None = None
    stopper: callbacks.GracefulStop | None = None
    early: callbacks.EarlyStopping | None = None
    profiler: callbacks.StepProfiler | None = None
    progress: EpochProgress | None = None
    allocator: AllocatorGuard | None = None

    @property
    def all(self) -> list:
        """The callbacks in the order Keras calls them: the timer, then checkpoints (a checkpoint
        that does not fit is rejected before anything else starts), then the rest."""
        optional = (
            self.guard,
            self.stopper,
            self.early,
            self.profiler,
            self.step_log,
            self.progress,
            self.allocator,
        )
        return [self.timer, self.checkpointing, *(c for c in optional if c is not None)]

    @property
    def evaluation(self) -> list:
        """The callbacks of the final evaluation."""
        return [self.allocator] if self.allocator is not None else []

    @property
    def allocator_restored(self) -> bool:
        """Whether the run put glibc's large-block policy back after its pipeline changed it."""
        return self.allocator is not None and self.allocator.restored

    def finish(self) -> None:
        """After the last fit: waits for checkpoints still being written and closes the step log."""
        try:
            self.checkpointing.finish()
        finally:
            self._close_step_log()

    def abandon(self) -> None:
        """After a fit interrupted at once: closes the step log, without waiting for checkpoints
        still being written (an error of theirs would hide the interrupt)."""
        self._close_step_log()

    def _close_step_log(self) -> None:
        if self.step_log is not None:
            self.step_log.close()

    def check_finite(self) -> None:
        """Raises Diverged, naming the step, when the NaN guard stopped training."""
        if self.guard is not None:
            self.guard.check(self.checkpointing.last_saved)

    @property
    def async_log_fetch(self) -> bool:
        """Whether Keras fetched step logs on its worker threads."""
        return is_async_safe(self.timer)

    def stopped(self) -> dict | None:
        """Why training ended before its last epoch, and where (None: it ran to the end)."""
        stopper = self.stopper
        if stopper is not None and stopper.stopped_at is not None:
            signal = (
                {
                    "signal": signals.signal_name(stopper.signal),
                    "exit_status": signals.exit_status(stopper.signal),
                }
                if stopper.signal
                else {}
            )
            return {
                "reason": stopper.reason,
                **signal,
                "step": stopper.stopped_at,
                "checkpoint": self.checkpointing.last_saved,
            }
        if self.early is not None and self.early.stopped_after is not None:
            return {
                "reason": "early_stopping",
                "epoch": self.early.stopped_after,
                "checkpoint": self.checkpointing.last_saved,
            }
        return None

    def log_files(self) -> dict:
        """Where the step log went: file paths by kind."""
        sinks_open = self.step_log.sinks if self.step_log else []
        return {name: str(path) for sink in sinks_open for name, path in sinks.files_written(sink).items()}

    def profile(self) -> ProfileFigures | None:
        """The profiler trace: its dir, the steps asked for and traced, and its files."""
        if self.profiler is None:
            return None
        p = self.profiler
        return ProfileFigures(
            dir=str(p.directory),
            steps=[p.first, p.last],
            traced=list(p.traced) if p.traced else None,
            files=p.trace_files(),
        )


def make_hooks(setup: RunSetup, stop_signals: signals.StopSignals | None = None) -> RunHooks:
    """The run's callbacks (`stop_signals`: the stop signals caught while it trains). The step log,
    progress bar and profiler run in the first process only; the others log a line per epoch into
    their logs."""
    config, context = setup.config, setup.context
    train, start = config.train, setup.checkpoints.start
    first = start.global_step
    deadline = context.started_at + train.max_time if train.max_time is not None else None
    stopper = callbacks.GracefulStop(
        first, deadline, stop_signals, several_processes=setup.devices.processes > 1
    )
    hooks = RunHooks(
        timer=StepTimer(async_safe=not setup.devices.emulated),
        guard=callbacks.StopOnNaN(first, setup.datasets.steps_per_epoch) if train.stop_on_nan else None,
        checkpointing=Checkpointing(
            config.checkpoint,
            setup.checkpoints.root,
            start,
            setup.checkpoints.resume,
            stopper=stopper,
            model=setup.checkpoints.model,
        ),
        stopper=stopper,
        allocator=AllocatorGuard() if setup.generator_in_pipeline else None,
    )
    early = train.early_stopping
    if early.monitor is not None:
        hooks.early = callbacks.EarlyStopping(
            monitor=early.monitor,
            patience=early.patience,
            min_delta=early.min_delta,
            mode=early.mode,
            verbose=0,
        )
    if context.identity.is_first and context.run_dir:
        run_dir = Path(context.run_dir)
        hooks.step_log = StepLog(
            functools.partial(sinks.open_sinks, run_dir, config.logging.sinks, first),
            train,
            setup.total_steps,
            first,
        )
        if config.profile.steps is not None:
            where = Path(config.profile.dir).expanduser() if config.profile.dir else run_dir / PROFILE_DIR
            hooks.profiler = callbacks.StepProfiler(*config.profile.steps, where, first)
    mode = progress_mode(train.verbose, context.identity.is_first, Console().is_terminal)
    if mode is not None:
        hooks.progress = EpochProgress(mode, train.epochs, train.batch_size)
    return hooks
