"""The arithmetic behind timing.* in metrics.json (no jax needed for the numbers)."""

import pytest

import meshrun
from meshrun.logs.timing import percentile, process_start_time, summarize


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
