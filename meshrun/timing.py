"""Honest timing: when the process started, and how long each training step really took.

Step times are taken when each step's results are ready on the devices, not when Python dispatched
it: Keras calls the batch-end hook only after it has fetched the step's logs from the devices.
Where that happens depends on `async_safe` (see StepTimer).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field

import keras

import meshrun


def process_start_time() -> float:
    """Wall-clock time (time.time()) at which this process started; from /proc on Linux, else the
    time meshrun was first imported."""
    try:
        with open("/proc/self/stat") as stat:
            fields_after_name = stat.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields_after_name[19])  # field 22 of stat(5): starttime
        with open("/proc/uptime") as uptime:
            uptime_s = float(uptime.read().split()[0])
        age = uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError):
        return meshrun.IMPORTED_AT


@dataclass
class StepStats:
    """Summary of one fit: compile (first step), steady-state step times, epoch times."""

    compile_s: float
    step_time_s: float
    step_time_p90_s: float
    steady_steps: int
    epoch_s: list[float] = field(default_factory=list)
    first_step_at: float = 0.0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(first_begin: float, ends_by_epoch: list[list[float]], epoch_s: list[float]) -> StepStats:
    """Turns step end times into stats. The first step (compilation) is timed from its dispatch;
    steady-state steps are the gaps between consecutive step ends inside one epoch, so epoch
    boundaries (iterator restarts, epoch-end callbacks) are not counted as step time."""
    first_end = ends_by_epoch[0][0]
    gaps = [later - earlier for ends in ends_by_epoch for earlier, later in zip(ends, ends[1:])]
    if not gaps:  # a single step in total: nothing steady to measure
        gaps = [first_end - first_begin]
    return StepStats(
        compile_s=first_end - first_begin,
        step_time_s=statistics.median(gaps),
        step_time_p90_s=percentile(gaps, 90),
        steady_steps=len(gaps),
        epoch_s=epoch_s,
    )


class StepTimer(keras.callbacks.Callback):
    """Records when each training step finished and how long each epoch took.

    With `async_safe=True` Keras fetches logs and calls the hook from a pool of worker threads
    while the loop dispatches the next steps (its default without callbacks: no pipeline bubble
    on accelerators). With False, the loop fetches each step's logs itself before dispatching the
    next. meshrun uses False on CPU: on emulated CPU devices (jax 0.10, keras 3.15) log fetches from
    worker threads racing the loop's dispatch can deadlock XLA's CPU all-reduce rendezvous (the
    process aborts after 40 s), and the synchronous loop is no slower there.
    """

    def __init__(self, async_safe: bool):
        super().__init__()
        self.async_safe = async_safe
        self._lock = threading.Lock()
        self._ends: dict[tuple[int, int], float] = {}
        self._epoch = 0
        self._epoch_started = 0.0
        self.epoch_s: list[float] = []
        self.first_begin = None
        self.first_begin_wall = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_started = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_begin is None:
            self.first_begin = time.perf_counter()
            self.first_begin_wall = time.time()

    def on_train_batch_end(self, batch, logs=None):
        # Runs once this step's logs have been fetched from the devices: the step is done.
        now = time.perf_counter()
        with self._lock:
            self._ends[(self._epoch, batch)] = now

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_s.append(time.perf_counter() - self._epoch_started)

    def stats(self) -> StepStats:
        """The step statistics of the finished fit."""
        by_epoch: dict[int, list[float]] = {}
        for (epoch, _batch), end in sorted(self._ends.items()):
            ends = by_epoch.setdefault(epoch, [])
            # Worker threads may record a hair out of order; a step cannot end before its predecessor.
            ends.append(max(end, ends[-1]) if ends else end)
        stats = summarize(self.first_begin, [by_epoch[e] for e in sorted(by_epoch)], list(self.epoch_s))
        stats.first_step_at = self.first_begin_wall
        return stats
