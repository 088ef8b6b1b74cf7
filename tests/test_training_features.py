"""Training switches: learning-rate schedules and gradient clipping, mixed precision, the step log
(log.jsonl) and the NaN guard, on 8 CPU devices."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import layout_rules, read_metrics, run_meshrun, train_in_process

from meshrun.errors import ConfigError
from meshrun.schedule import keras_schedule, learning_rate_at
from meshrun.schema import TrainConfig, parse_run_config


def config(mesh="2x4", epochs=2, **train) -> dict:
    return {
        "mesh": {"shape": mesh}, "layout": {"rules": layout_rules("dense_model")}, "model": {"name": "dense_model"},
        "data": {"name": "synthetic", "num_samples": 128, "eval_samples": 32},
        "train": {"epochs": epochs, "verbose": 0, **train},
    }


def log_records(run_dir: Path) -> tuple[list, list]:
    lines = [json.loads(line) for line in (Path(run_dir) / "log.jsonl").read_text().splitlines()]
    return [r for r in lines if "step" in r], [r for r in lines if "epoch_end" in r]


@pytest.mark.parametrize(
    "train",
    [
        TrainConfig(learning_rate=0.01),
        TrainConfig(learning_rate=0.01, lr_schedule="linear", min_learning_rate=0.001),
        TrainConfig(learning_rate=0.01, lr_schedule="cosine", warmup_steps=10, min_learning_rate=0.0005),
        TrainConfig(learning_rate=0.01, lr_schedule="cosine"),
    ],
)
def test_the_logged_learning_rate_is_the_one_keras_trains_with(train):
    schedule = keras_schedule(train, total_steps=100)
    for step in (0, 1, 5, 10, 11, 50, 99, 100, 150):
        keras_rate = schedule if isinstance(schedule, float) else float(schedule(step))
        assert learning_rate_at(train, step, 100) == pytest.approx(keras_rate, rel=1e-5, abs=1e-9), step


@pytest.mark.parametrize(
    "train, key",
    [
        ({"precision": "float8"}, "train.precision"),
        ({"lr_schedule": "step"}, "train.lr_schedule"),
        ({"warmup_steps": 5}, "train.warmup_steps"),
        ({"min_learning_rate": 1.0}, "train.min_learning_rate"),
        ({"clip_norm": 0}, "train.clip_norm"),
    ],
)
def test_bad_training_switches_name_the_key(train, key):
    with pytest.raises(ConfigError) as caught:
        parse_run_config(config(**train))
    assert caught.value.key == key


@pytest.mark.integration
def test_a_cosine_schedule_with_warmup_and_clipping_trains_and_logs_every_step(tmp_path):
    metrics = train_in_process(config(lr_schedule="cosine", warmup_steps=4, min_learning_rate=0.0001, clip_norm=1.0), tmp_path).metrics
    assert metrics["train"]["lr_schedule"] == "cosine" and metrics["train"]["clip_norm"] == 1.0
    steps, epochs = log_records(tmp_path)
    assert [r["step"] for r in steps] == list(range(16)) and [r["epoch"] for r in steps] == [0] * 8 + [1] * 8
    rates = [r["learning_rate"] for r in steps]
    assert rates[0] == 0.0 and rates[4] == pytest.approx(0.001) and rates[:5] == sorted(rates[:5]) and rates[4:] == sorted(rates[4:], reverse=True)
    assert all(math.isfinite(r["loss"]) and r["step_s"] > 0 and r["samples_per_s"] > 0 for r in steps)
    assert [e["loss"] for e in epochs] == pytest.approx(metrics["history"]["loss"])
    assert steps[7]["loss"] == pytest.approx(epochs[0]["loss"])  # the running mean at the end of the epoch


@pytest.mark.integration
def test_mixed_precision_keeps_float32_variables_and_mesh_invariance(tmp_path):
    runs = {mesh: train_in_process(config(mesh=mesh, precision="mixed_bfloat16"), tmp_path / mesh).metrics for mesh in ("8x1", "2x4")}
    for metrics in runs.values():
        assert metrics["train"]["precision"] == "mixed_bfloat16"
        assert {v["dtype"] for v in metrics["sharding"].values() if v["shape"] != [2]} == {"float32"}
    assert runs["8x1"]["history"]["loss"] == pytest.approx(runs["2x4"]["history"]["loss"], abs=2e-2)
    half = train_in_process(config(precision="mixed_float16"), tmp_path / "f16").metrics
    assert all(math.isfinite(loss) for loss in half["history"]["loss"])
    after = train_in_process(config(epochs=1), tmp_path / "after").metrics  # the policy does not leak into later runs
    assert after["train"]["precision"] == "float32"


@pytest.mark.e2e
def test_a_diverging_learning_rate_stops_the_run_at_the_first_bad_step(in_tmp):
    run_dir = in_tmp / "run"
    done = run_meshrun(
        ["train", "mesh=2x4", "train.verbose=0", "data.num_samples=128", "train.epochs=3", "train.optimizer=sgd",
         "train.learning_rate=1e20", "checkpoint.every_steps=1", "checkpoint.keep=2", f"hydra.run.dir={run_dir}"],
        in_tmp,
    )
    steps, _ = log_records(run_dir)
    bad = next(r["step"] for r in steps if not math.isfinite(r["loss"]))
    assert bad > 0 and steps[-1]["step"] == bad, "training went on after the loss turned"
    errors = [line for line in done.stderr.splitlines() if line.startswith("meshrun: error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-2000:]
    epoch, in_epoch = divmod(bad, 8)
    assert f"at step {bad + 1} (epoch {epoch + 1}, step {in_epoch + 1} of 8); training stopped there (train.stop_on_nan)" in errors[0]
    kept = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert kept[-1] == bad and f"the last good checkpoint is {run_dir / 'checkpoints' / str(bad)}" in errors[0]
    assert read_metrics(run_dir)["status"] == "error"


def test_the_default_callbacks_leave_keras_free_to_fetch_step_logs_asynchronously(tmp_path):
    """Keras fetches step logs on worker threads (no wait per step on accelerators) only while
    every callback with a per-step hook says it is async-safe; only step checkpoints need the
    loop's thread."""
    from keras.src.callbacks.callback_list import CallbackList

    from meshrun.callbacks import StepLog, StopOnNaN
    from meshrun.checkpoint import Checkpointing, Progress
    from meshrun.schema import CheckpointConfig

    callbacks = [StepLog(tmp_path / "log.jsonl", TrainConfig(), 16, 0), StopOnNaN(0, 8),
                 Checkpointing(CheckpointConfig(every_epoch=True), tmp_path / "epochs", Progress(), None)]
    assert CallbackList(callbacks)._async_train
    by_steps = Checkpointing(CheckpointConfig(every_steps=2), tmp_path / "steps", Progress(), None)
    assert not CallbackList([*callbacks, by_steps])._async_train
