"""A quantized frozen base (model.quantize=int8|int4), for QLoRA: the Dense and EinsumDense layers
of a model are built straight into Keras' quantized form, and each gets its weights quantized from
the float ones as they are read, one layer at a time, so the float model never exists whole.

- int8: Keras' `quantize("int8")`: one scale per output column (absmax over the reduced axes); the
  layer quantizes its inputs per call too (int8 matmuls).
- int4: Keras' `quantize("int4")`: the float kernel reshaped to (reduced, other) rows and columns,
  a scale and zero point per block of 128 rows and column, two values packed to a byte along the
  columns; the inputs stay float (weight-only).

The quantized values are those Keras' own `layer.quantize(mode)` gives for the same float weights
(the same formulas, applied a block of columns or rows at a time). Which layers a file filled is
kept by the build that reads them (filled_from_files), so that fill_from_initializers draws the
others. Importing this module imports numpy, not keras; its functions import keras.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection
from contextvars import ContextVar

import numpy as np

from meshrun.compat.keras.class_patches import dense_layers_patched
from meshrun.compat.keras.lora import adapter_of
from meshrun.compat.keras.quantized import (
    dequantized_kernel,
    int8_scale_as_stored,
    quantized_builds,
    quantized_kernel_facts,
)
from meshrun.errors import ConfigError
from meshrun.specs.quantized import COLUMNS, QUANTIZE_MODES, ROWS, QuantizedOf

INT4_BLOCK_SIZE = 128  # Keras' default for quantize("int4")
# The set (of layer ids) the build in force records the layers quantize_into fills in (filled_from_files).
_filled: ContextVar[set[int] | None] = ContextVar("meshrun_quantized_filled", default=None)
# The float block quantized at a time. Keras' quantizers make a few temporaries of a block's size, so
# the host holds about four blocks beside the weight: 4 MiB blocks keep that under 20 MiB (at 16 MiB,
# a 32 MiB kernel took 72 MiB more while it was quantized) and are as quick (scripts/bench_load.py).
CHUNK_BYTES = 4 << 20


def policy_name(mode: str, base: str) -> str:
    """The Keras dtype policy of a layer quantized by `mode` whose float policy is `base`."""
    return f"int4/{INT4_BLOCK_SIZE}_from_{base}" if mode == "int4" else f"int8_from_{base}"


@contextlib.contextmanager
def quantized_layers(mode: str | None):
    """While in force, every Dense and EinsumDense layer made is built quantized by `mode` (nothing
    changes for None), and one whose weights load from a float model's file quantizes them as they
    are read (loading_float_weights). The kernels of the others start as zeros, until
    `fill_from_initializers` draws them."""
    if mode is None:
        yield
        return
    with quantized_builds(lambda layer: policy_name(mode, layer.dtype_policy.name)), loading_float_weights():
        yield


def check_quantized(model, mode: str, name: str) -> None:
    """ConfigError on model.quantize when `model` (built) has no Dense or EinsumDense layer that was
    quantized."""
    if not quantized(model):
        raise ConfigError(
            "model.quantize",
            f"got {mode!r}, but {name} has no Dense or EinsumDense layer to quantize (Keras quantizes "
            "those, exactly those classes); valid for it: null",
        )


def quantized(model) -> list:
    """The layers of `model` that hold a quantized kernel (int8 or int4)."""
    from meshrun.compat.keras.models import sublayers

    layers = sublayers(model)
    return [layer for layer in layers if getattr(layer, "quantization_mode", None) in QUANTIZE_MODES]


def quantized_by_kernel(model) -> dict:
    """The quantized layers of `model` by their kernel's path (the path a float kernel has in a
    file or checkpoint)."""
    return {f"{layer.path}/kernel": layer for layer in quantized(model)}


def variable_facts(model) -> dict:
    """The QuantizedOf (meshrun.specs.quantized) of every variable of `model`'s quantized layers,
    by path: what float kernel each stands for and how its dimensions hold it."""
    found = {}
    for layer in quantized(model):
        facts = quantized_kernel_facts(layer)
        variables = facts["variables"]
        kernel, shape = variables["kernel"].path, facts["float_shape"]
        if layer.quantization_mode == "int8":
            holds = {"kernel": tuple(range(len(shape))), "scale": facts["scale_holds"]}
            rows, packed = None, False
        else:
            per_block = (None, COLUMNS) if facts["block_size"] else (COLUMNS,)
            holds = {"kernel": (ROWS, COLUMNS), "scale": per_block, "zero": per_block, "index": (None,)}
            rows, packed = facts["rows"], True
        for role, variable in variables.items():
            if variable is not None:
                found[variable.path] = QuantizedOf(
                    kernel, shape, role, holds[role], rows=rows, packed=packed and role == "kernel"
                )
    return found


def float_model_params(model) -> int:
    """`model.count_params()` as the float model it was quantized from has them: each quantized
    kernel counts its float kernel's elements, a quantization's scales, zero points and row indices
    none (as the plan counts them, meshrun.placement.plan.Plan.params); a float model's own count."""
    facts = variable_facts(model)
    held = sum(math.prod(v.shape) for v in model.weights if v.path in facts)
    float_kernels = sum(math.prod(f.float_shape) for f in facts.values() if f.role == "kernel")
    return int(model.count_params()) - held + float_kernels


def quantize_into(layer, kernel) -> None:
    """Assigns `layer` (an int8 or int4 Dense or EinsumDense) the quantized form of `kernel`, its
    float kernel (an array of its float shape, e.g. read from a file): the int8 or packed int4
    values, their scales and (int4) zero points, as Keras' `quantize` computes them. The host holds
    `kernel`, the quantized values and one float block of CHUNK_BYTES at a time."""
    for variable, value in quantized_values(layer, kernel):
        variable.assign(value)
    filled = _filled.get()
    if filled is not None:
        filled.add(id(layer))


def quantized_values(layer, kernel) -> list[tuple[object, np.ndarray]]:
    """The quantized form of `kernel` (an array of the float shape of `layer`, an int8 or int4
    Dense or EinsumDense) as (variable, value) pairs of the layer's variables: the int8 or packed
    int4 values, their scales, (int4 by blocks) zero points and row groups."""
    facts = quantized_kernel_facts(layer)
    if tuple(kernel.shape) != facts["float_shape"]:
        raise ValueError(
            f"{layer.path}: a float kernel of shape {facts['float_shape']} was expected, got {kernel.shape}"
        )
    if layer.quantization_mode == "int8":
        values, scale = _int8(kernel, facts["reduced"])
        return [
            (facts["variables"]["kernel"], values),
            (layer.kernel_scale, int8_scale_as_stored(layer, scale)),
        ]
    flat = np.asarray(kernel).reshape(facts["rows"], facts["columns"])
    block = facts["block_size"]
    packed, scale, zero = _int4_grouped(flat, block) if block else _int4_per_column(flat)
    pairs = [(facts["variables"]["kernel"], packed), (layer.kernel_scale, scale)]
    if block:
        groups = np.floor_divide(np.arange(facts["rows"], dtype="float32"), block)
        pairs += [(layer.kernel_zero, zero), (layer.g_idx, groups)]
    return pairs


@contextlib.contextmanager
def filled_from_files():
    """While in force, the quantized layers quantize_into fills (from a file's float weights as
    they load: a KerasHub preset, a transformers checkpoint) are recorded, by id, in the set it
    yields, which the caller keeps for fill_from_initializers once the model is built."""
    filled: set[int] = set()
    token = _filled.set(filled)
    try:
        yield filled
    finally:
        _filled.reset(token)


def _chunks(size: int, bytes_per_unit: int, multiple: int = 1):
    """Slices of range(size) of about CHUNK_BYTES each (a multiple of `multiple` long)."""
    step = max(multiple, CHUNK_BYTES // max(bytes_per_unit, 1) // multiple * multiple)
    for start in range(0, size, step):
        yield slice(start, min(size, start + step))


def _int8(kernel, reduced: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """int8 values and per-column scales (reduced axes kept as 1), a block of columns at a time
    along the kernel's first axis that is not reduced (`kernel`: an array, or a file's weight read
    where indexed)."""
    from keras import quantizers

    axis = next(a for a in range(len(kernel.shape)) if a not in reduced)
    values = np.empty(kernel.shape, dtype="int8")
    scale_shape = tuple(1 if a in reduced else s for a, s in enumerate(kernel.shape))
    scale = None
    unit = math.prod(kernel.shape) * np.dtype(kernel.dtype).itemsize // kernel.shape[axis]
    for part in _chunks(kernel.shape[axis], unit):
        index = (slice(None),) * axis + (part,)
        block = np.asarray(kernel[index])
        quantized, block_scale = quantizers.abs_max_quantize(block, axis=list(reduced), to_numpy=True)
        values[index] = np.asarray(quantized)
        block_scale = np.asarray(block_scale)
        if scale is None:
            scale = np.empty(scale_shape, dtype=block_scale.dtype)
        scale[index] = block_scale
    return values, scale


def _int4_grouped(flat: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Packed int4 values, scales and zero points per block of `block` rows, a few blocks at a time."""
    from keras import quantizers

    rows, columns = flat.shape
    packed = np.empty((rows, (columns + 1) // 2), dtype="int8")
    groups = -(-rows // block)
    scale = zero = None
    for part in _chunks(rows, flat.nbytes // rows, multiple=block):
        values, block_scale, block_zero = quantizers.abs_max_quantize_grouped_with_zero_point(
            flat[part], block_size=block, to_numpy=True
        )
        packed[part] = np.asarray(quantizers.pack_int4(values, axis=-1)[0])
        block_scale, block_zero = np.asarray(block_scale), np.asarray(block_zero)
        if scale is None:
            scale = np.empty((groups, columns), dtype=block_scale.dtype)
            zero = np.empty((groups, columns), dtype=block_zero.dtype)
        found = slice(part.start // block, part.start // block + block_scale.shape[0])
        scale[found], zero[found] = block_scale, block_zero
    return packed, scale, zero


def _int4_per_column(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    """Packed int4 values and one scale per column, an even block of columns at a time."""
    from keras import quantizers

    rows, columns = flat.shape
    packed = np.empty((rows, (columns + 1) // 2), dtype="int8")
    scale = None
    for part in _chunks(columns, flat.nbytes // columns, multiple=2):
        values, block_scale = quantizers.abs_max_quantize(
            flat[:, part], axis=0, value_range=(-8, 7), dtype="int8", to_numpy=True
        )
        packed[:, part.start // 2 : -(-part.stop // 2)] = np.asarray(quantizers.pack_int4(values, axis=-1)[0])
        block_scale = np.asarray(block_scale)[0]
        if scale is None:
            scale = np.empty((columns,), dtype=block_scale.dtype)
        scale[part] = block_scale
    return packed, scale, None


def fill_from_initializers(model, filled: Collection[int] = ()) -> None:
    """Fills every quantized layer of `model` that no file filled (`filled`: the ids of those that
    one did, filled_from_files; a new backbone, the user's own model: none) with its kernel
    initializer's values, quantized: the base a float build would have drawn, one layer's float
    kernel at a time."""
    import keras

    for layer in quantized(model):
        if id(layer) in filled:
            continue
        facts = quantized_kernel_facts(layer)
        drawn = layer.kernel_initializer(facts["float_shape"], dtype=layer.variable_dtype)
        quantize_into(layer, np.asarray(keras.ops.convert_to_numpy(drawn)))
        del drawn


@contextlib.contextmanager
def loading_float_weights():
    """While in force, a quantized Dense or EinsumDense whose weights are loaded from a float
    model's file (a KerasHub preset: its store holds the float kernel where the quantized form
    would hold the packed one) quantizes the float kernel as it is read (quantize_into) and takes
    its bias as it is; any other load is Keras' own."""

    def loading(cls, keras_load):
        def load_own_variables(self, store):
            if self.quantization_mode not in QUANTIZE_MODES or not _holds_float_kernel(self, store):
                return keras_load(self, store)
            quantize_into(self, store["0"])
            if self.bias is not None:
                self.bias.assign(store["1"])

        return load_own_variables

    with dense_layers_patched("load_own_variables", loading):
        yield


def _holds_float_kernel(layer, store) -> bool:
    """Whether a layer's saved `store` holds a float kernel of its float shape first (a float
    model's file) rather than its quantized form."""
    try:
        first = store["0"]
    except KeyError:
        return False
    shape = quantized_kernel_facts(layer)["float_shape"]
    return tuple(first.shape) == shape and np.dtype(first.dtype).kind not in "iub"


def merged_kernel(layer, read=None):
    """A quantized layer's float kernel (float32 numpy) with its LoRA adapter merged: the
    dequantized kernel + alpha / rank * A @ B (meshrun.compat.keras.lora), as the adapted layer
    computes with them. `read` reads a variable onto the host whole
    (compat.keras.quantized.dequantized_kernel)."""
    read = read or (lambda variable: np.asarray(variable.value))
    kernel = dequantized_kernel(layer, read)
    adapter = adapter_of(layer)
    if adapter is not None:
        a, b = (read(variable).astype("float32") for variable in (adapter.a, adapter.b))
        kernel = kernel + adapter.geometry.delta(a, b, adapter.scale, np)
    return kernel
