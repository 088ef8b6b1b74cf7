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

This module owns the source: its options and their checks, `load` and its registration. The steps
of `load` are modules of their own, imported when a run loads its data (parsing a config imports
this module, and none of them): text_tokenizer.py (the tokenizer for the run, the framing),
text_tokens.py (tokenizing into the token cache), text_split.py (the train/eval split),
text_batches.py (the batches read from the cache), text_report.py (the report's figures, the plan's
notes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshrun.config.fields import setting
from meshrun.data import text_report
from meshrun.data.registry import DataContext, SourceSpec, register_source
from meshrun.errors import ConfigError
from meshrun.text import corpus, examples
from meshrun.wording import one_of

if TYPE_CHECKING:
    from meshrun.data import pipeline

FORMATS = ("text", "chat")


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


def load(options: TextOptions, context: DataContext) -> pipeline.Datasets:
    """Tokenizes the corpus (or reads its tokens from the cache) and batches its rows."""
    from meshrun.data import text_batches, text_split, text_tokenizer, text_tokens

    seq_len, vocabulary = text_tokenizer.model_shape(context)
    tokenizer, source, key = text_tokenizer.run_tokenizer(options, context, vocabulary)
    framing = text_tokenizer.framing_for(options, tokenizer)
    chat = text_tokenizer.chat_format(options, tokenizer, source, key) if options.chat else None
    tokenized = text_tokens.tokenize_cached(options, tokenizer, framing, seq_len, context.shared_caches, chat)
    train, evaluation = text_split.train_and_eval(tokenized.arrays)
    eval_source = tokenized.meta["eval_source"]
    text_batches.check_enough_rows(options, context, seq_len, train, evaluation, eval_source)
    info = text_report.info(options, tokenized, tokenizer, chat, len(train[1]), len(evaluation[1]))
    return text_batches.datasets(train, evaluation, context, seq_len, options.shuffle, info)


SPEC = register_source(
    SourceSpec(
        "text",
        TextOptions,
        load,
        ".txt/.jsonl text tokenized by the model's tokenizer (KerasHub causal LMs)",
        notes=text_report.notes,
    )
)
