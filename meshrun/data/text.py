"""data=text: a KerasHub causal LM fine-tuned on text files, tokenized by the model's own tokenizer.

    meshrun train model=keras_hub model.preset=DIR data=text 'data.files=[corpus/*.txt]' \
      data.eval_fraction=0.05
    meshrun train model=keras_hub model.preset=DIR data=text 'data.files=[data/*.jsonl]' \
      'data.prompt="Instruction: {instruction} Response: "' 'data.completion="{response}"'

- Files (meshrun.text.corpus): `.jsonl` records (text from `data.field`, or `data.prompt` and
  `data.completion` templates over their fields: the loss counts the completion only), other
  files plain text (one document each, or cut at `data.separator`).
- The tokenizer is the preset's (model.preset), else `data.tokenizer` (a preset dir or a Hugging
  Face tokenizer.json); meshrun.text.tokenizer encodes with its library directly.
- Tokens are made once into the token cache (meshrun.text.cache) with a progress bar; a rerun on
  the same inputs reads them from there and tokenizes nothing. Training reads the cache's rows
  through the numpy feed, a batch at a time, without TensorFlow.
- Rows (meshrun.text.examples): packed for plain text, one example a row (padded) for
  prompt/completion data, as `data.packing` says.
- Held-out text: `data.eval_files`, else `data.eval_fraction` of the examples (a fixed seeded
  choice), else the run evaluates on its training text and says so.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshrun.config.fields import setting
from meshrun.data import pipeline
from meshrun.data.arrays import open_array
from meshrun.data.batches import ArraySpec, indexed_batches
from meshrun.data.registry import DataContext, SourceSpec, register_source
from meshrun.errors import ConfigError
from meshrun.system.trust import private_dir
from meshrun.text import cache, corpus, examples
from meshrun.wording import counted, format_bytes, one_of

log = logging.getLogger("meshrun")

FORMATS = ("text", "chat")
EVAL_SPLIT_SEED = 0  # the held-out examples do not change with train.seed
TOKEN_INPUTS = ("padding_mask", "token_ids")


@dataclass(frozen=True)
class TextOptions:
    """Which text, how it becomes examples and tokens, and where the tokens are cached."""

    files: Any = setting(
        (),
        "Paths or globs (a single string is one): .jsonl, one JSON object a line; other files UTF-8 "
        "text, one document each, or cut at `separator`.",
    )
    eval_files: Any = setting((), "The eval data, like files; none: eval_fraction of files.")
    eval_fraction: float = setting(
        0.0, "Hold out this share of the examples (a fixed seeded choice) when no eval_files."
    )
    separator: str | None = setting(None, "Cuts a plain-text file into documents; null: one document a file.")
    field: str = setting("text", "The .jsonl field holding the text (without prompt and completion).")
    prompt: str | None = setting(
        None,
        'A template over the .jsonl fields, e.g. "Instruction: {instruction} Response: ": what the model '
        "sees; the loss counts the completion and its end token only.",
    )
    completion: str | None = setting(None, 'The completion\'s template, e.g. "{response}", with prompt.')
    packing: bool | None = setting(
        None,
        "true: documents joined with the end token, cut into rows, no padding (a document attends to "
        "the ones before it in its row); false: one example a row, padded; null: true for plain text, "
        "false for prompt/completion data.",
    )
    tokenizer: str | None = setting(
        None, "A preset dir or a Hugging Face tokenizer.json; null: model.preset's."
    )
    end_token: str | None = setting(None, "The end token; null: the tokenizer's own.")
    too_long: str = setting(
        "drop",
        "drop or error, for an example longer than a row; truncate (data.format=chat): drop whole "
        "earliest exchanges after the system prompt until it fits.",
    )
    format: str = setting(
        "text",
        "text: plain text or prompt/completion records; chat: .jsonl records of messages [{role, "
        "content}], rendered by the model's chat template, the loss on the assistant's turns.",
    )
    train_on: str = setting(
        "all_assistant",
        "data.format=chat: the assistant turns the loss counts, all_assistant or last_assistant.",
    )
    chat_template: str | None = setting(
        None,
        "data.format=chat: a Jinja chat template file, or a built-in's name (gemma, llama3, chatml); "
        "null: the model's own, else the built-in its tokenizer's turn markers call for.",
    )
    cache_dir: str | None = setting(None, "Where tokens are cached; null: $XDG_CACHE_HOME/meshrun/tokens.")
    shuffle: bool = setting(True, "Shuffle the training rows each epoch.")

    def __post_init__(self):
        object.__setattr__(self, "files", _patterns(self.files, "data.files"))
        object.__setattr__(self, "eval_files", _patterns(self.eval_files, "data.eval_files"))
        if not self.files:
            raise ConfigError(
                "data.files",
                "is required for data=text: .txt or .jsonl files "
                "(paths or globs), e.g. 'data.files=[data/*.jsonl]'",
            )
        if (self.prompt is None) != (self.completion is None):
            given, missing = (
                ("data.prompt", "data.completion")
                if self.completion is None
                else ("data.completion", "data.prompt")
            )
            raise ConfigError(
                missing,
                f"is required with {given}: instruction data needs both templates, e.g. "
                "data.prompt='Instruction: {instruction} Response: ' data.completion='{response}'",
            )
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(
                "data.eval_fraction", f"got {self.eval_fraction}; expected 0 <= eval_fraction < 1"
            )
        if self.eval_fraction and self.eval_files:
            raise ConfigError(
                "data.eval_fraction",
                f"got {self.eval_fraction} with data.eval_files; held-out text comes from one of them",
            )
        if self.too_long not in examples.TOO_LONG:
            raise ConfigError("data.too_long", f"got {self.too_long!r}; valid: {one_of(examples.TOO_LONG)}")
        self._check_chat()
        if self.separator is not None:  # the command line cannot carry a newline: \n, \t and \r mean them
            object.__setattr__(
                self,
                "separator",
                self.separator.replace("\\n", "\n").replace("\\t", "\t").replace("\\r", "\r"),
            )
        if self.separator == "":
            raise ConfigError(
                "data.separator",
                "got an empty string; give the text between documents "
                "(e.g. '\\n\\n') or null (a file is one document)",
            )

    def _check_chat(self) -> None:
        """One line for a chat setting without data.format=chat, or a text setting with it."""
        from meshrun.text.chat import TRAIN_ON

        if self.format not in FORMATS:
            raise ConfigError("data.format", f"got {self.format!r}; valid: {one_of(FORMATS)}")
        if self.train_on not in TRAIN_ON:
            raise ConfigError("data.train_on", f"got {self.train_on!r}; valid: {one_of(TRAIN_ON)}")
        chat = self.format == "chat"
        if chat and self.prompt is not None:
            raise ConfigError(
                "data.prompt",
                "is set with data.format=chat, which renders records with the chat template; "
                "leave data.prompt and data.completion unset",
            )
        for key, value, default in (
            ("train_on", self.train_on, "all_assistant"),
            ("chat_template", self.chat_template, None),
            ("too_long", self.too_long if self.too_long == "truncate" else None, None),
        ):
            if not chat and value != default:
                raise ConfigError(
                    f"data.{key}", f"got {value!r}, which applies to conversations only: set data.format=chat"
                )

    @property
    def chat(self) -> bool:
        """Whether the records are conversations (data.format=chat)."""
        return self.format == "chat"

    @property
    def corpus_format(self) -> corpus.CorpusFormat:
        return corpus.CorpusFormat(
            separator=self.separator, field=self.field, prompt=self.prompt, completion=self.completion
        )

    @property
    def packs(self) -> bool:
        """Whether examples are packed into rows: data.packing, by default for plain text only."""
        return self.packing if self.packing is not None else (self.prompt is None and not self.chat)


def _patterns(value, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise ConfigError(key, f"got {value!r}; expected a path or glob, or a list of them")


@dataclass(frozen=True)
class Tokenized:
    """The corpus as token rows (train and eval arrays by name, read from the cache), and what the
    report says about it."""

    arrays: dict
    meta: dict
    hit: bool


def load(options: TextOptions, context: DataContext) -> pipeline.Datasets:
    """Tokenizes the corpus (or reads its tokens from the cache) and batches its rows."""
    seq_len, vocabulary = _model_shape(context)
    tokenizer, source, key = _tokenizer(options, context, vocabulary)
    framing = framing_for(options, tokenizer)
    chat = chat_format(options, tokenizer, source, key) if options.chat else None
    tokenized = tokenize_cached(options, tokenizer, framing, seq_len, context.shared_caches, chat)
    train, evaluation = _train_and_eval(tokenized.arrays)
    _check_enough_rows(options, context, seq_len, train, evaluation, tokenized.meta["eval_source"])
    spec = _batch_spec(seq_len)
    first = examples.model_batch(
        (
            {k: np.asarray(v[: context.process_batch_size]) for k, v in train[0].items()},
            np.asarray(train[1][: context.process_batch_size]),
        )
    )
    return pipeline.Datasets(
        train=_batches(train, context, spec, options.shuffle, endless=True),
        eval=_batches(evaluation, context, spec, shuffle=False, endless=False),
        steps_per_epoch=len(train[1]) // context.batch_size,
        sample_batch=first,
        info=_info(options, tokenized, tokenizer, chat, len(train[1]), len(evaluation[1])),
    )


def _train_and_eval(arrays: dict) -> tuple[tuple, tuple]:
    """The train and eval parts of the cached arrays; with no held-out part, the training part twice
    (and a warning that the perplexity is not held-out)."""
    train, evaluation = _split(arrays, "train"), _split(arrays, "eval")
    if evaluation is None:
        evaluation = train
        log.warning(
            "data=text without data.eval_files or data.eval_fraction: "
            "evaluating on the training text (the perplexity is not held-out)"
        )
    return train, evaluation


def _check_enough_rows(
    options: TextOptions, context: DataContext, seq_len: int, train: tuple, evaluation: tuple, eval_source
) -> None:
    """A ConfigError when the training or the held-out text makes fewer rows than a batch."""
    train_rows, eval_rows = len(train[1]), len(evaluation[1])
    pipeline.check_enough(
        train_rows,
        context.batch_size,
        "data.files",
        f"the training text ({counted(train_rows, 'row')} of {seq_len + 1} tokens)",
    )
    pipeline.check_enough(
        eval_rows,
        context.batch_size,
        "data.eval_files" if options.eval_files else "data.eval_fraction",
        f"the held-out text ({eval_source}: {counted(eval_rows, 'row')})",
    )


def _batch_spec(seq_len: int) -> tuple:
    """The shapes and dtypes of a model batch: ({token_ids, padding_mask}, labels, weights)."""
    return (
        {
            "token_ids": ArraySpec((None, seq_len), np.dtype(np.int32)),
            "padding_mask": ArraySpec((None, seq_len), np.dtype(np.int32)),
        },
        ArraySpec((None, seq_len), np.dtype(np.int32)),
        ArraySpec((None, seq_len), np.dtype(np.float32)),
    )


def _batches(columns: tuple, context: DataContext, spec: tuple, shuffle: bool, endless: bool):
    """The model batches of a part's rows (({tokens, lengths}, weights)), this process's share."""
    features, weights = columns
    rows = np.arange(len(weights))
    made = indexed_batches(
        features, weights, rows, context.batch_size, shuffle, context.seed, context.share, endless=endless
    )
    return made.map(examples.model_batch, spec)


def _info(
    options: TextOptions, tokenized: Tokenized, tokenizer, chat, train_rows: int, eval_rows: int
) -> dict:
    """What the run's report says about the text: tokens, the cache, rows, what was dropped."""
    meta = tokenized.meta
    info = {
        "tokens": meta["train"]["trained_tokens"],
        "cache": "hit" if tokenized.hit else "miss",
        "cache_entry": str(meta["dir"]),
        "tokenizer": tokenizer.description,
        "packed": options.packs,
        "padding_fraction": meta["train"]["padding_fraction"],
        "train_examples": meta["train"]["examples"],
        "train_rows": train_rows,
        "eval_rows": eval_rows,
        "eval_source": meta["eval_source"],
        "dropped_too_long": meta["train"]["dropped"] + meta.get("eval", {}).get("dropped", 0),
    }
    if chat is not None:
        info.update(
            format="chat",
            chat_template_used=chat.description,
            truncated_too_long=meta["train"]["truncated"] + meta.get("eval", {}).get("truncated", 0),
        )
    return info


def _model_shape(context: DataContext) -> tuple[int, int]:
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


def _tokenizer(options: TextOptions, context: DataContext, vocabulary: int):
    """The tokenizer of data.tokenizer, else the preset's (its check's verdict kept in the token
    cache), where it came from and the key that named it; one with more ids than the model has is
    a ConfigError."""
    from meshrun.text.tokenizer import check_fits_vocabulary, load_tokenizer, tokenizer_source

    source, key = tokenizer_source(
        options.tokenizer, getattr(context.model_options, "preset", None), "data.tokenizer"
    )
    tokenizer = load_tokenizer(source, key, options.cache_dir, context.shared_caches)
    check_fits_vocabulary(tokenizer, source, key, vocabulary)
    return tokenizer, source, key


def chat_format(options: TextOptions, tokenizer, source: str, key: str):
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


def framing_for(options: TextOptions, tokenizer) -> examples.Framing:
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


def tokenize_cached(
    options: TextOptions, tokenizer, framing: examples.Framing, seq_len: int, shared: bool = False, chat=None
) -> Tokenized:
    """The corpus's token rows from the cache, tokenized and written there first on a miss; the
    cache dir must be writable by its owner alone (by its group too when `shared`). `chat`: the
    ChatFormat of data.format=chat."""
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
    options: TextOptions, tokenizer, framing: examples.Framing, seq_len: int, files, eval_files, chat=None
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
    options: TextOptions,
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
        train, held_out = _hold_out(train, options.eval_fraction)
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


def _hold_out(items: list, fraction: float) -> tuple[list, list]:
    """`items` split into kept and held-out ones: a seeded choice of `fraction` of them (at least one), in
    file order."""
    count = max(1, int(round(len(items) * fraction)))
    chosen = set(
        np.random.default_rng(EVAL_SPLIT_SEED)
        .choice(len(items), size=min(count, len(items) - 1), replace=False)
        .tolist()
    )
    return [e for i, e in enumerate(items) if i not in chosen], [
        e for i, e in enumerate(items) if i in chosen
    ]


def _rows(items: list, tokenizer, framing, seq_len: int, options: TextOptions, advance) -> examples.Rows:
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


def _chat_rows(
    items: list, tokenizer, framing, seq_len: int, options: TextOptions, advance, chat
) -> examples.Rows:
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


def _split(arrays: dict, part: str) -> tuple | None:
    """({tokens, lengths}, weights) of part `part` of the cached arrays (None: the entry has none)."""
    if f"{part}_tokens" not in arrays:
        return None
    return {"tokens": arrays[f"{part}_tokens"], "lengths": arrays[f"{part}_lengths"]}, arrays[
        f"{part}_weights"
    ]


def notes(options: TextOptions) -> list[str]:
    """What packing (or not) means for attention, and for conversations what the loss counts, as
    `meshrun plan` says it."""
    return _chat_notes(options) + _packing_notes(options)


def _chat_notes(options: TextOptions) -> list[str]:
    if not options.chat:
        return []
    template = options.chat_template or "the model's own chat template (else a built-in one)"
    return [
        f"data.format=chat renders each conversation with {template}; the loss counts the text of "
        f"{'every assistant turn' if options.train_on == 'all_assistant' else 'the last assistant turn'} "
        "and its end-of-turn token, nothing else"
    ]


def _packing_notes(options: TextOptions) -> list[str]:
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


SPEC = register_source(
    SourceSpec(
        "text",
        TextOptions,
        load,
        ".txt/.jsonl text tokenized by the model's tokenizer (KerasHub causal LMs)",
        notes=notes,
    )
)
