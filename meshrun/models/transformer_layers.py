"""The transformer's own layers (meshrun.models.transformer). A module of their own, imported when a
transformer is built, so that importing the model registry does not import keras. They are
registered with Keras (package `meshrun`), so an exported model.keras loads with
`keras.saving.load_model` once this module is imported."""

from __future__ import annotations

import dataclasses

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="meshrun")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position to its input."""

    def __init__(self, seq_len, **kwargs):
        super().__init__(**kwargs)
        self.seq_len = seq_len

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            shape=(self.seq_len, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
            name="embeddings",
        )

    def call(self, x):
        return x + ops.cast(self.embeddings, x.dtype)[None, : ops.shape(x)[1]]

    def get_config(self):
        return {**super().get_config(), "seq_len": self.seq_len}


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """What a decoder block is built from: the model's width, its attention heads, the MLP's hidden
    width and the dropout rate (the fields of the model's TransformerOptions a block reads)."""

    d_model: int
    heads: int
    ff: int
    dropout: float

    @classmethod
    def of(cls, options) -> BlockSizes:
        """The sizes in `options`: the model's TransformerOptions, or a saved config's dict of them
        (which may hold the model's other fields too)."""
        read = options.get if isinstance(options, dict) else lambda name: getattr(options, name)
        return cls(**{field.name: read(field.name) for field in dataclasses.fields(cls)})

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.heads


@keras.saving.register_keras_serializable(package="meshrun")
class DecoderBlock(keras.layers.Layer):
    """One pre-layer-norm decoder block: causal self-attention, then the MLP, each residual.
    `options`: the model's TransformerOptions, or their fields as a dict (a saved config's)."""

    def __init__(self, options, **kwargs):
        super().__init__(**kwargs)
        self.options = options = BlockSizes.of(options)
        self.ln_1 = keras.layers.LayerNormalization(epsilon=1e-5, name="ln_1")
        self.attention = keras.layers.MultiHeadAttention(
            options.heads, options.head_dim, dropout=options.dropout, name="attention"
        )
        self.ln_2 = keras.layers.LayerNormalization(epsilon=1e-5, name="ln_2")
        self.mlp_up = keras.layers.Dense(options.ff, activation="gelu", name="mlp_up")
        self.mlp_down = keras.layers.Dense(options.d_model, name="mlp_down")
        self.dropout = keras.layers.Dropout(options.dropout)

    def build(self, input_shape):
        self.ln_1.build(input_shape)
        self.attention.build(input_shape, input_shape)
        self.ln_2.build(input_shape)
        self.mlp_up.build(input_shape)
        self.mlp_down.build((*input_shape[:-1], self.mlp_up.units))

    def compute_output_shape(self, input_shape):
        # Given, Keras builds the functional model without tracing the block's call through jax
        # (a plan of the 7b preset's 32 blocks in a third of the time).
        return input_shape

    def call(self, x, training=None):
        h = self.ln_1(x)
        x = x + self.attention(h, h, use_causal_mask=True, training=training)
        h = self.mlp_down(self.mlp_up(self.ln_2(x)))
        return x + self.dropout(h, training=training)

    def get_config(self):
        return {**super().get_config(), "options": dataclasses.asdict(self.options)}


@keras.saving.register_keras_serializable(package="meshrun")
class Head(keras.layers.Layer):
    """Logits x @ E^T from a (vocab, d_model) matrix E: the token embedding's own when tied,
    else the head's `embeddings`, laid out like the token embedding so one rule fits both.

    Keras cannot save a weight shared between two layers, so a tied head saves as an untied one
    holding a copy of E: a saved model computes the same logits, but its head no longer trains
    with the embedding."""

    def __init__(self, vocab, tied_to=None, **kwargs):
        super().__init__(**kwargs)
        self.vocab = vocab
        # A list, so Keras does not track the tied embedding as a sub-layer: its variable
        # keeps the single path token_embedding/embeddings.
        self._tied_to = [tied_to] if tied_to is not None else []

    def build(self, input_shape):
        if not self._tied_to:
            self.embeddings = self.add_weight(
                shape=(self.vocab, input_shape[-1]),
                initializer=keras.initializers.RandomNormal(stddev=0.02),
                name="embeddings",
            )

    def call(self, x):
        matrix = self._tied_to[0].embeddings if self._tied_to else self.embeddings
        return ops.matmul(x, ops.transpose(ops.cast(matrix, x.dtype)))

    def get_config(self):
        return {**super().get_config(), "vocab": self.vocab}  # saved untied (the class docstring says why)

    def save_own_variables(self, store):
        if self._tied_to:
            store["0"] = self._tied_to[0].embeddings.numpy()
        else:
            super().save_own_variables(store)
