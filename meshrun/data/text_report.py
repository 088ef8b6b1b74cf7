"""What data=text says about itself: the figures of the run's report (`info`: tokens, the cache hit
or miss, rows, what was dropped or truncated) and the notes `meshrun plan` prints (`notes`: what
packing means for attention, what the loss of conversations counts)."""

from __future__ import annotations


def info(options, tokenized, tokenizer, chat, train_rows: int, eval_rows: int) -> dict:
    """What the run's report says about the text: tokens, the cache, rows, what was dropped.
    `options`: the run's TextOptions (meshrun.data.text); `tokenized`: its
    meshrun.data.text_tokens.Tokenized; `chat`: the ChatFormat of data.format=chat, else None."""
    meta = tokenized.meta
    figures = {
        "tokens": meta["train"]["trained_tokens"],
        "cache": "hit" if tokenized.hit else "miss",
        "cache_entry": str(meta["dir"]),
        "tokenizer": tokenizer.description,
        "packed": options.packs,
        "padding_fraction": meta["train"]["padding_fraction"],
        "train_examples": meta["train"]["examples"] - meta["train"]["dropped"],  # those trained on
        "train_rows": train_rows,
        "eval_rows": eval_rows,
        "eval_source": meta["eval_source"],
        "dropped_too_long": meta["train"]["dropped"] + meta.get("eval", {}).get("dropped", 0),
    }
    if chat is not None:
        figures.update(
            format="chat",
            chat_template_used=chat.description,
            truncated_too_long=meta["train"]["truncated"] + meta.get("eval", {}).get("truncated", 0),
        )
    return figures


def notes(options) -> list[str]:
    """What packing (or not) means for attention, and for conversations what the loss counts, as
    `meshrun plan` says it."""
    return _chat_notes(options) + _packing_notes(options)


def _chat_notes(options) -> list[str]:
    if not options.chat:
        return []
    template = options.chat_template or "the model's own chat template (else a built-in one)"
    return [
        f"data.format=chat renders each conversation with {template}; the loss counts the text of "
        f"{'every assistant turn' if options.train_on == 'all_assistant' else 'the last assistant turn'} "
        "and its end-of-turn token, nothing else"
    ]


def _packing_notes(options) -> list[str]:
    if options.packs:
        return [
            "data=text packs examples (data.packing=true): they are joined with the end token and cut into "
            "rows of model.seq_len + 1 tokens, no padding; KerasHub's causal LMs take no segment ids, so an "
            "example attends to the ones before it in its row (data.packing=false: one example a row, padded)"
        ]
    return [
        "data=text puts one example a row (data.packing=false), right-padded: no example attends to another "
        "and padding weighs nothing (data.packing=true packs them: no "
        "padding, but examples attend to those before them in a row)"
    ]
