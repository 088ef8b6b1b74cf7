"""Private names of dependencies (meshrun.compat): each one exists in the installed versions, and a
release that lacks one stops meshrun before anything is built, with one line naming the package, its
version, the name and the versions meshrun works with (exit 2, nothing left behind). Each patch and
convention meshrun relies on still does what meshrun needs of it."""

import importlib.metadata
import json
import logging
import pkgutil
import subprocess
import sys

import pytest

import meshrun.compat
from conftest import LogRecords, cli_here, error_line_here
from meshrun import cli
from meshrun.compat import names as compat


def test_every_private_name_exists_in_the_installed_packages():
    assert set(compat.GROUPS) == {
        "keras",
        "jax",
        "hydra",
        "orbax",
        "tensorflow",
        "tensorboard",
        "keras_hub",
        "keras_quantize",
    }
    for group in compat.GROUPS:
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
def test_keras_without_a_name_meshrun_uses_stops_the_run_with_one_line(
    in_tmp, capsys, monkeypatch, unchecked
):
    from keras.src.backend.jax.trainer import JAXTrainer

    monkeypatch.delattr(JAXTrainer, "_get_jax_state")
    line = rejected(["mesh=2x4", "layout=dense_model"], capsys)
    version = importlib.metadata.version("keras")
    assert line.startswith(
        f"meshrun: error: keras: keras {version} has no keras.Model._get_jax_state, which meshrun uses for "
    )
    assert "; meshrun works with keras<3.16,>=3.14 (pip install 'keras<3.16,>=3.14')" in line
    assert list(in_tmp.iterdir()) == []


def test_hydra_without_a_name_meshrun_uses_stops_the_command_with_one_line(
    in_tmp, capsys, monkeypatch, unchecked
):
    from hydra.core.plugins import Plugins

    # Hydra's first plugin scan runs its core plugins' modules afresh: before the patch, not after
    Plugins.instance()
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    monkeypatch.delattr(BasicSweeper, "split_arguments")
    line = rejected(["-m", "mesh=8x1,2x4"], capsys)
    version = importlib.metadata.version("hydra-core")
    assert line.startswith(
        f"meshrun: error: hydra-core: hydra-core {version} has no "
        "hydra._internal.core_plugins.basic_sweeper.BasicSweeper.split_arguments"
    )
    assert list(in_tmp.iterdir()) == []


@pytest.mark.integration
def test_orbax_without_a_name_meshrun_uses_stops_a_checkpointing_run_with_one_line(
    in_tmp, capsys, monkeypatch, unchecked
):
    from orbax.checkpoint._src.metadata import checkpoint

    monkeypatch.delattr(checkpoint, "step_metadata_file_path")
    line = rejected(["mesh=2x4", f"checkpoint.dir={in_tmp / 'ckpt'}", "hydra.run.dir=run"], capsys)
    version = importlib.metadata.version("orbax-checkpoint")
    assert line.startswith(
        f"meshrun: error: orbax-checkpoint: orbax-checkpoint {version} has no "
        "orbax.checkpoint._src.metadata.checkpoint.step_metadata_file_path"
    )
    assert not (in_tmp / "run").exists()


@pytest.mark.integration
def test_tensorflow_without_a_name_meshrun_uses_stops_a_tf_data_run_with_one_line(
    in_tmp, capsys, monkeypatch, unchecked
):
    """A tf.data pipeline is looked into for a generator dataset before training (meshrun.run.feed)."""
    import tensorflow as tf

    (in_tmp / "tf_data_factory.py").write_text(
        "import numpy as np, tensorflow as tf\n"
        "def make(split, seed):\n"
        "    return tf.data.Dataset.from_tensor_slices((np.zeros((64, "
        "28, 28, 1), 'float32'), np.zeros((64, 10), 'float32')))\n"
    )
    monkeypatch.syspath_prepend(str(in_tmp))
    monkeypatch.delattr(tf.data.Dataset, "_as_serialized_graph")
    line = rejected(["data=python", "data.factory=tf_data_factory:make", "hydra.run.dir=run"], capsys)
    installed = compat.installed_distribution(
        "tensorflow"
    )  # tensorflow (meshrun[dev]) or tensorflow-cpu (meshrun[tf])
    version = importlib.metadata.version(installed)
    assert line.startswith(
        f"meshrun: error: {installed}: {installed} {version} has no "
        "tensorflow.data.Dataset._as_serialized_graph, which meshrun uses for telling whether a tf.data"
    )
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


# --- each name, and what meshrun does with it ------------------------------------------------------

EVERY_NAME = [name for group in compat.GROUPS for name in compat.names_of(group)]


def installed(package: str) -> bool:
    try:
        importlib.metadata.distribution(compat.installed_distribution(package))
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def on_both_ends(name: compat.PrivateName):
    """`name` as a test parameter of the smoke set, which the oldest stack runs too (keras-hub's once
    it is installed there)."""
    marks = [pytest.mark.smoke, pytest.mark.hub] if name.package == "keras-hub" else [pytest.mark.smoke]
    return pytest.param(name, marks=marks, id=f"{name.dotted}:{name.source_contains}".rstrip(":"))


@pytest.mark.parametrize("name", [on_both_ends(name) for name in EVERY_NAME])
def test_each_private_name_is_where_meshrun_reaches_it(name):
    if not installed(name.package):
        pytest.skip(
            f"{name.package} is not installed here (the oldest stack's smoke set installs no TensorFlow)"
        )
    compat.check_name(name)


COMPAT_MODULES = [module.name for module in pkgutil.walk_packages(meshrun.compat.__path__, "meshrun.compat.")]


def test_the_groups_name_every_module_of_compat_that_declares_private_names():
    """names.GROUPS and the modules of meshrun.compat agree: the modules that declare names of a
    group (their PRIVATE_NAMES) are the group's modules in GROUPS, and each module's PRIVATE_NAMES
    holds every PrivateName it defines (alone or in a tuple beside the functions that reach them)."""
    declaring: dict[str, set[str]] = {}
    for module_name in COMPAT_MODULES:
        module = importlib.import_module(module_name)
        declared = getattr(module, "PRIVATE_NAMES", ())
        defined = {
            name
            for value in vars(module).values()
            for name in (value if isinstance(value, tuple) else (value,))
            if isinstance(name, compat.PrivateName)
        }
        assert defined <= set(declared), (module_name, defined - set(declared))
        for name in declared:
            declaring.setdefault(name.group, set()).add(module_name)
    assert declaring == {group: set(modules) for group, modules in compat.GROUPS.items()}
    assert "meshrun.compat.keras.sharded_loading" in COMPAT_MODULES  # the walk reaches subpackages


@pytest.mark.smoke
def test_the_table_is_whole_in_a_process_that_imported_nothing_else_and_imports_no_dependency():
    """Read first thing in a fresh process, the table holds every name it holds here, and reading
    it imports none of the packages it names."""
    script = (
        "import json, sys\n"
        "from meshrun.compat.names import GROUPS, names_of\n"
        "counts = {group: len(names_of(group)) for group in GROUPS}\n"
        "imported = sorted({'keras', 'jax', 'hydra', 'orbax', 'tensorflow', 'tensorboard', 'keras_hub'}"
        " & set(sys.modules))\n"
        "print(json.dumps([counts, imported]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    counts, imported = json.loads(done.stdout)
    assert counts == {group: len(compat.names_of(group)) for group in compat.GROUPS} and imported == []


def test_every_module_of_compat_lists_its_names_by_its_own_package():
    packages = {(name.package, name.module.split(".")[0]) for name in EVERY_NAME}
    assert packages == {
        ("keras", "keras"),
        ("jax", "jax"),
        ("hydra-core", "hydra"),
        ("orbax-checkpoint", "orbax"),
        ("tensorflow", "tensorflow"),
        ("tensorboard", "tensorboard"),
        ("keras-hub", "keras_hub"),
    }


@pytest.mark.smoke
def test_keras_is_seeded_without_importing_tensorflow():
    """set_random_seed switches off Keras' LazyModule of TensorFlow while keras.utils.set_random_seed
    runs: Python's, numpy's and Keras' seeds are set, TensorFlow stays unimported."""
    script = (
        "import sys, numpy as np\n"
        "from meshrun.compat.keras.startup import import_keras, set_random_seed\n"
        "keras = import_keras()\n"
        "set_random_seed(7, None); first = np.random.rand(), float(keras.random.uniform((), seed=None))\n"
        "set_random_seed(7, None); again = np.random.rand(), float(keras.random.uniform((), seed=None))\n"
        "assert first == again, (first, again)\n"
        "assert 'tensorflow' not in sys.modules\n"
        "from keras.src.utils import module_utils\n"
        "assert module_utils.tensorflow._available is not False\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.smoke
def test_compile_recorded_records_what_compile_was_given_and_puts_compile_back():
    import keras

    from meshrun.compat.keras.models import compile_recorded

    original = keras.Model.compile
    with compile_recorded() as compiled:
        by_keyword = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        by_keyword.compile(optimizer="adam", loss="mse", metrics=["mae"], weighted_metrics=["mse"])
        by_position = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        by_position.compile("sgd", "mae", None, ["mse"])
        without_loss = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        without_loss.compile(optimizer="adam")
        assert not by_keyword.compiled
    assert keras.Model.compile is original
    assert compiled == {
        id(by_keyword): {"loss": "mse", "metrics": ["mae"], "weighted_metrics": ["mse"]},
        id(by_position): {"loss": "mae", "metrics": ["mse"]},
    }


@pytest.mark.smoke
def test_sublayers_lists_nested_layers_and_not_the_model():
    import keras

    from meshrun.compat.keras.models import sublayers

    inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="inner_dense")], name="inner")
    outer = keras.Sequential(
        [keras.Input((3,)), inner, keras.layers.Dense(2, name="outer_dense")], name="outer"
    )
    names = [layer.name for layer in sublayers(outer) if not isinstance(layer, keras.layers.InputLayer)]
    assert names == ["inner", "inner_dense", "outer_dense"]


@pytest.mark.smoke
def test_keras_dispatches_step_hooks_of_callbacks_marked_async_safe_on_worker_threads():
    import keras
    from keras.src.callbacks.callback_list import CallbackList

    from meshrun.compat.keras.callbacks import is_async_safe, mark_async_safe

    class StepHook(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    assert not is_async_safe(StepHook()) and not CallbackList([StepHook()])._async_train
    marked = mark_async_safe(StepHook())
    assert is_async_safe(marked) and CallbackList([marked])._async_train
    assert not CallbackList([mark_async_safe(StepHook(), False)])._async_train


@pytest.mark.smoke
def test_jax_modules_log_through_the_loggers_meshrun_quiets():
    import jax._src.profiler
    import jax._src.xla_bridge

    from meshrun.compat.jax import JAX_PLATFORM_LOGGER, JAX_PROFILER_LOGGER

    assert jax._src.xla_bridge.logger.name == JAX_PLATFORM_LOGGER
    assert jax._src.profiler.logger.name == JAX_PROFILER_LOGGER


@pytest.mark.smoke
def test_meshrun_k8s_default_port_is_jaxs_own_read_from_its_source_without_importing_jax():
    from jax._src.clusters.k8s_cluster import K8sCluster

    from meshrun.compat.jax import k8s_coordinator_port
    from meshrun.usage import command_help

    assert k8s_coordinator_port() == int(K8sCluster._coordinator_port)
    assert f"default {k8s_coordinator_port()})" in command_help("k8s")  # the help states it too
    read = "from meshrun.compat.jax import k8s_coordinator_port; k8s_coordinator_port(); import sys; "
    done = subprocess.run(
        [sys.executable, "-c", read + "print('jax' in sys.modules)"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_a_jax_without_its_kubernetes_port_stops_meshrun_k8s_with_one_line(in_tmp, capsys, monkeypatch):
    import meshrun.compat.jax as compat_jax

    monkeypatch.setattr(compat_jax, "_module_source", lambda module: "class K8sCluster:\n    pass\n")
    args = ["k8s", "devices.platform=cpu", "mesh=2x4", "--image", "reg/meshrun:0.1", "--nodes", "2"]
    line = error_line_here(args, capsys)
    version = importlib.metadata.version("jax")
    assert line.startswith(
        f"meshrun: error: jax: jax {version} has no "
        "jax._src.clusters.k8s_cluster.K8sCluster._coordinator_port, "
        "which meshrun uses for the coordinator port of jax's jobs on Kubernetes, meshrun k8s' default --port"
    )
    assert list(in_tmp.iterdir()) == []


@pytest.mark.integration
def test_variable_layouts_lay_out_the_variables_made_in_the_block_and_end_with_it():
    import jax
    import keras
    import numpy as np
    from jax.sharding import PartitionSpec
    from keras import distribution as kd

    from meshrun.compat.keras.variable_layouts import layout_of, variable_layouts

    assert layout_of(keras.Variable(np.zeros((2, 4)))) is None  # no distribution: no layout
    mesh = kd.DeviceMesh((2,), ["batch"], jax.devices()[:2])
    distribution = kd.DataParallel(device_mesh=mesh)
    split = kd.TensorLayout([None, "batch"], mesh)
    asked = []

    def layout(variable):
        asked.append(variable.path)
        return split

    with distribution.scope():
        with variable_layouts(distribution, layout):
            placed = keras.Variable(np.zeros((2, 4)), name="placed")
        after = keras.Variable(np.zeros((2, 4)), name="after")
    assert asked == ["placed"] and "get_variable_layout" not in vars(distribution)
    assert placed.value.sharding.spec == PartitionSpec(None, "batch") and layout_of(placed) is not None
    assert after.value.sharding.is_fully_replicated and layout_of(after) is not None


@pytest.mark.smoke
def test_split_sweep_gives_each_job_its_overrides():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from meshrun.compat.hydra import split_sweep

    parsed = OverridesParser.create().parse_overrides(["mesh=8x1,2x4", "train.epochs=1"])
    assert split_sweep(parsed) == [["mesh=8x1", "train.epochs=1"], ["mesh=2x4", "train.epochs=1"]]


def test_a_command_composes_its_config_once_and_a_multirun_follows_minus_m(in_tmp, capsys, monkeypatch):
    from hydra._internal.hydra import Hydra

    composed = []
    compose_config = Hydra.compose_config

    def counted(self, *args, **kwargs):
        composed.append(kwargs.get("run_mode"))
        return compose_config(self, *args, **kwargs)

    monkeypatch.setattr(Hydra, "compose_config", counted)
    assert cli_here(["plan", "mesh=2x4", "layout=dense_model"], capsys).returncode == 0
    assert len(composed) == 1  # Hydra.get_mode's composition left out (meshrun.compat.hydra)
    done = cli_here(
        ["plan", "-m", "mesh=2x4,4x2", "layout=dense_model"], capsys
    )  # -m alone makes it a multirun
    assert done.returncode == 0, done.stderr
    assert [line.strip() for line in done.stdout.splitlines() if "plan: " in line] == [
        "plan: dense_model on mesh 2x4 ('data', 'model')",
        "plan: dense_model on mesh 4x2 ('data', 'model')",
    ]
    assert Hydra.get_mode.__name__ == "get_mode"  # Hydra's own, put back after each command


@pytest.fixture
def absl_records():
    """The records absl's logger passes on (after its filters) while the test runs."""
    records = LogRecords()
    absl = logging.getLogger("absl")
    absl.addHandler(records)
    yield records.records
    absl.removeHandler(records)


@pytest.mark.smoke
def test_orbax_warnings_about_what_meshrun_does_on_purpose_are_info(tmp_path, absl_records):
    """A read-only manager (how meshrun finds and reads checkpoints) and jax.Array's type handler
    registered again on CPU make Orbax warn; meshrun.compat.orbax sends those to train.log only."""
    import jax

    from meshrun.compat.orbax import EXPECTED_WARNINGS, import_orbax, keep_replicated_arrays_whole_on_cpu

    ocp = import_orbax()
    ocp.CheckpointManager(tmp_path, options=ocp.CheckpointManagerOptions(read_only=True)).close()
    keep_replicated_arrays_whole_on_cpu()
    handler = ocp.type_handlers.get_type_handler(jax.Array)
    assert isinstance(handler, ocp.type_handlers.ArrayHandler) and handler._use_replica_parallel is False
    expected = [r for r in absl_records if r.getMessage().startswith(tuple(EXPECTED_WARNINGS))]
    seen = {text for text in EXPECTED_WARNINGS if any(r.getMessage().startswith(text) for r in expected)}
    assert seen == set(EXPECTED_WARNINGS), [r.getMessage() for r in absl_records]
    assert {r.levelname for r in expected} == {"INFO"}


@pytest.mark.smoke
def test_a_checkpoint_is_complete_once_orbax_has_written_its_step_metadata(tmp_path):
    import numpy as np

    from meshrun.compat.orbax import import_orbax, is_complete_checkpoint, steps_on_disk

    ocp = import_orbax()
    with ocp.CheckpointManager(
        tmp_path, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    ) as manager:
        manager.save(3, args=ocp.args.StandardSave({"x": np.zeros(2)}))
    (tmp_path / "4").mkdir()
    (tmp_path / "5.orbax-checkpoint-tmp").mkdir()
    assert is_complete_checkpoint(tmp_path / "3") and not is_complete_checkpoint(tmp_path / "4")
    assert steps_on_disk(tmp_path) == [
        3
    ]  # the same verdict read without Orbax (a run dir is checked before jax starts)


def test_dataset_ops_name_a_generator_dataset_inside_a_pipeline():
    from meshrun.compat.tensorflow import dataset_ops, import_tensorflow

    tf = import_tensorflow()
    generated = tf.data.Dataset.from_generator(
        lambda: iter(range(3)), output_signature=tf.TensorSpec((), tf.int64)
    )
    assert "GeneratorDataset" in dataset_ops(generated.map(lambda x: x + 1).batch(2))
    assert "GeneratorDataset" not in dataset_ops(tf.data.Dataset.range(3).batch(2))


@pytest.mark.smoke
def test_tensorboard_reads_the_events_its_protos_make(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from meshrun.logs.sinks.tensorboard_events import TensorBoard

    sink = TensorBoard(tmp_path)
    sink.step({"step": 3, "epoch": 1, "loss": 0.5, "step_s": 0.1})
    sink.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(3, 0.5)]


# keras_hub imported without TensorFlow (meshrun.compat.keras_hub), then TensorFlow imported as the
# user's code would: every keras_hub module must hold what a plain import with TensorFlow gives it,
# and a preset's tokenizer must run in TensorFlow's graph. argv: how to import, then the presets.
KERAS_HUB_AS_IMPORTED = r"""
import json, os, sys, types
os.environ["KERAS_BACKEND"] = "jax"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
how, presets = sys.argv[1], sys.argv[2:]
seen = {}
if how == "without tensorflow, then tensorflow":
    from meshrun.compat.keras_hub import TensorFlowArrival, import_keras_hub, keras_hub_has_tensorflow
    keras_hub = import_keras_hub()
    seen["before"] = {"tensorflow imported": "tensorflow" in sys.modules,
                      "keras_hub has it": keras_hub_has_tensorflow()}
    import tensorflow
    seen["after"] = {"keras_hub has it": keras_hub_has_tensorflow(),
                     "finder left": not any(isinstance(f, TensorFlowArrival) for f in sys.meta_path),
                     "tensorflow's loader": type(tensorflow.__spec__.loader).__name__}
else:
    import tensorflow, keras_hub

def described(value):
    if isinstance(value, types.ModuleType):
        return "module " + value.__name__
    if isinstance(value, type):
        return "class " + " < ".join(f"{c.__module__}.{c.__qualname__}" for c in value.__mro__)
    if value is None or isinstance(value, (bool, float, str)):
        return repr(value)[:200]
    return "a " + type(value).__module__ + "." + type(value).__qualname__

namespaces = {}
for name, module in sorted(sys.modules.items()):
    if module is not None and name.split(".")[0] == "keras_hub":
        namespaces[name] = {key: described(value) for key, value in vars(module).items()
                            if not key.startswith("__")}
        for key, value in vars(module).items():  # and each class defined there, one level down
            if isinstance(value, type) and value.__module__ == name:
                namespaces[f"{name}:{key}"] = {k: described(v) for k, v in vars(value).items()
                                               if not k.startswith("__")}
from meshrun.text.tokenizer_check import PROBE_TEXTS
from meshrun.text.tokenizer_encoders import KerasHubGraphEncoder
graphs = {path: [ids.tolist() for ids in
                 KerasHubGraphEncoder(keras_hub.tokenizers.Tokenizer.from_preset(path)).encode(list(PROBE_TEXTS))]
          for path in presets}
print(json.dumps({"seen": seen, "namespaces": namespaces, "graphs": graphs}))
"""


@pytest.mark.e2e
def test_keras_hub_imported_without_tensorflow_is_whole_once_tensorflow_is_imported(text_files):
    """A keras_hub release that binds something more of TensorFlow's at import fails here, naming it:
    add it to meshrun.compat.keras_hub.TENSORFLOW_NAMES."""
    pytest.importorskip(
        "tensorflow", reason="keras_hub is imported without TensorFlow only where it is installed"
    )
    presets = [
        str(text_files.gemma),
        str(text_files.gpt2),
    ]  # SentencePiece, and byte-level BPE (its tf.Module cache)
    hows = ("with tensorflow", "without tensorflow, then tensorflow")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", KERAS_HUB_AS_IMPORTED, how, *presets],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for how in hows
    ]
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err[-3000:]
    plain, revived = (json.loads(out.strip().splitlines()[-1]) for out, _ in outputs)
    assert revived["seen"]["before"] == {"tensorflow imported": False, "keras_hub has it": False}
    assert revived["seen"]["after"] == {
        "keras_hub has it": True,
        "finder left": True,
        "tensorflow's loader": "SourceFileLoader",
    }
    assert revived["namespaces"].keys() == plain["namespaces"].keys()
    differing = [
        (module, key, plain["namespaces"][module].get(key), names.get(key))
        for module, names in revived["namespaces"].items()
        for key in names.keys() | plain["namespaces"][module].keys()
        if names.get(key) != plain["namespaces"][module].get(key)
    ]
    assert not differing, differing[:10]
    assert revived["graphs"] == plain["graphs"] and all(ids for ids in plain["graphs"][presets[0]][:4])
