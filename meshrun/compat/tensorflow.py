"""TensorFlow, an optional dependency (the `tf` extra): whether it is installed, importing it
quietly with its GPUs hidden, and, past its public API, the ops of a tf.data pipeline's graph.
meshrun uses it for tf.data only (data=tfrecord, tf.data factories) and for the graph KerasHub
preset tokenizers are checked against where it is installed. Importing this module imports no TensorFlow."""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys

from meshrun.compat.names import PrivateName, ensure, uses
from meshrun.errors import ConfigError
from meshrun.system.process import stderr_silenced

log = logging.getLogger("meshrun")

# TensorFlow is an extra (pyproject.toml): the main job, the numpy and Grain feeds and the
# TensorBoard sink run without it, and so do KerasHub preset tokenizers (checked against KerasHub's
# TensorFlow graph where it is installed; meshrun.text.tokenizer_check); data=tfrecord, tf.data factories
# and a preset tokenizer that splits text its own way (Mistral's Tekken) need it.
TENSORFLOW_INSTALL = "pip install 'meshrun[tf]'"


def tensorflow_installed() -> bool:
    """Whether TensorFlow can be imported (found, not imported: that takes 2 s)."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"] is not None  # None: an import of it is known to fail
    return importlib.util.find_spec("tensorflow") is not None


def require_tensorflow(key: str, needs: str) -> None:
    """A ConfigError on `key` saying that `needs` (e.g. "data=tfrecord") needs TensorFlow and how
    to install it, when TensorFlow is not installed."""
    if not tensorflow_installed():
        raise ConfigError(key, f"{needs} needs TensorFlow, which is not installed: {TENSORFLOW_INSTALL}")


def import_tensorflow():
    """TensorFlow, which meshrun uses for tf.data only (data=tfrecord, tf.data factories, and the
    graph KerasHub preset tokenizers are checked against), imported with its C++ start-up lines kept
    off the console and its GPUs hidden (also when the user's code imported it first, if it has not
    run an op yet). keras-hub's dependency tensorflow-text installs the full TensorFlow: that build
    prints lines about missing CUDA drivers on import (no log level silences them) and, on a GPU
    machine, would reserve GPU memory that jax needs. Call it before meshrun's own uses of
    TensorFlow (a keras_hub imported without it gets it then: meshrun.compat.keras_hub); ImportError
    where TensorFlow is not installed (require_tensorflow first says so as a ConfigError)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:  # not imported yet (or an import of it is known to fail: ImportError again)
        with stderr_silenced():  # the import prints
            import tensorflow as tf
    return _with_gpus_hidden(tf)


@functools.cache
def _with_gpus_hidden(tf):
    """`tf` (the TensorFlow module), its GPUs hidden from it: once per process, as hiding them
    again would change nothing."""
    with stderr_silenced():  # the GPU probe of hiding them prints
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # its devices were initialised already (the user's code ran an op)
            log.debug("TensorFlow's devices were initialised before meshrun could hide its GPUs")
    return tf


def set_global_seed(seed: int | None) -> None:
    """Sets TensorFlow's global seed (None: unset) where TensorFlow is already imported; never imports it."""
    if sys.modules.get("tensorflow") is not None:
        sys.modules["tensorflow"].random.set_seed(seed)


PRIVATE_NAMES = uses(
    "tensorflow",
    PrivateName(
        "tensorflow",
        "tensorflow",
        "data.Dataset._as_serialized_graph",
        "telling whether a tf.data pipeline holds a generator "
        "dataset (which changes the process's malloc policy)",
    ),
)


def dataset_ops(dataset) -> set[str]:
    """The op names of a tf.data pipeline's graph, the ops of its functions (flat_map, interleave,
    a GeneratorDataset's own) included. Serializing the graph runs none of them."""
    ensure("tensorflow")
    import tensorflow as tf

    serialized = dataset._as_serialized_graph(
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE
    )
    graph = tf.compat.v1.GraphDef.FromString(serialized.numpy())
    return {node.op for node in graph.node} | {
        node.op for function in graph.library.function for node in function.node_def
    }
