"""Honest timing: when the process started, and the statistics of training steps (the callback that
times them is meshrun.logs.step_timer). No jax or keras here."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

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
