"""The model's own tokenizer, run as fast as its library allows: the TextTokenizer record, and
`load_tokenizer(source, key)`, which finds the tokenizer at `source` and makes one.

`source` is one of:

- A KerasHub preset dir (config.json, tokenizer.json and assets/tokenizer/, as `save_to_preset`
  writes). The tokenizer's class, vocabulary and special tokens are read through KerasHub, but text
  is encoded by the library underneath, called directly on every core: SentencePiece (Gemma,
  Llama 2, Mistral, ...) by `SentencePieceProcessor.encode(..., num_threads=cores)`, byte-level BPE
  (GPT-2, Llama 3, Qwen, ...) by a Hugging Face `tokenizers.Tokenizer` built from the same
  vocabulary and merges (GPT-2's split, byte-level alphabet) and its `encode_batch`. The library
  encoder is checked once against KerasHub's own TensorFlow graph, which is used instead where they
  differ (meshrun.text.tokenizer_check).
- A Hugging Face tokenizer.json, or a dir holding one (`tokenizers.Tokenizer.from_file`); it never
  needs TensorFlow.

The parts live beside this module: tokenizer_files.py (finding and fingerprinting the files),
tokenizer_encoders.py (the library encoders), special_tokens.py (start, end, pad and stop ids),
keras_hub_tokenizer.py (a preset's tokenizer layer and its encoder), tokenizer_check.py (the check
against KerasHub's graph and its verdicts).

Importing this module imports none of jax, keras, keras_hub and tensorflow.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from meshrun.errors import ConfigError
from meshrun.text import cache
from meshrun.text.keras_hub_tokenizer import preset_encoder
from meshrun.text.special_tokens import hugging_face_special_ids, keras_hub_special_ids, model_stop_ids
from meshrun.text.tokenizer_check import verdicts_in
from meshrun.text.tokenizer_encoders import HuggingFaceEncoder
from meshrun.text.tokenizer_files import (
    EXPECTED,
    PRESET_CONFIG_FILE,
    TOKENIZER_FILE,
    fingerprint_files,
    is_keras_serialized,
    keras_hub_tokenizer_files,
    read_json,
    tokenizer_file,
)
from meshrun.wording import first_line


class TextTokenizer:
    """The tokenizer a model was trained with, as data=text and generation use it: text to ids with
    no special tokens added (`encode`), ids back to text (`decode`), the ids of its special tokens,
    and a fingerprint of the files that define it (for token caches)."""

    def __init__(
        self,
        encoder,
        *,
        description: str,
        vocabulary_size: int,
        start_id: int | None,
        end_id: int | None,
        pad_id: int,
        fingerprint: str,
        stop_ids: tuple[int, ...] = (),
        start_token: str | None = None,
    ):
        self._encoder = encoder
        self.description = description  # one line for logs and metrics.json
        self.backend = encoder.backend  # "sentencepiece", "tokenizers" or "keras_hub"
        self.vocabulary_size = vocabulary_size  # the size of its id space (largest id + 1)
        self.start_id = start_id  # the token the model's preprocessor puts first (None: none)
        self.start_token = start_token  # the text a chat template writes as bos_token (None: none)
        self.end_id = end_id
        self.pad_id = pad_id
        self.fingerprint = fingerprint  # sha256 over the bytes of the tokenizer's files
        # the ids generation stops at: the end token, then any other the model's files name
        self.stop_ids = tuple(dict.fromkeys(([] if end_id is None else [end_id]) + list(stop_ids)))
        self._special_tokens: dict[str, int] | None = None

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The int32 ids of each text, no special tokens added; many texts are encoded on every core."""
        if isinstance(texts, str):
            raise TypeError("TextTokenizer.encode takes a sequence of texts, not one str")
        return [np.asarray(ids, dtype=np.int32) for ids in self._encoder.encode(list(texts))]

    def encode_ragged(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of all texts end to end (int32) and each text's count: `encode` without an array
        per text, for many texts at once (data=text)."""
        encoded = self._encoder.encode(list(texts))
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        values = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=int(lengths.sum()))
        return values, lengths

    @property
    def reads_special_tokens(self) -> bool:
        """Whether `encode_with_offsets` can encode a text holding special tokens (a Hugging Face
        tokenizers encoder reads them from text; SentencePiece does not read control tokens)."""
        return hasattr(self._encoder, "encode_with_offsets")

    def encode_with_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each text's int32 ids, special tokens in it read as their ids, no special tokens added,
        and the [start, end) character offsets of each id (int64, [n, 2]); only where
        `reads_special_tokens`."""
        return [
            (np.asarray(ids, dtype=np.int32), np.asarray(offsets, dtype=np.int64).reshape(-1, 2))
            for ids, offsets in self._encoder.encode_with_offsets(list(texts))
        ]

    def decode(self, ids) -> str:
        """The text of `ids` (a sequence or array of ints), special tokens skipped."""
        return self._encoder.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def token_id(self, token: str) -> int | None:
        """The id of a token string such as "<eos>", None if the tokenizer has no such token."""
        return self._encoder.token_id(token)

    def token_text(self, token_id: int) -> str:
        """The string of one id as the tokenizer's vocabulary writes it ("<eos>", "▁the", "Ġthe")."""
        return self._encoder.token_text(int(token_id))

    def special_tokens(self) -> dict[str, int]:
        """The tokenizer's special tokens by their text (control and added tokens: "<bos>",
        "<|eot_id|>", "<start_of_turn>"): text that holds one stands for that id alone. Found once
        (a SentencePiece model's are found by looking at every piece)."""
        if self._special_tokens is None:
            self._special_tokens = self._encoder.special_tokens()
        return dict(self._special_tokens)

    def __repr__(self) -> str:
        return f"TextTokenizer({self.description}, backend={self.backend})"


def tokenizer_source(given: str | None, preset: str | None, missing_key: str) -> tuple[str, str]:
    """Where a run's tokenizer comes from and the config key that names it: `given`
    (data.tokenizer), else the model's preset; with neither, a ConfigError on `missing_key`."""
    if given:
        return given, "data.tokenizer"
    if preset:
        return preset, "model.preset"
    raise ConfigError(
        missing_key,
        "needs a tokenizer: model.preset or data.tokenizer (a preset dir or a Hugging Face tokenizer.json); "
        "a model made from model.backbone brings none",
    )


def check_fits_vocabulary(tokenizer: TextTokenizer, source: str, key: str, vocabulary: int) -> None:
    """ConfigError naming `key` (where the tokenizer came from) when it has more ids than the
    model's `vocabulary`: its ids would index past the embedding. Fewer is fine (padded vocabularies)."""
    if tokenizer.vocabulary_size > vocabulary:
        raise ConfigError(
            key,
            f"got {source!r}, whose tokenizer has {tokenizer.vocabulary_size} ids, more than the model's "
            f"vocabulary of {vocabulary}; give the tokenizer the model was trained with",
        )


def load_tokenizer(
    source: str, key: str, cache_dir: str | None = None, shared_cache: bool = False
) -> TextTokenizer:
    """The tokenizer at `source` (a KerasHub preset dir, or a Hugging Face tokenizer.json or a dir
    holding one); anything else is a ConfigError blaming config key `key`. A KerasHub preset's
    tokenizer is checked against KerasHub's own once, the verdict kept in the token cache at
    `cache_dir` (data.cache_dir, None: its default), which must be writable by its owner alone (by
    its group too when `shared_cache`: meshrun.system.trust)."""
    path = Path(str(source)).expanduser()
    file = tokenizer_file(path, source, key)
    contents = read_json(file, source, key)
    if is_keras_serialized(contents):
        return _load_keras_hub(file.parent, source, key, verdicts_in(cache_dir, shared_cache))
    if isinstance(contents, dict) and isinstance(contents.get("model"), dict):
        model_type = contents["model"].get("type", "?")
        return _load_hugging_face(file, model_type, contents.get("post_processor"), source, key)
    raise ConfigError(
        key, f"got {source!r}, whose {file.name} is neither KerasHub's nor Hugging Face's; {EXPECTED}"
    )


def _load_hugging_face(file: Path, model_type: str, post_processor, source, key: str) -> TextTokenizer:
    """The Hugging Face tokenizer in `file` (a tokenizer.json of that `model_type`, whose
    `post_processor` says which token starts a text)."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as error:  # tokenizers raises plain Exception for a file it cannot parse
        raise ConfigError(
            key,
            f"got {source!r}, whose {file.name} Hugging Face "
            f"tokenizers cannot load ({first_line(error)}); {EXPECTED}",
        ) from None
    encoder = HuggingFaceEncoder(tokenizer)
    special = hugging_face_special_ids(encoder, file.parent, post_processor, source, key)
    return TextTokenizer(
        encoder,
        description=f"Hugging Face tokenizer ({model_type}) of {file.resolve()}",
        vocabulary_size=max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
        + 1,  # the id space
        start_id=special.start,
        end_id=special.end,
        pad_id=special.pad,
        fingerprint=fingerprint_files(file.parent, [file]),
        stop_ids=model_stop_ids(file.parent),
        start_token=special.start_token,
    )


def _load_keras_hub(preset: Path, source, key: str, verdicts: cache.ProbeVerdicts) -> TextTokenizer:
    """The preset's tokenizer: its library encoder where that encodes as KerasHub's TensorFlow graph
    does (a verdict found in `verdicts`, else found now and kept there), else the graph itself.
    TensorFlow is imported only to make the check or to use the graph."""
    if not (preset / PRESET_CONFIG_FILE).is_file():
        raise ConfigError(
            key,
            f"got {source!r}, a KerasHub {TOKENIZER_FILE} with no {PRESET_CONFIG_FILE} beside it; {EXPECTED}",
        )
    fingerprint = fingerprint_files(preset, keras_hub_tokenizer_files(preset))
    layer, encoder = preset_encoder(preset, source, key, fingerprint, verdicts)
    special = keras_hub_special_ids(layer, preset)
    return TextTokenizer(
        encoder,
        description=f"{type(layer).__name__} ({encoder.library}) of {preset.resolve()}",
        vocabulary_size=int(layer.vocabulary_size()),
        start_id=special.start,
        end_id=special.end,
        pad_id=special.pad,
        fingerprint=fingerprint,
        start_token=special.start_token,
    )
