"""A run passes through its phases once: prepare (every check, the model built by shapes only), then
execute (the one real build), then collect. Config errors that need the model or the data are found
in prepare, so the run's model is never built for them; a run that trains builds its model exactly
twice (once abstractly for the plan, once for real) through the CLI, in-process, on 8 CPU devices."""

import sys
import textwrap

import numpy as np
import pytest

from meshrun import cli

pytestmark = pytest.mark.integration

MODULE = "meshrun_test_run_phases"  # unique: this test process imports it once, from the working dir
SOURCE = """
import keras

# "abstract" (no distribution in force: the plan's build) or "real" (under the run's distribution)
BUILDS = []


def mlp():
    BUILDS.append("real" if keras.distribution.distribution() is not None else "abstract")
    inputs = keras.Input((16,), name="features")
    x = keras.layers.Dense(32, activation="relu", name="dense_1")(inputs)
    return keras.Model(inputs, keras.layers.Dense(4, activation="softmax", name="dense_2")(x))
"""
SMALL = ["train.verbose=0", "train.epochs=1", "mesh=2x4"]
SYNTHETIC = ["data.num_samples=64", "data.eval_samples=32"]


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """The working dir holds the user's module; yields its list of builds, emptied for the test."""
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = sys.modules.get(MODULE) or importlib.import_module(MODULE)
    module.BUILDS.clear()
    return module.BUILDS


def rejected(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "model=python", f"model.factory={MODULE}:mlp", *SMALL, *args])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def test_a_run_builds_its_model_once_by_shapes_and_once_for_real(builds, tmp_path):
    cli.main(
        [
            "train",
            "model=python",
            f"model.factory={MODULE}:mlp",
            *SMALL,
            *SYNTHETIC,
            "train.loss=sparse_categorical_crossentropy",
            f"hydra.run.dir={tmp_path / 'run'}",
        ]
    )
    assert builds == ["abstract", "real"]
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_data_that_does_not_fit_the_model_is_found_before_the_model_is_built(builds, tmp_path, capsys):
    np.savez(tmp_path / "wide.npz", x=np.zeros((64, 20), np.float32), y=np.zeros((64,), np.int64))
    line = rejected(
        ["data=arrays", f"data.path={tmp_path / 'wide.npz'}", "train.loss=sparse_categorical_crossentropy"],
        capsys,
    )
    assert "features of shape (20) do not fit the model's input of shape (16)" in line
    assert builds == ["abstract"]


def test_a_metric_keras_does_not_know_is_found_before_the_model_is_built(builds, capsys):
    line = rejected(
        [*SYNTHETIC, "train.loss=sparse_categorical_crossentropy", "train.metrics=[acuracy]"], capsys
    )
    assert line.startswith("meshrun: error: train.metrics: got 'acuracy', which is not a Keras metric")
    assert builds == ["abstract"]


def test_an_early_stopping_monitor_the_run_does_not_log_is_found_before_the_model_is_built(builds, capsys):
    line = rejected(
        [*SYNTHETIC, "train.loss=sparse_categorical_crossentropy", "train.early_stopping.monitor=auc"], capsys
    )
    assert (
        line == "meshrun: error: train.early_stopping.monitor: got 'auc', "
        "which this run does not log; valid: loss or accuracy"
    )
    assert builds == ["abstract"]


def test_a_run_without_a_loss_is_found_before_the_model_is_built(builds, capsys):
    line = rejected(SYNTHETIC, capsys)
    assert line.startswith("meshrun: error: train.loss: is required:")
    assert builds == ["abstract"]
