"""Keras callbacks of a run besides timing, progress and checkpoints: the step log (to the sinks of
`meshrun.sinks`), the guard that stops training at the first step whose loss is NaN or infinite,
the wall-clock budget, early stopping and the profiler trace.

All are `async_safe`: Keras may then call their per-step hooks from worker threads while the loop
dispatches the next steps (its default on accelerators; one callback without it would make every
step wait for its logs). So they take the step from the epoch's first step plus the batch index,
never from a running counter, and write under a lock."""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from pathlib import Path

import jax
import keras
import numpy as np

from meshrun.schedule import learning_rate_at


def finite(logs) -> bool:
    """Whether the loss in a step's logs is a finite number (True when there is none)."""
    loss = (logs or {}).get("loss")
    return loss is None or math.isfinite(float(loss))


class StepCounting(keras.callbacks.Callback):
    """A callback that knows each batch's global step, counted from 1 across the fit calls of a
    run (the epoch's first step plus the batch index, never a running counter: with async
    dispatch the batch-end hooks run on worker threads)."""

    async_safe = True

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


class StepLog(StepCounting):
    """Writes the run's log: for every training step its global step and epoch (both from 1), the
    running loss and metrics Keras reports, the learning rate, and the step's seconds and
    samples/s (from the end of the previous step); for every epoch its logs. Each record goes to
    every sink (log.jsonl always; CSV and TensorBoard when asked), opened by `open_sinks()` when
    training begins (a run rejected before that writes nothing).

    Between steps it only notes the step's logs and time: a writer thread turns them into records
    and writes them in batches, every WRITE_EVERY_S and at each epoch's end. Written one by one
    between steps, the same records cost training 3 to 4 times their own time on a 2-core
    machine. The learning rate comes from the schedule's formula, so logging never waits on the
    devices."""

    WRITE_EVERY_S = 0.5

    def __init__(self, open_sinks, train, total_steps: int, first_step: int):
        super().__init__(first_step)
        self.open_sinks = open_sinks
        self.sinks: list = []
        self.train = train
        self.total_steps = total_steps
        self._pending: collections.deque = collections.deque()  # ("step", step, epoch, logs, seconds) or ("epoch", record)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._writer = None
        self._failure = None
        self._last_end = time.perf_counter()

    def on_train_begin(self, logs=None):
        if not self.sinks:
            self.sinks = self.open_sinks()
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_until_closed, name="meshrun-step-log", daemon=True)
            self._writer.start()

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._last_end = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        with self._lock:
            now = time.perf_counter()
            seconds, self._last_end = now - self._last_end, now
            self._pending.append(("step", self.step_number(batch), self._epoch + 1, logs, seconds))

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        record = {"epoch_end": epoch + 1, "step": self._steps_before_epoch, **{k: float(v) for k, v in (logs or {}).items()}}
        self._pending.append(("epoch", record))
        self._wake.set()

    def _write_until_closed(self) -> None:
        while not self._closing:
            self._wake.wait(self.WRITE_EVERY_S)
            self._wake.clear()
            try:
                self._write_pending()
            except Exception as err:  # raised again by close(), on the training thread
                self._failure = err
                return

    def _write_pending(self) -> None:
        while self._pending:
            entry = self._pending.popleft()
            if entry[0] == "epoch":
                for sink in self.sinks:
                    sink.epoch(entry[1])
                continue
            _, step, epoch, logs, seconds = entry
            record = {
                "step": step, "epoch": epoch, **{k: float(v) for k, v in (logs or {}).items()},
                "learning_rate": learning_rate_at(self.train, step - 1, self.total_steps),
                "step_s": seconds, "samples_per_s": self.train.batch_size / seconds if seconds > 0 else None,
            }
            for sink in self.sinks:
                sink.step(record)

    def close(self) -> None:
        """Writes what is left, stops the writer and closes every sink (after the last fit of the
        run); a failure of the writer is raised here."""
        if self._writer is not None:
            self._closing = True
            self._wake.set()
            self._writer.join()
            self._writer = None
        try:
            if self._failure is None:
                self._write_pending()
        finally:
            for sink in self.sinks:
                sink.close()
        if self._failure is not None:
            raise self._failure


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
            f"the loss became {loss} at step {step} (epoch {epoch + 1}, step {in_epoch + 1} of {self.steps_per_epoch}); "
            f"training stopped there (train.stop_on_nan){kept}"
        )


class TimeBudget(StepCounting):
    """Stops training at the first step that begins after `deadline` (time.time()); that step still
    runs. Checked before each step on the loop's own thread, so the step count is exact even when
    logs are fetched asynchronously.

    With several processes, all must stop at the same step: they check together every
    `SYNC_EVERY` steps (from step 1), and process 0's clock decides (a broadcast from it)."""

    SYNC_EVERY = 20

    def __init__(self, deadline: float, first_step: int, several_processes: bool = False):
        super().__init__(first_step)
        self.deadline = deadline
        self.several_processes = several_processes
        self.stopped_at = None  # the last step run, once stopped
        self._batches_done = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.stopped_at is None and self._over(self.step_number(batch)):
            self.stopped_at = self.step_number(batch)
            self._batches_done = batch + 1
            self.model.stop_training = True

    def _over(self, step: int) -> bool:
        over = time.time() >= self.deadline
        if not self.several_processes:
            return over
        if (step - 1) % self.SYNC_EVERY:
            return False
        from jax.experimental import multihost_utils

        return bool(multihost_utils.broadcast_one_to_all(np.int32(over)))

    def batches_done(self, batches: int) -> int:
        """How many of the current epoch's `batches` ran (fewer once the budget stopped it)."""
        return self._batches_done if self._batches_done is not None else batches


class EarlyStopping(keras.callbacks.EarlyStopping):
    """Keras' early stopping, quiet on the epochs that do not evaluate (train.eval_every) and
    remembering the epoch (from 1) it stopped after."""

    async_safe = True

    def get_monitor_value(self, logs):
        logs = logs or {}
        if self.monitor not in logs:
            return None  # val_* is missing on epochs without evaluation; the monitor was checked before training
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
            logging.getLogger("jax._src.profiler").setLevel(logging.WARNING)  # it logs each file it converts
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
