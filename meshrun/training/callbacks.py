"""Keras callbacks that guard and stop training: the guard that stops at the first step whose loss
is NaN or infinite, the graceful stop (the wall-clock budget, stop signals), early stopping and the
profiler trace (timing, progress, the step log and checkpoints have modules of their own).

All are async-safe (meshrun.compat.keras.callbacks.mark_async_safe): Keras may then call their
per-step hooks from worker threads while the loop dispatches the next steps (its default on
accelerators; one callback without it would make every step wait for its logs). So they take the
step from the epoch's first step plus the batch index, never from a running counter, and write under
a lock."""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path

import jax
import keras
import numpy as np

from meshrun.compat.jax import JAX_PROFILER_LOGGER
from meshrun.compat.keras.callbacks import mark_async_safe


def finite(logs) -> bool:
    """Whether the loss in a step's logs is a finite number (True when there is none)."""
    loss = (logs or {}).get("loss")
    return loss is None or math.isfinite(float(loss))


@mark_async_safe
class StepCounting(keras.callbacks.Callback):
    """A callback that knows each batch's global step, counted from 1 across the fit calls of a
    run (the epoch's first step plus the batch index, never a running counter: with async
    dispatch the batch-end hooks run on worker threads)."""

    def __init__(self, first_step: int):
        super().__init__()
        self._steps_before_epoch = first_step
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def step_number(self, batch: int) -> int:
        """The global step (from 1) of `batch` of the current epoch."""
        return self._steps_before_epoch + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self._steps_before_epoch += self.params["steps"]  # the steps of this fit's epochs


class Diverged(RuntimeError):
    """The loss became NaN or infinite and train.stop_on_nan stopped training."""


class StopOnNaN(StepCounting):
    """Stops training at the end of the first step whose loss is NaN or infinite, and remembers it.
    Keras' running loss turns non-finite with the first bad step, so that step is the one named.
    With async dispatch (accelerators) training may run a step or two past it."""

    def __init__(self, first_step: int, steps_per_epoch: int):
        super().__init__(first_step)
        self.steps_per_epoch = steps_per_epoch
        self.bad = None
        self._lock = threading.Lock()

    def on_train_batch_end(self, batch, logs=None):
        if not finite(logs):
            with self._lock:
                step = self.step_number(batch)
                if self.bad is None or step < self.bad[0]:
                    self.bad = (step, float(logs["loss"]))
            self.model.stop_training = True

    def check(self, last_checkpoint: str | None) -> None:
        """Raises Diverged naming the step, if training was stopped."""
        if self.bad is None:
            return
        step, loss = self.bad
        epoch, in_epoch = divmod(step - 1, self.steps_per_epoch)
        kept = f"; the last good checkpoint is {last_checkpoint}" if last_checkpoint else ""
        raise Diverged(
            f"the loss became {loss} at step {step} (epoch {epoch + 1}, step {in_epoch + 1} of "
            f"{self.steps_per_epoch}); training stopped there (train.stop_on_nan){kept}"
        )


class GracefulStop(StepCounting):
    """Stops training at a step boundary when asked: at the first step that begins after `deadline`
    (time.time(); train.max_time), or after a stop signal `signals` caught (SIGTERM, SIGUSR1,
    Ctrl-C; meshrun.system.signals). The step that was beginning still runs. Checked before
    each step on the loop's own thread, so the step count is exact even when logs are fetched
    asynchronously.

    With several processes, all must stop at the same step: they check together every
    `SYNC_EVERY` steps (from step 1), process 0's clock deciding the deadline and a signal caught
    by any process stopping them all."""

    SYNC_EVERY = 20
    MAX_TIME, SIGNAL = "max_time", "signal"

    def __init__(
        self, first_step: int, deadline: float | None = None, signals=None, several_processes: bool = False
    ):
        super().__init__(first_step)
        self.deadline = deadline
        self.signals = signals
        self.several_processes = several_processes
        self.stopped_at = None  # the last step run, once stopped
        self.reason = None  # MAX_TIME or SIGNAL, once stopped
        self.signal = None  # the signal's number, for SIGNAL
        self._batches_done = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.stopped_at is not None:
            return
        step = self.step_number(batch)
        reason, signum = self._asked(step)
        if reason is not None:
            self.stopped_at, self.reason, self.signal = step, reason, signum
            self._batches_done = batch + 1
            self.model.stop_training = True

    def _asked(self, step: int) -> tuple[str | None, int | None]:
        """(reason, signal number) when training should stop after `step`, else (None, None)."""
        over = self.deadline is not None and time.time() >= self.deadline
        signum = (self.signals.received if self.signals is not None else None) or 0
        if self.several_processes:
            if (step - 1) % self.SYNC_EVERY:
                return None, None
            from jax.experimental import multihost_utils

            asked = multihost_utils.process_allgather(np.array([int(over), signum], dtype=np.int32))
            over, signum = bool(asked[0][0]), int(asked[:, 1].max())
        if signum:
            return self.SIGNAL, signum
        return (self.MAX_TIME, None) if over else (None, None)

    def batches_done(self, batches: int) -> int:
        """How many of the current epoch's `batches` ran (fewer once training was stopped in it)."""
        return self._batches_done if self._batches_done is not None else batches


@mark_async_safe
class EarlyStopping(keras.callbacks.EarlyStopping):
    """Keras' early stopping, quiet on the epochs that do not evaluate (train.eval_every) and
    remembering the epoch (from 1) it stopped after."""

    def get_monitor_value(self, logs):
        logs = logs or {}
        if self.monitor not in logs:
            return (
                None  # val_* is missing on epochs without evaluation; the monitor was checked before training
            )
        return logs[self.monitor]

    @property
    def stopped_after(self):
        """The epoch (from 1) training stopped after, or None."""
        return self.stopped_epoch + 1 if self.stopped_epoch else None


class StepProfiler(StepCounting):
    """Traces training steps `first` to `last` (global, from 1) with the JAX profiler into
    `directory`: the trace starts before step `first` is dispatched and stops once step `last`'s
    results are back (or when training ends first)."""

    def __init__(self, first: int, last: int, directory: Path, first_step: int):
        super().__init__(first_step)
        self.first, self.last = first, last
        self.directory = directory
        self.traced = None  # (first, last) steps actually traced
        self._started = None
        self._last_seen = first
        self._lock = threading.Lock()

    def on_train_batch_begin(self, batch, logs=None):
        step = self.step_number(batch)
        if self._started is None and self.traced is None and self.first <= step <= self.last:
            self.directory.mkdir(parents=True, exist_ok=True)
            logging.getLogger(JAX_PROFILER_LOGGER).setLevel(logging.WARNING)  # it logs each file it converts
            jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True)
            self._started = step

    def on_train_batch_end(self, batch, logs=None):
        if self._started is not None:
            self._last_seen = self.step_number(batch)
            if self._last_seen >= self.last:
                self._stop(self._last_seen)

    def on_train_end(self, logs=None):
        if self._started is not None:
            self._stop(self._last_seen)

    def _stop(self, step: int) -> None:
        with self._lock:
            if self._started is None:
                return
            jax.profiler.stop_trace()
            self.traced, self._started = (self._started, step), None

    def trace_files(self) -> list[str]:
        """The trace files written (xplane.pb for TensorBoard, perfetto_trace.json.gz for Perfetto)."""
        return sorted(str(p) for p in self.directory.rglob("*") if p.is_file())
