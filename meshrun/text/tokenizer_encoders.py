"""The library encoders a TextTokenizer encodes and decodes with: SentencePiece (C++) and Hugging
Face `tokenizers` (Rust), each a batch on every core, and KerasHub's own tokenizer layer run as
tf.data runs it (its TensorFlow graph), the reference the other two are checked against; the library
encoder for a KerasHub tokenizer layer (`fast_encoder`: SentencePiece, or a Hugging Face byte-level
BPE built from its vocabulary and merges); and `same_ids`, how two encodings are compared.

Each encoder has `backend`, `library`, `encode`, `decode`, `token_id`, `token_text` and
`special_tokens`. Importing this module imports none of jax, keras, keras_hub and tensorflow (each
encoder imports its library when made or used).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np


def available_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def same_ids(encoded: Sequence, reference: Sequence) -> bool:
    """Whether two encodings of the same texts hold the same ids, text by text."""
    return len(encoded) == len(reference) and all(
        np.array_equal(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        for a, b in zip(encoded, reference, strict=True)
    )


class HuggingFaceEncoder:
    """Encodes with a Hugging Face `tokenizers.Tokenizer` (Rust, a batch on every core)."""

    backend = "tokenizers"
    library = "Hugging Face tokenizers"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # encode_batch_fast skips the offsets encode_batch computes (tokenizers >= 0.20)
        self._encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self._encode_batch(texts, add_special_tokens=False)]

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Each text's ids and, for each id, the (start, end) of the characters it stands for: the
        special tokens in the text read as the tokenizer reads them, as transformers' `tokenizer(text,
        add_special_tokens=False)` encodes a rendered chat."""
        return [(e.ids, e.offsets) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.id_to_token(token_id) or ""

    def special_tokens(self) -> dict[str, int]:
        return {added.content: int(i) for i, added in self.tokenizer.get_added_tokens_decoder().items()}


class SentencePieceEncoder:
    """Encodes with a SentencePiece model (C++, a batch on every core)."""

    backend = "sentencepiece"
    library = "SentencePiece"

    def __init__(self, proto: bytes):
        import sentencepiece

        self.processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
        self.threads = available_cores()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.processor.encode(texts, out_type=int, num_threads=self.threads)

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(ids)  # control tokens (pad, bos, eos) decode to nothing

    def token_id(self, token: str) -> int | None:
        found = self.processor.piece_to_id(token)  # the unknown token's id for a piece it lacks
        return found if self.processor.id_to_piece(found) == token else None

    def token_text(self, token_id: int) -> str:
        return self.processor.id_to_piece(token_id)

    def special_tokens(self) -> dict[str, int]:
        """Control pieces (<bos>, <eos>: never read from text) and the user-defined ones written
        as markers (<start_of_turn>), which the model proto alone tells apart: a piece in angle
        brackets, not a byte, that text encodes to as one id."""
        processor, found = self.processor, {}
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if processor.is_control(i) or (
                piece.startswith("<")
                and piece.endswith(">")
                and not processor.is_byte(i)
                and not processor.is_unknown(i)
                and processor.encode(piece) == [i]
            ):
                found[piece] = i
        return found


class KerasHubGraphEncoder:
    """Encodes with a KerasHub tokenizer layer as tf.data runs it (a TensorFlow graph): the
    reference the library encoders are checked against, and the fallback where they differ."""

    backend = "keras_hub"
    library = "KerasHub, TensorFlow graph"

    def __init__(self, layer):
        self.layer = layer
        self._graph = None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        import tensorflow as tf

        values, row_splits = self._traced()(tf.constant(texts, dtype=tf.string))
        return np.split(values.numpy(), row_splits.numpy()[1:-1])

    def _traced(self):
        if self._graph is None:
            import tensorflow as tf

            @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
            def tokenize(texts):
                ids = self.layer.tokenize(texts)
                if not isinstance(ids, tf.RaggedTensor):
                    ids = tf.RaggedTensor.from_tensor(ids)
                return ids.flat_values, ids.row_splits

            self._graph = tokenize
        return self._graph

    def decode(self, ids: list[int]) -> str:
        special = set(self.layer.special_token_ids)
        text = self.layer.detokenize([i for i in ids if i not in special])
        return text.decode("utf-8") if isinstance(text, bytes) else str(text)

    def token_id(self, token: str) -> int | None:
        try:
            found = int(self.layer.token_to_id(token))
            return found if self.layer.id_to_token(found) == token else None
        except (ValueError, KeyError, IndexError):
            return None

    def token_text(self, token_id: int) -> str:
        return str(self.layer.id_to_token(token_id))

    def special_tokens(self) -> dict[str, int]:
        names = [
            *getattr(self.layer, "special_tokens", []),
            *(getattr(self.layer, "unsplittable_tokens", None) or []),
        ]
        return {name: found for name in names if (found := self.token_id(name)) is not None}


def fast_encoder(layer):
    """The library encoder for `layer` (None for a kind of tokenizer it has none for)."""
    from keras_hub.tokenizers import BytePairTokenizer, SentencePieceTokenizer

    if isinstance(layer, SentencePieceTokenizer) and layer.proto is not None:
        return SentencePieceEncoder(layer.proto)
    if isinstance(layer, BytePairTokenizer) and layer.vocabulary is not None:
        return HuggingFaceEncoder(_byte_level_bpe(layer))
    return None


def _byte_level_bpe(layer):
    """A Hugging Face tokenizer with `layer`'s vocabulary, merges and unsplittable tokens, splitting
    text as GPT-2 does (KerasHub's graph path emulates that split)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    merges = [tuple(merge.split(" ")) for merge in layer.merges if merge and "#version:" not in merge]
    tokenizer = Tokenizer(models.BPE(vocab=dict(layer.vocabulary), merges=merges))
    tokenizer.add_special_tokens(list(layer.unsplittable_tokens or []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(layer.add_prefix_space))
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer
