"""KerasHub, as meshrun uses it past its public API: the layout of the LoRA weights file that
`Backbone.save_lora_weights` writes, whose adapters meshrun rescales (meshrun.models.hub_export).
Importing this module imports no KerasHub."""

from __future__ import annotations

from meshrun.compat.names import PrivateName, ensure, uses

LORA_KERNEL_B_DATASET = "lora_kernel_b"  # the name of each adapter's B matrix in a .lora.h5 file

uses(
    "keras_hub",
    PrivateName("keras-hub", "keras_hub.models", "Backbone.save_lora_weights",
                f"the LoRA adapters in a .lora.h5 file, each B matrix a dataset named {LORA_KERNEL_B_DATASET!r}",
                source_contains=f'["{LORA_KERNEL_B_DATASET}"]'),
)


def lora_kernel_b_dataset() -> str:
    """The name of the datasets that hold the adapters' B matrices in a file of
    `Backbone.save_lora_weights`."""
    ensure("keras_hub")
    return LORA_KERNEL_B_DATASET
