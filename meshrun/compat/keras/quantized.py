"""Keras' int8 and int4 layers as a quantized base (model.quantize) uses them past Keras' public
API: Dense and EinsumDense layers built straight into their quantized form, what a quantized
kernel is made of (its float shape, reduced axes, int4 rows, columns and blocks), int8 scales in
the layout Keras stores them, and a quantized kernel back to float (the merged export of a QLoRA
run). Its names are a group of their own (keras_quantize), checked only by runs that quantize.
Importing this module imports neither Keras nor jax."""

from __future__ import annotations

import contextlib
import functools
import math

from meshrun.compat.keras.class_patches import dense_layers_patched
from meshrun.compat.names import PrivateName, ensure, uses

QUANTIZE = "keras_quantize"  # the group of this module's names
_BUILDS_AND_KERNEL_FACTS = uses(
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


_DEQUANTIZING = uses(
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


PRIVATE_NAMES = _BUILDS_AND_KERNEL_FACTS + _DEQUANTIZING
