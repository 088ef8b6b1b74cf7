"""Honest timing: when the process started, and the statistics of training steps (the callback that
times them is meshrun.logs.step_timer). No jax or keras here."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

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
    """Summary of one fit: compile (first step), steady-state step times, the time and steps that
    throughput is taken over, epoch times and how many steps each epoch ran. With a single step
    in all there is nothing steady to time: the step times and the throughput window are None."""

    compile_s: float
    step_time_s: float | None
    step_time_p90_s: float | None
    steady_steps: int
    epoch_s: list[float] = field(default_factory=list)
    first_step_at: float = 0.0
    minor_faults_per_step: float | None = None
    epoch_steps: list[int] = field(default_factory=list)
    throughput_s: float | None = None
    throughput_steps: int = 0

    def rate(self, per_step: float | None) -> float | None:
        """`per_step` (samples, tokens or FLOPs of one step) per second of the throughput window;
        None without a window or a figure."""
        if per_step is None or not self.throughput_s:
            return None
        return per_step * self.throughput_steps / self.throughput_s


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(
    first_begin: float,
    epoch_begins: list[float],
    ends_by_epoch: list[list[float]],
    epoch_s: list[float],
    faults_by_epoch: list[list[int]] | None = None,
    trained_until: list[float] | None = None,
) -> StepStats:
    """Turns step end times into stats. The first step (compilation) is timed from its dispatch;
    steady-state steps are the gaps between consecutive step ends inside one epoch, so epoch
    boundaries (iterator restarts, epoch-end callbacks, evaluation) are not counted as step time.
    Throughput is timed over `throughput_window` instead, boundaries included, as a clock outside
    sees them. `epoch_begins` are the epochs' starts, `trained_until` when each epoch's training
    work ended (default: its last step's end), `faults_by_epoch` the process's minor page faults
    at each step end, which give the faults per steady step after the first FAULT_WARMUP_STEPS."""
    first_end = ends_by_epoch[0][0]
    gaps = _gaps(ends_by_epoch)
    window_s, window_steps = throughput_window(
        epoch_begins, ends_by_epoch, trained_until or [ends[-1] for ends in ends_by_epoch]
    )
    return StepStats(
        compile_s=first_end - first_begin,
        step_time_s=statistics.median(gaps) if gaps else None,
        step_time_p90_s=percentile(gaps, 90) if gaps else None,
        steady_steps=len(gaps),
        epoch_s=epoch_s,
        minor_faults_per_step=faults_per_step(faults_by_epoch) if faults_by_epoch else None,
        epoch_steps=[len(ends) for ends in ends_by_epoch],
        throughput_s=window_s if window_steps else None,
        throughput_steps=window_steps,
    )


def throughput_window(
    epoch_begins: list[float], ends_by_epoch: list[list[float]], trained_until: list[float]
) -> tuple[float, int]:
    """The seconds and the steps that throughput is taken over: every epoch after the first, whole
    (from its start until its training work ended, `trained_until`: the data's restart at an
    epoch's start counts, as it does on the wall clock); with one epoch, its steps after the
    compiling one. The first epoch is left out because its first steps after compiling still warm
    up (on 8 CPU devices here the dozen steps after compiling take 2 to 6 times a steady step)."""
    if len(ends_by_epoch) > 1:
        later = list(zip(epoch_begins[1:], trained_until[1:], ends_by_epoch[1:], strict=True))
        return sum(until - begin for begin, until, _ in later), sum(len(ends) for _, _, ends in later)
    ends = ends_by_epoch[0]
    return trained_until[0] - ends[0], len(ends) - 1


def faults_per_step(faults_by_epoch: list[list[int]]) -> float | None:
    """Median minor page faults of the steady steps (gaps between step ends inside an epoch) after
    the first FAULT_WARMUP_STEPS of them, or after the first half where there are fewer than twice
    as many; None with no steady step. The median, as for step times: a step that grows the heap
    (glibc then faults in the new pages once) is rare, a step that maps its buffers afresh is every
    step."""
    gaps = _gaps(faults_by_epoch)
    if not gaps:
        return None
    return statistics.median(gaps[min(FAULT_WARMUP_STEPS, len(gaps) // 2) :])


def _gaps(values_by_epoch: list[list]) -> list:
    """Differences of consecutive values inside each epoch, epoch after epoch."""
    return [
        later - earlier
        for values in values_by_epoch
        for earlier, later in zip(values, values[1:], strict=False)
    ]
