"""How long each training step really took, and how many page faults it cost: a Keras callback.

Step times are taken when each step's results are ready on the devices, not when Python dispatched
it: Keras calls the batch-end hook only after it has fetched the step's logs from the devices.
Where that happens depends on `async_safe` (see StepTimer). The process's minor page faults are
read at the same moments: a steady step that faults thousands of pages is paying for an allocator
that gives its buffers back every step (meshrun.system.allocator).
"""

from __future__ import annotations

import threading
import time

import keras

from meshrun.compat.keras.callbacks import mark_async_safe
from meshrun.logs.timing import StepStats, summarize
from meshrun.system import allocator


class StepTimer(keras.callbacks.Callback):
    """Records when each training step finished (and the process's minor page faults by then), when
    each epoch began, how long it took and when its training work ended (the throughput window of
    meshrun.logs.timing).

    With `async_safe=True` Keras fetches logs and calls the hook from a pool of worker threads
    while the loop dispatches the next steps (its default without callbacks: no pipeline bubble
    on accelerators). With False, the loop fetches each step's logs itself before dispatching the
    next. meshrun uses False on CPU: on emulated CPU devices (jax 0.10, keras 3.15) log fetches from
    worker threads racing the loop's dispatch can deadlock XLA's CPU all-reduce rendezvous (the
    process aborts after 40 s), and the synchronous loop is no slower there.
    """

    def __init__(self, async_safe: bool):
        super().__init__()
        mark_async_safe(self, async_safe)
        self._lock = threading.Lock()
        self._ends: dict[tuple[int, int], tuple[float, int]] = {}
        self._epoch = 0
        self._began: dict[int, float] = {}  # by epoch index
        self._epoch_s: dict[int, float] = {}
        self._trained_until: dict[int, float | None] = {}  # the epoch's end, unless it evaluated
        self.first_begin = None
        self.first_begin_wall = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._began[epoch] = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_begin is None:
            self.first_begin = time.perf_counter()
            self.first_begin_wall = time.time()

    def on_train_batch_end(self, batch, logs=None):
        # Runs once this step's logs have been fetched from the devices: the step is done.
        now, faults = time.perf_counter(), allocator.minor_faults()
        with self._lock:
            self._ends[(self._epoch, batch)] = (now, faults)

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        self._epoch_s[epoch] = now - self._began[epoch]
        # Keras evaluates validation_data before this hook: such an epoch's training ended at its last step.
        self._trained_until[epoch] = None if any(name.startswith("val_") for name in logs or {}) else now

    def stats(self) -> StepStats:
        """The step statistics of the finished fit."""
        by_epoch: dict[int, list[float]] = {}
        faults_by_epoch: dict[int, list[int]] = {}
        for (epoch, _batch), (end, faults) in sorted(self._ends.items()):
            ends, counts = by_epoch.setdefault(epoch, []), faults_by_epoch.setdefault(epoch, [])
            # Worker threads may record a hair out of order; a step cannot end before its predecessor.
            ends.append(max(end, ends[-1]) if ends else end)
            counts.append(max(faults, counts[-1]) if counts else faults)
        epochs = sorted(by_epoch)  # every epoch that ran runs at least the step it began with
        until = [self._trained_until.get(e) or by_epoch[e][-1] for e in epochs]
        stats = summarize(
            self.first_begin,
            [self._began[e] for e in epochs],
            [by_epoch[e] for e in epochs],
            [self._epoch_s[e] for e in sorted(self._epoch_s)],
            [faults_by_epoch[e] for e in epochs],
            until,
        )
        stats.first_step_at = self.first_begin_wall
        return stats
