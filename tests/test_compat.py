"""Private names of dependencies (meshrun.compat): each one exists in the installed versions, and a
release that lacks one stops meshrun before anything is built, with one line naming the package, its
version, the name and the versions meshrun works with (exit 2, nothing left behind)."""

import importlib.metadata

import pytest

from meshrun import cli, compat


def test_every_private_name_exists_in_the_installed_packages():
    assert set(compat.PRIVATE_NAMES) == {"keras", "hydra", "orbax", "tensorflow"}
    for group in compat.PRIVATE_NAMES:
        compat.check(group)


@pytest.fixture
def unchecked():
    """Forgets which groups this process has checked, before and after the test."""
    compat.ensure.cache_clear()
    yield
    compat.ensure.cache_clear()


def rejected(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", *args, "train.verbose=0"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.integration
def test_keras_without_a_name_meshrun_uses_stops_the_run_with_one_line(in_tmp, capsys, monkeypatch, unchecked):
    from keras.src.backend.jax.trainer import JAXTrainer

    monkeypatch.delattr(JAXTrainer, "_get_jax_state")
    line = rejected(["mesh=2x4", "layout=dense_model"], capsys)
    version = importlib.metadata.version("keras")
    assert line.startswith(f"meshrun: error: keras: keras {version} has no keras.Model._get_jax_state, which meshrun uses for ")
    assert "; meshrun works with keras<3.16,>=3.14 (pip install 'keras<3.16,>=3.14')" in line
    assert list(in_tmp.iterdir()) == []


def test_hydra_without_a_name_meshrun_uses_stops_the_command_with_one_line(in_tmp, capsys, monkeypatch, unchecked):
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    monkeypatch.delattr(BasicSweeper, "split_arguments")
    line = rejected(["-m", "mesh=8x1,2x4"], capsys)
    version = importlib.metadata.version("hydra-core")
    assert line.startswith(f"meshrun: error: hydra-core: hydra-core {version} has no "
                           "hydra._internal.core_plugins.basic_sweeper.BasicSweeper.split_arguments")
    assert list(in_tmp.iterdir()) == []


@pytest.mark.integration
def test_orbax_without_a_name_meshrun_uses_stops_a_checkpointing_run_with_one_line(in_tmp, capsys, monkeypatch, unchecked):
    from orbax.checkpoint._src.metadata import checkpoint

    monkeypatch.delattr(checkpoint, "step_metadata_file_path")
    line = rejected(["mesh=2x4", f"checkpoint.dir={in_tmp / 'ckpt'}", "hydra.run.dir=run"], capsys)
    version = importlib.metadata.version("orbax-checkpoint")
    assert line.startswith(f"meshrun: error: orbax-checkpoint: orbax-checkpoint {version} has no "
                           "orbax.checkpoint._src.metadata.checkpoint.step_metadata_file_path")
    assert not (in_tmp / "run").exists()


@pytest.mark.integration
def test_tensorflow_without_a_name_meshrun_uses_stops_a_tf_data_run_with_one_line(in_tmp, capsys, monkeypatch, unchecked):
    """A tf.data pipeline is looked into for a generator dataset before training (meshrun.run.feed)."""
    import tensorflow as tf

    (in_tmp / "tf_data_factory.py").write_text(
        "import numpy as np, tensorflow as tf\n"
        "def make(split, seed):\n"
        "    return tf.data.Dataset.from_tensor_slices((np.zeros((64, 28, 28, 1), 'float32'), np.zeros((64, 10), 'float32')))\n"
    )
    monkeypatch.syspath_prepend(str(in_tmp))
    monkeypatch.delattr(tf.data.Dataset, "_as_serialized_graph")
    line = rejected(["data=python", "data.factory=tf_data_factory:make", "hydra.run.dir=run"], capsys)
    installed = compat.installed_distribution("tensorflow")  # tensorflow (meshrun[dev]) or tensorflow-cpu (meshrun[tf])
    version = importlib.metadata.version(installed)
    assert line.startswith(f"meshrun: error: {installed}: {installed} {version} has no "
                           "tensorflow.data.Dataset._as_serialized_graph, which meshrun uses for telling whether a tf.data")
    assert not (in_tmp / "run").exists()


def test_a_tensorflow_error_names_the_tensorflow_distribution_installed(monkeypatch):
    """meshrun[tf] installs tensorflow-cpu, keras-hub's tensorflow-text the full tensorflow: the
    error names the one there is, with the version range meshrun asks for it."""
    installed = {"tensorflow-cpu": "2.21.0"}
    monkeypatch.setattr(compat, "_installed", lambda package: installed.get(package, compat.NOT_INSTALLED))
    assert compat.installed_distribution("tensorflow") == "tensorflow-cpu"
    installed["tensorflow"] = "2.21.0"
    assert compat.installed_distribution("tensorflow") == "tensorflow"
    assert compat.installed_distribution("keras") == "keras"
