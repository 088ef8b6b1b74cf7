"""transformer: a decoder-only language model, GPT style with pre-layer-norm blocks.

tokens -> token_embedding + position_embedding -> block_0 .. block_{L-1} -> final_norm -> head
Each block: x + attention(ln_1(x)) (causal multi-head), then x + mlp_down(gelu(mlp_up(ln_2(x)))).
The head computes logits = x @ E^T with the token embedding's E (tied) or its own (vocab, d_model)
matrix `head/embeddings` (untied), so one layout rule places both the same way.

Variable paths (what layout rules match):
    token_embedding/embeddings          (vocab, d_model)
    position_embedding/embeddings       (seq_len, d_model)
    block_N/attention/{query,key,value}/kernel   (d_model, heads, head_dim)   bias (heads, head_dim)
    block_N/attention/attention_output/kernel    (heads, head_dim, d_model)   bias (d_model,)
    block_N/mlp_up/kernel   (d_model, ff)   bias (ff,)
    block_N/mlp_down/kernel (ff, d_model)   bias (d_model,)
    block_N/ln_{1,2}/{gamma,beta}, final_norm/{gamma,beta}   (d_model,)
    head/embeddings (vocab, d_model)    (untied head only)

With a stage mesh axis (meshrun.pipeline) the blocks are one layer `blocks` holding each block
weight stacked, `blocks/stacked_attention_query_kernel` (layers, d_model, heads, head_dim) and so on;
the layout rules above still place them (the stack's first dimension goes over the stage axis).

Layouts: transformer_tp (its default), transformer_fsdp, transformer_2d, replicated.
Loss: next-token cross-entropy on logits; data: synthetic token sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.config.fields import setting
from meshrun.errors import ConfigError
from meshrun.models.registry import (
    ModelSpec,
    class_accuracy,
    fill_from_preset,
    register_model,
    require_positive,
)

# Sizes from CI-tiny to 7B-class. 7b: LLaMA-7B's width and depth with a GELU MLP of 4 x d_model,
# 6.74e9 parameters.
PRESETS = {
    "tiny": dict(layers=2, d_model=64, heads=8, ff=256, vocab=512, seq_len=32, tied_head=True),
    "small": dict(layers=4, d_model=256, heads=8, ff=1024, vocab=8192, seq_len=128, tied_head=True),
    "125m": dict(layers=12, d_model=768, heads=12, ff=3072, vocab=50304, seq_len=1024, tied_head=True),
    "1b": dict(layers=24, d_model=2048, heads=16, ff=8192, vocab=32000, seq_len=2048, tied_head=False),
    "7b": dict(layers=32, d_model=4096, heads=32, ff=16384, vocab=32000, seq_len=2048, tied_head=False),
}


@dataclass(frozen=True)
class TransformerOptions:
    """The language model's sizes: a named preset, any field of which can be overridden."""

    preset: str = setting("tiny", "The sizes: tiny, small, 125m, 1b or 7b; the keys below override it.")
    layers: int | None = setting(None, "Transformer blocks; null: the preset's.")
    d_model: int | None = setting(None, "The model width; null: the preset's.")
    heads: int | None = setting(None, "Attention heads (they divide d_model); null: the preset's.")
    ff: int | None = setting(None, "The MLP's hidden width; null: the preset's.")
    vocab: int | None = setting(None, "The vocabulary size; null: the preset's.")
    seq_len: int | None = setting(None, "Tokens per sequence; null: the preset's.")
    tied_head: bool | None = setting(
        None, "Whether the output head shares the token embedding; null: the preset's."
    )
    dropout: float = setting(0.0, "The dropout rate.")

    def __post_init__(self):
        fill_from_preset(self, PRESETS)
        require_positive(self, "layers", "d_model", "heads", "ff", "vocab", "seq_len")
        if self.d_model % self.heads:
            raise ConfigError(
                "model.heads",
                f"got {self.heads}, which does not divide model.d_model={self.d_model}; "
                f"use a divisor of {self.d_model}",
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("model.dropout", f"got {self.dropout}; expected 0 <= dropout < 1")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.heads


def matmul_params(options: TransformerOptions) -> int:
    """Parameters that take part in a matmul for every token: the blocks' weights and the head
    (the token embedding when tied). Embedding lookups cost no FLOPs, so untied input embeddings
    and position embeddings are left out."""
    d, ff = options.d_model, options.ff
    per_block = 4 * d * d + 4 * d + 2 * d * ff + ff + d + 4 * d  # attention, mlp, two layer norms
    return options.layers * per_block + 2 * d + d * options.vocab


def analytic_flops(options: TransformerOptions, batch_size: int, variables=None) -> float:
    """6 * N * tokens for one train step (forward 2N, backward 4N per token), N = matmul_params.
    It leaves out attention's score and value products (12 * layers * seq_len * d_model per token)."""
    return 6.0 * matmul_params(options) * batch_size * options.seq_len


def build(options: TransformerOptions):
    """Builds the functional language model; its output is logits of shape (batch, seq_len, vocab)."""
    import keras

    from meshrun.models import transformer_layers as layers
    from meshrun.pipeline import repeated_blocks

    tokens = keras.Input(shape=(options.seq_len,), dtype="int32", name="tokens")
    token_embedding = keras.layers.Embedding(options.vocab, options.d_model, name="token_embedding")
    x = token_embedding(tokens)
    x = layers.PositionEmbedding(options.seq_len, name="position_embedding")(x)
    x = repeated_blocks(lambda name: layers.DecoderBlock(options, name=name), options.layers)(x)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    tied_to = token_embedding if options.tied_head else None
    logits = layers.Head(options.vocab, tied_to=tied_to, name="head")(x)
    return keras.Model(tokens, logits, name="transformer")


SPEC = register_model(
    ModelSpec(
        name="transformer",
        options=TransformerOptions,
        build=build,
        layouts=("transformer_tp", "transformer_fsdp", "transformer_2d", "replicated", "auto"),
        data="tokens",
        loss=lambda options: _next_token_loss(),
        description="decoder-only language model, presets tiny to 7b",
        metrics=class_accuracy,
        tokens_per_sample=lambda options: options.seq_len,
        analytic_flops=analytic_flops,
        language_model=True,
    )
)


def _next_token_loss():
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, name="next_token_crossentropy")
