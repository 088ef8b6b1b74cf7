"""Tokenizing data=text's corpus into the token cache (meshrun.text.cache): the cache entry its
inputs and settings name, read back on a hit; on a miss the files read (meshrun.text.corpus), the
held-out examples chosen, every example or conversation encoded into rows (meshrun.text.examples)
with a progress bar on a terminal, what was too long said, and the arrays written to the entry."""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import logging
import sys
import time
from dataclasses import dataclass

from meshrun.data.arrays import open_array
from meshrun.data.text_split import hold_out
from meshrun.errors import ConfigError
from meshrun.system.trust import private_dir
from meshrun.text import cache, corpus, examples
from meshrun.wording import counted, format_bytes, one_of

log = logging.getLogger("meshrun")


@dataclass(frozen=True)
class Tokenized:
    """The corpus as token rows (train and eval arrays by name, read from the cache), and what the
    report says about it."""

    arrays: dict
    meta: dict
    hit: bool


def tokenize_cached(
    options, tokenizer, framing: examples.Framing, seq_len: int, shared: bool = False, chat=None
) -> Tokenized:
    """The corpus's token rows from the cache, tokenized and written there first on a miss; the
    cache dir must be writable by its owner alone (by its group too when `shared`). `options`: the
    run's TextOptions (meshrun.data.text); `chat`: the ChatFormat of data.format=chat."""
    files = corpus.expand(options.files, "data.files")
    eval_files = corpus.expand(options.eval_files, "data.eval_files")
    settings = {
        "files": [str(f) for f in files],
        "eval_files": [str(f) for f in eval_files],
        "eval_fraction": options.eval_fraction,
        "format": vars(options.corpus_format),
        "packing": options.packs,
        "too_long": options.too_long,
        "seq_len": seq_len,
        "framing": vars(framing),
        "tokenizer": tokenizer.fingerprint,
    }
    if chat is not None:  # only then: text caches keep their keys
        settings["chat"] = {
            "template": hashlib.sha256(chat.template.text.encode()).hexdigest(),
            "train_on": options.train_on,
        }
    root = private_dir(
        cache.root(options.cache_dir), "data.cache_dir", shared, what="the tokens a run trains on"
    )
    directory = root / cache.key(settings, files + eval_files)
    meta = cache.find(directory)
    hit = meta is not None
    if not hit:
        arrays, meta = _tokenize(options, tokenizer, framing, seq_len, files, eval_files, chat)
        cache.write(directory, arrays, meta)
        meta = cache.find(directory)
    else:
        count = len(files + eval_files)
        log.info(
            f"tokens of the {count} file{'s' if count > 1 else ''} read from the token cache {directory}"
        )
    arrays = {
        name.removesuffix(".npy"): open_array(str(directory / name), "data.cache_dir")
        for name in meta["arrays"]
    }
    return Tokenized(arrays, {**meta, "dir": directory}, hit)


def _tokenize(
    options, tokenizer, framing: examples.Framing, seq_len: int, files, eval_files, chat=None
) -> tuple[dict, dict]:
    """Reads and tokenizes the corpus into train (and eval) rows; returns the arrays and their metadata."""
    started = time.perf_counter()
    with collection_paused():
        return _tokenize_all(options, tokenizer, framing, seq_len, files, eval_files, started, chat)


@contextlib.contextmanager
def collection_paused():
    """Python's cyclic garbage collector off while a corpus is read: its millions of small objects
    would each time trigger collections that walk every object of the process (jax's and keras'
    included), which took as long as reading the text."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _tokenize_all(
    options,
    tokenizer,
    framing: examples.Framing,
    seq_len: int,
    files,
    eval_files,
    started: float,
    chat=None,
) -> tuple[dict, dict]:
    if chat is not None:
        train = corpus.read_conversations(files, "data.files")
        held_out = corpus.read_conversations(eval_files, "data.eval_files") if eval_files else []
    else:
        train = corpus.read_examples(files, options.corpus_format, "data.files")
        held_out = (
            corpus.read_examples(eval_files, options.corpus_format, "data.eval_files") if eval_files else []
        )
    source = f"{one_of([str(f) for f in eval_files])}" if eval_files else None
    if options.eval_fraction:
        train, held_out = hold_out(train, options.eval_fraction)
        source = f"{options.eval_fraction:.0%} of the examples ({len(held_out)})"
    total_bytes = sum(_text_bytes(e) for e in train + held_out)
    rows_of = functools.partial(_chat_rows, chat=chat) if chat is not None else _rows
    with TokenizingProgress(total_bytes, tokenizer.description) as advance:
        parts = {"train": rows_of(train, tokenizer, framing, seq_len, options, advance)}
        if held_out:
            parts["eval"] = rows_of(held_out, tokenizer, framing, seq_len, options, advance)
    arrays, meta = {}, {"eval_source": source, "tokenizer": tokenizer.description}
    for part, rows in parts.items():
        arrays.update(
            {f"{part}_tokens": rows.tokens, f"{part}_lengths": rows.lengths, f"{part}_weights": rows.weights}
        )
        meta[part] = {
            "examples": len(train if part == "train" else held_out),
            "rows": len(rows.lengths),
            "trained_tokens": rows.trained_tokens,
            "padding_fraction": round(rows.padding_fraction, 6),
            "dropped": rows.dropped,
            "truncated": rows.truncated,
        }
        noun = f"{part} conversation" if chat is not None else f"{part} example"
        if rows.dropped:
            _warn_dropped(rows, noun, meta[part]["examples"], seq_len, options.too_long)
        if rows.truncated:
            one = rows.truncated == 1
            log.warning(
                f"data.too_long=truncate: {rows.truncated:,} of the {counted(meta[part]['examples'], noun)} "
                f"{'was' if one else 'were'} longer than model.seq_len + 1 = {seq_len + 1} tokens and lost "
                "their earliest exchanges to fit"
            )
    seconds = time.perf_counter() - started
    log.info(
        f"tokenized {format_bytes(total_bytes)} of text into {meta['train']['trained_tokens']:,} training "
        f"tokens in {seconds:.1f} s "
        f"({format_bytes(int(total_bytes / max(seconds, 1e-9)))}/s, {tokenizer.description})"
    )
    return arrays, meta


def _warn_dropped(rows: examples.Rows, noun: str, count: int, seq_len: int, too_long: str = "drop") -> None:
    """Says how many of `count` examples (`noun`: what they are) were too long for a row and left out."""
    one = rows.dropped == 1
    log.warning(
        f"data.too_long={too_long}: {rows.dropped:,} of the {counted(count, noun)} "
        f"{'makes' if one else 'make'} "
        f"more than model.seq_len + 1 = {seq_len + 1} tokens and {'was' if one else 'were'} left out (the "
        f"first: {rows.first_dropped}); raise model.seq_len to keep {'it' if one else 'them'}"
    )


def _rows(items: list, tokenizer, framing, seq_len: int, options, advance) -> examples.Rows:
    texts = examples.encode_all(tokenizer.encode_ragged, [e.text for e in items], advance)
    prompts = None
    if options.prompt is not None:
        prompts = examples.framed_prompts(
            framing, examples.encode_all(tokenizer.encode_ragged, [e.prompt for e in items], advance)
        )
    rows = examples.to_rows(items, prompts, texts, framing, seq_len, options.packs, options.too_long)
    if not len(rows.lengths):
        raise ConfigError(
            "data.files",
            f"the text makes no row of model.seq_len + 1 = {seq_len + 1} tokens "
            f"({counted(len(items), 'example')}{_too_long(rows.dropped, len(items))})",
        )
    return rows


def _text_bytes(item) -> int:
    """The characters of an example, or of a conversation's turns."""
    if isinstance(item, corpus.Example):
        return len(item.prompt) + len(item.text)
    return sum(len(turn["content"]) for turn in item.messages)


def _chat_rows(items: list, tokenizer, framing, seq_len: int, options, advance, chat) -> examples.Rows:
    """The rows of conversations: each rendered and tokenized by `chat` with its weights, too long
    ones truncated, dropped or an error as data.too_long says, then packed or padded."""
    kept, dropped = chat.fit(items, seq_len + 1, options.too_long, options.train_on)
    advance(sum(_text_bytes(c) for c in items))
    first = dropped[0] if dropped else None
    rows = examples.weighted_rows(
        [e.ids for e in kept],
        [e.weights for e in kept],
        seq_len,
        options.packs,
        framing.pad,
        dropped=len(dropped),
        first_dropped=first.where if first is not None else None,
        truncated=sum(e.truncated for e in kept),
    )
    if not len(rows.lengths):
        raise ConfigError(
            "data.files",
            f"the conversations make no row of model.seq_len + 1 = {seq_len + 1} tokens "
            f"({counted(len(items), 'conversation')}{_too_long(rows.dropped, len(items))})",
        )
    return rows


def _too_long(dropped: int, examples: int) -> str:
    """How many of the examples were too long, after their count: `, all too long`, `, 2 too long`."""
    if not dropped:
        return ""
    if dropped == examples:
        return ", too long" if examples == 1 else ", all too long"
    return f", {dropped:,} too long"


class TokenizingProgress:
    """A progress bar over the bytes tokenized, on a terminal; `advance(bytes)` moves it."""

    def __init__(self, total: int, what: str):
        self.total, self.what, self.bar = total, what, None

    def __enter__(self):
        if sys.stderr.isatty() and self.total > (1 << 20):
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(
                TextColumn("tokenizing"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("tokenizing", total=self.total)
        return self.advance

    def advance(self, size: int) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, size)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
