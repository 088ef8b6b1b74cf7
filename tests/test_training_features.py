"""Training switches: learning-rate schedules and gradient clipping, mixed precision, the step log
(log.jsonl) and the NaN guard, on 8 CPU devices."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import (
    FAST,
    layout_rules,
    read_metrics,
    train_in_process,
)
from meshrun import cli
from meshrun.config.parse import parse_run_config
from meshrun.config.schema import TrainConfig
from meshrun.errors import ConfigError
from meshrun.training.schedule import keras_schedule, learning_rate_at


def config(mesh="2x4", epochs=2, **train) -> dict:
    return {
        "mesh": {"shape": mesh},
        "layout": {"rules": layout_rules("dense_model")},
        "model": {"name": "dense_model"},
        "data": {"name": "synthetic", "num_samples": 128, "eval_samples": 32},
        "train": {"epochs": epochs, "verbose": 0, **train},
    }


def log_records(run_dir: Path) -> tuple[list, list]:
    lines = [json.loads(line) for line in (Path(run_dir) / "log.jsonl").read_text().splitlines()]
    return [r for r in lines if "epoch_end" not in r], [r for r in lines if "epoch_end" in r]


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
    metrics = train_in_process(
        config(lr_schedule="cosine", warmup_steps=4, min_learning_rate=0.0001, clip_norm=1.0), tmp_path
    ).metrics
    assert metrics["train"]["lr_schedule"] == "cosine" and metrics["train"]["clip_norm"] == 1.0
    steps, epochs = log_records(tmp_path)
    assert [r["step"] for r in steps] == list(range(1, 17)) and [r["epoch"] for r in steps] == [1] * 8 + [
        2
    ] * 8
    assert [(e["epoch_end"], e["step"]) for e in epochs] == [(1, 8), (2, 16)]
    rates = [r["learning_rate"] for r in steps]
    assert (
        rates[0] == 0.0
        and rates[4] == pytest.approx(0.001)
        and rates[:5] == sorted(rates[:5])
        and rates[4:] == sorted(rates[4:], reverse=True)
    )
    assert all(math.isfinite(r["loss"]) and r["step_s"] > 0 and r["samples_per_s"] > 0 for r in steps)
    assert [e["loss"] for e in epochs] == pytest.approx(metrics["history"]["loss"])
    assert steps[7]["loss"] == pytest.approx(epochs[0]["loss"])  # the running mean at the end of the epoch


@pytest.mark.integration
def test_mixed_precision_keeps_float32_variables_and_mesh_invariance(tmp_path):
    runs = {
        mesh: train_in_process(config(mesh=mesh, precision="mixed_bfloat16"), tmp_path / mesh).metrics
        for mesh in ("8x1", "2x4")
    }
    for metrics in runs.values():
        assert metrics["train"]["precision"] == "mixed_bfloat16"
        assert {v["dtype"] for v in metrics["sharding"].values() if v["shape"] != [2]} == {"float32"}
    assert runs["8x1"]["history"]["loss"] == pytest.approx(runs["2x4"]["history"]["loss"], abs=2e-2)
    half = train_in_process(config(precision="mixed_float16"), tmp_path / "f16").metrics
    assert all(math.isfinite(loss) for loss in half["history"]["loss"])
    after = train_in_process(
        config(epochs=1), tmp_path / "after"
    ).metrics  # the policy does not leak into later runs
    assert after["train"]["precision"] == "float32"


@pytest.mark.integration
def test_a_diverging_learning_rate_stops_the_run_at_the_first_bad_step(in_tmp, capsys):
    """The real CLI in this process (tests/test_cli_e2e.py keeps a training failure's exit status 1
    in a fresh process)."""
    run_dir = in_tmp / "run"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(
            [
                "train",
                "mesh=2x4",
                "train.verbose=0",
                "data.num_samples=128",
                "train.epochs=3",
                "train.optimizer=sgd",
                "train.learning_rate=1e20",
                "checkpoint.every_steps=1",
                "checkpoint.keep=2",
                f"hydra.run.dir={run_dir}",
            ]
        )
    stderr = capsys.readouterr().err
    steps, _ = log_records(run_dir)
    bad = next(r["step"] for r in steps if not math.isfinite(r["loss"]))
    assert bad > 1 and steps[-1]["step"] == bad, "training went on after the loss turned"
    errors = [line for line in stderr.splitlines() if line.startswith("meshrun: error:")]
    assert exit_info.value.code == 1 and len(errors) == 1, stderr[-2000:]
    epoch, in_epoch = divmod(bad - 1, 8)
    assert (
        f"at step {bad} (epoch {epoch + 1}, step {in_epoch + 1} "
        "of 8); training stopped there (train.stop_on_nan)" in errors[0]
    )
    kept = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert (
        kept[-1] == bad - 1
        and f"the last good checkpoint is {run_dir / 'checkpoints' / str(bad - 1)}" in errors[0]
    )
    assert read_metrics(run_dir)["status"] == "error"


def test_the_default_callbacks_leave_keras_free_to_fetch_step_logs_asynchronously(tmp_path):
    """Keras fetches step logs on worker threads (no wait per step on accelerators) only while
    every callback with a per-step hook says it is async-safe; only step checkpoints need the
    loop's thread."""
    from keras.src.callbacks.callback_list import CallbackList

    from meshrun.config.schema import CheckpointConfig
    from meshrun.logs.progress import EpochProgress
    from meshrun.logs.sinks import open_sinks
    from meshrun.training.callbacks import EarlyStopping, GracefulStop, StepProfiler, StopOnNaN
    from meshrun.training.checkpoint import Progress
    from meshrun.training.checkpoint_callback import Checkpointing
    from meshrun.training.steplog import StepLog

    budget = GracefulStop(first_step=0, deadline=0.0)
    callbacks = [
        StepLog(lambda: open_sinks(tmp_path, {"tensorboard", "csv"}), TrainConfig(), 16, 0),
        StopOnNaN(0, 8),
        budget,
        EarlyStopping(monitor="loss"),
        StepProfiler(2, 3, tmp_path / "profile", 0),
        EpochProgress("bar", 2, 16),
        Checkpointing(CheckpointConfig(every_epoch=True), tmp_path / "epochs", Progress(), None, budget),
    ]
    assert CallbackList(callbacks)._async_train
    by_steps = Checkpointing(CheckpointConfig(every_steps=2), tmp_path / "steps", Progress(), None)
    assert not CallbackList([*callbacks, by_steps])._async_train


# --- gradient accumulation, evaluation, early stopping, the time budget -------------------------


def no_dropout(raw: dict) -> dict:
    return {**raw, "model": {"name": "dense_model", "dropout": 0.0}}


@pytest.mark.integration
def test_accumulating_two_half_batches_trains_exactly_like_the_whole_batch(tmp_path):
    whole = train_in_process(no_dropout(config(batch_size=16)), tmp_path / "whole").metrics
    halves = train_in_process(
        no_dropout(config(batch_size=8, grad_accum_steps=2)), tmp_path / "halves"
    ).metrics
    assert halves["train"]["samples_per_update"] == 16 and halves["train"]["steps_per_epoch"] == 16
    assert halves["train"]["updates"] == whole["train"]["updates"] == 16
    assert halves["history"]["loss"] == pytest.approx(whole["history"]["loss"], abs=1e-6)
    assert halves["eval"]["loss"] == pytest.approx(whole["eval"]["loss"], abs=1e-6)


@pytest.mark.integration
def test_eval_every_adds_validation_metrics_and_the_lm_reports_perplexity(tmp_path):
    raw = {
        "mesh": {"shape": "2x4"},
        "layout": {"rules": layout_rules("transformer_tp")},
        "model": {"name": "transformer"},
        "data": {"name": "synthetic", "num_samples": 64, "eval_samples": 32},
        "train": {"epochs": 3, "verbose": 0, "eval_every": 2},
    }
    metrics = train_in_process(raw, tmp_path).metrics
    assert (
        len(metrics["history"]["val_loss"]) == 1 and len(metrics["history"]["val_accuracy"]) == 1
    )  # after epoch 2 only
    assert set(metrics["eval"]) == {"loss", "accuracy", "perplexity"}
    assert metrics["eval"]["perplexity"] == pytest.approx(math.exp(metrics["eval"]["loss"]), rel=1e-6)
    _, epochs = log_records(tmp_path)
    assert ["val_loss" in e for e in epochs] == [False, True, False]


@pytest.mark.integration
def test_early_stopping_stops_after_patience_and_saves_the_stop(tmp_path):
    raw = config(epochs=5, early_stopping={"monitor": "loss", "patience": 1, "min_delta": 10.0})
    metrics = train_in_process({**raw, "checkpoint": {"every_steps": 5}}, tmp_path).metrics
    assert len(metrics["history"]["loss"]) == 2  # epoch 1 improves on nothing, epoch 2 does not improve by 10
    assert metrics["train"]["stopped"] == {
        "reason": "early_stopping",
        "epoch": 2,
        "checkpoint": str(tmp_path / "checkpoints" / "16"),
    }
    assert metrics["checkpoint"]["saved_steps"] == [5, 10, 15, 16]


@pytest.mark.integration
def test_the_time_budget_stops_mid_epoch_with_a_checkpoint_that_resumes_exactly(tmp_path):
    """A budget of 1 ms is spent before the first step begins, so training stops after that step
    (mid-epoch 1) and saves it; resuming finishes like an uninterrupted run."""
    whole = train_in_process(config(epochs=2), tmp_path / "whole").metrics
    stopped = train_in_process(config(epochs=2, max_time=0.001), tmp_path / "stopped").metrics
    checkpoints = tmp_path / "stopped" / "checkpoints"
    assert stopped["status"] == "ok" and stopped["train"]["stopped"] == {
        "reason": "max_time",
        "step": 1,
        "checkpoint": str(checkpoints / "1"),
    }
    assert stopped["checkpoint"]["saved_steps"] == [1] and "loss" in stopped["eval"]
    resumed = train_in_process({**config(epochs=2), "resume": str(checkpoints)}, tmp_path / "resumed").metrics
    assert resumed["checkpoint"]["resumed_at_step"] == 1 and resumed["train"]["stopped"] is None
    assert resumed["history"]["loss"] == pytest.approx(whole["history"]["loss"], abs=1e-6)
    assert resumed["eval"]["loss"] == pytest.approx(whole["eval"]["loss"], abs=1e-6)


# --- logging sinks, the profiler trace, progress -------------------------------------------------


@pytest.mark.integration
def test_tensorboard_events_and_csv_files_hold_every_step_and_epoch(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    raw = {**config(eval_every=1), "logging": {"tensorboard": True, "csv": True}}
    metrics = train_in_process(raw, tmp_path).metrics
    assert metrics["logs"] == {
        "jsonl": str(tmp_path / "log.jsonl"),
        "tensorboard": str(tmp_path / "tensorboard"),
        "csv": str(tmp_path / "steps.csv"),
        "epochs_csv": str(tmp_path / "epochs.csv"),
    }
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {
        "train/loss",
        "train/learning_rate",
        "train/samples_per_s",
        "epoch/loss",
        "epoch/val_loss",
    } <= set(tags)
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 17))
    assert [e.value for e in events.Scalars("epoch/loss")] == pytest.approx(metrics["history"]["loss"])
    assert [e.value for e in events.Scalars("epoch/val_loss")] == pytest.approx(
        metrics["history"]["val_loss"]
    )
    steps, epochs = log_records(tmp_path)
    rows = (tmp_path / "steps.csv").read_text().splitlines()
    assert rows[0].split(",") == list(steps[0]) and len(rows) == 17
    assert float(rows[5].split(",")[2]) == pytest.approx(steps[4]["loss"])
    epoch_rows = (tmp_path / "epochs.csv").read_text().splitlines()
    assert epoch_rows[0] == "epoch_end,step,epoch_steps,epoch_s,loss,val_loss" and len(epoch_rows) == 3


@pytest.mark.integration
def test_the_profiler_traces_the_asked_steps_into_the_run_dir(tmp_path):
    metrics = train_in_process({**config(), "profile": {"steps": [3, 5]}}, tmp_path).metrics
    profile = metrics["profile"]
    assert profile["dir"] == str(tmp_path / "profile") and profile["traced"] == [3, 5]
    names = [Path(f).name for f in profile["files"]]
    assert any(n.endswith(".xplane.pb") for n in names) and "perfetto_trace.json.gz" in names
    assert all(
        Path(f).stat().st_size > 0 and Path(f).is_relative_to(tmp_path / "profile" / "plugins" / "profile")
        for f in profile["files"]
    )


def test_step_hooks_run_out_of_order_still_count_every_step_of_the_epoch(capsys):
    from meshrun.logs.progress import EpochProgress

    progress = EpochProgress("lines", epochs=1, batch_size=8)
    progress.set_params({"steps": 8})
    progress.on_epoch_begin(0)
    for batch in (0, 1, 2, 3, 4, 5, 7, 6):  # as Keras' worker threads may run them (async-safe callbacks)
        progress.on_train_batch_end(batch, {"loss": 1.0})
    progress.on_epoch_end(0, {"loss": 1.0})
    line = capsys.readouterr().out.strip()
    assert line.startswith("epoch 1/1: loss 1.0000") and "stopped" not in line, line


def test_the_progress_bar_shows_step_time_and_throughput():
    import io

    import keras
    import numpy as np
    from rich.console import Console

    from meshrun.logs.progress import EpochProgress

    screen = io.StringIO()
    bar = EpochProgress(
        "bar", epochs=2, batch_size=8, console=Console(file=screen, force_terminal=True, width=160)
    )
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, epochs=2, verbose=0, callbacks=[bar])
    text = screen.getvalue()
    assert "epoch 1/2" in text and "epoch 2/2" in text and "8/8" in text
    assert "ms/step" in text and "samples/s" in text and "loss " in text


@pytest.mark.integration
def test_progress_is_a_line_per_epoch_off_a_terminal_and_nothing_when_quiet(in_tmp, capsys):
    """The real CLI in this process, its stdout pytest's capture: not a terminal."""
    cli.main(
        [
            "train",
            "mesh=2x4",
            "data.num_samples=128",
            "data.eval_samples=32",
            "train.epochs=2",
            "train.verbose=1",
            "train.max_time=1h",
            f"hydra.run.dir={in_tmp / 'shown'}",
        ]
    )
    shown = capsys.readouterr()
    assert read_metrics(in_tmp / "shown")["status"] == "ok", shown.err[-2000:]
    lines = [line for line in shown.out.splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"] and "samples/s" in lines[1], (
        shown.err[-2000:]
    )
    cli.main(["train", "mesh=2x4", *FAST, f"hydra.run.dir={in_tmp / 'quiet'}"])
    quiet = capsys.readouterr()
    assert read_metrics(in_tmp / "quiet")["status"] == "ok" and not any(
        line.startswith("epoch ") for line in quiet.out.splitlines()
    )
    assert "meshrun: dense_model on mesh 2x4" in quiet.out  # the summary still shows


# --- bad switches --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"train": {"grad_accum_steps": 0}}, "train.grad_accum_steps"),
        ({"train": {"eval_every": 0}}, "train.eval_every"),
        ({"train": {"max_time": "soon"}}, "train.max_time"),
        ({"train": {"max_time": -5}}, "train.max_time"),
        ({"train": {"early_stopping": {"mode": "down"}}}, "train.early_stopping.mode"),
        ({"train": {"early_stopping": {"patience": -1}}}, "train.early_stopping.patience"),
        ({"train": {"early_stopping": {"monitor": "val_loss"}}}, "train.early_stopping.monitor"),
        ({"train": {"early_stopping": {"monitr": "loss"}}}, "train.early_stopping.monitr"),
        ({"profile": {"steps": [5, 2]}}, "profile.steps"),
        ({"profile": {"steps": [1, 2, 3]}}, "profile.steps"),
        ({"logging": {"tensorbord": True}}, "logging.tensorbord"),
    ],
)
def test_bad_run_switches_name_the_key(raw, key):
    base = config()
    with pytest.raises(ConfigError) as caught:
        parse_run_config({**base, **raw, "train": {**base["train"], **raw.get("train", {})}})
    assert caught.value.key == key


@pytest.mark.parametrize(
    "text, seconds",
    [
        (90, 90.0),
        ("90s", 90.0),
        ("90m", 5400.0),
        ("1h30m", 5400.0),
        ("2h", 7200.0),
        ("1:30:00", 5400.0),
        ("0:45", 45.0),
    ],
)
def test_durations_read_as_seconds(text, seconds):
    assert parse_run_config({**config(), "train": {"max_time": text}}).train.max_time == seconds


@pytest.mark.integration
@pytest.mark.parametrize(
    "raw, key, words",
    [
        ({"grad_accum_steps": 17}, "train.grad_accum_steps", "more than the run's 16 training steps"),
        ({"early_stopping": {"monitor": "accuracy"}}, "train.early_stopping.monitor", "valid: loss"),
    ],
)
def test_switches_that_need_the_run_are_checked_before_training(tmp_path, raw, key, words):
    with pytest.raises(ConfigError) as caught:
        train_in_process(config(**raw), tmp_path)
    assert caught.value.key == key and words in str(caught.value)
    assert not (tmp_path / "log.jsonl").exists()


@pytest.mark.integration
def test_a_profile_past_the_last_step_is_one_line_and_leaves_nothing(in_tmp, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "mesh=2x4", *FAST, "profile.steps=[10,40]", "hydra.run.dir=run"])
    stderr = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in stderr
    assert stderr.strip().splitlines() == [
        "meshrun: error: profile.steps: got [10, 40]; the run "
        "has 16 training steps: valid 1 <= first <= last <= 16"
    ]
    assert list(in_tmp.iterdir()) == []
