"""Small KerasHub causal LMs of a named family, with random weights and a tokenizer trained on given
text (meshrun.text.tokenizer_training): what `meshrun preset` saves as a preset to try fine-tuning
with, offline, and what the tests' presets are (tests/presets.py).

- gemma: GemmaCausalLM; SentencePiece as Gemma's (<pad> 0, <eos> 1, <bos> 2, <unk> 3, the chat turn
  markers <start_of_turn> 4 and <end_of_turn> 5, no dummy prefix).
- llama: Llama3CausalLM; byte-level BPE with Llama 3's five special tokens last.
- mistral: MistralCausalLM; SentencePiece as Mistral 7B's (<unk> 0, <s> 1, </s> 2, a dummy prefix).
- gpt2: GPT2CausalLM; byte-level BPE with <|endoftext|> last; one key/value head per query head.

The sizes are a PresetShape: the feed-forward is twice the hidden size wide and each head
hidden / query heads wide. The same texts, shape and seed give the same tokenizer and weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meshrun.compat.keras.startup import import_keras, set_random_seed
from meshrun.models.hub.presets import import_keras_hub
from meshrun.text.tokenizer_training import (
    GEMMA_SENTENCEPIECE,
    MISTRAL_SENTENCEPIECE,
    SentencePieceSetup,
    byte_level_bpe,
    sentencepiece_proto,
    vocabulary_and_merges,
)

# Tokens the byte-level BPE families add after the trained ones (as the real models have them last).
GPT2_SPECIAL_TOKENS = ("<|endoftext|>",)
TOKENIZER_LIBRARIES = {"SentencePiece": "sentencepiece", "byte-level BPE": "tokenizers"}
LLAMA3_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)


@dataclass(frozen=True)
class PresetShape:
    """The sizes of a small causal LM: ids in its vocabulary (and its tokenizer's), transformer
    blocks, hidden size, query and key/value heads, the preprocessor's sequence length (a
    fine-tune's default model.seq_len), dropout, and the seed its weights are drawn with."""

    vocabulary_size: int = 512
    num_layers: int = 2
    hidden_dim: int = 64
    num_query_heads: int = 8
    num_key_value_heads: int = 1
    sequence_length: int = 64
    dropout: float = 0  # stored as the backbones' own default is (0, not 0.0)
    seed: int = 0

    @property
    def head_dim(self) -> int:
        """Each attention head's width."""
        return self.hidden_dim // self.num_query_heads

    @property
    def intermediate_dim(self) -> int:
        """The feed-forward layer's width."""
        return 2 * self.hidden_dim


@dataclass(frozen=True)
class Family:
    """A model family `meshrun preset` makes: its KerasHub task class, its tokenizer (the kind, in
    words, `train(texts, shape, key)` giving the keyword arguments of the KerasHub class
    `tokenizer_class`), how its backbone is built (`backbone(keras_hub, shape)`), its default
    (query, key/value) heads, whether it groups several query heads on one key/value head and
    whether it has rotary position embeddings (GPT-2 has neither)."""

    name: str
    task: str
    tokenizer_kind: str
    tokenizer_class: str
    train: Callable[[Sequence[str], PresetShape, str], dict]
    backbone: Callable[[Any, PresetShape], Any]
    heads: tuple[int, int]
    grouped: bool = True
    rotary: bool = True

    @property
    def preprocessor(self) -> str:
        """The name of its KerasHub CausalLMPreprocessor class."""
        return f"{self.task}Preprocessor"

    @property
    def library(self) -> str:
        """The module its tokenizer is trained with."""
        return TOKENIZER_LIBRARIES[self.tokenizer_kind]


def causal_lm(family: Family, texts: Sequence[str], shape: PresetShape, key: str):
    """A `family` causal LM of `shape` with a tokenizer trained on `texts` and a preprocessor of
    shape.sequence_length tokens, weights drawn with shape.seed; a ConfigError on `key` when the
    text cannot give the tokenizer's vocabulary."""
    return assemble(family, tokenizer(family, family.train(texts, shape, key)), shape)


def tokenizer(family: Family, trained: dict):
    """The family's KerasHub tokenizer layer made of what its `train` gave."""
    return getattr(_keras_hub().models, family.tokenizer_class)(**trained)


def assemble(family: Family, tokenizer_layer, shape: PresetShape):
    """A `family` causal LM of `shape` around `tokenizer_layer` (a KerasHub tokenizer of
    shape.vocabulary_size ids), weights drawn with shape.seed."""
    keras_hub = _keras_hub()
    set_random_seed(shape.seed, tensorflow_seed=shape.seed)
    backbone = family.backbone(keras_hub, shape)
    preprocessor = getattr(keras_hub.models, family.preprocessor)(
        tokenizer_layer, sequence_length=shape.sequence_length
    )
    return getattr(keras_hub.models, family.task)(backbone=backbone, preprocessor=preprocessor)


def _keras_hub():
    """keras_hub, on Keras' jax backend (which keras_hub would not choose when it imports Keras)."""
    import_keras()
    return import_keras_hub()


def bpe_vocabulary(texts: Sequence[str], special_tokens: Sequence[str], shape: PresetShape, key: str) -> dict:
    """The vocabulary and merges of a byte-level BPE trained on `texts`, special tokens last, as
    KerasHub's BytePairTokenizer classes take them (keyword arguments)."""
    vocabulary, merges = vocabulary_and_merges(
        byte_level_bpe(texts, special_tokens, shape.vocabulary_size, key)
    )
    return {"vocabulary": vocabulary, "merges": merges}


def _sentencepiece(setup: SentencePieceSetup):
    def train(texts: Sequence[str], shape: PresetShape, key: str) -> dict:
        return {"proto": sentencepiece_proto(texts, shape.vocabulary_size, setup, key)}

    return train


def _byte_level(special_tokens: Sequence[str]):
    def train(texts: Sequence[str], shape: PresetShape, key: str) -> dict:
        return bpe_vocabulary(texts, special_tokens, shape, key)

    return train


def _gemma_backbone(keras_hub, shape: PresetShape):
    return keras_hub.models.GemmaBackbone(
        vocabulary_size=shape.vocabulary_size,
        num_layers=shape.num_layers,
        num_query_heads=shape.num_query_heads,
        num_key_value_heads=shape.num_key_value_heads,
        hidden_dim=shape.hidden_dim,
        intermediate_dim=shape.intermediate_dim,
        head_dim=shape.head_dim,
        dropout=shape.dropout,
    )


def _grouped_backbone(class_name: str):
    """A builder of Llama-style backbones (Llama 3, Mistral), which take the same arguments."""

    def backbone(keras_hub, shape: PresetShape):
        return getattr(keras_hub.models, class_name)(
            vocabulary_size=shape.vocabulary_size,
            num_layers=shape.num_layers,
            num_query_heads=shape.num_query_heads,
            num_key_value_heads=shape.num_key_value_heads,
            hidden_dim=shape.hidden_dim,
            intermediate_dim=shape.intermediate_dim,
            dropout=shape.dropout,
        )

    return backbone


def _gpt2_backbone(keras_hub, shape: PresetShape):
    """GPT-2's position table holds twice the preprocessor's sequence length, so a fine-tune can
    use longer rows."""
    return keras_hub.models.GPT2Backbone(
        vocabulary_size=shape.vocabulary_size,
        num_layers=shape.num_layers,
        num_heads=shape.num_query_heads,
        hidden_dim=shape.hidden_dim,
        intermediate_dim=shape.intermediate_dim,
        dropout=shape.dropout,
        max_sequence_length=2 * shape.sequence_length,
    )


FAMILIES = {
    family.name: family
    for family in (
        Family(
            "gemma",
            "GemmaCausalLM",
            "SentencePiece",
            "GemmaTokenizer",
            _sentencepiece(GEMMA_SENTENCEPIECE),
            _gemma_backbone,
            (8, 1),
        ),
        Family(
            "llama",
            "Llama3CausalLM",
            "byte-level BPE",
            "Llama3Tokenizer",
            _byte_level(LLAMA3_SPECIAL_TOKENS),
            _grouped_backbone("Llama3Backbone"),
            (8, 2),
        ),
        Family(
            "mistral",
            "MistralCausalLM",
            "SentencePiece",
            "MistralTokenizer",
            _sentencepiece(MISTRAL_SENTENCEPIECE),
            _grouped_backbone("MistralBackbone"),
            (8, 2),
        ),
        Family(
            "gpt2",
            "GPT2CausalLM",
            "byte-level BPE",
            "GPT2Tokenizer",
            _byte_level(GPT2_SPECIAL_TOKENS),
            _gpt2_backbone,
            (8, 8),
            grouped=False,
            rotary=False,
        ),
    )
}
