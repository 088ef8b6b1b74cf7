"""A tokenizer's start, end, pad and stop ids, as the model's files name them: for a Hugging Face
tokenizer.json, the tokenizer_config.json beside it (else well-known token names) and the ids its
generation_config.json (else config.json) stops at; for a KerasHub preset, its tokenizer layer's,
the start token only where the preset's preprocessor puts it first.

Importing this module imports none of jax, keras, keras_hub and tensorflow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from meshrun.text.tokenizer_files import PREPROCESSOR_FILE, PRESET_CONFIG_FILE

# Special tokens of a Hugging Face tokenizer.json, by name, first found wins.
HF_END_TOKENS = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|im_end|>")
HF_START_TOKENS = ("<|begin_of_text|>", "<s>", "<bos>")
HF_PAD_TOKENS = ("<pad>",)
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # names the end and pad tokens where it is beside
HF_GENERATION_CONFIG_FILE = "generation_config.json"  # names the ids a model stops at where it is beside


def hugging_face_special_ids(encoder, folder: Path) -> tuple[int | None, int | None, int]:
    """(start, end, pad) ids of a Hugging Face tokenizer (its `encoder`) in `folder`: the end and
    pad tokens its tokenizer_config.json names, else the first of HF_END_TOKENS and HF_PAD_TOKENS it
    has; pad is the end token where it has none, else 0."""
    named = _named_special_tokens(folder / HF_TOKENIZER_CONFIG_FILE)
    end = _first_token(encoder, [named["eos_token"]] if named.get("eos_token") else HF_END_TOKENS)
    pad = _first_token(encoder, [named["pad_token"]] if named.get("pad_token") else HF_PAD_TOKENS)
    start = _first_token(encoder, HF_START_TOKENS)
    return start, end, pad if pad is not None else (end if end is not None else 0)


def model_stop_ids(folder: Path) -> tuple[int, ...]:
    """The ids a transformers model stops generating at, as its generation_config.json (else its
    config.json) beside the tokenizer names them (`eos_token_id`: an id or a list); () without."""
    for name in (HF_GENERATION_CONFIG_FILE, PRESET_CONFIG_FILE):
        try:
            config = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        value = config.get("eos_token_id") if isinstance(config, dict) else None
        ids = value if isinstance(value, list) else [value]
        found = tuple(int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool))
        if found:
            return found
    return ()


def _named_special_tokens(file: Path) -> dict[str, str]:
    """The special tokens a tokenizer_config.json beside a tokenizer.json names (bos_token,
    eos_token, pad_token: a string, or a dict with its content), {} without one."""
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    named = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        value = config.get(key) if isinstance(config, dict) else None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            named[key] = value
    return named


def _first_token(encoder, tokens: Sequence[str]) -> int | None:
    """The id of the first of `tokens` the tokenizer has."""
    for token in tokens:
        found = encoder.token_id(token)
        if found is not None:
            return found
    return None


def keras_hub_special_ids(layer, preset: Path) -> tuple[int | None, int | None, int]:
    """(start, end, pad) ids: the start token only where the preset's preprocessor puts it first;
    pad is the tokenizer's, else the end token."""
    start = getattr(layer, "start_token_id", None)
    end = getattr(layer, "end_token_id", None)
    pad = getattr(layer, "pad_token_id", None)
    if not _preprocessor_adds_start(preset):
        start = None
    if pad is None:
        pad = end if end is not None else 0
    return _optional_int(start), _optional_int(end), int(pad)


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


def _preprocessor_adds_start(preset: Path) -> bool:
    """Whether the preset's preprocessor puts the start token first (true where it has none saved:
    KerasHub's causal LM preprocessors do by default)."""
    try:
        config = json.loads((preset / PREPROCESSOR_FILE).read_text(encoding="utf-8")).get("config", {})
    except (OSError, ValueError):
        return True
    return bool(config.get("add_start_token", True))
