"""New tokenizers trained on a user's text, for the small presets `meshrun preset` makes (and the
tests build): SentencePiece set up as Gemma's or as Mistral's (Llama 2's), and Hugging Face
byte-level BPE with special tokens last, as GPT-2's and Llama 3's.

Training is deterministic (one thread): the same texts and settings give byte-identical
tokenizers. A tokenizer holds exactly the ids asked for, or a ConfigError on the `key` given says
why this text cannot give them (too little text for that many ids, or more distinct characters
than ids) and what to give instead; SentencePiece would refuse in its own words and byte-level BPE
would silently stop short. Importing this module imports neither library.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from meshrun.errors import ConfigError
from meshrun.wording import first_line

BYTES = 256  # byte pieces (SentencePiece's byte fallback) or byte tokens (byte-level BPE)
# SentencePiece skips lines longer than this (its max_sentence_length, in bytes) without a word.
SENTENCEPIECE_LONGEST_LINE = 4192


@dataclass(frozen=True)
class SentencePieceSetup:
    """How a family's SentencePiece model is set up: its special pieces by id (pad: -1 for none),
    whether a space is put before each text (a "dummy prefix", as Llama 2's and Mistral's have;
    Gemma's has none, so decoding gives back the text exactly) and its user-defined pieces, which
    come right after the special ones and are always one piece where they occur in a text (Gemma's
    chat turn markers)."""

    pad: tuple[int, str]
    eos: tuple[int, str]
    bos: tuple[int, str]
    unk: tuple[int, str]
    dummy_prefix: bool
    user_defined: tuple[str, ...] = ()

    @property
    def special_count(self) -> int:
        """How many ids the special and user-defined pieces take."""
        named = sum(1 for piece_id, _ in (self.pad, self.eos, self.bos, self.unk) if piece_id >= 0)
        return named + len(self.user_defined)


GEMMA_SENTENCEPIECE = SentencePieceSetup(
    pad=(0, "<pad>"),
    eos=(1, "<eos>"),
    bos=(2, "<bos>"),
    unk=(3, "<unk>"),
    dummy_prefix=False,
    user_defined=("<start_of_turn>", "<end_of_turn>"),
)
MISTRAL_SENTENCEPIECE = SentencePieceSetup(
    pad=(-1, "<pad>"), eos=(2, "</s>"), bos=(1, "<s>"), unk=(0, "<unk>"), dummy_prefix=True
)


def sentencepiece_proto(
    texts: Iterable[str], vocabulary_size: int, setup: SentencePieceSetup, key: str
) -> bytes:
    """A SentencePiece model (serialized proto) of `vocabulary_size` pieces trained on the lines of
    `texts`, set up as `setup` says: BPE with byte fallback, digits split, whitespace kept as it is
    (no normalisation), every character of the text a piece. Lines longer than SentencePiece's
    default limit are trained on too (the limit is raised to the longest)."""
    import sentencepiece

    lines = [line for text in texts for line in text.splitlines() if line.strip()]
    longest = max((len(line.encode()) for line in lines), default=0)
    longer = {"max_sentence_length": longest} if longest > SENTENCEPIECE_LONGEST_LINE else {}
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            vocab_size=vocabulary_size,
            model_type="bpe",
            pad_id=setup.pad[0],
            eos_id=setup.eos[0],
            bos_id=setup.bos[0],
            unk_id=setup.unk[0],
            pad_piece=setup.pad[1],
            eos_piece=setup.eos[1],
            bos_piece=setup.bos[1],
            unk_piece=setup.unk[1],
            byte_fallback=True,
            split_digits=True,
            add_dummy_prefix=setup.dummy_prefix,
            remove_extra_whitespaces=False,
            normalization_rule_name="identity",
            allow_whitespace_only_pieces=True,
            user_defined_symbols=list(setup.user_defined),
            character_coverage=1.0,
            num_threads=1,
            minloglevel=2,
            **longer,
        )
    except RuntimeError as err:
        raise _sentencepiece_refusal(err, vocabulary_size, setup, key) from None
    return model.getvalue()


def _sentencepiece_refusal(
    err: RuntimeError, vocabulary_size: int, setup: SentencePieceSetup, key: str
) -> ConfigError:
    """SentencePiece's refusal to train, in meshrun's words where it is about the vocabulary size."""
    message = str(err)
    too_many = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", message)
    if too_many:
        return too_little_text(vocabulary_size, int(too_many.group(1)), "a SentencePiece", key)
    too_few = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
    if too_few:
        needed = int(too_few.group(1))
        characters = needed - BYTES - setup.special_count
        return ConfigError(
            key,
            f"got {vocabulary_size}, too few ids for this text: a SentencePiece tokenizer keeps each of its "
            f"{characters} distinct characters as a piece, beside {BYTES} byte pieces and "
            f"{setup.special_count} special tokens; give {key} {needed} or more",
        )
    return ConfigError(
        key, f"got {vocabulary_size}; SentencePiece cannot train on this text: {first_line(err)}"
    )


def too_little_text(asked: int, most: int, tokenizer: str, key: str) -> ConfigError:
    """The error for a vocabulary larger than the text gives `tokenizer` (at most `most` ids)."""
    return ConfigError(
        key,
        f"got {asked}, more ids than this text gives {tokenizer} tokenizer ({most} at most): "
        f"give more text or a smaller {key}, e.g. {key} {most}",
    )


def byte_level_bpe(texts: Iterable[str], special_tokens: Sequence[str], vocabulary_size: int, key: str):
    """A Hugging Face byte-level BPE `tokenizers.Tokenizer` of `vocabulary_size` ids trained on
    `texts` (each one apart: no merge crosses from one to the next), with GPT-2's split and no
    prefix space, and `special_tokens` given the last ids, as GPT-2 and Llama 3 have theirs."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    least = BYTES + len(special_tokens)
    if vocabulary_size < least:
        raise ConfigError(
            key,
            f"got {vocabulary_size}, too few ids: a byte-level BPE tokenizer holds {BYTES} byte tokens and "
            f"{len(special_tokens)} special tokens; give {key} {least} or more",
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocabulary_size - len(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in special_tokens])
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size < vocabulary_size:  # the trainer ran out of pairs to merge
        raise too_little_text(vocabulary_size, size, "a byte-level BPE", key)
    return tokenizer


def vocabulary_and_merges(tokenizer) -> tuple[dict[str, int], list[str]]:
    """The vocabulary (with added tokens) and merge rules ("a b") of a HF BPE tokenizer, as
    KerasHub's BytePairTokenizer takes them."""
    model = json.loads(tokenizer.to_str())["model"]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]]
    return tokenizer.get_vocab(with_added_tokens=True), merges
