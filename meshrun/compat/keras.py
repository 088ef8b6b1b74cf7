"""Keras, as meshrun uses it past its public API: importing it without the optional packages it
would load, seeding it without TensorFlow, the JAX trainer's state and data placement (XLA cost
analysis, checkpoints), the flat list of a model's layers, the attribute that lets Keras call
callbacks from worker threads, recording what a model's code compiles it with, loading a
preset's weights straight onto their shards, and LoRA dropout's call of an adapted layer.

Each private name is listed (meshrun.compat.names.uses) beside the function that reaches it, and
checked with the rest of the keras group before the first use. Importing this module imports
neither Keras nor jax.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
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


uses(
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


# --- the JAX trainer's state and data placement ----------------------------------------------------

uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.backend.jax.trainer",
        "_distribute_data",
        "placing a batch on the mesh as fit does, to lower the real train step for XLA's cost analysis",
    ),
    PrivateName(
        "keras",
        "keras",
        "Model._get_jax_state",
        "the training state fit passes to the train step (cost analysis)",
    ),
    PrivateName(
        "keras",
        "keras",
        "Model._get_state_sharding_spec",
        "the state shardings fit gives jax.jit (cost analysis)",
    ),
    PrivateName(
        "keras",
        "keras",
        "Model.jax_state_sync",
        "writing the live training state back to the variables before a checkpoint",
    ),
)


def distribute_data(batch):
    """`batch` placed on the mesh of the distribution in force, as fit places it."""
    ensure("keras")
    from keras.src.backend.jax import trainer

    return trainer._distribute_data(batch)


def training_state(model):
    """The (trainable, non-trainable, optimizer, metrics) state tuple fit passes to the train step."""
    ensure("keras")
    return model._get_jax_state(
        trainable_variables=True,
        non_trainable_variables=True,
        optimizer_variables=True,
        metrics_variables=True,
    )


def state_shardings(model):
    """The shardings of the training state, as fit gives them to jax.jit as out_shardings."""
    ensure("keras")
    return model._get_state_sharding_spec()


def sync_training_state(model) -> None:
    """Writes the state the JAX trainer keeps off the variables during an epoch back onto them."""
    ensure("keras")
    model.jax_state_sync()


# --- models and callbacks --------------------------------------------------------------------------

uses(
    "keras",
    PrivateName(
        "keras",
        "keras",
        "Layer._flatten_layers",
        "every layer of a model, whose <layer>/output paths layout rules may match",
    ),
    PrivateName(
        "keras",
        "keras",
        "Model.compile",
        "recording what a model's own code compiles it with where compiling cannot run (the abstract build)",
        source_contains="weighted_metrics",
    ),
    PrivateName(
        "keras",
        "keras.src.callbacks.callback_list",
        "CallbackList",
        "letting Keras fetch step logs on worker threads while "
        "meshrun's callbacks run (their async_safe attribute)",
        source_contains="async_safe",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.variables",
        "Variable.__init__",
        "the initializer of a block's weight, which the "
        "weights of pipelined blocks stacked from it start with",
        source_contains="self._initializer = initializer",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.variables",
        "initialize_all_variables",
        "leaving a pipelined block's template weights unmade (only their shapes and initializers are used)",
        source_contains='"uninitialized_variables"',
    ),
    PrivateName(
        "keras",
        "keras.src.layers.layer",
        "Layer",
        "telling a pipelined block's frozen weights (made to train, then frozen) from its state (seed "
        "generators, moving statistics): a layer's _trainable_variables",
        source_contains="self._trainable_variables = trainable_variables",
    ),
)

uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.ops.function",
        "Function._run_through_graph",
        "rebuilding a functional model with its blocks replaced by pipelined ones (KerasHub's LMs)",
        source_contains="call_fn",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.variables",
        "Variable.__init__",
        "dropping the arrays of block weights once they are stacked (release_values)",
        source_contains="self._value = None",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.jax.core",
        "JaxVariable._initialize",
        "giving a variable made without a value its first "
        "one, laid out where it already lies (initialize_with)",
        source_contains="self._direct_assign(value)",
    ),
)


def initialize_with(variable, value) -> None:
    """Gives `variable`, made without a value (weights_described_only), `value` as its first, laid
    out as the distribution says: a value laid out so already is not copied (where `assign` would
    need a first value to replace, and Keras' own initial values may take a whole copy on one
    device)."""
    ensure("keras")
    variable._initialize(value)


def release_values(variables) -> None:
    """Drops the arrays of `variables`, which nothing reads again: the weights of blocks that
    pipelined stacks were made from. (The model's old graph still reaches those blocks, through the
    nodes of the layers it shares with the new one, so they would otherwise stay in memory.)"""
    ensure("keras")
    for variable in variables:
        variable._value = None


def building_abstractly() -> bool:
    """Whether variables made now get shapes alone, no values (inside a keras.StatelessScope: the
    plan's abstract build)."""
    ensure("keras")
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    return in_stateless_scope()


def rerun_functional(model, inputs, call):
    """The outputs of functional `model`'s graph applied to `inputs`, each of its layers' calls made
    by `call(layer, *args, **kwargs)` (which may call something else instead)."""
    ensure("keras")
    return model._run_through_graph(inputs, operation_fn=lambda operation: operation, call_fn=call)


ASYNC_SAFE = "async_safe"  # the attribute Keras' CallbackList reads on each callback
COMPILED_ARGUMENTS = ("loss", "metrics", "weighted_metrics")  # what compile_recorded records


def initializer_of(variable):
    """The initializer `variable` was created with (None for one created from a value)."""
    ensure("keras")
    return variable._initializer


@contextlib.contextmanager
def weights_described_only():
    """Layers built in the block have weights with shapes, dtypes and initializers but no values,
    and never get them: Keras would otherwise make them at its next initialization of deferred
    variables."""
    ensure("keras")
    import keras
    from keras.src.backend.common import global_state

    before = list(global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True))
    with keras.StatelessScope(initialize_variables=False):
        yield
    global_state.set_global_attribute("uninitialized_variables", before)


def frozen_weights(layer) -> list:
    """The weights of `layer` (and the layers inside it) made to train but frozen (trainable=False
    set on their layer), as opposed to state a layer keeps by design (moving statistics, seed
    generators' states), which is non-trainable from the start."""
    ensure("keras")
    return [
        v
        for sub in layer._flatten_layers(include_self=True)
        for v in sub._trainable_variables
        if not v.trainable
    ]


def sublayers(model) -> list:
    """Every layer inside `model`, nested ones included (not the model itself)."""
    ensure("keras")
    return list(model._flatten_layers(include_self=False))


@contextlib.contextmanager
def compile_recorded():
    """While in force, `keras.Model.compile` records what models were compiled with instead of
    compiling them: the abstract build runs the user's factory in a StatelessScope, where creating
    an optimizer fails. Yields {id(model): its loss, metrics and weighted_metrics as given} for
    the models compiled with a loss."""
    ensure("keras")
    import keras

    compiled: dict[int, dict] = {}
    original = keras.Model.compile
    takes = inspect.signature(original)

    def record(model, *args, **kwargs):
        given = takes.bind(model, *args, **kwargs).arguments
        if given.get("loss") is not None:
            compiled[id(model)] = {k: given[k] for k in COMPILED_ARGUMENTS if given.get(k) is not None}

    keras.Model.compile = record
    try:
        yield compiled
    finally:
        keras.Model.compile = original


def mark_async_safe(callback, safe: bool = True):
    """Tells Keras whether it may call the per-step hooks of `callback` (a class or an instance)
    from worker threads while its loop dispatches the next steps; returns `callback`, so it serves
    as a class decorator."""
    setattr(callback, ASYNC_SAFE, safe)
    return callback


def is_async_safe(callback) -> bool:
    """Whether Keras may call the per-step hooks of `callback` from worker threads."""
    return bool(getattr(callback, ASYNC_SAFE, False))


# --- LoRA dropout --------------------------------------------------------------------------------

uses(
    "keras",
    PrivateName(
        "keras",
        "keras",
        "layers.Dense.kernel.fget",
        "LoRA dropout: a Dense layer's kernel holds its LoRA update merged in (adapted_kernel)",
        source_contains="self.lora_kernel_a, self.lora_kernel_b",
    ),
    PrivateName(
        "keras",
        "keras",
        "layers.EinsumDense.kernel.fget",
        "LoRA dropout: an EinsumDense layer's kernel holds its LoRA update merged in (adapted_kernel)",
        source_contains="self.lora_kernel_a, self.lora_kernel_b",
    ),
    PrivateName(
        "keras",
        "keras.src.ops.operation",
        "Operation.__call__",
        "LoRA dropout: a call set on a layer instance is the one Keras runs (replace_call)",
        source_contains="call_fn = self.call",
    ),
)


def adapted_kernel(layer):
    """The kernel of a Dense or EinsumDense `layer` with its LoRA update (alpha / rank * A @ B)
    merged in, as Keras computes it each call when LoRA is on."""
    ensure("keras")
    return layer.kernel


def replace_call(layer, call) -> None:
    """Makes `call` what `layer` runs when called (its own call is left on its class)."""
    ensure("keras")
    layer.call = call


# --- variables laid out by the distribution ---------------------------------------------------------

uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.backend.jax.core",
        "JaxVariable._initialize_layout",
        "laying out the weights of pipelined blocks on their stages' devices while a model is built: "
        "Keras asks the distribution in force through its instance (variable_layouts)",
        source_contains="distribution.get_variable_layout(self)",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.jax.core",
        "JaxVariable._initialize_layout",
        "telling a variable made with a layout of its own from one the distribution lays out "
        "(layout_of: a variable's _layout)",
        source_contains="self._layout is None",
    ),
)


def layout_of(variable):
    """The layout `variable` was made with or was given by the distribution (its _layout: a
    TensorLayout, a jax sharding, or None where it has none yet)."""
    ensure("keras")
    return getattr(variable, "_layout", None)


@contextlib.contextmanager
def variable_layouts(distribution, layout):
    """While the block runs, each variable made under `distribution` without a layout of its own is
    laid out by `layout(variable)` instead of `distribution.get_variable_layout` (which `layout` may
    call): set on this instance alone, which Keras asks for each variable it makes."""
    ensure("keras")
    distribution.get_variable_layout = layout
    try:
        yield
    finally:
        del distribution.get_variable_layout


# --- a preset's weights straight onto their shards -------------------------------------------------

uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.backend.jax.core",
        "JaxVariable._direct_assign",
        "putting a weight read from a file onto its shards "
        "without a whole copy on one device (load_onto_shards)",
        source_contains="self._value = value",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.jax.core",
        "JaxVariable._initialize_with_initializer",
        "starting a variable as zeros on its shards where a file's "
        "weights replace its initial values (load_onto_shards)",
        source_contains="self._initialize_layout()",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.variables",
        "Variable.__init__",
        "the dtype a variable stores, whatever autocast scope is in force (load_onto_shards)",
        source_contains="self._dtype",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.stateless_scope",
        "in_stateless_scope",
        "leaving what happens inside a StatelessScope to Keras (load_onto_shards), and stacking pipelined "
        "blocks' values only where they have some (building_abstractly)",
    ),
)


@contextlib.contextmanager
def load_onto_shards(on_placed=None, every_weight_read: bool = False):
    """Where a model's weights are read from files under a distribution (from_preset), keeps every
    device at the bytes the layout gives it. While in force:

    - a variable that the distribution lays out starts as zeros made on its shards, instead of
      running its initializer, whose values the file's replace next (XLA's random numbers for a
      large variable take several times its size in temporaries, on the host with CPU devices);
    - assigning an array held on the host (the numpy array Keras' weight loading read from the
      file) to such a variable drops the old value and copies each device's slice of the array
      straight onto that device. Keras' own assign copies the whole array onto one device first,
      which runs out of memory for a preset larger than one device (keras #21634). `on_placed()`
      runs after each such placement (where loading peaks).

    Variables the files did not fill get their initializer's values when the block ends. Anything
    else goes to Keras.

    With `every_weight_read` (the caller assigns each variable inside the block: a transformers
    checkpoint, meshrun.hf.load), a laid-out variable starts with no value at all, which Keras
    allows while a model is traced for its shapes (it stands in zeros there, abstract ones), so no
    zeros are made and copied onto the devices only to be replaced."""
    ensure("keras")
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.jax.core import JaxVariable

    waiting = {}  # id -> (variable, initializer): zeros until the files fill them, in creation order
    keras_initialize, keras_assign = JaxVariable._initialize_with_initializer, JaxVariable.assign
    had_own_assign = "assign" in JaxVariable.__dict__

    def initialize(variable, initializer):
        variable._initialize_layout()
        sharding = _sharding_of(variable)
        if sharding is None or in_stateless_scope():
            return keras_initialize(variable, initializer)
        if every_weight_read:
            variable._value, variable._initializer = None, _abstract_zeros
        else:
            variable._value = _zeros_on_shards(tuple(variable.shape), sharding, variable._dtype)
        waiting[id(variable)] = (variable, initializer)

    def assign(variable, value):
        zeros = waiting.pop(id(variable), None) is not None
        sharding = _host_value_sharding(variable, value)
        if sharding is None:
            return keras_assign(variable, value)
        old, variable._value = variable._value, None  # the old value goes first: the new one takes its place
        if (
            zeros and old is not None and sys.getrefcount(old) <= 2
        ):  # our zeros, held by nothing else (`old`, the call's argument)
            old.delete()  # at once: dropping the last reference frees the buffers later, beside the new ones
        del old
        placed = _place_slices(value, tuple(variable.shape), sharding, variable._dtype)
        if on_placed is not None:
            on_placed()
        variable._direct_assign(placed)
        return placed

    JaxVariable._initialize_with_initializer, JaxVariable.assign = initialize, assign
    try:
        with weights_read_a_slice_at_a_time():
            yield
    finally:
        JaxVariable._initialize_with_initializer = keras_initialize
        if had_own_assign:
            JaxVariable.assign = keras_assign
        else:
            del JaxVariable.assign
    for variable, initializer in waiting.values():
        keras_initialize(variable, initializer)


uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.saving.saving_lib",
        "H5IOStore.__getitem__",
        "reading a weight of a Keras weights file a slice at a time as it goes onto its shards "
        "(weights_read_a_slice_at_a_time): the store reads each whole, from its h5 group",
        source_contains="self._h5_entry_group",
    ),
)


@contextlib.contextmanager
def weights_read_a_slice_at_a_time():
    """While in force, a weight that Keras reads from a weights file (`model.weights.h5`, not a
    sharded one) is handed over as an H5Weight, read from the file only where indexed, instead of
    a whole array: load_onto_shards then reads each device's slice alone, and the host never holds
    a large weight whole."""
    import h5py
    from keras.src.saving.saving_lib import H5IOStore

    keras_getitem = H5IOStore.__getitem__

    def getitem(store, key):
        found = store._h5_entry_group.get(key) if type(store) is H5IOStore and "/" not in key else None
        if not isinstance(found, h5py.Dataset) or not found.shape:
            return keras_getitem(store, key)
        return H5Weight(found)

    H5IOStore.__getitem__ = getitem
    try:
        yield
    finally:
        H5IOStore.__getitem__ = keras_getitem


class H5Weight:
    """A weight in a Keras weights file, read only where indexed (`weight[index]`), or whole by
    numpy.asarray; bfloat16 as Keras reads it (stored with a dtype attribute)."""

    def __init__(self, dataset):
        import ml_dtypes
        import numpy as np

        self.dataset = dataset
        self.shape = tuple(dataset.shape)
        self.ndim = len(self.shape)
        stored = dataset.attrs.get("dtype") if "dtype" in dataset.attrs else None
        self.dtype = np.dtype(ml_dtypes.bfloat16) if stored == "bfloat16" else dataset.dtype

    def __getitem__(self, index):
        import numpy as np

        return np.array(self.dataset[index], dtype=self.dtype)

    def __array__(self, dtype=None, copy=None):
        whole = self[()]
        return whole if dtype is None else whole.astype(dtype)


def _abstract_zeros(shape, dtype=None):
    """What a variable without a value stands for while Keras traces a model for its shapes."""
    import jax

    return jax.numpy.zeros(shape, dtype)


def _sharding_of(variable):
    """The jax sharding of a variable's layout, or None when it has none."""
    import jax
    from keras.distribution import TensorLayout

    layout = layout_of(variable)
    sharding = layout.backend_layout if isinstance(layout, TensorLayout) else layout
    return sharding if isinstance(sharding, jax.sharding.Sharding) else None


def _host_value_sharding(variable, value):
    """The sharding to put `value` on when load_onto_shards places it: a value on the host of the
    variable's shape, assigned outside a StatelessScope to a variable with a layout; else None."""
    import jax
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    if isinstance(value, jax.Array) or in_stateless_scope():
        return None
    if not hasattr(value, "__getitem__") or tuple(getattr(value, "shape", ())) != tuple(variable.shape):
        return None  # not an array, or Keras' own error about the shape
    return _sharding_of(variable)


def _place_slices(value, shape: tuple, sharding, dtype):
    """`value` (an array on the host) as a jax array of `sharding`: each local device gets a copy of
    its slice alone, one distinct slice copied out at a time."""
    import numpy as np

    stored = _numpy_dtype(dtype)
    return _on_each_device(shape, sharding, lambda index: np.array(value[index], dtype=stored))


def _zeros_on_shards(shape: tuple, sharding, dtype):
    """Zeros of `shape` as a jax array of `sharding`, made shard by shard."""
    import numpy as np

    stored = _numpy_dtype(dtype)
    return _on_each_device(shape, sharding, lambda index: np.zeros(_slice_shape(index, shape), dtype=stored))


def _numpy_dtype(dtype):
    """The numpy dtype of a Keras dtype name (bfloat16 included)."""
    import jax
    import numpy as np

    return np.dtype(jax.numpy.dtype(dtype))


def _slice_shape(index: tuple, shape: tuple) -> tuple:
    return tuple(len(range(*part.indices(size))) for part, size in zip(index, shape, strict=True))


def _on_each_device(shape: tuple, sharding, read_slice):
    """A jax array of `shape` and `sharding` whose shards are `read_slice(index)` (a numpy array),
    made one distinct slice at a time and copied onto the devices that hold it."""
    import jax

    slices: dict = {}  # the slice's bounds -> its index and the devices that hold it
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        bounds = tuple(part.indices(size) for part, size in zip(index, shape, strict=True))
        slices.setdefault(bounds, (index, []))[1].append(device)
    from meshrun.system.load_memory import unsampled

    shards = []
    for index, devices in slices.values():
        host = read_slice(index)
        shards.extend(jax.device_put(host, device) for device in devices)
        del host
    with unsampled():  # until the parts are dropped, they and the whole share their buffers
        whole = jax.make_array_from_single_device_arrays(shape, sharding, shards)
        shards.clear()
    return whole


# --- a quantized base (model.quantize) --------------------------------------------------------------

# Keras' int8 and int4 layers (3.14 and 3.15 alike): a group of its own, checked only by runs that
# quantize, so that a Keras that lays them out otherwise still runs everything else.
QUANTIZE = "keras_quantize"
uses(
    QUANTIZE,
    PrivateName(
        "keras",
        "keras.src.layers.layer",
        "Layer.__new__",
        "building Dense and EinsumDense layers straight into their quantized form: a layer wraps the "
        "build its class has when it is made (quantized_builds)",
        source_contains="original_build_method = obj.build",
    ),
    PrivateName(
        "keras",
        "keras.src.layers.core.einsum_dense",
        "EinsumDense._set_quantization_info",
        "the axes an EinsumDense's kernel is reduced over (quantized_kernel_facts)",
        source_contains="self._kernel_reduced_axes",
    ),
    PrivateName(
        "keras",
        "keras.src.layers.core.einsum_dense",
        "EinsumDense._adjust_scale_for_quant",
        "an EinsumDense's int8 scales in the layout Keras stores them (int8_scale_as_stored)",
        source_contains="scale = ops.transpose(scale, transpose_axes)",
    ),
    PrivateName(
        "keras",
        "keras.src.layers.core.einsum_dense",
        "EinsumDense._int4_build",
        "an EinsumDense's int4 kernel: its float kernel reshaped to (reduced, other) rows and columns and "
        "packed along the columns (quantized_kernel_facts)",
        source_contains="self.original_kernel_shape = kernel_shape",
    ),
    PrivateName(
        "keras",
        "keras.src.layers.core.dense",
        "Dense._int4_build",
        "a Dense layer's int4 kernel: packed along its output dimension (quantized_kernel_facts)",
        source_contains="self._orig_output_dim = output_dim",
    ),
)


@contextlib.contextmanager
def dense_layers_patched(name: str, replacement):
    """While in force, method `name` of Keras' Dense and EinsumDense classes is
    `replacement(cls, keras_method)` (a function of the layer and the method's arguments), for
    those classes exactly (Keras' own `quantize` takes no subclass either)."""
    from keras import layers

    originals = {cls: cls.__dict__[name] for cls in (layers.Dense, layers.EinsumDense)}
    for cls, method in originals.items():
        setattr(cls, name, replacement(cls, method))
    try:
        yield
    finally:
        for cls, method in originals.items():
            setattr(cls, name, method)


@contextlib.contextmanager
def quantized_builds(policy_of):
    """While in force, each Dense and EinsumDense layer made and built gets the dtype policy named
    `policy_of(layer)` (such as `int8_from_float32`; None leaves it as it is) just before it
    builds, so that it makes its variables in their quantized form (an int8 kernel and its scales)
    and its float kernel never exists. Keras does the same for a layer whose saved config holds a
    quantized policy. A layer wraps the build its class has when it is made: make it inside."""
    ensure(QUANTIZE)
    from keras import dtype_policies

    def quantizing(cls, keras_build):
        @functools.wraps(keras_build)  # Keras reads the build's signature for the shapes it passes
        def build(self, *args, **kwargs):
            if type(self) is cls and self.dtype_policy.quantization_mode is None:
                name = policy_of(self)
                if name:
                    self.dtype_policy = dtype_policies.get(name)
            return keras_build(self, *args, **kwargs)

        return build

    with dense_layers_patched("build", quantizing):
        yield


def quantized_kernel_facts(layer) -> dict:
    """What the quantized form of a built int8 or int4 Dense or EinsumDense `layer` is made of: the
    float kernel's shape (`float_shape`), the axes of it the layer's matmul reduces over
    (`reduced`), and for int4 the block of rows each scale covers (`block_size`, None: one scale per
    column) and the 2-D (rows, columns) the float kernel is reshaped to before its columns are
    packed two to a byte (`rows`, `columns`)."""
    ensure(QUANTIZE)
    from keras import layers

    mode = layer.quantization_mode
    if isinstance(layer, layers.EinsumDense):
        layer._set_quantization_info()
        reduced = tuple(int(a) for a in layer._kernel_reduced_axes)
        shape = tuple(layer.original_kernel_shape) if mode == "int4" else tuple(layer._kernel.shape)
    else:
        reduced = (0,)
        shape = (
            (layer._orig_input_dim, layer._orig_output_dim) if mode == "int4" else tuple(layer._kernel.shape)
        )
    facts = {
        "float_shape": tuple(int(s) for s in shape),
        "reduced": reduced,
        "variables": {
            role: getattr(layer, name, None)
            for role, name in (
                ("kernel", "_kernel"),
                ("scale", "kernel_scale"),
                ("zero", "kernel_zero"),
                ("index", "g_idx"),
            )
        },
    }
    if mode == "int8":
        facts["scale_holds"] = _int8_scale_holds(layer, len(shape), reduced)
    if mode == "int4":
        rows = math.prod(size for axis, size in enumerate(facts["float_shape"]) if axis in reduced)
        block = getattr(layer, "_int4_block_size", None)
        facts.update(
            rows=rows,
            columns=math.prod(facts["float_shape"]) // rows,
            block_size=None if block in (None, -1) else int(block),
        )
    return facts


def _int8_scale_holds(layer, rank: int, reduced: tuple[int, ...]) -> tuple[int | None, ...]:
    """For each dimension of an int8 layer's stored scale, the float kernel axis it runs along
    (None: a dimension of size 1): Keras' transform of the scales applied to the axes."""
    from keras import layers

    held = [None if axis in reduced else axis for axis in range(rank)]
    if not isinstance(layer, layers.EinsumDense):
        return tuple(held[1:])  # a Dense layer's scale: one per output
    if layer._kernel_transpose_axes:
        held = [held[a] for a in layer._kernel_transpose_axes]
    for axis in sorted(layer._kernel_expand_axes):
        held.insert(axis, None)
    for axis in sorted(layer._kernel_squeeze_axes, reverse=True):
        held.pop(axis)
    return tuple(held)


def int8_scale_as_stored(layer, scale):
    """`scale` (the per-column scales of an int8 kernel, the float kernel's shape with its reduced
    axes kept as 1) in the layout the layer stores it: a Dense's one per output, an EinsumDense's
    transposed and squeezed as its equation needs."""
    ensure(QUANTIZE)
    import numpy as np
    from keras import layers

    if isinstance(layer, layers.EinsumDense):
        return np.asarray(layer._adjust_scale_for_quant(scale, "kernel"))
    return np.squeeze(scale, axis=0)


uses(
    QUANTIZE,
    PrivateName(
        "keras",
        "keras.src.quantizers",
        "dequantize_with_sz_map",
        "an int4 kernel quantized by blocks of rows, back to float as Keras' own layer computes it, for "
        "the merged float export of a QLoRA run (dequantized_kernel)",
    ),
    PrivateName(
        "keras",
        "keras.src.layers.core.einsum_dense",
        "EinsumDense._adjust_scale_for_dequant",
        "an EinsumDense's stored int8 scales laid out as its kernel, to dequantize it (dequantized_kernel)",
        source_contains="reverse_transpose",
    ),
)


def dequantized_kernel(layer, read=None):
    """The float kernel (of its float shape, as a float32 numpy array) that a built int8 or int4
    Dense or EinsumDense `layer` computes with: its quantized values times their scales (int4: less
    their zero points, unpacked and reshaped back), as Keras' own layer dequantizes them; its LoRA
    adapters are not in it. Each variable is read onto the host whole by `read(variable)` (default:
    numpy of its value, for arrays this process holds whole)."""
    ensure(QUANTIZE)
    import numpy as np
    from keras import layers, quantizers
    from keras.src.quantizers import dequantize_with_sz_map

    read = read or (lambda variable: np.asarray(variable.value))
    facts = quantized_kernel_facts(layer)
    kernel = read(facts["variables"]["kernel"])
    scale = read(layer.kernel_scale).astype("float32")
    if layer.quantization_mode == "int8":
        if isinstance(layer, layers.EinsumDense):
            scale = np.asarray(layer._adjust_scale_for_dequant(scale))
        return kernel.astype("float32") / scale
    values = np.asarray(quantizers.unpack_int4(kernel, facts["columns"], axis=-1))
    if facts["block_size"]:
        zero, index = read(layer.kernel_zero), read(layer.g_idx)
        flat = np.asarray(dequantize_with_sz_map(values, scale, zero, index, group_axis=0), dtype="float32")
    else:
        flat = values.astype("float32") / scale
    return flat.reshape(facts["float_shape"])
