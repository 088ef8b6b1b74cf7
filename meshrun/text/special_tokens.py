"""A tokenizer's start, end, pad and stop ids, as the model's files name them: for a Hugging Face
tokenizer.json, the tokenizer_config.json beside it and the tokenizer.json's own post-processor
(else well-known token names) and the ids its generation_config.json (else config.json) stops at;
for a KerasHub preset, its tokenizer layer's, the start token only where the preset's preprocessor
puts it first.

The start token of a Hugging Face tokenizer is two things, as transformers has them: the token its
tokenizer_config.json names `bos_token` (a string, or an AddedToken dict with its `content`), which a
chat template writes as `bos_token`, and the token put before every text, which is the one the
tokenizer.json's post-processor (TemplateProcessing) puts before it, as `tokenizer(text)` does:
transformers 5 drops `add_bos_token` and `add_eos_token` from the config where a tokenizer.json is
present, whose post-processor decides. A tokenizer.json alone (no tokenizer_config.json) without a
TemplateProcessing starts texts with the first of HF_START_TOKENS it has.

Importing this module imports none of jax, keras, keras_hub and tensorflow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from meshrun.errors import ConfigError
from meshrun.text.tokenizer_files import PREPROCESSOR_FILE, PRESET_CONFIG_FILE

# Special tokens of a Hugging Face tokenizer.json, by name, first found wins.
HF_END_TOKENS = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|im_end|>")
HF_START_TOKENS = ("<|begin_of_text|>", "<s>", "<bos>")  # a tokenizer.json alone only
HF_PAD_TOKENS = ("<pad>",)
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # names the start, end and pad tokens where beside
HF_GENERATION_CONFIG_FILE = "generation_config.json"  # names the ids a model stops at where it is beside
NAMED = ("bos_token", "eos_token", "pad_token")
UNSTATED = "unstated"  # a post-processor that says nothing about a start token (none, or not a template)


class SpecialIds(NamedTuple):
    """A tokenizer's special tokens: `start` (the id put before every text, None: none), `end`,
    `pad`, and `start_token` (the text a chat template writes as bos_token, None: none)."""

    start: int | None
    end: int | None
    pad: int
    start_token: str | None


def hugging_face_special_ids(encoder, folder: Path, post_processor, source, key: str) -> SpecialIds:
    """The special ids of a Hugging Face tokenizer (its `encoder`; `post_processor`: its
    tokenizer.json's) in `folder`: start, end and pad as the tokenizer_config.json beside it names
    them (the module's docstring says how the start token is found), else the first of
    HF_END_TOKENS and HF_PAD_TOKENS it has; pad is the end token where it has none, else 0. A start
    or end token the file names that the tokenizer does not have is a ConfigError on `key`."""
    config = _tokenizer_config(folder / HF_TOKENIZER_CONFIG_FILE)
    named = _named_special_tokens(config or {})
    for field in NAMED[:2]:
        if field in named and encoder.token_id(named[field]) is None:
            raise ConfigError(
                key,
                f"got {source!r}, whose {HF_TOKENIZER_CONFIG_FILE} names {field} {named[field]!r}, which its "
                f"tokenizer does not have; name one of its tokens there (or null for none)",
            )
    end = _first_token(encoder, [named["eos_token"]] if "eos_token" in named else HF_END_TOKENS)
    pad = _first_token(encoder, [named["pad_token"]] if "pad_token" in named else HF_PAD_TOKENS)
    pad = pad if pad is not None else (end if end is not None else 0)
    added = post_processor_start(post_processor)
    if config is None:  # a tokenizer.json alone: well-known names where its post-processor is silent
        if added == UNSTATED:
            added = next((token for token in HF_START_TOKENS if encoder.token_id(token) is not None), None)
        return SpecialIds(None if added is None else encoder.token_id(added), end, pad, added)
    start_id = None if added in (None, UNSTATED) else encoder.token_id(added)
    return SpecialIds(start_id, end, pad, named.get("bos_token"))


def post_processor_start(post_processor) -> str | None:
    """The token a tokenizer.json's post-processor (a TemplateProcessing, alone or in a Sequence)
    puts before a single text: its text, None where it puts none first, UNSTATED without one."""
    processors = [post_processor]
    if isinstance(post_processor, dict) and post_processor.get("type") == "Sequence":
        processors = post_processor.get("processors") or []
    for processor in processors:
        if isinstance(processor, dict) and processor.get("type") == "TemplateProcessing":
            single = processor.get("single") or []
            first = single[0] if single and isinstance(single[0], dict) else {}
            special = first.get("SpecialToken")
            if not isinstance(special, dict):
                return None
            tokens = (processor.get("special_tokens") or {}).get(special.get("id"), {}).get("tokens") or []
            return tokens[0] if len(tokens) == 1 else None
    return UNSTATED


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


def _tokenizer_config(file: Path) -> dict | None:
    """The tokenizer_config.json beside a tokenizer.json, None without one (or one that is not a
    JSON object)."""
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _named_special_tokens(config: dict) -> dict[str, str]:
    """The special tokens a tokenizer_config.json names (bos_token, eos_token, pad_token: a string,
    or an AddedToken dict with its content); a null one is left out."""
    named = {}
    for field in NAMED:
        value = config.get(field)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            named[field] = value
    return named


def _first_token(encoder, tokens: Sequence[str]) -> int | None:
    """The id of the first of `tokens` the tokenizer has."""
    for token in tokens:
        found = encoder.token_id(token)
        if found is not None:
            return found
    return None


def keras_hub_special_ids(layer, preset: Path) -> SpecialIds:
    """The special ids of a preset's tokenizer `layer`: the start token only where the preset's
    preprocessor puts it first; pad is the tokenizer's, else the end token."""
    start = getattr(layer, "start_token_id", None)
    end = getattr(layer, "end_token_id", None)
    pad = getattr(layer, "pad_token_id", None)
    if not _preprocessor_adds_start(preset):
        start = None
    if pad is None:
        pad = end if end is not None else 0
    start = _optional_int(start)
    return SpecialIds(
        start, _optional_int(end), int(pad), None if start is None else str(layer.id_to_token(start))
    )


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
