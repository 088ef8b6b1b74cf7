"""What a person watches during training: a rich progress bar per epoch with the step time and
throughput of the recent steps and the running metrics, or one line per epoch (train.verbose=2,
and verbose=1 when the output is not a terminal, so CI logs stay readable)."""

from __future__ import annotations

import collections
import sys
import threading
import time

import keras
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from meshrun.compat.keras.callbacks import mark_async_safe

RECENT_STEPS = 50  # the step time shown is the mean over this many of the latest steps
UPDATE_EVERY_S = 0.25  # the bar takes new figures at most this often (rich redraws it twice a second)


def metrics_text(logs: dict) -> str:
    """Logs as the console shows them: `loss 0.1234 accuracy 0.5000`."""
    return "  ".join(f"{name} {float(value):.4f}" for name, value in (logs or {}).items())


@mark_async_safe
class EpochProgress(keras.callbacks.Callback):
    """Shows training as it goes: `bar` (a rich bar per epoch, kept on screen when the epoch ends)
    or `lines` (a line per epoch). Step times are the gaps between the ends of recent steps. Per
    step it only notes the time; the bar is updated at most every UPDATE_EVERY_S."""

    def __init__(self, mode: str, epochs: int, batch_size: int, console: Console | None = None):
        super().__init__()
        self.mode = mode
        self.epochs = epochs
        self.batch_size = batch_size
        self.console = console or Console(file=sys.stdout)
        self._bar = None
        self._task = None
        self._ends: collections.deque = collections.deque(maxlen=RECENT_STEPS + 1)
        self._lock = threading.Lock()

    def on_train_begin(self, logs=None):
        if self.mode == "bar" and self._bar is None:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[speed]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[metrics]}"),
                console=self.console,
                refresh_per_second=2,
            )
            self._bar.start()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_started = self._updated = time.perf_counter()
        self._batches = 0
        self._ends.clear()
        self._ends.append(self._epoch_started)
        if self._bar is not None:
            self._task = self._bar.add_task(
                f"epoch {epoch + 1}/{self.epochs}", total=self.params["steps"], speed="", metrics=""
            )

    def on_train_batch_end(self, batch, logs=None):
        with self._lock:
            now = time.perf_counter()
            self._ends.append(now)
            self._batches = max(
                self._batches, batch + 1
            )  # Keras' worker threads may run the hooks out of order
            if self._bar is not None and now - self._updated >= UPDATE_EVERY_S:
                self._updated = now
                self._bar.update(
                    self._task, completed=self._batches, speed=self._speed(), metrics=metrics_text(logs)
                )

    def _speed(self) -> str:
        if len(self._ends) < 3:  # the first step is mostly compilation
            return ""
        step_s = (self._ends[-1] - self._ends[1]) / (len(self._ends) - 2)
        return f"{step_s * 1e3:.2f} ms/step {self.batch_size / step_s:,.0f} samples/s" if step_s > 0 else ""

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._epoch_started
        planned = self.params["steps"]
        # Training stopped in this epoch (a signal, the time budget): it ran fewer steps than planned.
        cut = f"; stopped after {self._batches} of {planned} steps" if self._batches < planned else ""
        if self._bar is not None:
            description = f"epoch {epoch + 1}/{self.epochs}" + (" (stopped)" if cut else "")
            self._bar.update(
                self._task,
                completed=self._batches,
                speed=self._speed(),
                metrics=metrics_text(logs),
                description=description,
            )
            return
        speed = self._speed() or f"{seconds:.2f} s"
        print(
            f"epoch {epoch + 1}/{self.epochs}: {metrics_text(logs)}  ({seconds:.2f} s, {speed}{cut})",
            flush=True,
        )

    def on_train_end(self, logs=None):
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def progress_mode(verbose: int, first_process: bool, terminal: bool) -> str | None:
    """How training shows progress: None (quiet), `bar` or `lines`. Processes other than the
    first write a line per epoch into their logs."""
    if verbose == 0:
        return None
    if verbose == 2 or not first_process or not terminal:
        return "lines"
    return "bar"
