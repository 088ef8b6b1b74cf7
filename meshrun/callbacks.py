"""Keras callbacks of a run besides timing and checkpoints: the step log (`log.jsonl` in the run
dir, a line per training step and per epoch) and the guard that stops training at the first step
whose loss is NaN or infinite.

Both are `async_safe`: Keras may then call their per-step hooks from worker threads while the loop
dispatches the next steps (its default on accelerators; one callback without it would make every
step wait for its logs). So they take the step from the epoch's first step plus the batch index,
never from a running counter, and write under a lock."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import keras

from meshrun.schedule import learning_rate_at

LOG_FILE = "log.jsonl"


def finite(logs) -> bool:
    """Whether the loss in a step's logs is a finite number (True when there is none)."""
    loss = (logs or {}).get("loss")
    return loss is None or math.isfinite(float(loss))


class StepLog(keras.callbacks.Callback):
    """Writes `log.jsonl`: for every training step its global step, epoch, the running loss and
    metrics Keras reports, the learning rate, and the step's seconds and samples/s (from the end of
    the previous step); for every epoch its logs. The learning rate comes from the schedule's
    formula, so logging never waits on the devices."""

    async_safe = True

    def __init__(self, path: Path, train, total_steps: int, first_step: int):
        super().__init__()
        self.path = path
        self.train = train
        self.total_steps = total_steps
        self._epoch_first_step = first_step
        self._file = None
        self._lock = threading.Lock()

    def on_train_begin(self, logs=None):
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1 << 16)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._last_end = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        step = self._epoch_first_step + batch
        with self._lock:
            now = time.perf_counter()
            seconds, self._last_end = now - self._last_end, now
            record = {
                "step": step, "epoch": self._epoch, **{k: float(v) for k, v in (logs or {}).items()},
                "learning_rate": learning_rate_at(self.train, step, self.total_steps),
                "step_s": seconds, "samples_per_s": self.train.batch_size / seconds if seconds > 0 else None,
            }
            self._file.write(json.dumps(record) + "\n")

    def on_epoch_end(self, epoch, logs=None):
        self._epoch_first_step += self.params["steps"]  # the steps of this fit's epochs
        self._file.write(json.dumps({"epoch_end": epoch, **{k: float(v) for k, v in (logs or {}).items()}}) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Flushes and closes the file (after the last fit of the run)."""
        if self._file is not None:
            self._file.close()
            self._file = None


class Diverged(RuntimeError):
    """The loss became NaN or infinite and train.stop_on_nan stopped training."""


class StopOnNaN(keras.callbacks.Callback):
    """Stops training at the end of the first step whose loss is NaN or infinite, and remembers it.
    Keras' running loss turns non-finite with the first bad step, so that step is the one named."""

    async_safe = True  # with async dispatch (accelerators) training may run a step or two past it

    def __init__(self, first_step: int, steps_per_epoch: int):
        super().__init__()
        self._epoch_first_step = first_step
        self.steps_per_epoch = steps_per_epoch
        self.bad = None
        self._lock = threading.Lock()

    def on_train_batch_end(self, batch, logs=None):
        if not finite(logs):
            with self._lock:
                step = self._epoch_first_step + batch
                if self.bad is None or step < self.bad[0]:
                    self.bad = (step, float(logs["loss"]))
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self._epoch_first_step += self.params["steps"]

    def check(self, last_checkpoint: str | None) -> None:
        """Raises Diverged naming the step, if training was stopped."""
        if self.bad is None:
            return
        step, loss = self.bad
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        kept = f"; the last good checkpoint is {last_checkpoint}" if last_checkpoint else ""
        raise Diverged(
            f"the loss became {loss} at step {step + 1} (epoch {epoch + 1}, step {in_epoch + 1} of {self.steps_per_epoch}); "
            f"training stopped there (train.stop_on_nan){kept}"
        )
