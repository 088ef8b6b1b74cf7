"""A text corpus as data=text reads it: the files its patterns name, and the examples in them (or,
for training a new tokenizer, all of their text: read_texts).

- A `.jsonl` file holds one JSON object a line: its text is the record's `field`, or, for
  instruction data, a prompt and a completion made by format templates over its fields.
- Any other file is UTF-8 text: one document, or several cut at `separator`.

A byte-order mark at the start of a file is not part of its text. A file is read once however many
paths name it (links included).

Every problem with the files is a ConfigError naming the key, the file and, for JSONL, the line.
"""

from __future__ import annotations

import glob
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from meshrun.errors import ConfigError
from meshrun.wording import counted, one_of

log = logging.getLogger("meshrun")

RECORD_SUFFIXES = (".jsonl",)


@dataclass(frozen=True)
class CorpusFormat:
    """How examples are read from files: the separator of plain-text documents (None: a file is
    one document), the JSONL field holding plain text, and the prompt and completion templates of
    instruction data (None: plain text)."""

    separator: str | None = None
    field: str = "text"
    prompt: str | None = None
    completion: str | None = None

    @property
    def instructions(self) -> bool:
        """Whether examples are prompt/completion pairs (templates given)."""
        return self.prompt is not None


class Example(NamedTuple):
    """One example: its prompt ("" for plain text), which the loss leaves out, and its text (the
    document, or the completion), which the loss counts; read from `file`, at JSONL line `line`
    or plain-text document `document` (counted from 1). A tuple: a corpus holds millions."""

    prompt: str
    text: str
    file: str
    line: int = 0
    document: int = 0

    @property
    def where(self) -> str:
        """Where it was read, as errors name it: FILE:LINE, or FILE document N."""
        return f"{self.file}:{self.line}" if self.line else f"{self.file} document {self.document}"


def expand(patterns: tuple[str, ...], key: str) -> tuple[Path, ...]:
    """The files `patterns` (paths or globs) name, in the order given (a glob's matches sorted);
    a pattern matching no file, or a dir, is a ConfigError on `key`."""
    files = []
    for pattern in patterns:
        expanded = str(Path(pattern).expanduser())
        matches = sorted(glob.glob(expanded, recursive=True)) if glob.has_magic(expanded) else [expanded]
        found = [Path(m) for m in matches if Path(m).is_file()]
        if not found:
            what = "matches no file" if glob.has_magic(expanded) else "is not a file"
            raise ConfigError(
                key,
                f"got {pattern!r}, which {what}; give .txt or "
                ".jsonl files (paths or globs, e.g. 'data/*.jsonl')",
            )
        files.extend(found)
    return read_once(files, key)


def read_once(files: list[Path], key: str) -> tuple[Path, ...]:
    """`files` with each file once, by its real path: a path named twice, or a link to a file named
    before it (a glob over a dir that holds links), is left out, and the log says so for the links."""
    first_by_real: dict[Path, Path] = {}
    linked = []
    for path in dict.fromkeys(files):
        first = first_by_real.setdefault(path.resolve(), path)
        if first != path:
            linked.append(f"{path} = {first}")
    if linked:
        one = len(linked) == 1
        log.info(
            f"{key}: {counted(len(linked), 'path')} {'names' if one else 'name'} the same file as an earlier "
            f"path (through a link), which is read once: {_listed(linked)}"
        )
    return tuple(first_by_real.values())


def _listed(items: list[str], shown: int = 3) -> str:
    """The first `shown` items, comma-separated, and how many more there are."""
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {more:,} more" if more > 0 else "")


def read_examples(files: tuple[Path, ...], corpus: CorpusFormat, key: str) -> list[Example]:
    """Every example of `files`, in file order; an empty corpus is a ConfigError on `key`."""
    examples = []
    for path in files:
        examples.extend(
            _records(path, corpus) if path.suffix in RECORD_SUFFIXES else _documents(path, corpus)
        )
    if not examples:
        if len(files) == 1:
            raise ConfigError(key, f"{str(files[0])!r} holds no text: it is empty or only whitespace")
        raise ConfigError(
            key,
            f"none of the {counted(len(files), 'file')} ({_listed([repr(str(f)) for f in files])}) holds any "
            "text: each is empty or only whitespace",
        )
    return examples


def read_conversations(files: tuple[Path, ...], key: str) -> list:
    """Every conversation of `files` (JSONL records of `messages`: meshrun.text.chat), in file
    order; a plain-text file, a bad record or no record at all is a ConfigError on `key`."""
    from meshrun.text.chat import conversation_of

    conversations = []
    for path in files:
        if path.suffix not in RECORD_SUFFIXES:
            raise ConfigError(
                key,
                f"got {str(path)!r}, plain text; data.format=chat reads .jsonl records "
                '{"messages": [{"role": ..., "content": ...}, ...]}',
            )
        for number, line in enumerate(_read_text(path, key).splitlines(), start=1):
            if line.strip():
                where = f"{path}:{number}"
                conversations.append(conversation_of(_parse_record(line, where, key), where, key))
    if not conversations:
        raise ConfigError(
            key, f"{one_of([repr(str(f)) for f in files])} hold no conversation: only blank lines"
        )
    return conversations


def read_texts(files: tuple[Path, ...], key: str) -> list[str]:
    """All the text of `files`, to train a tokenizer on: a plain-text file whole, and every string
    field of every JSONL record (an instruction and its response alike), in file order; a ConfigError
    on `key` when they hold none."""
    texts = []
    for path in files:
        if path.suffix not in RECORD_SUFFIXES:
            texts.append(_read_text(path, key))
            continue
        for number, line in enumerate(_read_text(path, key).splitlines(), start=1):
            if line.strip():
                record = _parse_record(line, f"{path}:{number}", key)
                texts.extend(value for value in record.values() if isinstance(value, str))
    if not any(text.strip() for text in texts):
        what = f"{str(files[0])!r} holds" if len(files) == 1 else f"the {len(files)} files hold"
        raise ConfigError(
            key, f"{what} no text to train a tokenizer on (empty, or JSONL records without text fields)"
        )
    return texts


def _read_text(path: Path, key: str = "data.files") -> str:
    """The file's text; a UTF-8 byte-order mark at its start (some editors write one) is not part of it."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(
            key, f"{str(path)!r} is not UTF-8 text (byte {err.start}); convert it, e.g. iconv -t UTF-8"
        ) from None


def _documents(path: Path, corpus: CorpusFormat) -> list[Example]:
    if corpus.instructions:
        raise ConfigError(
            "data.prompt",
            f"is set, but {str(path)!r} is plain text; prompt and completion templates read .jsonl records",
        )
    text = _read_text(path)
    parts = text.split(corpus.separator) if corpus.separator else [text]
    name = str(path)
    return [Example("", part, name, document=i + 1) for i, part in enumerate(parts) if part.strip()]


def _records(path: Path, corpus: CorpusFormat) -> list[Example]:
    examples, name = [], str(path)
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        record = _parse_record(line, where)
        if corpus.instructions:
            prompt = _fill("data.prompt", corpus.prompt, record, where)
            completion = _fill("data.completion", corpus.completion, record, where)
            if not completion.strip():
                raise ConfigError(
                    "data.completion",
                    f"gives an empty completion for {where}; the loss would count only its end token",
                )
            examples.append(Example(prompt, completion, name, line=number))
        else:
            examples.append(Example("", _field(record, corpus.field, where), name, line=number))
    return examples


def _parse_record(line: str, where: str, key: str = "data.files") -> dict:
    try:
        record = json.loads(line)
    except ValueError as err:
        raise ConfigError(key, f"{where} is not JSON ({err})") from None
    if not isinstance(record, dict):
        raise ConfigError(key, f"{where} holds a JSON {type(record).__name__}, not an object of fields")
    return record


def _field(record: dict, field: str, where: str) -> str:
    if field not in record:
        chat = "; records of messages are read with data.format=chat" if "messages" in record else ""
        raise ConfigError(
            "data.field", f"got {field!r}, which {where} lacks; its fields: {one_of(sorted(record))}{chat}"
        )
    value = record[field]
    if not isinstance(value, str):
        raise ConfigError(
            "data.field", f"got {field!r}: {where} holds a {type(value).__name__} there, not text"
        )
    return value


def _fill(key: str, template: str, record: dict, where: str) -> str:
    """`template` formatted with the record's fields."""
    try:
        return template.format_map(record)
    except KeyError as err:
        raise ConfigError(
            key, f"names field {err.args[0]!r}, which {where} lacks; its fields: {one_of(sorted(record))}"
        ) from None
    except (ValueError, IndexError, AttributeError) as err:
        raise ConfigError(
            key,
            f"got {template!r}, not a format template over the record's "
            f"fields ({err}); write fields as {{name}}, braces as {{{{ }}}}",
        ) from None
