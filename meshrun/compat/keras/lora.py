"""meshrun's LoRA on Keras' Dense and EinsumDense layers, as PEFT's: an adapter of rank r on the
layer's kernel seen as a (in_features, out_features) matrix, in_features the product of the kernel's
axes the input is reduced over and out_features that of the axes the output gets (a q/k/v kernel
(hidden, heads, head_dim): hidden in, heads * head_dim out; the output projection (heads, head_dim,
hidden): heads * head_dim in, hidden out). A is (in_features, r), B is (r, out_features), the update
alpha / r * A @ B reshaped to the kernel's shape. Keras' own `enable_lora` gives an EinsumDense one A
of the kernel's shape with its last axis replaced by r and one B (r, last axis), which for a q/k/v
kernel is an A per head and an update of rank heads * r: not PEFT's adapter.

The adapter's variables are the layer's own (`lora_kernel_a`, `lora_kernel_b`, float32), so they
train, checkpoint and are placed as its other weights; the layer's call is replaced by one that adds
the adapter's product to Keras' own call (float, int8 or int4 alike: Keras' LoRA stays off), and its
save (model.keras, a preset) writes the kernel with the update merged in. Importing this module
imports neither Keras nor jax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.utils.tracking",
        "Tracker.unlock",
        "adding LoRA adapters to a built Dense or EinsumDense layer (add_adapter), as Keras' own "
        "enable_lora does: a built layer's tracker is locked",
    ),
    PrivateName(
        "keras",
        "keras.src.ops.operation",
        "Operation.__call__",
        "LoRA: a call set on a layer instance is the one Keras runs (add_adapter)",
        source_contains="call_fn = self.call",
    ),
    PrivateName(
        "keras",
        "keras.src.ops.operation",
        "Operation.__call__",
        "LoRA: a quantized layer runs its quantized_call instead of its call (add_adapter)",
        source_contains="call_fn = self.quantized_call",
    ),
    PrivateName(
        "keras",
        "keras",
        "layers.EinsumDense.save_own_variables",
        "LoRA: an adapted EinsumDense saves its kernel with the update merged in (save_with): Keras "
        "saves the kernel variables _get_kernel_with_merged_lora returns",
        source_contains="self._get_kernel_with_merged_lora()",
    ),
    PrivateName(
        "keras",
        "keras",
        "layers.Dense.save_own_variables",
        "LoRA: an adapted Dense layer saves its kernel with the update merged in (save_with)",
        source_contains="self._get_kernel_with_merged_lora()",
    ),
)

ADAPTER_ATTRIBUTE = "meshrun_lora"  # the LoraAdapter an adapted layer carries
A_NAME, B_NAME = "lora_kernel_a", "lora_kernel_b"  # the adapter's variables, named as Keras names its own
DENSE_EQUATION = "...a,ab->...b"  # a Dense layer's matmul, as an einsum


@dataclass(frozen=True)
class LoraGeometry:
    """How a rank-r adapter lies on a kernel: the kernel's (float) shape, its axes the input is
    reduced over (`reduced`) and those the output gets (`produced`), each in the kernel's order, and
    the layer's einsum equation (a Dense layer's matmul as DENSE_EQUATION)."""

    equation: str
    kernel_shape: tuple[int, ...]
    reduced: tuple[int, ...]
    produced: tuple[int, ...]

    @property
    def in_features(self) -> int:
        return math.prod(self.kernel_shape[axis] for axis in self.reduced)

    @property
    def out_features(self) -> int:
        return math.prod(self.kernel_shape[axis] for axis in self.produced)

    def parameters(self, rank: int) -> int:
        """The adapter's parameters at `rank`: r * (in_features + out_features), as PEFT's."""
        return rank * (self.in_features + self.out_features)

    def delta(self, a, b, scale: float, xp):
        """The update scale * A @ B of the kernel's shape, computed with `xp` (numpy or jax.numpy)."""
        flat = xp.matmul(a, b) * scale
        sizes = [self.kernel_shape[axis] for axis in (*self.reduced, *self.produced)]
        order = sorted(range(len(sizes)), key=lambda i: (*self.reduced, *self.produced)[i])
        return xp.transpose(xp.reshape(flat, sizes), order)

    def product_equations(self) -> tuple[str, str]:
        """The two einsums of the adapter's product: the input with A (the reduced axes, then the
        rank) to the output's other axes and the rank, then that with B (the rank, then the
        produced axes) to the output."""
        inputs, kernel, output = _parts(self.equation)
        rank = next(
            c for c in "zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPONMLKJIHGFEDCBA" if c not in self.equation
        )
        reduced = "".join(kernel[axis] for axis in self.reduced)
        produced = "".join(kernel[axis] for axis in self.produced)
        kept = "".join(c for c in output if c not in produced)
        return f"{inputs},{reduced}{rank}->{kept}{rank}", f"{kept}{rank},{rank}{produced}->{output}"


def _parts(equation: str) -> tuple[str, str, str]:
    operands, output = equation.replace(" ", "").split("->")
    inputs, kernel = operands.split(",")
    return inputs, kernel, output


def geometry(equation: str, kernel_shape: tuple[int, ...]) -> LoraGeometry:
    """The LoraGeometry of a kernel of `kernel_shape` under einsum `equation`. ValueError when an
    axis of the kernel is neither reduced nor only the output's (one both the input and the output
    have: a kernel per head, which PEFT's Linear adapter does not cover)."""
    inputs, kernel, output = _parts(equation)
    if "." in kernel or len(kernel) != len(kernel_shape):
        raise ValueError(f"its equation {equation!r} does not fit its kernel of shape {kernel_shape}")
    reduced = tuple(i for i, c in enumerate(kernel) if c in inputs and c not in output)
    produced = tuple(i for i, c in enumerate(kernel) if c in output and c not in inputs)
    if len(reduced) + len(produced) != len(kernel) or not reduced or not produced:
        raise ValueError(
            f"its equation {equation!r} keeps a kernel axis in both its input and its output, so its kernel "
            "is no (in_features, out_features) matrix"
        )
    return LoraGeometry(equation, tuple(int(s) for s in kernel_shape), reduced, produced)


def layer_geometry(layer) -> LoraGeometry:
    """The LoraGeometry of a built Dense or EinsumDense `layer` (an int8 or int4 one: of its float
    kernel). ValueError where no adapter fits it (geometry)."""
    from keras import layers

    if layer.quantization_mode is not None:
        from meshrun.compat.keras.quantized import quantized_kernel_facts

        shape = quantized_kernel_facts(layer)["float_shape"]
    else:
        shape = tuple(layer.kernel.shape)
    equation = layer.equation if isinstance(layer, layers.EinsumDense) else DENSE_EQUATION
    return geometry(equation, shape)


@dataclass(frozen=True)
class LoraAdapter:
    """The adapter on one layer: its geometry, rank and alpha, its variables A (in_features, rank)
    and B (rank, out_features), and the share of its input dropped in training (`dropout`, drawn
    from `seeds`; 0: none)."""

    geometry: LoraGeometry
    rank: int
    alpha: float
    a: object
    b: object
    dropout: float = 0.0
    seeds: object = None

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def delta(self, xp=None):
        """The update alpha / rank * A @ B of the kernel's shape, in float32, on the devices that hold
        A and B (`xp`: jax.numpy by default; numpy reads them onto the host)."""
        if xp is None:
            import jax.numpy as xp
        return self.geometry.delta(xp.asarray(self.a.value), xp.asarray(self.b.value), self.scale, xp)

    def product(self, inputs):
        """alpha / rank * B A x for the layer's input `inputs`, shaped as the layer's output, computed
        in the inputs' dtype through the rank."""
        from keras import ops

        down, up = self.geometry.product_equations()
        g = self.geometry
        a = ops.reshape(ops.cast(self.a, inputs.dtype), [g.kernel_shape[i] for i in g.reduced] + [self.rank])
        b = ops.reshape(ops.cast(self.b, inputs.dtype), [self.rank] + [g.kernel_shape[i] for i in g.produced])
        return ops.multiply(ops.einsum(up, ops.einsum(down, inputs, a), b), self.scale)


def adapter_of(layer) -> LoraAdapter | None:
    """The LoraAdapter on `layer`, None where it has none."""
    return getattr(layer, ADAPTER_ATTRIBUTE, None)


def add_adapter(layer, rank: int, alpha: float) -> LoraAdapter:
    """Puts a rank-`rank` adapter on a built Dense or EinsumDense `layer` (layer_geometry must fit
    it): A drawn as PEFT draws lora_A (uniform in +-1/sqrt(in_features)), B zeros, both float32 and
    trainable; the layer's call (a quantized layer's quantized_call) then gives its own call's
    output (its activation taken off and applied after) plus the adapter's product, of its input
    dropped in training where the adapter has dropout (drop_inputs). Its own weights are left as
    they are (frozen by the caller)."""
    ensure("keras")
    from keras import initializers, ops, random

    shape = layer_geometry(layer)
    # PEFT's lora_A: kaiming_uniform_(a=sqrt(5)), which is uniform in +-1/sqrt(in_features).
    peft_uniform = initializers.VarianceScaling(scale=1 / 3, mode="fan_in", distribution="uniform")
    layer._tracker.unlock()
    try:
        a = layer.add_weight(
            name=A_NAME, shape=(shape.in_features, rank), initializer=peft_uniform, dtype="float32"
        )
        b = layer.add_weight(
            name=B_NAME, shape=(rank, shape.out_features), initializer="zeros", dtype="float32"
        )
        layer.lora_kernel_a, layer.lora_kernel_b = a, b
    finally:
        layer._tracker.lock()
    adapter = LoraAdapter(shape, rank, alpha, a, b)
    setattr(layer, ADAPTER_ATTRIBUTE, adapter)
    activation, layer.activation = layer.activation, None
    # What Keras runs when the layer is called: a quantized layer's quantized_call, else its call.
    runs = "quantized_call" if layer.quantization_mode is not None else "call"
    own_call = getattr(layer, runs)

    def call(inputs, training=None):
        outputs = own_call(inputs, training=training)
        adapter = adapter_of(layer)
        if training and adapter.dropout:
            inputs = random.dropout(inputs, adapter.dropout, seed=adapter.seeds)
        outputs = ops.add(outputs, ops.cast(adapter.product(inputs), outputs.dtype))
        return outputs if activation is None else activation(outputs)

    setattr(layer, runs, call)
    return adapter


def drop_inputs(layer, rate: float, seeds) -> None:
    """Makes the adapter on `layer` drop a share `rate` of its input in training, the masks drawn
    from the seed generator `seeds` (PEFT's lora_dropout: the layer's own kernel sees all of it)."""
    setattr(layer, ADAPTER_ATTRIBUTE, replace(adapter_of(layer), dropout=rate, seeds=seeds))


class _Substituted:
    """A Keras weights store whose writes of some variables (by identity) write other values."""

    def __init__(self, store, values: dict):
        self._store, self._values = store, values

    def __setitem__(self, key, value):
        self._store[key] = self._values.get(id(value), value)

    def __getitem__(self, key):
        return self._store[key]

    def __getattr__(self, name):
        return getattr(self._store, name)


def save_with(layer, substitutes) -> None:
    """Makes `layer`'s save (model.save, a KerasHub preset) write `substitutes()` (values by
    `id(variable)`: its kernel with the adapter merged, for a quantized layer also its scales) in
    place of those variables' own values; its variables themselves are left as they are."""
    ensure("keras")
    keras_save = layer.save_own_variables

    def save_own_variables(store):
        keras_save(_Substituted(store, substitutes()))

    layer.save_own_variables = save_own_variables
