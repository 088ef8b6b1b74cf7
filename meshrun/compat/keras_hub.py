"""KerasHub, as meshrun uses it past its public API: the layout of the LoRA weights file that
`Backbone.save_lora_weights` writes, whose adapters meshrun rescales (meshrun.models.hub_export),
and which byte-pair tokenizers split text as their base class does (meshrun.text.tokenizer).
Importing this module imports no KerasHub."""

from __future__ import annotations

from meshrun.compat.names import PrivateName, ensure, uses

LORA_KERNEL_B_DATASET = "lora_kernel_b"  # the name of each adapter's B matrix in a .lora.h5 file

uses(
    "keras_hub",
    PrivateName("keras-hub", "keras_hub.models", "Backbone.save_lora_weights",
                f"the LoRA adapters in a .lora.h5 file, each B matrix a dataset named {LORA_KERNEL_B_DATASET!r}",
                source_contains=f'["{LORA_KERNEL_B_DATASET}"]'),
    PrivateName("keras-hub", "keras_hub.tokenizers", "BytePairTokenizer._tokenize_tf",
                "telling a byte-pair tokenizer that splits text its own way (its class redefines how it tokenizes, "
                "as MistralTekkenTokenizer does) from one that splits as GPT-2 does, where TensorFlow is not there to check"),
)


def lora_kernel_b_dataset() -> str:
    """The name of the datasets that hold the adapters' B matrices in a file of
    `Backbone.save_lora_weights`."""
    ensure("keras_hub")
    return LORA_KERNEL_B_DATASET


def splits_as_byte_pair_tokenizer(layer) -> bool:
    """Whether a KerasHub BytePairTokenizer `layer` tokenizes as the base class does (GPT-2's
    split: GPT2Tokenizer, Llama3Tokenizer, QwenTokenizer, ...): no class between its own and
    BytePairTokenizer redefines a method of the base class that tokenizes or reads the merges
    (MistralTekkenTokenizer and CLIPTokenizer do, to split text their own way)."""
    ensure("keras_hub")
    from keras_hub.tokenizers import BytePairTokenizer

    mro = type(layer).__mro__
    if BytePairTokenizer not in mro:
        return False
    tokenizing = {name for name in vars(BytePairTokenizer) if "tokenize" in name or "merges" in name}
    return not any(tokenizing & set(vars(cls)) for cls in mro[: mro.index(BytePairTokenizer)])
