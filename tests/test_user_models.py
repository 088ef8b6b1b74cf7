"""model=python: the user's own Keras models from a module in the working dir, through the CLI on 8
emulated CPU devices: functional and subclassed models train, their placement equals the plan, their
losses do not depend on the mesh, a compiled model brings its loss and metrics, and every bad
factory is one line with exit 2."""

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import read_metrics, train_here
from meshrun import cli

pytestmark = pytest.mark.integration

MODULE = "meshrun_test_user_models"  # unique: this test process imports it once, from the working dir
SOURCE = '''
import keras


def functional(hidden=32, classes=4):
    inputs = keras.Input((16,), name="features")
    x = keras.layers.Dense(hidden, activation="relu", name="dense_1")(inputs)
    x = keras.layers.Dropout(0.2, name="dropout")(x)
    return keras.Model(inputs, keras.layers.Dense(classes, activation="softmax", name="dense_2")(x))


class Tower(keras.Model):
    """Unnamed layers, a dropout (its seed generator is a variable) and no build(): built on its first
    call."""

    def __init__(self, hidden, classes):
        super().__init__()
        self.up = keras.layers.Dense(hidden, activation="relu")
        self.drop = keras.layers.Dropout(0.2)
        self.out = keras.layers.Dense(classes, activation="softmax")

    def call(self, x, training=None):
        return self.out(self.drop(self.up(x), training=training))


def subclassed(hidden=32, classes=4):
    return Tower(hidden, classes)


def compiled(hidden=32):
    model = functional(hidden)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                  metrics=[keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")])
    return model


def empty():
    class Nothing(keras.Model):
        def call(self, x):
            return x * 2.0
    return Nothing()


def not_a_model():
    return [1, 2]


def broken(hidden=32):
    raise ValueError("hidden must be even\\nsecond line")


def samples(split, seed):
    import numpy as np

    rng = np.random.default_rng(seed + (split == "eval"))
    count = 128 if split == "train" else 32
    return [(rng.standard_normal(16).astype("float32"), np.int32(i % 4)) for i in range(count)]


NOT_CALLABLE = 3
'''
FUNCTIONAL_RULES = "layout.rules={dense_1/kernel:[null,model],dense_1/bias:[model]}"
SUBCLASSED_RULES = "layout.rules={tower/dense/kernel:[null,model],tower/dense/bias:[model]}"
FAST = ["train.verbose=0", "train.epochs=2", "data.num_samples=128", "data.eval_samples=32"]
SPARSE = "train.loss=sparse_categorical_crossentropy"
MESHES = ("8x1", "2x4", "1x8")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The user's working dir: their module and a .npz of 16 features and 4 classes."""
    folder = tmp_path_factory.mktemp("user")
    (folder / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    rng = np.random.default_rng(0)
    np.savez(
        folder / "train.npz",
        x=rng.standard_normal((128, 16)).astype("float32"),
        y=rng.integers(0, 4, 128).astype("int32"),
    )
    return folder


@pytest.fixture
def in_workdir(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    return workdir


def plan_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "plan.json").read_text())


def assert_placed_as_planned(run_dir: Path) -> None:
    metrics, plan = read_metrics(run_dir), plan_of(run_dir)
    planned = {v["path"]: v for v in plan["variables"]}
    assert set(planned) == set(metrics["sharding"])
    for path, placed in metrics["sharding"].items():
        assert placed["spec"] == planned[path]["spec"], path
        assert placed["bytes_per_device"] == planned[path]["bytes_per_device"], path
        assert placed["rule"] == planned[path].get("rule"), path


@pytest.fixture(scope="module")
def mesh_runs(workdir, tmp_path_factory):
    """The functional and the subclassed model, each trained on every mesh of MESHES."""
    here = os.getcwd()
    os.chdir(workdir)
    try:
        out = tmp_path_factory.mktemp("runs")
        runs = {}
        for name, extra in (
            ("functional", [FUNCTIONAL_RULES]),
            ("subclassed", [SUBCLASSED_RULES, "model.input_shape=[16]"]),
        ):
            for mesh in MESHES:
                run_dir = out / f"{name}-{mesh}"
                args = [f"model.factory={MODULE}:{name}", SPARSE, f"mesh={mesh}", *FAST, *extra]
                runs[(name, mesh)] = (train_here(["model=python", *args], run_dir), run_dir)
        return runs
    finally:
        os.chdir(here)


@pytest.mark.parametrize("name", ["functional", "subclassed"])
def test_a_user_model_is_placed_as_planned_with_its_rules(mesh_runs, name):
    metrics, run_dir = mesh_runs[(name, "2x4")]
    assert_placed_as_planned(run_dir)
    kernel = "dense_1/kernel" if name == "functional" else "tower/dense/kernel"
    assert metrics["sharding"][kernel]["spec"] == [None, "model"]
    assert metrics["sharding"][kernel]["origin"] == "rules"
    assert metrics["model"]["name"] == "python" and metrics["model"]["label"] == f"{MODULE}:{name}"
    assert metrics["model"]["inputs"] == [{"name": None, "shape": [16], "dtype": "float32"}]
    assert metrics["model"]["outputs"] == [{"name": None, "shape": [4], "dtype": "float32"}]
    assert metrics["data"]["family"] == "shaped"


def test_the_subclassed_models_paths_are_stable_across_builds(mesh_runs):
    """Unnamed layers and a dropout seed generator: the plan's build and the run's build (and a
    later run in the same process) give the same paths, with no _1 suffixes."""
    first = set(mesh_runs[("subclassed", "8x1")][0]["sharding"])
    last = set(mesh_runs[("subclassed", "1x8")][0]["sharding"])
    assert first == last
    assert "tower/dense/kernel" in first and "seed_generator/seed_generator_state" in first
    assert not any(path.startswith("tower_1/") or path.startswith("seed_generator_1/") for path in first), (
        first
    )


@pytest.mark.parametrize("name", ["functional", "subclassed"])
def test_user_model_losses_do_not_depend_on_the_mesh(mesh_runs, name):
    reference = mesh_runs[(name, MESHES[0])][0]
    assert len(reference["history"]["loss"]) == 2
    for mesh in MESHES[1:]:
        metrics = mesh_runs[(name, mesh)][0]
        assert metrics["history"]["loss"] == pytest.approx(reference["history"]["loss"], abs=1e-5), mesh
        assert metrics["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], abs=1e-5), mesh


@pytest.mark.parametrize("name,extra", [("functional", []), ("subclassed", ["model.input_shape=[16]"])])
def test_layout_auto_shards_a_user_model_without_rules(mesh_runs, in_workdir, tmp_path, name, extra):
    run_dir = tmp_path / "auto"
    auto = ["layout=auto", "layout.min_bytes=1KiB", "layout.fsdp=true", "mesh=2x4"]
    metrics = train_here(
        ["model=python", f"model.factory={MODULE}:{name}", SPARSE, *FAST, *auto, *extra], run_dir
    )
    assert_placed_as_planned(run_dir)
    kernel = "dense_1/kernel" if name == "functional" else "tower/dense/kernel"
    # (16, 32): the only variable of 1 KiB or more; no width to tell, so model takes rows, data the rest.
    assert metrics["sharding"][kernel]["spec"] == ["model", "data"]
    assert metrics["sharding"][kernel]["origin"] == "auto"
    assert [p for p, v in metrics["sharding"].items() if v["rule"]] == [kernel]
    reference = mesh_runs[(name, "2x4")][0]
    assert metrics["history"]["loss"] == pytest.approx(reference["history"]["loss"], abs=1e-5)
    assert metrics["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], abs=1e-5)


def test_a_compiled_model_brings_its_loss_and_metrics(in_workdir, tmp_path):
    metrics = train_here(
        ["model=python", f"model.factory={MODULE}:compiled", "mesh=2x4", *FAST], tmp_path / "run"
    )
    assert set(metrics["eval"]) == {"loss", "top2"}
    assert metrics["train"]["loss"] == "sparse_categorical_crossentropy"
    assert metrics["train"]["optimizer"] == "adam"  # meshrun's train.optimizer, not the factory's sgd


def test_a_subclassed_model_builds_from_the_inputs_the_data_declares(in_workdir, tmp_path):
    args = [
        f"model.factory={MODULE}:subclassed",
        "data=arrays",
        "data.path=train.npz",
        "data.validation_split=0.25",
        SPARSE,
        "mesh=2x4",
        "train.verbose=0",
        "train.epochs=1",
    ]
    metrics = train_here(["model=python", *args], tmp_path / "run")
    assert metrics["model"]["inputs"] == [{"name": None, "shape": [16], "dtype": "float32"}]
    assert metrics["sharding"]["tower/dense/kernel"]["shape"] == [16, 32]


def test_model_kwargs_reach_the_factory(in_workdir, tmp_path):
    metrics = train_here(
        [
            "model=python",
            f"model.factory={MODULE}:functional",
            "model.kwargs={hidden:8,classes:3}",
            SPARSE,
            *FAST,
        ],
        tmp_path / "run",
    )
    assert metrics["sharding"]["dense_1/kernel"]["shape"] == [16, 8]
    assert metrics["model"]["outputs"][0]["shape"] == [3]
    assert metrics["model"]["options"]["kwargs"] == {"hidden": 8, "classes": 3}


def test_plan_of_a_user_model_allocates_nothing_and_lists_its_paths(in_workdir, capsys):
    args = [
        "plan",
        "model=python",
        f"model.factory={MODULE}:subclassed",
        "model.input_shape=[16]",
        "mesh=2x4",
        SUBCLASSED_RULES,
        "--json",
    ]
    with pytest.raises(
        SystemExit
    ):  # a model compiled without a loss, and none given: train would refuse it, and so does plan
        cli.main(args)
    refused = json.loads(capsys.readouterr().out)
    assert refused["status"] == "error" and refused["errors"][0].startswith("train.loss: is required")
    cli.main([*args, SPARSE])
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "ok" and plan["model"]["name"] == f"{MODULE}:subclassed"
    placed = {v["path"]: v for v in plan["variables"]}
    assert (
        placed["tower/dense/kernel"]["spec"] == [None, "model"]
        and placed["tower/dense/kernel"]["origin"] == "rules"
    )
    assert placed["tower/dense_1/kernel"]["rule"] is None


@pytest.mark.e2e
def test_the_console_script_imports_the_factory_from_the_working_dir(workdir, tmp_path):
    """The `meshrun` console script does not put the working dir on the import path (python -m
    does); meshrun does, for model.factory and data.factory alike."""
    script = Path(sys.executable).parent / "meshrun"
    command = [str(script)] if script.exists() else [sys.executable, "-P", "-m", "meshrun"]
    run_dir = tmp_path / "run"
    args = [
        "train",
        "model=python",
        f"model.factory={MODULE}:functional",
        SPARSE,
        "mesh=2x4",
        FUNCTIONAL_RULES,
        *FAST,
        "data=python",
        f"data.factory={MODULE}:samples",
        f"hydra.run.dir={run_dir}",
    ]
    import subprocess

    done = subprocess.run([*command, *args], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    metrics = read_metrics(run_dir)
    assert metrics["sharding"]["dense_1/kernel"]["spec"] == [None, "model"]
    assert metrics["data"]["factory"] == f"{MODULE}:samples" and metrics["data"]["train_samples"] == 128
    assert done.stderr == ""  # no TensorFlow start-up noise


BAD = {
    "module not found": (
        ["model.factory=no_such_models:build", SPARSE],
        [
            "model.factory: got 'no_such_models:build': no module 'no_such_models' in the working dir",
            "PYTHONPATH",
        ],
    ),
    "attribute missing": (
        [f"model.factory={MODULE}:functionl", SPARSE],
        [f"module '{MODULE}' has no function 'functionl'", "did you mean functional?"],
    ),
    "not callable": (
        [f"model.factory={MODULE}:NOT_CALLABLE", SPARSE],
        ["'NOT_CALLABLE' is a int, not a function or class"],
    ),
    "returns no model": (
        [f"model.factory={MODULE}:not_a_model", SPARSE],
        [f"{MODULE}:not_a_model returned list, not a keras.Model"],
    ),
    "factory raises": (
        [f"model.factory={MODULE}:broken", SPARSE],
        [f"model.factory: {MODULE}:broken() raised ValueError: hidden must be even"],
    ),
    "unknown kwarg": (
        [f"model.factory={MODULE}:functional", "model.kwargs={hiden:8}", SPARSE],
        ["model.kwargs: got 'hiden'", "did you mean hidden?", "it takes: hidden or classes"],
    ),
    "no colon": (
        ["model.factory=mymodels.build", SPARSE],
        ["model.factory: got 'mymodels.build'; expected module:function"],
    ),
    "no factory": ([SPARSE], ["model.factory: got None; expected module:function"]),
    "no loss for an uncompiled model": (
        [f"model.factory={MODULE}:functional"],
        [
            "train.loss: is required",
            f"{MODULE}:functional returns a model that is not compiled with a loss",
            "e.g. train.loss=",
        ],
    ),
    "unbuilt model without inputs": (
        [f"model.factory={MODULE}:subclassed", SPARSE],
        ["model.input_shape:", "not built yet", "give its inputs as model.input_shape"],
    ),
    "inputs that do not fit": (
        [f"model.factory={MODULE}:functional", "model.input_shape=[15]", SPARSE],
        [
            "model:",
            "cannot be called on inputs input (15)",
            "expected shape=(None, 16), found shape=(None, 15)",
        ],
    ),
    "no variables": (
        [f"model.factory={MODULE}:empty", "model.input_shape=[4]", SPARSE],
        [f"{MODULE}:empty has no variables"],
    ),
    "bad input shape": (
        [f"model.factory={MODULE}:subclassed", "model.input_shape=[16,0]", SPARSE],
        ["model.input_shape: got [16, 0]"],
    ),
    "bad input dtype": (
        [f"model.factory={MODULE}:subclassed", "model.input_dtype=float", SPARSE],
        ["model.input_dtype: got 'float'", "float32"],
    ),
    "rule matching no user path": (
        [
            f"model.factory={MODULE}:functional",
            SPARSE,
            "mesh=2x4",
            "layout.rules={dense_3/kernel:[null,model]}",
        ],
        ["layout.rules.dense_3/kernel: matches no variable", "dense_1/kernel"],
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_user_model_input_is_one_line_with_exit_2(name, workdir, tmp_path, monkeypatch, capsys):
    args, expected = BAD[name]
    monkeypatch.chdir(workdir)
    before = sorted(p.name for p in workdir.iterdir())
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "model=python", *args, "train.verbose=0"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("meshrun: error: "), err
    for part in expected:
        assert part in lines[0], (part, lines[0])
    assert sorted(p.name for p in workdir.iterdir() if p.name != "__pycache__") == [
        p for p in before if p != "__pycache__"
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    "args",
    [[f"model.factory={MODULE}:functional", SPARSE, FUNCTIONAL_RULES], [f"model.factory={MODULE}:compiled"]],
    ids=["functional", "compiled by its factory"],
)
def test_an_own_models_planned_step_peak_is_the_measured_one(in_workdir, tmp_path, args):
    """With a device memory to fit, the plan counts the train step's peak (compiled on abstract
    inputs) and it is the one the run measures after fit, within 10% (issue 68); a factory that
    compiles its model brings its loss to that step too."""
    run_dir = tmp_path / "run"
    args = [*args, *FAST, "mesh=2x4"]
    metrics = train_here(["model=python", *args, "devices.memory_gib=1"], run_dir)
    memory, plan = metrics["memory"], plan_of(run_dir)
    assert plan["device_memory"]["counts"] == "the step's peak"
    assert memory["planned_step_peak_bytes_per_device"] == plan["step"]["step_peak_bytes_per_device"]
    assert memory["planned_step_peak_bytes_per_device"] == pytest.approx(
        memory["peak_bytes_per_device"], rel=0.10
    )
