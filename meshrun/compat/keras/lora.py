"""Keras' LoRA as meshrun's LoRA dropout uses it past Keras' public API: the kernel of a Dense or
EinsumDense layer with its LoRA update merged in, and a call set on a layer instance, which Keras
runs instead of its class's. Importing this module imports neither Keras nor jax."""

from __future__ import annotations

from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
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
