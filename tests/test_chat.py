"""data.format=chat without a model: conversations read from JSONL (every bad record one line),
rendered by a template (the model's, a built-in one, or a file), tokenized so that exactly the
assistant's text and its end-of-turn token weigh, one start token, truncation by whole exchanges,
and rows packed or padded. The tokenizers are small byte-level BPEs trained here (Hugging Face
`tokenizers`); the reference ids of transformers are checked in test_chat_reference.py."""

import json

import numpy as np
import pytest

from meshrun.errors import ConfigError
from meshrun.text import chat, corpus, examples
from meshrun.text.tokenizer import load_tokenizer
from presets import byte_level_bpe, corpus_text

LLAMA3_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SYSTEM = {"role": "system", "content": "You answer in one word."}
THREE_TURNS = (
    SYSTEM,
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "blue"},
    {"role": "user", "content": "And grass?"},
    {"role": "assistant", "content": " green\n"},
    {"role": "user", "content": "Snow?"},
    {"role": "assistant", "content": "white, of course"},
)


def tokenizer_dir(path, special_tokens, config: dict | None = None):
    path.mkdir(parents=True, exist_ok=True)
    text = corpus_text(8000) + "\n\nWhat colour is the sky? blue green white And grass? Snow? of course"
    byte_level_bpe(text, special_tokens).save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(str(path), "data.tokenizer")


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama3")
    return tokenizer_dir(folder, LLAMA3_TOKENS), str(folder)


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chatml")
    return tokenizer_dir(folder, CHATML_TOKENS), str(folder)


def weighted_texts(tokenizer, encoded) -> list[str]:
    """The weighted positions decoded back to text, one string per run of weighted ids, special
    tokens kept."""
    hf = tokenizer._encoder.tokenizer
    runs, current = [], []
    for token, weight in zip(encoded.ids.tolist(), encoded.weights.tolist(), strict=True):
        if weight:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [hf.decode(run, skip_special_tokens=False) for run in runs]


# --- templates ------------------------------------------------------------------------------------


def test_the_built_in_template_is_chosen_by_the_tokenizers_turn_markers(llama3, chatml):
    assert chat.load_chat(*llama3, None).description == "meshrun's built-in llama3 template"
    assert chat.load_chat(*chatml, None).description == "meshrun's built-in chatml template"


def test_the_models_own_template_wins_over_the_built_in_and_a_given_one_over_both(tmp_path, llama3):
    own = "{% for m in messages %}<|start_header_id|>{{ m.role }}: {{ m.content }}<|eot_id|>{% endfor %}"
    tokenizer = tokenizer_dir(tmp_path / "own", LLAMA3_TOKENS, {"chat_template": own})
    found = chat.load_chat(tokenizer, str(tmp_path / "own"), None)
    assert found.description.startswith("the chat_template of") and found.template.text == own
    given = tmp_path / "given.jinja"
    given.write_text(
        chat.CHATML_TEMPLATE.replace("<|im_start|>", "<|start_header_id|>").replace(
            "<|im_end|>", "<|eot_id|>"
        )
    )
    assert chat.load_chat(tokenizer, str(tmp_path / "own"), str(given)).description == f"the template {given}"
    assert chat.load_chat(tokenizer, str(tmp_path / "own"), "llama3").template.text == chat.LLAMA3_TEMPLATE


def test_a_tokenizer_without_turn_markers_or_template_needs_data_chat_template(tmp_path):
    tokenizer = tokenizer_dir(tmp_path / "plain", ("<|endoftext|>",))
    error = pytest.raises(ConfigError, chat.load_chat, tokenizer, str(tmp_path / "plain"), None).value
    assert (
        error.key == "data.chat_template"
        and "is required" in str(error)
        and "gemma, llama3 or chatml" in str(error)
    )


@pytest.mark.parametrize(
    "given, words",
    [
        ("missing.jinja", "got 'missing.jinja', which does not exist; give a Jinja chat template file"),
        ("{% for m in messages %}", "is not a Jinja template: line 1"),
    ],
)
def test_a_bad_template_file_is_one_line(tmp_path, llama3, given, words):
    if given.startswith("{%"):
        (tmp_path / "bad.jinja").write_text(given)
        given = str(tmp_path / "bad.jinja")
    error = pytest.raises(ConfigError, chat.load_chat, llama3[0], llama3[1], given).value
    assert error.key == "data.chat_template" and words in str(error) and "\n" not in str(error)


def test_a_template_that_fails_to_render_names_the_record_and_its_line(tmp_path, llama3):
    template = tmp_path / "strict.jinja"
    template.write_text(
        "{% for m in messages %}\n"
        "{% if m.role == 'system' %}{{ raise_exception('no system turns here') }}{% endif %}\n"
        "<|start_header_id|>{{ m.content }}<|eot_id|>{% endfor %}"
    )
    format_ = chat.load_chat(llama3[0], llama3[1], str(template))
    conversation = chat.Conversation(THREE_TURNS, "chats.jsonl:7")
    error = pytest.raises(ConfigError, format_.encode_many, [conversation]).value
    assert str(error) == (
        f"data.chat_template: the template {template} fails on chats.jsonl:7 at its line 2: "
        "no system turns here; it takes no system turn: drop the system turns, or give "
        "data.chat_template a template that takes one"
    )


def test_gemmas_own_template_refusing_a_system_turn_names_the_built_in_one():
    """Gemma 1/2's own template refuses a system turn: the line names data.chat_template=gemma,
    meshrun's built-in Gemma template, which renders the conversation."""
    from pathlib import Path

    gemma = Path(__file__).resolve().parent / "data" / "chat" / "gemma"
    tokenizer = load_tokenizer(str(gemma), "model.preset")
    own = chat.load_chat(tokenizer, str(gemma), None)
    conversation = chat.Conversation(THREE_TURNS, "chats.jsonl:3")
    error = pytest.raises(ConfigError, own.encode_many, [conversation]).value
    assert error.key == "model.preset" and "\n" not in str(error)
    assert str(error).endswith(
        "System role not supported; it takes no system turn: data.chat_template=gemma puts the system "
        "prompt before the first user turn's text, as Gemma 3's template does"
    )
    built_in = chat.load_chat(tokenizer, str(gemma), "gemma")
    assert "You answer in one word." in built_in.render(THREE_TURNS)


def test_a_template_that_closes_turns_with_no_special_token_is_refused(tmp_path, llama3):
    template = tmp_path / "open.jinja"
    template.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    format_ = chat.load_chat(llama3[0], llama3[1], str(template))
    error = pytest.raises(ConfigError, format_.encode_many, [chat.Conversation(THREE_TURNS, "c:1")]).value
    assert "ends an assistant turn with no special token" in str(error)


# --- records --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record, words",
    [
        ({"text": "hi"}, "d.jsonl:1 has no 'messages' (its fields: text); data.format=chat reads records"),
        ({"messages": []}, "d.jsonl:1: 'messages' is []; expected a list of turns"),
        ({"messages": [{"role": "user"}]}, "d.jsonl:1 turn 1 (user) has no 'content'"),
        (
            {"messages": [{"role": "bot", "content": "x"}]},
            'd.jsonl:1 turn 1 has role "bot"; valid: system, user or assistant',
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "y"},
                    {"role": "user", "content": "z"},
                ]
            },
            "d.jsonl:1 ends with a user turn, so it has nothing to learn",
        ),
    ],
)
def test_every_bad_record_is_one_line_naming_file_and_line(tmp_path, record, words):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(record) + "\n")
    error = pytest.raises(ConfigError, corpus.read_conversations, (path,), "data.files").value
    assert error.key == "data.files" and words.replace("d.jsonl", str(path)) in str(error)
    assert "\n" not in str(error)


def test_a_plain_text_file_is_refused_for_chat(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    error = pytest.raises(ConfigError, corpus.read_conversations, (tmp_path / "a.txt",), "data.files").value
    assert "plain text; data.format=chat reads .jsonl records" in str(error)


# --- weights --------------------------------------------------------------------------------------


def test_exactly_the_assistant_text_and_its_end_of_turn_token_weigh(llama3, chatml):
    for (tokenizer, source), end in ((llama3, "<|eot_id|>"), (chatml, "<|im_end|>")):
        format_ = chat.load_chat(tokenizer, source, None)
        encoded = format_.encode(THREE_TURNS)
        trims = "llama3" in format_.description  # Llama 3's template trims each turn's text
        replies = [
            m["content"].strip() if trims else m["content"] for m in THREE_TURNS if m["role"] == "assistant"
        ]
        assert weighted_texts(tokenizer, encoded) == [reply + end for reply in replies]
        last = format_.encode(THREE_TURNS, train_on="last_assistant")
        assert weighted_texts(tokenizer, last) == [replies[-1] + end]
        assert np.array_equal(last.ids, encoded.ids)  # the same tokens, fewer weigh
        assert format_.end_of_turn_ids == (tokenizer.token_id(end),)


def test_the_ids_are_the_rendered_text_and_start_with_exactly_one_start_token(tmp_path, llama3):
    tokenizer, source = llama3
    start = tokenizer.token_id("<|begin_of_text|>")
    format_ = chat.load_chat(tokenizer, source, None)
    encoded = format_.encode(THREE_TURNS)
    assert encoded.ids[0] == start and encoded.ids[1] != start
    assert tokenizer._encoder.tokenizer.decode(
        encoded.ids.tolist(), skip_special_tokens=False
    ) == format_.render(THREE_TURNS)
    for text in ("{{ bos_token }}{{ bos_token }}", ""):  # a template that writes it twice, or not at all
        template = tmp_path / "t.jinja"
        template.write_text(
            text + "{% for m in messages %}<|start_header_id|>{{ m.content }}<|eot_id|>{% endfor %}"
        )
        ids = chat.load_chat(tokenizer, source, str(template)).encode(THREE_TURNS).ids
        assert ids[0] == start and ids[1] != start


def test_the_generation_prompt_is_the_training_text_up_to_the_reply(llama3):
    tokenizer, source = llama3
    format_ = chat.load_chat(tokenizer, source, None)
    prompt = format_.prompt_ids(THREE_TURNS[:-1])
    whole = format_.encode(THREE_TURNS).ids
    assert whole[: len(prompt)].tolist() == prompt.tolist()
    assert tokenizer._encoder.tokenizer.decode(prompt.tolist(), skip_special_tokens=False).endswith(
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


# --- too long, packing ----------------------------------------------------------------------------


def test_truncate_drops_whole_earliest_exchanges_and_keeps_the_system_prompt(llama3):
    tokenizer, source = llama3
    format_ = chat.load_chat(tokenizer, source, None)
    conversation = chat.Conversation(THREE_TURNS, "c.jsonl:1")
    full = len(format_.encode(THREE_TURNS).ids)
    without_first = format_.encode((SYSTEM, *THREE_TURNS[3:])).ids
    last_only = format_.encode((SYSTEM, *THREE_TURNS[5:])).ids
    kept, dropped = format_.fit([conversation], len(without_first), "truncate", "all_assistant")
    assert not dropped and kept[0].truncated and kept[0].ids.tolist() == without_first.tolist()
    assert weighted_texts(tokenizer, kept[0]) == ["green<|eot_id|>", "white, of course<|eot_id|>"]
    kept, dropped = format_.fit([conversation], len(last_only), "truncate", "all_assistant")
    assert kept[0].ids.tolist() == last_only.tolist()
    kept, dropped = format_.fit([conversation], len(last_only) - 1, "truncate", "all_assistant")
    assert not kept and dropped == [conversation]  # the last exchange is never cut
    kept, dropped = format_.fit([conversation], full, "drop", "all_assistant")
    assert not kept[0].truncated and len(kept[0].ids) == full
    kept, dropped = format_.fit([conversation], full - 1, "drop", "all_assistant")
    assert dropped == [conversation]
    error = pytest.raises(ConfigError, format_.fit, [conversation], full - 1, "error", "all_assistant").value
    assert error.key == "data.too_long" and f"c.jsonl:1 makes {full} tokens" in str(error)


def test_conversations_pack_end_to_end_or_pad_one_a_row_with_their_weights(llama3):
    tokenizer, source = llama3
    format_ = chat.load_chat(tokenizer, source, None)
    encoded = format_.encode_many(
        [chat.Conversation(THREE_TURNS[1:3], "a"), chat.Conversation(THREE_TURNS, "b")]
    )
    seq_len = max(len(e.ids) for e in encoded)
    padded = examples.weighted_rows(
        [e.ids for e in encoded], [e.weights for e in encoded], seq_len, False, pad=7
    )
    assert padded.tokens.shape == (2, seq_len + 1)
    for row, length, weights, one in zip(padded.tokens, padded.lengths, padded.weights, encoded, strict=True):
        assert row[:length].tolist() == one.ids.tolist() and (row[length:] == 7).all()
        assert weights.tolist() == np.pad(one.weights[1:], (0, seq_len - length + 1)).tolist()
    stream = np.concatenate([e.ids for e in encoded])
    packed = examples.weighted_rows([e.ids for e in encoded], [e.weights for e in encoded], 8, True, pad=7)
    assert packed.padding_fraction == 0 and packed.tokens[0].tolist() == stream[:9].tolist()
    assert packed.tokens[1][0] == stream[8]  # rows overlap by one token: each label once


# --- meshrun generate's conversations -------------------------------------------------------------


def test_generate_takes_a_conversation_turn_by_turn_or_as_json_lines():
    from meshrun.generate import parse_request

    turns = parse_request(
        ["run", "--system", "Be brief.", "--user", "Hi", "--assistant", "Hello", "--user", "Sky?"]
    )
    assert turns.chat and turns.prompts == (
        (
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Sky?"},
        ),
    )
    line = json.dumps({"messages": [{"role": "user", "content": "Sky?"}]})
    lines = parse_request(
        ["run", "--chat", line, "--chat", json.dumps([{"role": "user", "content": "Sea?"}])]
    )
    assert lines.chat and [c[-1]["content"] for c in lines.prompts] == ["Sky?", "Sea?"]
    assert not parse_request(["run", "--prompt", "Sky?"]).chat


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--chat", "{nope"], "--chat: --chat 1 is not JSON ("),
        (["--chat", '{"turns": []}'], "--chat: --chat 1 has no 'messages'"),
        (
            ["--chat", '[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]'],
            "--chat: --chat 1 ends with an assistant turn, but a conversation to reply to ends with the",
        ),
        (
            ["--chat", '[{"role": "robot", "content": "a"}]'],
            '--chat: --chat 1 turn 1 has role "robot"; valid:',
        ),
        (["--prompt", "a", "--user", "b"], "--user: was given with --prompt; give text prompts (--prompt)"),
        (
            ["--system", "a"],
            "--user: the conversation of --system/--user/--assistant ends with a system turn",
        ),
    ],
)
def test_a_bad_conversation_for_generate_is_one_line(args, expected):
    from meshrun.generate import parse_request

    error = pytest.raises(ConfigError, parse_request, ["run", *args]).value
    assert str(error).startswith(expected) and "\n" not in str(error), str(error)


def test_records_of_messages_read_as_text_point_to_data_format_chat(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": THREE_TURNS}) + "\n")
    error = pytest.raises(
        ConfigError, corpus.read_examples, (path,), corpus.CorpusFormat(), "data.files"
    ).value
    assert error.key == "data.field" and str(error).endswith(
        "records of messages are read with data.format=chat"
    )
