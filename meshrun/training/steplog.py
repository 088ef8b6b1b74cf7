"""The step log: a record per training step and per epoch, written to the run's sinks
(meshrun.logs.sinks) by a writer thread, so that logging costs training no step time."""

from __future__ import annotations

import collections
import threading
import time

from meshrun.training.callbacks import StepCounting
from meshrun.training.schedule import learning_rate_at


class StepLog(StepCounting):
    """Writes the run's log: for every training step its global step and epoch (both from 1), the
    running loss and metrics Keras reports, the learning rate, and the step's seconds and
    samples/s (from the end of the previous step); for every epoch the global step it ended at, the
    steps it ran (fewer than an epoch has where training was stopped in it, or resumed), its
    seconds (start to end, evaluation included) and its logs. Each record goes to
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
        self._pending: collections.deque = (
            collections.deque()
        )  # ("step", step, epoch, logs, seconds) or ("epoch", record)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._writer = None
        self._failure = None
        self._last_end = self._epoch_began = time.perf_counter()
        self._batches = 0  # the steps the current epoch has run

    def on_train_begin(self, logs=None):
        if not self.sinks:
            self.sinks = self.open_sinks()
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_until_closed, name="meshrun-step-log", daemon=True
            )
            self._writer.start()

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._last_end = self._epoch_began = time.perf_counter()
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        with self._lock:
            now = time.perf_counter()
            seconds, self._last_end = now - self._last_end, now
            self._batches = max(self._batches, batch + 1)
            self._pending.append(("step", self.step_number(batch), self._epoch + 1, logs, seconds))

    def on_epoch_end(self, epoch, logs=None):
        # An epoch that training was stopped in ran fewer steps than Keras planned (self.params).
        seconds, batches = time.perf_counter() - self._epoch_began, self._batches
        record = {
            "epoch_end": epoch + 1,
            "step": self.step_number(batches - 1),
            "epoch_steps": batches,
            "epoch_s": seconds,
            **{k: float(v) for k, v in (logs or {}).items()},
        }
        super().on_epoch_end(epoch, logs)
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
                "step": step,
                "epoch": epoch,
                **{k: float(v) for k, v in (logs or {}).items()},
                "learning_rate": learning_rate_at(self.train, step - 1, self.total_steps),
                "step_s": seconds,
                "samples_per_s": self.train.batch_size / seconds if seconds > 0 else None,
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
