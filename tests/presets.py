"""Small KerasHub presets built locally, for the tests of fine-tuning on text (nothing is downloaded).

The presets are those `meshrun preset` makes (meshrun.models.hub.small_presets: a real tokenizer trained
on the given text, SentencePiece for Gemma and byte-level BPE with Hugging Face `tokenizers` for
GPT-2 and Llama 3, around a tiny causal LM with random weights, written with `save_to_preset`) at
the tests' sizes: vocabulary 512, 2 layers, hidden size 64, 4 query heads, sequence length 64.
Here also a Mistral with a Tekken tokenizer, which `meshrun preset` does not make. Each takes a
second or two. `hf_tokenizer_json` writes a Hugging Face tokenizer.json alone; `write_checkpoint`
and `write_tokenizer` a transformers checkpoint dir (random weights, a byte-level BPE tokenizer.json)
of a config such as TIED_LLAMA.
`corpus_text`, `instruction_records` and `chat_records` are the texts to train on
(`held_out_chat` a conversation to test a chat model on). Everything is deterministic:
the same arguments give byte-identical tokenizer files and the same weights. Keras runs on jax
(tests/conftest.py sets it); models are built with no distribution.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np

from meshrun.hf import families, safetensors
from meshrun.models.hub.small_presets import (
    FAMILIES,
    GPT2_SPECIAL_TOKENS,  # noqa: F401 (the tests read it here)
    PresetShape,
    assemble,
    bpe_vocabulary,
    causal_lm,
)
from meshrun.text import tokenizer_training

VOCABULARY_SIZE = 512
SEQUENCE_LENGTH = 64
SEED = 0
SHAPE = PresetShape(
    vocabulary_size=VOCABULARY_SIZE,
    num_layers=2,
    hidden_dim=64,
    num_query_heads=4,
    num_key_value_heads=2,
    sequence_length=SEQUENCE_LENGTH,
    seed=SEED,
)
KEY = "vocabulary_size"  # what an error about the vocabulary would name

HF_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>")
MISTRAL_SPECIAL_TOKENS = ("<s>", "</s>")
# The pre-tokenization pattern of Mistral's Tekken tokenizers (tiktoken style): unlike GPT-2's split,
# it cuts numbers into single digits and words at case changes.
TEKKEN_SPLIT_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

WORDS = (
    "the a an this that every some no one two three four five six seven eight nine ten "
    "cat dog bird fish horse river mountain city house garden tree flower road bridge ship train "
    "boy girl man woman child teacher farmer doctor king queen friend stranger "
    "red blue green yellow white black brown grey orange purple "
    "big small old young quiet loud quick slow warm cold bright dark happy tired "
    "runs walks sees finds takes gives makes keeps reads writes sings opens closes likes wants "
    "ran walked saw found took gave made kept read wrote sang opened closed liked wanted "
    "in on under over near behind through across with without before after "
    "and but or so because while when if then "
    "morning evening night day week year summer winter rain snow wind sun moon star sky"
).split()
YEARS = ("1999", "2000", "2010", "2012", "2020", "2021", "2023", "2024", "2025")
CONTRACTIONS = ("it's", "don't", "we'll", "they're", "I've", "can't", "she'd", "you're")
UNICODE_WORDS = ("café", "naïve", "résumé", "Zürich", "über", "東京", "Ελλάδα", "🙂")

# Facts an instruction-tuned tiny model can learn: "What colour is the sky?" -> "blue".
COLOUR_OF = {
    "the sky": "blue",
    "grass": "green",
    "snow": "white",
    "coal": "black",
    "a banana": "yellow",
    "blood": "red",
    "an orange": "orange",
    "a plum": "purple",
    "ash": "grey",
    "soil": "brown",
}
COLOURS = ("red", "blue", "green", "yellow", "white", "black")


def corpus_text(size_bytes: int = 35_000, seed: int = 0) -> str:
    """English-like plain text of about `size_bytes` characters: sentences drawn from a word list
    (with numbers and years, punctuation, contractions, a little non-ASCII text and
    instruction-style lines), paragraphs separated by blank lines, some of them indented lists (so
    tokenizers learn runs of spaces)."""
    rng = random.Random(seed)
    paragraphs, size = [], 0
    while size < size_bytes:
        paragraphs.append(_paragraph(rng))
        size += len(paragraphs[-1]) + 2
    return "\n\n".join(paragraphs) + "\n"


def _paragraph(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.1:
        record = instruction_records(1, seed=rng.randrange(1 << 30))[0]
        return f"Instruction: {record['instruction']}\nResponse: {record['response']}"
    if kind < 0.2:
        return _indented_list(rng)
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 6)))


def _sentence(rng: random.Random) -> str:
    kind = rng.random()
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
    if kind < 0.2:
        words.insert(rng.randrange(len(words)), f"in {rng.choice(YEARS)}")
    elif kind < 0.3:
        words.insert(
            rng.randrange(len(words)), str(rng.choice([rng.randint(0, 99), rng.randint(100, 99_999)]))
        )
    if kind < 0.45:
        words.insert(rng.randrange(len(words)), rng.choice(CONTRACTIONS))
    if kind < 0.5:
        words.insert(rng.randrange(len(words)), rng.choice(UNICODE_WORDS))
    if kind > 0.8:
        words[rng.randrange(len(words))] += ","
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice((".", ".", ".", "?", "!", ":", ";"))


def _indented_list(rng: random.Random) -> str:
    items = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(2, 5))]
    return "Items:\n" + "\n".join(f"    - {item}" for item in items)


def instruction_records(n: int, seed: int = 0) -> list[dict]:
    """`n` instruction/response pairs a tiny model can learn: reversing two or three colour words
    ("Reverse the words: red blue" -> "blue red") and naming the colour of a thing ("What colour
    is the sky?" -> "blue")."""
    rng = random.Random(seed)
    return [_reverse_record(rng) if rng.random() < 0.5 else _colour_record(rng) for _ in range(n)]


def _reverse_record(rng: random.Random) -> dict:
    words = [rng.choice(COLOURS) for _ in range(rng.randint(2, 3))]
    return {"instruction": f"Reverse the words: {' '.join(words)}", "response": " ".join(reversed(words))}


def _colour_record(rng: random.Random) -> dict:
    thing = rng.choice(sorted(COLOUR_OF))
    return {"instruction": _colour_question(thing), "response": COLOUR_OF[thing]}


SYSTEM_PROMPTS = ("You answer in one word.", "Name the colour.")
EXCHANGES = 3  # user/assistant exchanges in each chat record
# The held-out conversation: its questions are trained, their order here never is (chat_records skips it).
HELD_OUT_THINGS = ("grass", "coal", "the sky")


def chat_records(n: int, seed: int = 0, system: bool = True) -> list[dict]:
    """`n` conversations a tiny chat model can learn, as {"messages": [{role, content}, ...]}: three
    user/assistant exchanges each, asking the colour of a thing ("What colour is the sky?" ->
    "blue"), with a system prompt (SYSTEM_PROMPTS) on about half of them unless `system` is False
    (Gemma 1/2's template refuses a system turn). Things are drawn without replacement from the
    COLOUR_OF facts, reshuffled when all are used, so every fact is trained within the first four
    records; no record asks the held-out conversation's questions in its order (held_out_chat)."""
    rng = random.Random(seed)
    pool: list[str] = []
    records = []
    while len(records) < n:
        things = [_next_thing(rng, pool) for _ in range(EXCHANGES)]
        with_system, system_prompt = rng.random() < 0.5, rng.choice(SYSTEM_PROMPTS)  # drawn either way
        if _asks_held_out_order(things):
            continue
        prompt = [_turn("system", system_prompt)] if system and with_system else []
        records.append({"messages": prompt + [turn for thing in things for turn in _exchange(thing)]})
    return records


def held_out_chat() -> tuple[list[dict], str]:
    """A conversation to test a model trained on chat_records with: two answered exchanges and a
    last user turn whose fact (the sky is blue) is trained, in an order of questions no record has;
    and the reply expected to it."""
    *answered, last = HELD_OUT_THINGS
    messages = [turn for thing in answered for turn in _exchange(thing)]
    return messages + [_turn("user", _colour_question(last))], COLOUR_OF[last]


def _next_thing(rng: random.Random, pool: list[str]) -> str:
    if not pool:
        pool.extend(sorted(COLOUR_OF))
        rng.shuffle(pool)
    return pool.pop()


def _asks_held_out_order(things: list[str]) -> bool:
    return tuple(things) == HELD_OUT_THINGS


def _exchange(thing: str) -> list[dict]:
    return [_turn("user", _colour_question(thing)), _turn("assistant", COLOUR_OF[thing])]


def _colour_question(thing: str) -> str:
    return f"What colour is {thing}?"


def _turn(role: str, content: str) -> dict:
    return {"role": role, "content": content}


# --- tokenizers -----------------------------------------------------------------------------------


def sentencepiece_proto(text: str, vocabulary_size: int = VOCABULARY_SIZE) -> bytes:
    """A SentencePiece model (serialized proto) trained on the lines of `text`, set up as Gemma's:
    pad=0, eos=1, bos=2, unk=3, the turn markers <start_of_turn>=4 and <end_of_turn>=5 (one id
    wherever they occur), BPE with byte fallback, digits split, no whitespace normalisation and no
    dummy prefix (so decoding gives back the text exactly)."""
    return tokenizer_training.sentencepiece_proto(
        [text], vocabulary_size, tokenizer_training.GEMMA_SENTENCEPIECE, KEY
    )


def byte_level_bpe(text: str, special_tokens: tuple[str, ...], vocabulary_size: int = VOCABULARY_SIZE):
    """A Hugging Face byte-level BPE `tokenizers.Tokenizer` trained on the paragraphs of `text`,
    with `special_tokens` given the last ids, as GPT-2 and Llama 3 have theirs; `vocabulary_size`
    ids in all."""
    return tokenizer_training.byte_level_bpe(text.split("\n\n"), special_tokens, vocabulary_size, KEY)


def hf_tokenizer_json(path, text: str, vocabulary_size: int = VOCABULARY_SIZE) -> Path:
    """Writes a Hugging Face byte-level BPE tokenizer.json (with <|begin_of_text|> and
    <|end_of_text|>, no pad token) of `vocabulary_size` ids trained on `text` into dir `path`;
    returns the file's path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    file = path / "tokenizer.json"
    byte_level_bpe(text, HF_SPECIAL_TOKENS, vocabulary_size).save(str(file))
    return file


# --- presets: meshrun preset's families at the tests' sizes ---------------------------------------


def gemma_preset(path, text: str, num_key_value_heads: int = 1, dropout: float = 0.0) -> Path:
    """A tiny Gemma (SentencePiece tokenizer trained on `text`) saved as a KerasHub preset in
    `path`; returns `path`. With `dropout`, training draws random numbers (a resume must restore
    their state)."""
    shape = replace(SHAPE, num_key_value_heads=num_key_value_heads, dropout=dropout)
    return _save(causal_lm(FAMILIES["gemma"], [text], shape, KEY), path)


def gpt2_preset(path, text: str) -> Path:
    """A tiny GPT-2 (byte-level BPE trained on `text`, <|endoftext|> last) saved as a KerasHub
    preset in `path`; returns `path`. No dropout: KerasHub's default of 0.1 makes its train step
    compile four times as long (12 s against 3 s on CPU: the random bits of every dropout mask);
    dropout's random state is tested on a Gemma built with it (gemma_preset)."""
    shape = replace(SHAPE, num_key_value_heads=SHAPE.num_query_heads)
    return _save(causal_lm(FAMILIES["gpt2"], text.split("\n\n"), shape, KEY), path)


def llama3_preset(path, text: str) -> Path:
    """A tiny Llama 3 (byte-level BPE trained on `text`, Llama 3's five special tokens last) saved
    as a KerasHub preset in `path`; returns `path`."""
    return _save(causal_lm(FAMILIES["llama"], text.split("\n\n"), SHAPE, KEY), path)


def mistral_tekken_preset(path, text: str) -> Path:
    """A tiny Mistral whose tokenizer is a Tekken byte-level BPE (trained on `text` with GPT-2's
    split, but splitting text by TEKKEN_SPLIT_PATTERN as Mistral's newer models do) saved as a
    KerasHub preset in `path`; returns `path`. A GPT-2-style encoder disagrees with it on numbers."""
    import keras_hub

    trained = bpe_vocabulary(text.split("\n\n"), MISTRAL_SPECIAL_TOKENS, SHAPE, KEY)
    tokenizer = keras_hub.tokenizers.MistralTekkenTokenizer(**trained, split_pattern=TEKKEN_SPLIT_PATTERN)
    return _save(assemble(FAMILIES["mistral"], tokenizer, SHAPE), path)


def _save(causal_lm, path) -> Path:
    path = Path(path)
    causal_lm.save_to_preset(str(path))
    return path


# --- transformers checkpoints ---------------------------------------------------------------------

# Divisible over the 2x4 mesh's model axis (4): 8 query and 4 key/value heads.
TIED_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 320,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "max_position_embeddings": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


SHARD_BYTES = 200_000  # the tiny Llama's 0.7 MB in 4 files


def write_checkpoint(directory, config: dict, seed: int = 0, shard_bytes: int = SHARD_BYTES) -> None:
    """A transformers checkpoint of `config` with random weights, written by meshrun's own writer."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    hf_config = families.HFConfig(config, str(directory))
    family = families.family_of(hf_config)
    maps = family.tensors(family.arguments(hf_config), hf_config)
    dtype = hf_config.dtype
    rng = np.random.default_rng(seed)
    values = {
        m.name: (rng.normal(size=m.transform.hf_shape) * 0.1).astype(safetensors.numpy_dtype(dtype))
        for m in maps
    }
    planned = [safetensors.PlannedTensor(name, dtype, value.shape) for name, value in values.items()]
    safetensors.write_shards(directory, planned, values.__getitem__, shard_bytes)


def write_tokenizer(directory) -> None:
    """A byte-level BPE tokenizer.json trained on a few KB of text, with a tokenizer_config.json
    holding a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    text = ["the quick brown fox jumps over the lazy dog, again and again"] * 40
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(text, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": "{{ messages }}"})
    )
