"""Honest timing: when the process started, and the statistics of training steps (the callback that
times them is meshrun.logs.step_timer). No jax or keras here."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

import meshrun

# Steps left out of the page-fault rate at a run's start (at most half of them): the first steps
# fault in memory pools and buffers that later steps reuse.
FAULT_WARMUP_STEPS = 50


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
    minor_faults_per_step: Optional[float] = None


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(first_begin: float, ends_by_epoch: list[list[float]], epoch_s: list[float],
              faults_by_epoch: Optional[list[list[int]]] = None) -> StepStats:
    """Turns step end times into stats. The first step (compilation) is timed from its dispatch;
    steady-state steps are the gaps between consecutive step ends inside one epoch, so epoch
    boundaries (iterator restarts, epoch-end callbacks, evaluation) are not counted as step time.
    `faults_by_epoch`, the process's minor page faults at each step end, gives the faults per
    steady step, after the first FAULT_WARMUP_STEPS."""
    first_end = ends_by_epoch[0][0]
    gaps = _gaps(ends_by_epoch)
    if not gaps:  # a single step in total: nothing steady to measure
        gaps = [first_end - first_begin]
    return StepStats(
        compile_s=first_end - first_begin,
        step_time_s=statistics.median(gaps),
        step_time_p90_s=percentile(gaps, 90),
        steady_steps=len(gaps),
        epoch_s=epoch_s,
        minor_faults_per_step=faults_per_step(faults_by_epoch) if faults_by_epoch else None,
    )


def faults_per_step(faults_by_epoch: list[list[int]]) -> Optional[float]:
    """Median minor page faults of the steady steps (gaps between step ends inside an epoch) after
    the first FAULT_WARMUP_STEPS of them, or after the first half where there are fewer than twice
    as many; None with no steady step. The median, as for step times: a step that grows the heap
    (glibc then faults in the new pages once) is rare, a step that maps its buffers afresh is every
    step."""
    gaps = _gaps(faults_by_epoch)
    if not gaps:
        return None
    return statistics.median(gaps[min(FAULT_WARMUP_STEPS, len(gaps) // 2):])


def _gaps(values_by_epoch: list[list]) -> list:
    """Differences of consecutive values inside each epoch, epoch after epoch."""
    return [later - earlier for values in values_by_epoch for earlier, later in zip(values, values[1:])]
