"""Keras' start-up as meshrun uses it past its public API: importing it without the optional
packages it would load, and seeding it or saving a model without importing TensorFlow (Keras'
LazyModule of TensorFlow). Importing this module imports neither Keras nor jax."""

from __future__ import annotations

import contextlib
import os
import sys

from meshrun.compat.names import PrivateName, ensure, uses
from meshrun.compat.tensorflow import set_global_seed as set_tensorflow_seed

# Keras imports these at its own import when they are installed, for its scikit-learn wrappers and
# its image-plotting helpers, neither of which meshrun uses: together 0.5-0.9 s of every start-up.
KERAS_OPTIONAL_IMPORTS = ("sklearn", "matplotlib")


def import_keras():
    """Keras, imported without the optional packages it would import for features meshrun does not
    use (KERAS_OPTIONAL_IMPORTS; Keras imports each inside try/except ImportError). They stay
    importable afterwards; only keras.wrappers' scikit-learn estimators and keras.visualization's
    plots are then unavailable in this process. Keras runs on its jax backend."""
    if "keras" in sys.modules:
        return sys.modules["keras"]
    os.environ["KERAS_BACKEND"] = "jax"  # meshrun runs Keras on jax only
    refused = [name for name in KERAS_OPTIONAL_IMPORTS if name not in sys.modules]
    for name in refused:
        sys.modules[name] = None  # Python's own way to make `import name` raise ImportError
    try:
        import keras
    finally:
        for name in refused:
            del sys.modules[name]
    return keras


PRIVATE_NAMES = uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.utils.module_utils",
        "LazyModule",
        "seeding Keras and saving models without importing TensorFlow "
        "(Keras asks it whether TensorFlow is installed, importing it)",
        source_contains="self._available",
    ),
)


def set_random_seed(seed: int, tensorflow_seed: int | None) -> None:
    """keras.utils.set_random_seed (Python's, numpy's and Keras' seeds) without importing
    TensorFlow, which it seeds whenever TensorFlow is installed (2 s of start-up). Where
    TensorFlow is already imported, its global seed is set to `tensorflow_seed`, the one meshrun's
    tf.data pipelines expect (meshrun.data.order.tensorflow_global_seed)."""
    import keras

    with _tensorflow_unavailable_to_keras():
        keras.utils.set_random_seed(seed)
    set_tensorflow_seed(tensorflow_seed)


@contextlib.contextmanager
def keras_without_tensorflow():
    """Runs the block (saving a model) with Keras told TensorFlow is not there, unless it is
    imported already: Keras' serialization asks whether it is (importing it when installed: 2-4 s
    and 500 MiB) to recognise TensorFlow's shapes and types, which a process that never imported
    TensorFlow cannot hold."""
    if sys.modules.get("tensorflow") is not None:
        yield
        return
    with _tensorflow_unavailable_to_keras():
        yield


@contextlib.contextmanager
def _tensorflow_unavailable_to_keras():
    """Keras' LazyModule of TensorFlow says it is unavailable while the block runs."""
    ensure("keras")
    from keras.src.utils import module_utils

    lazy = module_utils.tensorflow
    saved = lazy._available
    lazy._available = False
    try:
        yield
    finally:
        lazy._available = saved
