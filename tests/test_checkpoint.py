"""Checkpoints and resume: a resumed run trains exactly like an uninterrupted one (mid-epoch
included), on any mesh and layout, after a SIGKILL, and in a 2-process job; checkpoints cut short
are never picked; the exported model loads in plain Keras; bad resume settings are one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import (
    FAST,
    cli_here,
    error_line_here,
    layout_rules,
    read_metrics,
    run_meshrun,
    train_in_process,
)
from meshrun import cli
from meshrun.errors import ConfigError
from meshrun.training.checkpoint import ResumePoint, read_progress

SMALL = {
    "data": {"name": "synthetic", "num_samples": 128, "eval_samples": 32},
    "model": {"name": "dense_model"},
}


def config(mesh="2x4", layout="dense_model", epochs=3, **sections) -> dict:
    raw = {
        **SMALL,
        "mesh": {"shape": mesh},
        "layout": {"rules": layout_rules(layout)},
        "train": {"epochs": epochs, "verbose": 0},
    }
    for key, value in sections.items():
        raw[key] = value
    return raw


def exported_weights(run_dir: Path) -> list:
    import keras

    return keras.saving.load_model(run_dir / "model.keras").get_weights()


def assert_same_weights(first, second, tolerance):
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_allclose(a, b, atol=tolerance, rtol=0)


# --- finding checkpoints and bad input, no training ----------------------------------------------


def test_find_never_auto_and_paths(tmp_path):
    from meshrun.training.checkpoint import find

    assert find("never", tmp_path) is None
    assert find("auto", tmp_path / "none-yet") is None
    with pytest.raises(ConfigError, match="which does not exist") as missing:
        find(str(tmp_path / "nowhere"), tmp_path)
    assert missing.value.key == "resume"
    (tmp_path / "7.orbax-checkpoint-tmp-1234").mkdir()  # what a write cut short leaves
    with pytest.raises(ConfigError, match="holds no complete checkpoint"):
        find(str(tmp_path), tmp_path)
    assert find("auto", tmp_path) is None


def test_a_checkpoint_dir_that_cannot_be_written_is_a_config_error(tmp_path):
    from meshrun.training.checkpoint import check_writable

    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="not a writable dir") as caught:
        check_writable(tmp_path / "a-file" / "checkpoints")
    assert caught.value.key == "checkpoint.dir"


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"checkpoint": {"every_steps": 0}}, "checkpoint.every_steps"),
        ({"checkpoint": {"keep": 0}}, "checkpoint.keep"),
        ({"resume": ""}, "resume"),
    ],
)
def test_bad_checkpoint_settings(raw, key):
    from meshrun.config.parse import parse_run_config

    with pytest.raises(ConfigError) as caught:
        parse_run_config({"mesh": {"shape": "2x4"}, "model": {"name": "dense_model"}, **raw})
    assert caught.value.key == key


def test_resume_defaults_to_auto_only_with_a_checkpoint_dir():
    from meshrun.config.parse import parse_run_config

    base = {"mesh": {"shape": "2x4"}, "model": {"name": "dense_model"}}
    assert parse_run_config(base).resume_mode() == "never"
    assert parse_run_config({**base, "checkpoint": {"dir": "/x"}}).resume_mode() == "auto"
    assert (
        parse_run_config({**base, "checkpoint": {"dir": "/x"}, "resume": "never"}).resume_mode(requeued=True)
        == "never"
    )
    assert parse_run_config(base).resume_mode(requeued=True) == "auto"


# --- resuming, in this process (8 devices) -------------------------------------------------------


@pytest.mark.integration
def test_resuming_mid_epoch_trains_exactly_like_the_uninterrupted_run(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    saving = {"every_steps": 3, "keep": 10, "dir": str(checkpoints), "export": True}
    whole = train_in_process(config(checkpoint=saving), tmp_path / "whole").metrics
    assert whole["checkpoint"]["saved_steps"] == [3, 6, 9, 12, 15, 18, 21, 24]
    assert sorted(int(p.name) for p in checkpoints.iterdir()) == [3, 6, 9, 12, 15, 18, 21, 24]
    # Step 12 is half-way through epoch 2 (8 steps an epoch).
    resumed = train_in_process(
        config(checkpoint={"export": True}, resume=str(checkpoints / "12")), tmp_path / "resumed"
    ).metrics
    assert (
        resumed["checkpoint"]["resumed_from"] == str(checkpoints / "12")
        and resumed["checkpoint"]["resumed_at_step"] == 12
    )
    assert resumed["history"]["loss"] == pytest.approx(whole["history"]["loss"], abs=1e-6)
    assert resumed["eval"]["loss"] == pytest.approx(whole["eval"]["loss"], abs=1e-6)
    assert_same_weights(exported_weights(tmp_path / "resumed"), exported_weights(tmp_path / "whole"), 1e-6)
    assert whole["timing"]["checkpoint_s"] > 0
    # Step 24, the last of epoch 3, is saved at the epoch's end: a whole epoch with its logs, so a
    # run given a fourth epoch continues from it (it asked Keras for an epoch of 0 steps).
    last = read_progress(ResumePoint(checkpoints, 24))
    assert (last.epoch, last.step_in_epoch, last.history["loss"]) == (
        3,
        0,
        pytest.approx(whole["history"]["loss"], abs=1e-6),
    )
    more = train_in_process(config(epochs=4, resume=str(checkpoints / "24")), tmp_path / "more").metrics
    assert (
        more["history"]["loss"][:3] == pytest.approx(whole["history"]["loss"], abs=1e-6)
        and len(more["history"]["loss"]) == 4
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    "mesh, layout",
    [
        ("8x1", "dense_model"),
        ("1x8", "dense_model"),
        ("4x2", "dense_model"),
        ("2x4", "replicated"),
        ("1x1", "replicated"),
    ],
)
def test_a_checkpoint_from_2x4_resumes_on_other_meshes_and_layouts(tmp_path_factory, mesh, layout):
    base = tmp_path_factory.getbasetemp() / "from-2x4"
    checkpoints = base / "checkpoints"
    if not (base / "whole" / "model.keras").exists():  # written once, by the first case
        saving = {"every_epoch": True, "keep": 5, "dir": str(checkpoints), "export": True}
        whole = train_in_process(config(checkpoint=saving), base / "whole").metrics
        (base / "whole.json").write_text(json.dumps(whole["history"]))
    history = json.loads((base / "whole.json").read_text())
    run_dir = base / f"{mesh}-{layout}"
    resumed = train_in_process(
        config(mesh=mesh, layout=layout, checkpoint={"export": True}, resume=str(checkpoints / "16")), run_dir
    ).metrics
    assert resumed["mesh"]["shape"] == [int(d) for d in mesh.split("x")]
    assert resumed["history"]["loss"] == pytest.approx(history["loss"], abs=1e-5)
    assert_same_weights(exported_weights(run_dir), exported_weights(base / "whole"), 1e-5)


@pytest.mark.integration
def test_the_exported_model_loads_in_plain_keras_without_meshrun(tmp_path):
    train_in_process(config(epochs=1, checkpoint={"export": True}), tmp_path)
    script = (
        "import keras; m = keras.saving.load_model('model.keras'); "
        "print(m.count_params(), [l.name for l in m.layers][-1])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_NUM", "XLA"))} | {
        "KERAS_BACKEND": "jax"
    }
    done = subprocess.run(
        [sys.executable, "-I", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["158810", "d2"]


@pytest.mark.integration
def test_naming_a_checkpoint_dir_saves_every_epoch_and_a_schedule_that_never_fires_warns(tmp_path, capfd):
    """Through the CLI in this process (what it saves and prints is a fresh process's); the
    seeds' model as config() trains it, so its programs are compiled already."""
    checkpoints = tmp_path / "checkpoints"
    args = ["train", "mesh=2x4", "layout=dense_model", *FAST, f"checkpoint.dir={checkpoints}"]
    done = cli_here([*args, f"hydra.run.dir={tmp_path / 'run'}"], capfd)
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_metrics(tmp_path / "run")["checkpoint"]["saved_steps"] == [8, 16]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["16", "8"]

    never = cli_here(
        [*args, "checkpoint.every_steps=100", "resume=never", f"hydra.run.dir={tmp_path / 'never'}"], capfd
    )
    assert never.returncode == 0, never.stderr[-2000:]
    assert (
        "checkpoint.every_steps=100 is more than the run's 16 training steps, so it never saves; "
        "give at most 16 or checkpoint.every_epoch=true"
    ) in never.stdout  # the log's console lines
    assert read_metrics(tmp_path / "never")["checkpoint"]["saved_steps"] == []


# --- the command line: faults and bad input -------------------------------------------------------

# 32 steps an epoch, 128 in all: the kill comes once the checkpoint of step 60 is complete, with 68
# steps and 13 saves still to run (3 to 4 s on the 2-core machine under load); it takes a 0.05 s poll.
LONG = [
    "mesh=2x4",
    "layout=dense_model",
    "train.verbose=0",
    "data.num_samples=512",
    "data.eval_samples=32",
    "train.epochs=4",
    "checkpoint.every_steps=5",
    "checkpoint.keep=4",
    "checkpoint.export=true",
]


@pytest.mark.e2e
def test_a_killed_run_continues_from_its_last_complete_checkpoint(tmp_path):
    """SIGKILL mid-training, a checkpoint cut short on disk, then the same command again: the
    final weights and losses equal an uninterrupted run's."""
    cli.main(["train", *LONG, f"hydra.run.dir={tmp_path / 'whole'}"])  # the reference, in this process
    assert read_metrics(tmp_path / "whole")["status"] == "ok"
    checkpoints = tmp_path / "checkpoints"
    command = ["train", *LONG, f"checkpoint.dir={checkpoints}"]
    first = subprocess.Popen(
        [sys.executable, "-m", "meshrun", *command, f"hydra.run.dir={tmp_path / 'first'}"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while not any(p.name.isdigit() and int(p.name) >= 60 for p in checkpoints.glob("*")):
        assert first.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    complete = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    # A checkpoint cut short at a later step: what a kill during a write leaves.
    partial = checkpoints / f"{complete + 5}.orbax-checkpoint-tmp"
    if not partial.exists():  # the kill may have cut a real write short already
        shutil.copytree(checkpoints / str(complete), partial)
        shutil.rmtree(partial / "state")
    cli.main(
        [*command, f"hydra.run.dir={tmp_path / 'second'}"]
    )  # the same command again (in this process: it is not about the process)
    metrics = read_metrics(tmp_path / "second")
    assert metrics["status"] == "ok" and metrics["checkpoint"]["resumed_from"] == str(
        checkpoints / str(complete)
    )
    assert metrics["history"]["loss"] == pytest.approx(
        read_metrics(tmp_path / "whole")["history"]["loss"], abs=1e-6
    )
    assert_same_weights(exported_weights(tmp_path / "second"), exported_weights(tmp_path / "whole"), 1e-6)


@pytest.mark.integration
def test_bad_resume_and_checkpoint_dirs_are_one_line_errors(in_tmp, capfd):
    """Through the CLI in this process (the errors are the same as a fresh process's)."""
    source = in_tmp.parent / f"{in_tmp.name}-source"
    cli.main(
        [
            "train",
            "mesh=2x4",
            "train.verbose=0",
            "data.num_samples=128",
            "train.epochs=1",
            "checkpoint.every_epoch=true",
            f"checkpoint.dir={source}",
            f"hydra.run.dir={source}-run",
        ]
    )
    assert read_metrics(f"{source}-run")["status"] == "ok"
    capfd.readouterr()
    (in_tmp.parent / f"{in_tmp.name}-file").write_text("")
    not_a_checkpoint = in_tmp.parent / f"{in_tmp.name}-other" / "3"
    not_a_checkpoint.mkdir(parents=True)
    cases = {
        f"resume={in_tmp / 'nowhere'}": "resume: got '{}', which does not exist".format(in_tmp / "nowhere"),
        f"resume={not_a_checkpoint.parent}": "which holds no complete checkpoint",
        f"resume={source} model.hidden=100 train.epochs=2": "d1/kernel is 784x200 there but 784x100 here; it "
        "was written by model=dense_model with other options (model.hidden=200 there, 100 here)",
        # another model: named before the progress, which would read as 'at the end of training'
        f"checkpoint.dir={source} model=cnn train.epochs=1": f"resume: checkpoint {source}/8 was written by "
        "model=dense_model, and this run builds model=cnn; resume it with model=dense_model",
        f"resume={source}/8 train.epochs=1": "is at the end of training (epoch 1 of 1)",
        f"checkpoint.every_epoch=true checkpoint.dir={in_tmp.parent / (in_tmp.name + '-file')}/checkpoints": (
            "checkpoint.dir: got "
        ),
    }
    for overrides, words in cases.items():
        line = error_line_here(["train", "mesh=2x4", "data.num_samples=128", *overrides.split()], capfd)
        assert words in line, (overrides, line)
        assert list(in_tmp.iterdir()) == [], f"{overrides} left files behind"


@pytest.mark.e2e
def test_a_two_process_job_checkpoints_and_resumes_on_another_mesh(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    common = [
        "distributed.local_processes=2",
        "layout=dense_model",
        "train.verbose=0",
        "data.num_samples=128",
        "data.eval_samples=32",
        f"checkpoint.dir={checkpoints}",
        "checkpoint.every_epoch=true",
    ]
    first = run_meshrun(
        ["train", *common, "mesh=2x4", "train.epochs=2", f"hydra.run.dir={tmp_path / 'first'}"], tmp_path
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert sorted(int(p.name) for p in checkpoints.iterdir()) == [8, 16]
    second = run_meshrun(
        ["train", *common, "mesh=1x8", "train.epochs=3", f"hydra.run.dir={tmp_path / 'second'}"], tmp_path
    )
    assert second.returncode == 0, second.stderr[-2000:]
    metrics = read_metrics(tmp_path / "second")
    assert (
        metrics["checkpoint"]["resumed_from"] == str(checkpoints / "16")
        and metrics["devices"]["processes"] == 2
    )
    # Only meshrun's lines carry its label on the console; jax's and Orbax's INFO lines (and the
    # warnings Orbax gives about meshrun's read-only look for checkpoints) go to train.log only.
    logged = [line for line in second.stdout.splitlines() if re.match(r"\[\d\d:\d\d:\d\d\]\[", line)]
    assert any("resumed from checkpoint" in line for line in logged)
    assert all("][meshrun] " in line for line in logged), logged
    assert (
        "Given directory is read only" not in second.stdout and "JAX distributed service" not in second.stdout
    )
    train_log = (tmp_path / "second" / "train.log").read_text()
    assert "][absl] Given directory is read only=" in train_log
    assert "][jax._src.distributed] Connecting to JAX distributed service" in train_log
    whole = train_in_process(config(epochs=3)).metrics
    assert metrics["history"]["loss"] == pytest.approx(whole["history"]["loss"], abs=1e-5)
