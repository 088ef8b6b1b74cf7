"""The arithmetic behind timing.* in metrics.json (no jax needed for the numbers)."""

import pytest

import meshrun
from meshrun.logs.timing import faults_per_step, percentile, process_start_time, summarize


def test_compile_is_the_first_step_and_steady_steps_exclude_epoch_boundaries():
    # epoch 0: first step ends at 1.0 (dispatched at 0.0), then 0.1 s steps; epoch 1 starts after a
    # 5 s pause that must not count as a step.
    ends = [[1.0, 1.1, 1.2, 1.3], [6.3, 6.4, 6.5, 6.6]]
    stats = summarize(0.0, [0.0, 6.0], ends, epoch_s=[1.3, 0.7])
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
    stats = summarize(
        0.0,
        [0.0, 59.5],
        [ends[:60], ends[60:]],
        epoch_s=[60.0, 60.0],
        faults_by_epoch=[counts[:60], counts[60:]],
    )
    assert stats.minor_faults_per_step == 3
    assert faults_per_step([[0, 9, 14, 19, 24]]) == 5  # a short run: the warm-up is its first half
    assert (
        faults_per_step([[7]]) is None and summarize(0.0, [0.0], [[1.0]], [1.0]).minor_faults_per_step is None
    )


def test_throughput_is_timed_over_the_epochs_after_the_first_with_their_starts_not_over_the_median_step():
    # Epoch 0 compiles (1 s) and warms up (0.5 s steps); epochs 1 and 2 start with a 0.4 s restart of
    # the data, then 0.1 s steps, one of them 0.5 s. The median step (0.1 s) says 10 steps/s; the
    # wall clock of the epochs after the first says 8 steps in 1.1 + 0.7 s.
    ends = [[1.0, 1.5, 2.0, 2.1], [5.4, 5.5, 6.0, 6.1], [9.4, 9.5, 9.6, 9.7]]
    stats = summarize(0.0, [0.0, 5.0, 9.0], ends, epoch_s=[2.2, 1.2, 0.8])
    assert stats.step_time_s == pytest.approx(0.1)
    assert stats.throughput_steps == 8 and stats.throughput_s == pytest.approx(1.1 + 0.7)
    assert stats.rate(16) == pytest.approx(16 * 8 / 1.8) and stats.rate(None) is None
    assert stats.epoch_steps == [4, 4, 4]
    one_epoch = summarize(0.0, [0.0], ends[:1], epoch_s=[2.2])  # its steps after the compiling one
    assert one_epoch.throughput_steps == 3 and one_epoch.throughput_s == pytest.approx(1.1)
    # Reading the epoch's metrics at its end is training work too (evaluation is not: the timer then
    # passes the last step's end).
    read = summarize(0.0, [0.0, 5.0, 9.0], ends, epoch_s=[2.2, 1.2, 0.8], trained_until=[2.1, 6.2, 9.8])
    assert read.throughput_steps == 8 and read.throughput_s == pytest.approx(1.2 + 0.8)


def test_a_single_step_times_no_step_and_no_throughput_instead_of_the_compilation():
    stats = summarize(0.0, [0.0], [[0.27]], epoch_s=[0.3])
    assert stats.compile_s == pytest.approx(0.27)
    assert stats.step_time_s is None and stats.step_time_p90_s is None and stats.steady_steps == 0
    assert stats.throughput_s is None and stats.rate(16) is None and stats.epoch_steps == [1]
