"""A preset's weights loaded straight onto their shards under a distribution, past Keras' public
API (load_onto_shards): Keras' JAX variables start as zeros made on their shards (or as no value,
where the caller fills every one), and a weight read on the host goes onto each device a slice at
a time, never whole onto one device. Importing this module imports neither Keras nor jax."""

from __future__ import annotations

import contextlib
import sys

from meshrun.compat.keras.class_patches import methods_replaced
from meshrun.compat.keras.h5_weights import weights_read_a_slice_at_a_time
from meshrun.compat.keras.variable_layouts import layout_of
from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
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
        "leaving what happens inside a StatelessScope to Keras (load_onto_shards)",
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
    from keras.src.backend.jax.core import JaxVariable

    loading = _ShardedLoading(
        JaxVariable._initialize_with_initializer, JaxVariable.assign, on_placed, every_weight_read
    )
    with methods_replaced(
        JaxVariable,
        _initialize_with_initializer=lambda variable, initializer: loading.initialize(variable, initializer),
        assign=lambda variable, value: loading.assign(variable, value),
    ):
        with weights_read_a_slice_at_a_time():
            yield
    loading.initialize_unfilled()


class _ShardedLoading:
    """What load_onto_shards keeps while in force: Keras' own initialization and assignment of a
    JAX variable (what it leaves the rest to), and the laid-out variables that started without
    their initializer's values, in creation order, until the files fill them."""

    def __init__(self, keras_initialize, keras_assign, on_placed, every_weight_read: bool):
        self.keras_initialize, self.keras_assign = keras_initialize, keras_assign
        self.on_placed, self.every_weight_read = on_placed, every_weight_read
        self.waiting = {}  # id -> (variable, initializer): zeros until the files fill them

    def initialize(self, variable, initializer):
        """A laid-out variable starts as zeros on its shards (no value with every_weight_read);
        any other, as Keras starts it."""
        from keras.src.backend.common.stateless_scope import in_stateless_scope

        variable._initialize_layout()
        sharding = _sharding_of(variable)
        if sharding is None or in_stateless_scope():
            return self.keras_initialize(variable, initializer)
        if self.every_weight_read:
            variable._value, variable._initializer = None, _abstract_zeros
        else:
            variable._value = _zeros_on_shards(tuple(variable.shape), sharding, variable._dtype)
        self.waiting[id(variable)] = (variable, initializer)

    def assign(self, variable, value):
        """A value on the host goes onto a laid-out variable's shards a slice at a time, its old
        value dropped first; any other, as Keras assigns it."""
        zeros = self.waiting.pop(id(variable), None) is not None
        sharding = _host_value_sharding(variable, value)
        if sharding is None:
            return self.keras_assign(variable, value)
        _drop_value(variable, ours=zeros)
        placed = _place_slices(value, tuple(variable.shape), sharding, variable._dtype)
        if self.on_placed is not None:
            self.on_placed()
        variable._direct_assign(placed)
        return placed

    def initialize_unfilled(self) -> None:
        """The variables the files did not fill get their initializer's values."""
        for variable, initializer in self.waiting.values():
            self.keras_initialize(variable, initializer)


def _drop_value(variable, ours: bool) -> None:
    """Drops `variable`'s value before a new one takes its place; zeros of ours (`ours`) that
    nothing else holds are deleted at once: dropping the last reference frees the buffers later,
    beside the new ones."""
    old, variable._value = variable._value, None
    if ours and old is not None and sys.getrefcount(old) <= 2:  # held by `old` and the call's argument
        old.delete()
    del old


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
