"""The arithmetic behind timing.* in metrics.json (no jax needed for the numbers)."""

import pytest

import meshrun
from meshrun.logs.timing import faults_per_step, percentile, process_start_time, summarize


def test_compile_is_the_first_step_and_steady_steps_exclude_epoch_boundaries():
    # epoch 0: first step ends at 1.0 (dispatched at 0.0), then 0.1 s steps; epoch 1 starts after a
    # 5 s pause that must not count as a step.
    ends = [[1.0, 1.1, 1.2, 1.3], [6.3, 6.4, 6.5, 6.6]]
    stats = summarize(0.0, ends, epoch_s=[1.3, 0.3])
    assert stats.compile_s == pytest.approx(1.0)
    assert stats.step_time_s == pytest.approx(0.1)
    assert stats.steady_steps == 6
    assert stats.step_time_p90_s == pytest.approx(0.1)


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([0, 10], 90) == pytest.approx(9.0)


def test_process_start_precedes_the_import_of_meshrun():
    started = process_start_time()
    assert started <= meshrun.IMPORTED_AT + 0.02  # /proc/uptime has 10 ms resolution
    assert meshrun.IMPORTED_AT - started < 600


def test_faults_per_step_is_the_median_of_steady_steps_after_the_warm_up():
    # Two epochs of 60 steps: the first 51 fault their pools in, then one step in ten grows the
    # heap; the faults between the epochs (evaluation, say) fall in no step.
    counts, total = [], 0
    for step in range(120):
        total += 1000 if step <= 50 or step == 60 else (400 if step % 10 == 0 else 3)
        counts.append(total)
    ends = [float(s) for s in range(120)]
    stats = summarize(0.0, [ends[:60], ends[60:]], epoch_s=[60.0, 60.0], faults_by_epoch=[counts[:60], counts[60:]])
    assert stats.minor_faults_per_step == 3
    assert faults_per_step([[0, 9, 14, 19, 24]]) == 5  # a short run: the warm-up is its first half
    assert faults_per_step([[7]]) is None and summarize(0.0, [[1.0]], [1.0]).minor_faults_per_step is None
