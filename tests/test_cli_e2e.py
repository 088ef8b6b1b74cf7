"""The CLI end to end, as a user runs it: `python -m meshrun train ...` in a fresh subprocess (and
the choices a recipe or a model brings, by the same CLI in this process)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST, cli_here, read_metrics, run_meshrun, train_here

pytestmark = pytest.mark.e2e

REQUIRED = {
    "status",
    "error",
    "mesh.shape",
    "mesh.axis_names",
    "mesh.batch_axis",
    "devices.platform",
    "devices.count",
    "devices.processes",
    "model.name",
    "model.params",
    "train.global_batch_size",
    "train.steps_per_epoch",
    "timing.startup_s",
    "timing.compile_s",
    "timing.step_time_s",
    "timing.step_time_p90_s",
    "timing.samples_per_s",
    "timing.epoch_s",
    "timing.eval_s",
    "timing.wall_s",
    "timing.teardown_s",
    "timing.tokens_per_s",
    "history.loss",
    "eval.loss",
    "sharding",
    "flops.per_step",
    "flops.per_s",
    "flops.mfu",
    "flops.analytic_per_step",
    "memory.peak_bytes_per_device",
    "memory.live_peak_bytes_per_device",
    "memory.params_bytes_per_device",
    "memory.optimizer_bytes_per_device",
}


def flat_keys(tree, prefix=""):
    keys = set()
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        keys.add(dotted)
        if isinstance(value, dict) and key != "sharding":
            keys |= flat_keys(value, dotted + ".")
    return keys


# The README's main job, `meshrun train mesh=2x4 layout=dense_model` in a fresh process, run once a
# module: its run dir and output serve the metrics.json test and the README's losses test.
_readme_run: dict = {}


def readme_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The README's main job's outcome and run dir, run by the first test that asks."""
    if not _readme_run:
        root = tmp_path_factory.mktemp("readme-run")
        run_dir = root / "run"
        _readme_run["run"] = (
            run_meshrun(["train", "mesh=2x4", "layout=dense_model", f"hydra.run.dir={run_dir}"], root),
            run_dir,
        )
    return _readme_run["run"]


def test_train_writes_a_complete_metrics_json(tmp_path_factory):
    done, run_dir = readme_run(tmp_path_factory)
    assert done.returncode == 0, done.stderr
    metrics = read_metrics(run_dir)
    assert REQUIRED <= flat_keys(metrics), REQUIRED - flat_keys(metrics)
    assert metrics["status"] == "ok" and metrics["error"] is None
    assert metrics["mesh"]["shape"] == [2, 4]
    assert metrics["devices"] == {
        **metrics["devices"],
        "platform": "cpu",
        "count": 8,
        "processes": 1,
        "emulated": True,
    }
    assert metrics["sharding"]["d1/kernel"]["spec"] == [None, "model"]
    assert len(metrics["history"]["loss"]) == 3 == len(metrics["timing"]["epoch_s"])
    assert 0 < metrics["timing"]["startup_s"] < metrics["timing"]["wall_s"]
    assert metrics["timing"]["teardown_s"] < 0.01  # the process ends right after: no session to clear
    assert "emulating 8 CPU devices" in done.stdout + done.stderr
    assert "placed variables" in done.stdout  # the rich report
    assert (run_dir / ".hydra" / "config.yaml").exists()
    # The plan the run was checked against, beside the metrics: the same placement.
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["status"] == "ok" and plan["mesh"]["shape"] == [2, 4]
    planned = {v["path"]: v for v in plan["variables"]}
    assert planned["d1/kernel"]["spec"] == [None, "model"]
    for path, placed in metrics["sharding"].items():
        assert planned[path]["bytes_per_device"] == placed["bytes_per_device"], path
    assert plan["per_device"]["params_bytes"] == metrics["memory"]["params_bytes_per_device"]
    assert metrics["flops"]["per_step"] > 0 and metrics["flops"]["mfu"] is None
    assert (
        sorted(p.name for p in run_dir.iterdir()) == files_a_default_run_writes()
    )  # as `meshrun train --help` says


def files_a_default_run_writes() -> list[str]:
    """The files `meshrun train --help` says a run writes into its run dir without switches."""
    from meshrun.usage import command_help

    holds = command_help("train").split(" holds ", 1)[1].split(";", 1)[0]
    return sorted(name.rstrip("/") for name in re.findall(r"[\w.]+\.(?:json|jsonl|log)\b|\.\w+/", holds))


README = Path(__file__).parents[1] / "README.md"


def readme_losses() -> list[float]:
    """The epoch losses the README's "What a run looks like" shows for its main job."""
    shown = README.read_text().split("## What a run looks like", 1)[1].split("```", 2)[1]
    assert "$ meshrun train mesh=2x4 layout=dense_model\n" in shown
    return [float(line.rsplit("loss ", 1)[1]) for line in shown.splitlines() if line.startswith("epoch ")]


@pytest.mark.smoke
def test_the_readme_quickstart_trains_to_the_losses_the_readme_shows(tmp_path_factory):
    done, run_dir = readme_run(tmp_path_factory)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = readme_losses()
    assert len(shown) == 3
    assert [round(loss, 4) for loss in read_metrics(run_dir)["history"]["loss"]] == pytest.approx(
        shown, abs=1e-4
    )


# Imported only where used (data=tfrecord, tf.data factories; keras' scikit-learn wrappers and
# image plots, which meshrun does not use): 2-3 s of start-up between them.
NOT_FOR_THE_DEFAULT_RUN = ("tensorflow", "sklearn", "matplotlib")
# Runs the meshrun command in this process (as `python -m meshrun` would), then prints which of
# NOT_FOR_THE_DEFAULT_RUN it imported (meshrun imports TensorFlow with stderr muted, so
# -X importtime cannot tell).
RUN_AND_LIST = """
import json, sys
from meshrun import cli
status = cli.run(sys.argv[2:], as_program=False)
imported = [m for m in sys.argv[1].split(",") if sys.modules.get(m) is not None]
print(json.dumps({"status": status, "imported": imported}))
"""


@pytest.mark.parametrize(
    "data, expected", [([], []), (["data=python", "data.factory=tf_factory:dataset"], ["tensorflow"])]
)
def test_only_a_run_that_reads_tf_data_imports_tensorflow(tmp_path, data, expected):
    """The README's main job imports neither TensorFlow nor scikit-learn (nor matplotlib); one whose
    data is a tf.data.Dataset imports TensorFlow (the check can tell)."""
    (tmp_path / "tf_factory.py").write_text(
        "def dataset(split, seed):\n    import numpy as np, tensorflow as tf\n"
        "    return tf.data.Dataset.from_tensor_slices((np.zeros((64, "
        "28, 28, 1), 'float32'), np.zeros((64, 10), 'float32')))\n"
    )
    args = ["train", "mesh=2x4", "layout=dense_model", *FAST, *data, f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST, ",".join(NOT_FOR_THE_DEFAULT_RUN), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"status": 0, "imported": expected}
    assert read_metrics(tmp_path / "run")["status"] == "ok"


def test_importing_meshrun_train_imports_keras_but_not_tensorflow(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, meshrun.train; print(sorted(m for m in sys.argv[1].split(',') "
            "if sys.modules.get(m) is not None), 'keras' in sys.modules)",
            ",".join(NOT_FOR_THE_DEFAULT_RUN),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]", "True"]


def test_config_error_in_a_fresh_process_is_one_line_exit_2_and_leaves_nothing(tmp_path):
    done = run_meshrun(["train", "mesh=2x4", "train.batch_size=15"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "meshrun: error: train.batch_size: got 15, which does not divide by the batch axis 'data' "
        "of size 2; use a multiple of 2, e.g. 14 or 16"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_failure_during_training_writes_status_error(tmp_path, in_tmp, capsys):
    """By the CLI in this process (the run's failure, not the process, is the point)."""
    run_dir = tmp_path / "run"
    # The user's data generator fails in the middle of the first epoch.
    (tmp_path / "failing_data.py").write_text(
        "import numpy as np\n"
        "def make(split, seed):\n"
        "    for i in range(40):\n"
        "        yield np.zeros((28, 28, 1), np.float32), np.zeros((10,), np.float32)\n"
        "    raise RuntimeError('disk went away')\n"
    )
    done = cli_here(
        [
            "train",
            *FAST,
            "data=python",
            "data.factory=failing_data:make",
            "data.num_samples=128",
            "data.eval_samples=32",
            f"hydra.run.dir={run_dir}",
        ],
        capsys,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("meshrun: error: training failed: ")
    assert "Traceback" not in done.stderr
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "error" and metrics["error"]
    assert "Traceback" in (run_dir / "error.log").read_text()


def test_multirun_over_mesh_shapes_in_one_process(tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = run_meshrun(
        ["train", "-m", "mesh=8x1,1x8", "layout=dense_model", *FAST, f"hydra.sweep.dir={sweep_dir}"], tmp_path
    )
    assert done.returncode == 0, done.stderr
    first, second = read_metrics(sweep_dir / "0"), read_metrics(sweep_dir / "1")
    assert first["mesh"]["shape"] == [8, 1] and second["mesh"]["shape"] == [1, 8]
    assert sorted(first["sharding"]) == sorted(second["sharding"])  # no `_1` suffixes in job 2
    assert second["history"]["loss"] == pytest.approx(first["history"]["loss"], abs=1e-5)
    # Job 1 counts from its own start, not from the process's (which would include all of job 0).
    later, earlier = second["timing"], first["timing"]
    assert (
        later["time_to_first_step_s"] < earlier["wall_s"]
    )  # cumulative, it would include all of job 0's wall
    assert 0 < later["startup_s"] < later["time_to_first_step_s"] < later["wall_s"]
    assert (
        earlier["teardown_s"] > 0 and later["teardown_s"] > 0
    )  # jobs sharing a process clear the session, counted in wall_s


@pytest.mark.integration
def test_recipe_runs_the_seeds_model_parallel_example(tmp_path, in_tmp):
    run_dir = tmp_path / "run"
    metrics = train_here(["recipe=seeds_model_parallel", *FAST], run_dir)
    assert metrics["mesh"]["shape"] == [2, 4]
    assert metrics["choices"]["recipe"] == "seeds_model_parallel"


@pytest.mark.integration
def test_picking_a_model_brings_its_layout_data_and_loss(tmp_path, in_tmp, capsys):
    run_dir = tmp_path / "run"
    metrics = train_here(["model=transformer", "mesh=2x4", *FAST], run_dir)
    stdout = capsys.readouterr().out
    assert metrics["choices"]["layout"] == "transformer_tp"
    assert metrics["data"]["family"] == "tokens"
    assert metrics["train"]["loss"] == "next_token_crossentropy"
    assert metrics["sharding"]["block_0/mlp_up/kernel"]["spec"] == [None, "model"]
    assert metrics["timing"]["tokens_per_s"] > metrics["timing"]["samples_per_s"] > 0
    assert "tokens/s" in stdout and "6·N·tokens" in stdout
