"""Examples tokenized into the rows a causal LM trains on: `seq_len + 1` tokens a row (inputs are
the first seq_len, labels the last seq_len), with a weight for every label.

How an example becomes tokens (the same way at training and at sampling time, `prompt_ids`):
`[start] + encode(prompt)`, then `encode(text) + [end]`. Prompt and text are encoded apart, so
the ids trained on are exactly the ids whose weights were computed: the prompt's tokens weigh 0,
the text's tokens and the end token weigh 1 (the model learns to stop), padding weighs 0 and is
found by each row's length, never by comparing ids with the end token (which may be the pad id).

- Packed (`packing`): examples are joined into one stream and cut into rows every seq_len
  tokens, no padding. KerasHub's causal LMs take no segment ids, so an example attends to the
  ones before it in its row.
- Unpacked: each example starts a row of its own, right-padded; one longer than a row is
  dropped or an error (`too_long`); a plain-text document longer than a row continues in the
  next rows.

Encoded texts travel as Ragged arrays (all ids end to end, and each text's count), and rows are
cut with array operations, never a Python loop per example: a corpus holds millions of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from meshrun.errors import ConfigError
from meshrun.text.corpus import Example

TOO_LONG = ("drop", "error", "truncate")  # truncate: conversations only (meshrun.text.chat)
ENCODE_CHUNK_BYTES = (
    1 << 20
)  # texts encoded per call: enough for the tokenizer's threads (scripts/bench_tokenize.py)


class Ragged(NamedTuple):
    """Many id sequences: their ids end to end (int32) and each one's count."""

    values: np.ndarray
    lengths: np.ndarray

    @property
    def starts(self) -> np.ndarray:
        """Where each sequence begins in `values`."""
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)


@dataclass(frozen=True)
class Rows:
    """Token rows: ids (rows, seq_len + 1) int32, each row's real tokens (`lengths`), label
    weights (rows, seq_len) uint8, the examples dropped as too long, and the first such one."""

    tokens: np.ndarray
    lengths: np.ndarray
    weights: np.ndarray
    dropped: int = 0
    first_dropped: str | None = None
    truncated: int = 0  # conversations that lost their earliest exchanges to fit (data.too_long=truncate)

    @property
    def trained_tokens(self) -> int:
        """The labels that count in the loss."""
        return int(self.weights.sum(dtype=np.int64))

    @property
    def padding_fraction(self) -> float:
        """The share of row positions that hold padding."""
        if not self.tokens.size:
            return 0.0
        return 1.0 - float(self.lengths.sum(dtype=np.int64)) / self.tokens.size


@dataclass(frozen=True)
class Framing:
    """The special tokens around an example: `start` (None: none) and `end`, and the pad id."""

    start: int | None
    end: int
    pad: int


def prompt_ids(encode: Callable[[Sequence[str]], list], framing: Framing, prompt: str) -> np.ndarray:
    """The ids a prompt is given to the model as, at training and at sampling time: the start
    token (where the tokenizer has one) and the prompt encoded alone."""
    return framed_prompt(framing, encode([prompt])[0])


def framed_prompt(framing: Framing, encoded) -> np.ndarray:
    """An encoded prompt with the start token before it (where the tokenizer has one)."""
    return np.concatenate([_start(framing), np.asarray(encoded, dtype=np.int32)]).astype(np.int32)


def framed_prompts(framing: Framing, encoded: Ragged) -> Ragged:
    """Many encoded prompts (as prompt_ids makes each), the start token before every one."""
    if framing.start is None:
        return encoded
    count = len(encoded.lengths)
    lengths = encoded.lengths + 1
    values = np.empty(int(lengths.sum()), np.int32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    values[starts] = framing.start
    values[_positions(starts + 1, encoded.lengths)] = encoded.values
    return Ragged(values, lengths) if count else encoded


def encode_all(
    encode_ragged: Callable[[Sequence[str]], tuple], texts: list[str], advance: Callable[[int], None]
) -> Ragged:
    """Every text encoded (`encode_ragged`: TextTokenizer.encode_ragged), a chunk of about
    ENCODE_CHUNK_BYTES at a time; `advance(bytes)` after each."""
    values, lengths, chunk, size = [], [], [], 0

    def flush():
        encoded = encode_ragged(chunk)
        values.append(encoded[0])
        lengths.append(encoded[1])
        advance(size)

    for text in texts:
        chunk.append(text)
        size += len(text)
        if size >= ENCODE_CHUNK_BYTES:
            flush()
            chunk, size = [], 0
    if chunk:
        flush()
    if not values:
        return Ragged(np.zeros(0, np.int32), np.zeros(0, np.int64))
    return Ragged(np.concatenate(values).astype(np.int32), np.concatenate(lengths).astype(np.int64))


def to_rows(
    examples: list[Example],
    prompts: Ragged | None,
    texts: Ragged,
    framing: Framing,
    seq_len: int,
    packing: bool,
    too_long: str,
) -> Rows:
    """The rows of `examples`, given their encoded prompts (framed_prompts; None for plain text,
    whose examples start with the start token) and their encoded texts."""
    heads = prompts if prompts is not None else _start_heads(framing, len(texts.lengths))
    sizes = heads.lengths + texts.lengths + 1
    keep = np.ones(len(sizes), bool)
    if prompts is not None and not packing:
        keep = sizes <= seq_len + 1
        if not keep.all():
            first = examples[int(np.argmin(keep))]
            too_many = int(sizes[np.argmin(keep)])
            if too_long == "error":
                raise ConfigError(
                    "data.too_long",
                    f"is error, and {first.where} makes {too_many} tokens, more than model.seq_len + 1 = "
                    f"{seq_len + 1}; raise model.seq_len or set data.too_long=drop",
                )
    stream, weights, offsets = _stream(_kept(heads, keep), _kept(texts, keep), framing.end)
    kept_sizes = sizes[keep]
    rows = (
        _packed(stream, weights, seq_len)
        if packing
        else _padded(stream, weights, offsets, kept_sizes, seq_len, framing.pad)
    )
    dropped = int((~keep).sum())
    first_dropped = (
        f"{examples[int(np.argmin(keep))].where} ({int(sizes[np.argmin(keep)])} tokens)" if dropped else None
    )
    return Rows(*rows, dropped=dropped, first_dropped=first_dropped)


def weighted_rows(ids: list, weights: list, seq_len: int, packing: bool, pad: int, **counts) -> Rows:
    """The rows of examples given as ids and a weight per id (conversations: meshrun.text.chat),
    each at most seq_len + 1 ids: packed end to end, or one a row, right-padded with `pad`.
    `counts`: Rows' dropped, first_dropped and truncated."""
    if not ids:
        return Rows(*_empty(seq_len), **counts)
    sizes = np.fromiter(map(len, ids), np.int64, count=len(ids))
    stream = np.concatenate(ids).astype(np.int32)
    stream_weights = np.concatenate(weights).astype(np.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    rows = (
        _packed(stream, stream_weights, seq_len)
        if packing
        else _padded(stream, stream_weights, offsets, sizes, seq_len, pad)
    )
    return Rows(*rows, **counts)


def _start(framing: Framing) -> np.ndarray:
    return np.asarray([framing.start] if framing.start is not None else [], dtype=np.int32)


def _start_heads(framing: Framing, count: int) -> Ragged:
    """The head of every plain-text example: the start token (or nothing)."""
    width = 0 if framing.start is None else 1
    return Ragged(
        np.full(count * width, framing.start if width else 0, np.int32), np.full(count, width, np.int64)
    )


def _positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """starts[i] + 0, 1, ..., lengths[i] - 1 for every i, end to end."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total)


def _kept(ragged: Ragged, keep: np.ndarray) -> Ragged:
    if keep.all():
        return ragged
    return Ragged(ragged.values[np.repeat(keep, ragged.lengths)], ragged.lengths[keep])


def _stream(heads: Ragged, texts: Ragged, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every example end to end, head + text + end, with each token's weight (0 in the head, 1
    in the text and the end token) and where each example begins."""
    sizes = heads.lengths + texts.lengths + 1
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    stream = np.empty(int(sizes.sum()), np.int32)
    weights = np.ones(len(stream), np.uint8)
    head_positions = _positions(offsets, heads.lengths)
    stream[head_positions] = heads.values
    weights[head_positions] = 0
    stream[_positions(offsets + heads.lengths, texts.lengths)] = texts.values
    stream[offsets + sizes - 1] = end
    return stream, weights, offsets


def _packed(stream: np.ndarray, weights: np.ndarray, seq_len: int):
    """One stream cut into rows of seq_len + 1 every seq_len tokens (each token a label once); the
    tail that does not fill a row is left out. A label that is an example's head (its start
    token: nothing before it predicts it) weighs 0."""
    count = max((len(stream) - 1) // seq_len, 0)
    if not count:
        return _empty(seq_len)
    window = (np.arange(count) * seq_len)[:, None] + np.arange(seq_len + 1)
    return stream[window], np.full(count, seq_len + 1, np.int32), weights[window[:, 1:]]


def _padded(
    stream: np.ndarray, weights: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, seq_len: int, pad: int
):
    """Each example from the start of a row, right-padded with `pad`; one longer than a row (a
    plain-text document) goes on in further rows, overlapping by one token."""
    if not len(sizes):
        return _empty(seq_len)
    per_example = np.maximum((sizes - 2) // seq_len + 1, 1)  # rows of an example: every label once
    example = np.repeat(np.arange(len(sizes)), per_example)
    part = np.arange(int(per_example.sum())) - np.repeat(np.cumsum(per_example) - per_example, per_example)
    first = offsets[example] + part * seq_len
    lengths = np.minimum(seq_len + 1, sizes[example] - part * seq_len).astype(np.int32)
    window = first[:, None] + np.arange(seq_len + 1)
    real = np.arange(seq_len + 1)[None, :] < lengths[:, None]
    window = np.where(real, window, 0)
    tokens = np.where(real, stream[window], pad).astype(np.int32)
    row_weights = np.where(real[:, 1:], weights[window[:, 1:]], 0).astype(np.uint8)
    return tokens, lengths, row_weights


def _empty(seq_len: int):
    return np.zeros((0, seq_len + 1), np.int32), np.zeros(0, np.int32), np.zeros((0, seq_len), np.uint8)


def model_batch(batch: tuple) -> tuple:
    """A batch of rows ({tokens, lengths}, weights) as the model takes it: ({token_ids,
    padding_mask}, next tokens, label weights as float32)."""
    features, weights = batch
    tokens, lengths = features["tokens"], features["lengths"]
    seq_len = tokens.shape[1] - 1
    padding_mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int32)
    return (
        {"token_ids": tokens[:, :-1], "padding_mask": padding_mask},
        tokens[:, 1:],
        weights.astype(np.float32),
    )
