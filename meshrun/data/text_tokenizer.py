"""The tokenizer a data=text run uses and what it must fit: the model's sequence length and
vocabulary (read from its inputs and logits), the tokenizer (data.tokenizer, else model.preset's),
the chat format of data.format=chat, and the special tokens framing every example (`framing_for`,
also what sampling frames its prompts with). meshrun.text.tokenizer loads and encodes; this module
chooses for the run."""

from __future__ import annotations

import logging

from meshrun.data.registry import DataContext
from meshrun.errors import ConfigError
from meshrun.text import examples

log = logging.getLogger("meshrun")

TOKEN_INPUTS = ("padding_mask", "token_ids")


def model_shape(context: DataContext) -> tuple[int, int]:
    """The model's sequence length and vocabulary (its logits' width); a model that does not take
    {token_ids, padding_mask} is a ConfigError."""
    signature = context.signature
    names = tuple(sorted(s.name or "" for s in signature.inputs)) if signature is not None else ()
    if names != TOKEN_INPUTS:
        raise ConfigError(
            "data",
            "data=text feeds causal LMs taking token_ids and "
            f"padding_mask (model=keras_hub), not {context.model.name}",
        )
    return int(signature.inputs[0].shape[0]), int(signature.outputs[0].shape[-1])


def run_tokenizer(options, context: DataContext, vocabulary: int):
    """The tokenizer of data.tokenizer, else the preset's (its check's verdict kept in the token
    cache), where it came from and the key that named it; one with more ids than the model has is
    a ConfigError. `options`: the run's TextOptions (meshrun.data.text)."""
    from meshrun.text.tokenizer import check_fits_vocabulary, load_tokenizer, tokenizer_source

    source, key = tokenizer_source(
        options.tokenizer, getattr(context.model_options, "preset", None), "data.tokenizer"
    )
    tokenizer = load_tokenizer(source, key, options.cache_dir, context.shared_caches)
    check_fits_vocabulary(tokenizer, source, key, vocabulary)
    return tokenizer, source, key


def chat_format(options, tokenizer, source: str, key: str):
    """How conversations are rendered and tokenized (meshrun.text.chat.ChatFormat): with
    data.chat_template, else the template beside the tokenizer at `source` (named by `key`), else
    the built-in one its turn markers call for."""
    from meshrun.text.chat import load_chat

    chat = load_chat(tokenizer, source, options.chat_template, key)
    log.info(
        f"conversations rendered by {chat.description}, "
        f"the loss on {options.train_on.replace('_', ' ')} turns"
    )
    return chat


def framing_for(options, tokenizer) -> examples.Framing:
    """The special tokens around every example: the tokenizer's start, its end (or data.end_token), its
    pad."""
    if options.end_token is not None:
        end = tokenizer.token_id(options.end_token)
        if end is None:
            raise ConfigError(
                "data.end_token",
                f"got {options.end_token!r}, which {tokenizer.description} "
                "does not have; null takes its own end token",
            )
    else:
        end = tokenizer.end_id
        if end is None:
            raise ConfigError(
                "data.end_token",
                f"is required: {tokenizer.description} names no end token; give the token that ends a text",
            )
    return examples.Framing(
        start=tokenizer.start_id,
        end=int(end),
        pad=int(tokenizer.pad_id if tokenizer.pad_id is not None else end),
    )
