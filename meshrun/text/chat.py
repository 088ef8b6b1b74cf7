"""Conversations as a chat model trains on them: `messages` rendered by the model's own chat
template, tokenized so that the loss weighs exactly the assistant's turns.

- **The template** (`find_template`): data.chat_template when given (a Jinja file, or the name of a
  built-in: gemma, llama3, chatml), else the `chat_template` the model came with (its
  tokenizer_config.json, or chat_template.jinja, beside its tokenizer), else the built-in one its
  tokenizer's turn markers call for (`<start_of_turn>`: Gemma's; `<|start_header_id|>` and
  `<|eot_id|>`: Llama 3's; `<|im_start|>`: ChatML, Qwen's). It is rendered as transformers renders
  it, by Jinja's sandboxed environment (a template can read its arguments, not Python's insides).
- **The weighted text** of an assistant turn is its content as the template renders it (Llama 3's
  and Gemma's trim it) and everything after it up to and including the first special token, the
  end of its turn (`<|eot_id|>`, `<end_of_turn>`, `<|im_end|>`): the model learns to stop. It is
  found by rendering the conversation up to the turn with the generation prompt and up to the turn's
  end: the difference is the turn. A template whose renderings are not prefixes of one another (one
  that rewrites earlier turns) is refused, as is one that ends a turn with no special token.
- **Tokens** (`ChatFormat.encode_many`): where the tokenizer reads special tokens from text (a Hugging
  Face tokenizers encoder), the whole rendered text is encoded at once, as apply_chat_template does,
  and a token weighs where its characters overlap a weighted text (transformers' rule for
  `return_assistant_tokens_mask`): no piece gets a prefix space of its own, so SentencePiece-style
  BPEs (a Metaspace pre-tokenizer, the legacy Prepend normalizer) give transformers' ids. Elsewhere
  (SentencePiece, which does not read control tokens such as `<bos>` from text, and KerasHub's
  graph) the text is cut at every special token (each becomes its id) and at the edges of the
  weighted text, and each plain piece is encoded alone. The reference test
  (tests/test_chat_reference.py) checks the ids, and the weights where transformers gives a mask,
  against apply_chat_template for Llama 3, Gemma, ChatML, Mistral, Llama 2 and DeepSeek-style
  tokenizers.
- **One start token**: where the tokenizer starts text with one (its start_id), the ids start with
  exactly one, whether the template writes it, the tokenizer adds it, or both.
- **Too long** (`fit`): data.too_long=truncate drops whole exchanges (a user turn and the replies
  after it), earliest first after the system prompt, and renders again until the conversation fits;
  the last exchange is never cut: a conversation whose last exchange alone is too long is dropped.

Importing this module imports numpy and jinja2 only.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from meshrun.errors import ConfigError
from meshrun.wording import first_line, one_of

ROLES = ("system", "user", "assistant")
TRAIN_ON = ("all_assistant", "last_assistant")
TEMPLATE_KEY = "data.chat_template"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
PROBE = ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"})

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# Gemma's turns; a system prompt goes before the first user turn's text, as Gemma 3's template puts it
# (Gemma 1 and 2's refuse a system turn).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] | trim + '\\n\\n' %}"
    "{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') "
    "+ message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Each built-in template and the special tokens a tokenizer must have for it to be chosen.
BUILT_IN = {
    "gemma": (GEMMA_TEMPLATE, ("<start_of_turn>", "<end_of_turn>")),
    "llama3": (LLAMA3_TEMPLATE, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    "chatml": (CHATML_TEMPLATE, ("<|im_start|>", "<|im_end|>")),
}


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template: its Jinja text, where it came from (as logs and errors say it), and the
    config key that chose it (errors in it blame that key)."""

    text: str
    source: str
    key: str


class Conversation(NamedTuple):
    """One record's turns ({role, content} dicts) and where it was read (FILE:LINE)."""

    messages: tuple
    where: str


@dataclass(frozen=True)
class Encoded:
    """A conversation's ids (int32) and the weight of each in the loss (uint8: 1 on the assistant's
    weighted text), and whether earlier exchanges were dropped to make it fit."""

    ids: np.ndarray
    weights: np.ndarray
    truncated: bool = False


# --- reading records ---------------------------------------------------------------------------------


def conversation_of(record: dict, where: str, key: str = "data.files") -> Conversation:
    """The conversation of one JSONL record, or a ConfigError naming `key` and `where` for a record
    without `messages`, a turn that is not {role, content} text, a role other than ROLES, or a
    conversation that does not end with the assistant's turn."""
    messages = record.get("messages")
    if messages is None:
        raise ConfigError(
            key,
            f"{where} has no 'messages' (its fields: {one_of(sorted(record)) or 'none'}); data.format=chat "
            'reads records {"messages": [{"role": "user", "content": "..."}, ...]}',
        )
    turns = _turns(
        messages, where, key, "assistant", "so it has nothing to learn; a conversation for training"
    )
    return Conversation(turns, where)


def _turns(messages, where: str, key: str, last: str, why: str) -> tuple[dict, ...]:
    """`messages` checked turn by turn, the last one's role `last` (`why` says why, before "ends
    with the {last}'s turn")."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ConfigError(key, f"{where}: 'messages' is {_shown(messages)}; expected a list of turns")
    turns = tuple(_turn(turn, number, where, key) for number, turn in enumerate(messages, start=1))
    role = turns[-1]["role"]
    if role != last:
        article = "an" if role == "assistant" else "a"
        raise ConfigError(key, f"{where} ends with {article} {role} turn, {why} ends with the {last}'s turn")
    return turns


def _turn(turn, number: int, where: str, key: str) -> dict:
    if not isinstance(turn, dict):
        raise ConfigError(key, f"{where} turn {number} is {_shown(turn)}; expected {{role, content}}")
    role = turn.get("role")
    if role not in ROLES:
        raise ConfigError(key, f"{where} turn {number} has role {_shown(role)}; valid: {one_of(ROLES)}")
    content = turn.get("content")
    if not isinstance(content, str):
        what = "no 'content'" if content is None else f"content {_shown(content)}, not text"
        raise ConfigError(key, f"{where} turn {number} ({role}) has {what}")
    return {"role": role, "content": content}


def _shown(value, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def prompt_conversation(turns: Sequence, where: str, key: str) -> tuple[dict, ...]:
    """Turns ({role, content} dicts) a model is asked to reply to, checked as records are; a
    conversation that does not end with a user turn is a ConfigError on `key`."""
    return _turns(turns, where, key, "user", "but a conversation to reply to")


# --- the template ---------------------------------------------------------------------------------


def find_template(given: str | None, tokenizer_source: str | None, tokenizer, key: str) -> ChatTemplate:
    """The chat template a run renders with: `given` (data.chat_template: a file, or a built-in's
    name), else the one beside the tokenizer at `tokenizer_source` (from config key `key`), else
    the built-in one the tokenizer's special tokens call for; else a ConfigError saying what to give."""
    if given:
        return _given_template(given)
    if tokenizer_source:
        found = _template_beside(Path(str(tokenizer_source)).expanduser(), key)
        if found is not None:
            return found
    specials = tokenizer.special_tokens()
    for name, (text, markers) in BUILT_IN.items():
        if all(marker in specials for marker in markers):
            return ChatTemplate(text, f"meshrun's built-in {name} template", TEMPLATE_KEY)
    raise ConfigError(
        TEMPLATE_KEY,
        f"is required: {tokenizer.description} came with no chat template and has none of the turn "
        f"markers of meshrun's built-in ones ({one_of(BUILT_IN)}); give a Jinja file or a built-in's name",
    )


def _given_template(given: str) -> ChatTemplate:
    if given in BUILT_IN:
        return ChatTemplate(BUILT_IN[given][0], f"meshrun's built-in {given} template", TEMPLATE_KEY)
    path = Path(given).expanduser()
    if not path.is_file():
        raise ConfigError(
            TEMPLATE_KEY,
            f"got {given!r}, which {'is a dir' if path.is_dir() else 'does not exist'}; give a Jinja chat "
            f"template file or a built-in template's name ({one_of(BUILT_IN)})",
        )
    try:
        return ChatTemplate(path.read_text(encoding="utf-8"), f"the template {given}", TEMPLATE_KEY)
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            TEMPLATE_KEY, f"got {given!r}, which cannot be read ({first_line(error)})"
        ) from None


def _template_beside(source: Path, key: str) -> ChatTemplate | None:
    """The chat template in the tokenizer_config.json (or chat_template.jinja) beside the tokenizer
    at `source` (a file or its dir); None without one. A list of named templates gives its default."""
    folder = source if source.is_dir() else source.parent
    try:
        config = json.loads((folder / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    text = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(text, list):
        named = {entry.get("name"): entry.get("template") for entry in text if isinstance(entry, dict)}
        text = named.get("default")
    if isinstance(text, str) and text.strip():
        return ChatTemplate(text, f"the chat_template of {folder / TOKENIZER_CONFIG_FILE}", key)
    if (folder / TEMPLATE_FILE).is_file():
        return ChatTemplate(
            (folder / TEMPLATE_FILE).read_text(encoding="utf-8"), str(folder / TEMPLATE_FILE), key
        )
    return None


def _compiled(template: ChatTemplate):
    """The template compiled in a sandboxed Jinja environment set up as transformers sets up its
    own (trimmed blocks, loop controls, tojson, raise_exception; {% generation %} blocks render
    their text); a syntax error is a ConfigError naming the template's line."""
    try:
        import jinja2
    except ImportError:
        raise ConfigError(
            template.key,
            "renders conversations with Jinja, which is not installed: pip install 'meshrun[hub]'",
        ) from None
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlocks(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlocks, loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    try:
        return environment.from_string(template.text)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise ConfigError(
            template.key, f"{template.source} is not a Jinja template: line {error.lineno}: {error.message}"
        ) from None


def _overlap_weights(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """1 for each token (its [start, end) characters in `offsets`) that overlaps one of the weighted
    `spans`, else 0 (uint8): transformers' rule for `return_assistant_tokens_mask`."""
    weights = np.zeros(len(offsets), np.uint8)
    for start, end in spans:
        weights |= ((offsets[:, 1] > start) & (offsets[:, 0] < end)).astype(np.uint8)
    return weights


def _template_line(error: BaseException) -> str:
    """`at its line N` for an error raised while a template rendered (Jinja puts the template's
    lines in the traceback), else ''."""
    line, trace = None, error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == "<template>":
            line = trace.tb_lineno
        trace = trace.tb_next
    return f" at its line {line}" if line else ""


# --- rendering and tokens --------------------------------------------------------------------------


def load_chat(tokenizer, tokenizer_source: str | None, template_file: str | None, key: str = "model.preset"):
    """The ChatFormat of a run: `tokenizer` (meshrun.text.tokenizer.TextTokenizer, read from
    `tokenizer_source`, set by config key `key`) and the template find_template chooses."""
    return ChatFormat(find_template(template_file, tokenizer_source, tokenizer, key), tokenizer)


class ChatFormat:
    """Renders conversations with one template and turns them into weighted ids with one tokenizer."""

    def __init__(self, template: ChatTemplate, tokenizer):
        self.template = template
        self.tokenizer = tokenizer
        self._jinja = _compiled(template)
        self._specials = tokenizer.special_tokens()
        ordered = sorted(self._specials, key=len, reverse=True)
        self._special_pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._start = tokenizer.start_id
        self.bos_token = tokenizer.start_token or ""
        self.eos_token = tokenizer.token_text(tokenizer.end_id) if tokenizer.end_id is not None else ""

    @property
    def description(self) -> str:
        return self.template.source

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False, where: str = "") -> str:
        """The template's text for `messages` (with the assistant's header after them when
        `add_generation_prompt`); a failure is a ConfigError naming `where` and the template's line."""
        try:
            return self._jinja.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except Exception as error:  # whatever a template raises: TemplateError, TypeError, ...
            place = f" on {where}" if where else ""
            raise ConfigError(
                self.template.key,
                f"{self.template.source} fails{place}{_template_line(error)}: {first_line(error)}"
                f"{self._system_hint(messages, add_generation_prompt)}",
            ) from None

    def _system_hint(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
        """What to do where the template fails on a conversation with a system turn and renders it
        without one (Gemma 1 and 2's refuse a system turn): meshrun's built-in Gemma template for a
        tokenizer with Gemma's turn markers, else a template that takes one; '' otherwise."""
        if not messages or messages[0]["role"] != "system" or len(messages) < 2:
            return ""
        try:
            self._jinja.render(
                messages=list(messages[1:]),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except Exception:  # it fails for another reason too
            return ""
        if all(marker in self._specials for marker in BUILT_IN["gemma"][1]):
            return (
                "; it takes no system turn: data.chat_template=gemma puts the system prompt before the "
                "first user turn's text, as Gemma 3's template does"
            )
        return (
            "; it takes no system turn: drop the system turns, or give data.chat_template a template "
            "that takes one"
        )

    @functools.cached_property
    def end_of_turn_ids(self) -> tuple[int, ...]:
        """The special token that ends an assistant turn (rendering a probe conversation: a
        template that cannot render one is a ConfigError)."""
        text, spans = self._weighted_spans(PROBE, "all_assistant", "a probe conversation")
        found = self._special_pattern.search(text, spans[0][0]) if self._special_pattern else None
        return (self._specials[found.group()],) if found else ()

    def _weighted_spans(self, messages, train_on: str, where: str) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the (start, end) of each weighted text in it: an assistant
        turn's content and what follows it up to its end-of-turn token."""
        text = self.render(messages, where=where)
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if train_on == "last_assistant":
            turns = turns[-1:]
        spans = []
        for index in turns:
            before = self.render(messages[:index], add_generation_prompt=True, where=where)
            through = self.render(messages[: index + 1], where=where)
            if not (through.startswith(before) and text.startswith(through)):
                raise ConfigError(
                    self.template.key,
                    f"{self.template.source} renders {where} so that its earlier turns change as turns are "
                    "added; meshrun finds an assistant turn's tokens by rendering the conversation up to "
                    "it: use a template whose renderings grow by appending",
                )
            content = messages[index]["content"]
            start = through.find(content, len(before))
            if start < 0:  # a template that trims the text (Llama 3's, Gemma's)
                content = content.strip()
                start = through.find(content, len(before))
            if start < 0:
                raise ConfigError(
                    self.template.key,
                    f"{self.template.source} does not render the assistant's text of {where} (turn "
                    f"{index + 1}) as given; meshrun weighs the text the template writes",
                )
            closing = (
                self._special_pattern.search(through, start + len(content)) if self._special_pattern else None
            )
            if closing is None:
                raise ConfigError(
                    self.template.key,
                    f"{self.template.source} ends an assistant turn with no special token, so the model "
                    "could not learn where its turn stops; use a template that closes each turn with one",
                )
            spans.append((start, closing.end()))
        return text, spans

    def _pieces(self, text: str, spans: list[tuple[int, int]]) -> list[tuple[str, int, int | None]]:
        """`text` cut at its special tokens and at the spans' edges: (text, weight, special id or None)."""
        cuts = {0, len(text)}
        specials = {}
        for found in self._special_pattern.finditer(text) if self._special_pattern else ():
            specials[found.start()] = found.end()
            cuts.update(found.span())
        for span in spans:
            cuts.update(span)
        ordered = sorted(cuts)
        pieces = []
        for start, end in zip(ordered, ordered[1:], strict=False):
            weight = int(any(a <= start and end <= b for a, b in spans))
            piece = text[start:end]
            special = self._specials[piece] if specials.get(start) == end else None
            pieces.append((piece, weight, special))
        return pieces

    def encode_many(
        self, conversations: Sequence[Conversation], train_on: str = "all_assistant"
    ) -> list[Encoded]:
        """Each conversation's ids and weights (`train_on`: one of TRAIN_ON, as data.train_on is
        checked), all of them encoded in one batch."""
        return self._encoded([self._weighted_spans(c.messages, train_on, c.where) for c in conversations])

    def _encoded(self, rendered: list[tuple[str, list[tuple[int, int]]]]) -> list[Encoded]:
        """Each rendered text and its weighted spans as ids and weights, each beginning with one
        start token (_one_start): the whole text encoded at once where the tokenizer reads special
        tokens from text, else cut into pieces (_pieces)."""
        if self.tokenizer.reads_special_tokens:
            encoded = self.tokenizer.encode_with_offsets([text for text, _ in rendered])
            pairs = [
                (ids, _overlap_weights(offsets, spans))
                for (ids, offsets), (_, spans) in zip(encoded, rendered, strict=True)
            ]
        else:
            pairs = self._encoded_pieces([self._pieces(text, spans) for text, spans in rendered])
        return [self._one_start(ids, weights) for ids, weights in pairs]

    def _encoded_pieces(
        self, cut: list[list[tuple[str, int, int | None]]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each list of pieces (_pieces) as ids and weights: a special token its id, the plain
        pieces of all of them encoded in one batch."""
        plain = [text for pieces in cut for text, _, special in pieces if special is None]
        encoded = iter(self.tokenizer.encode(plain) if plain else [])
        results = []
        for pieces in cut:
            ids, weights = [], []
            for _text, weight, special in pieces:
                piece_ids = [special] if special is not None else next(encoded).tolist()
                ids.extend(piece_ids)
                weights.extend([weight] * len(piece_ids))
            results.append((np.asarray(ids, np.int32), np.asarray(weights, np.uint8)))
        return results

    def encode(
        self, messages: Sequence[dict], train_on: str = "all_assistant", where: str = "a conversation"
    ) -> Encoded:
        """One conversation's ids and weights (encode_many)."""
        return self.encode_many([Conversation(tuple(messages), where)], train_on)[0]

    def prompt_ids(self, messages: Sequence[dict], where: str = "the conversation") -> np.ndarray:
        """The ids a model completes `messages` from: rendered with the generation prompt (the
        assistant's header), tokenized as training tokenizes."""
        text = self.render(messages, add_generation_prompt=True, where=where)
        return self._encoded([(text, [])])[0].ids

    def _one_start(self, ids: np.ndarray, weights: np.ndarray) -> Encoded:
        """`ids` beginning with exactly one start token where the tokenizer has one."""
        if self._start is None:
            return Encoded(ids, weights)
        leading = 0
        while leading < len(ids) and ids[leading] == self._start:
            leading += 1
        keep = max(leading - 1, 0)
        ids, weights = ids[keep:], weights[keep:]
        if not leading:
            ids = np.concatenate([[self._start], ids]).astype(np.int32)
            weights = np.concatenate([[0], weights]).astype(np.uint8)
        return Encoded(ids, weights)

    def fit(
        self, conversations: Sequence[Conversation], limit: int, too_long: str, train_on: str
    ) -> tuple[list[Encoded], list[Conversation]]:
        """The conversations' encodings that hold at most `limit` ids, and those dropped: a longer
        one is dropped (too_long=drop), an error (error), or cut by whole earliest exchanges until it
        fits (truncate; dropped when its last exchange alone does not fit)."""
        kept, dropped = [], []
        for conversation, encoded in zip(
            conversations, self.encode_many(conversations, train_on), strict=True
        ):
            if len(encoded.ids) > limit and too_long == "truncate":
                encoded = self._truncated(conversation, limit, train_on) or encoded
            if len(encoded.ids) <= limit:
                kept.append(encoded)
                continue
            if too_long == "error":
                raise ConfigError(
                    "data.too_long",
                    f"is error, and {conversation.where} makes {len(encoded.ids)} tokens, more than "
                    f"model.seq_len + 1 = {limit}; raise model.seq_len or set data.too_long=truncate or drop",
                )
            dropped.append(conversation)
        return kept, dropped

    def _truncated(self, conversation: Conversation, limit: int, train_on: str) -> Encoded | None:
        """The conversation without its earliest exchanges (after the system turns), as few dropped
        as make it fit; None when even its last exchange alone does not."""
        messages = conversation.messages
        system = [m for m in messages[:1] if m["role"] == "system"]
        rest = list(messages[len(system) :])
        starts = [i for i, m in enumerate(rest) if m["role"] == "user" and i > 0]
        for start in starts:
            encoded = self.encode(system + rest[start:], train_on, conversation.where)
            if len(encoded.ids) <= limit:
                return Encoded(encoded.ids, encoded.weights, truncated=True)
        return None
