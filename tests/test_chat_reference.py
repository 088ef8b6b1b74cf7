"""meshrun's chat rendering against transformers' `apply_chat_template` (issue 54).

tests/data/chat/ holds tiny tokenizers with real chat templates (Llama 3 Instruct's, Gemma 1/2
instruct's, Qwen 2.5's ChatML; since issue 66 Mistral's with a Metaspace BPE, Llama 2's with the legacy
Prepend normalizer, and a DeepSeek-R1-Distill-like one whose start token is <｜begin▁of▁sentence｜>)
and, for a few conversations (20 in the issue 66 cases), the text and ids transformers renders them
to, its assistant masks and the ids of plain texts, made by scripts/make_chat_reference.py
(transformers is not a test dependency).
meshrun's ChatFormat (meshrun.text.chat) must give the same text and ids from the case's own
tokenizer dir, and for Gemma also through the SentencePiece path (a KerasHub preset whose tokenizer
is the case's tokenizer.model, the template given as a file). Its loss weights must cover exactly
each assistant turn's content, as the template renders it, and its end-of-turn token.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parent / "data" / "chat"
CASES = ("llama3", "gemma", "chatml")
ISSUE66 = ("mistral", "llama2", "deepseek")  # with assistant_masks and plain texts
ALL = CASES + ISSUE66
WITH_BOS = ("llama3", "gemma")
TRIMS_CONTENT = ("llama3", "gemma")  # their templates write `message['content'] | trim`
KEY = "data.path"


def reference(case: str) -> dict:
    return json.loads((DATA / f"{case}.reference.json").read_text())


def case_chat(case: str):
    """meshrun's ChatFormat of a case, its tokenizer and template read from the case's dir."""
    from meshrun.text.chat import load_chat
    from meshrun.text.tokenizer import load_tokenizer

    source = str(DATA / case)
    return load_chat(load_tokenizer(source, KEY), source, None)


def records_and_references(case: str):
    ref = reference(case)
    keys = ("text", "ids", "prompt_text", "prompt_ids")
    return [
        (record["messages"], dict(zip(keys, values, strict=True)))
        for record, *values in zip(ref["records"], *map(ref.get, keys), strict=True)
    ]


@pytest.fixture(scope="module")
def gemma_preset_chat(tmp_path_factory):
    """meshrun's ChatFormat of a tiny KerasHub Gemma whose tokenizer is the gemma case's
    tokenizer.model (the SentencePiece path), its template given as a file."""
    from dataclasses import replace

    import keras_hub

    from meshrun.models.hub.small_presets import FAMILIES, assemble
    from meshrun.text.chat import load_chat
    from meshrun.text.tokenizer import load_tokenizer
    from presets import SHAPE

    root = tmp_path_factory.mktemp("chat_gemma")
    proto = (DATA / "gemma" / "tokenizer.model").read_bytes()
    shape = replace(SHAPE, num_layers=1, hidden_dim=16, num_query_heads=2, num_key_value_heads=1)
    assemble(FAMILIES["gemma"], keras_hub.models.GemmaTokenizer(proto=proto), shape).save_to_preset(
        str(root / "preset")
    )
    template = root / "gemma.jinja"
    template.write_text(json.loads((DATA / "gemma" / "tokenizer_config.json").read_text())["chat_template"])
    preset = str(root / "preset")
    tokenizer = load_tokenizer(preset, KEY, cache_dir=str(root / "cache"))
    return load_chat(tokenizer, preset, str(template))


# The data alone: checks that need no meshrun.text.chat


@pytest.mark.parametrize("case", ALL)
def test_the_cases_tokenizer_gives_the_reference_ids_of_the_rendered_text(case):
    """The reference data agrees with itself and with meshrun's tokenizer: the case's tokenizer
    (loaded by meshrun) encodes transformers' rendered text to transformers' ids."""
    from meshrun.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(DATA / case), KEY)
    for _, expected in records_and_references(case):
        for text, ids in (
            (expected["text"], expected["ids"]),
            (expected["prompt_text"], expected["prompt_ids"]),
        ):
            assert tokenizer.encode([text])[0].tolist() == ids


def test_gemmas_tokenizer_model_gives_the_ids_its_tokenizer_json_gives():
    """tokenizer.model and tokenizer.json are the same tokenizer: SentencePiece encodes the text
    after <bos> (a control piece, which SentencePiece does not read from text) to the same ids."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(DATA / "gemma" / "tokenizer.model"))
    assert reference("gemma")["sentencepiece_ids_equal"] == [True] * len(reference("gemma")["records"])
    for _, expected in records_and_references("gemma"):
        assert [processor.bos_id(), *processor.encode(expected["text"].removeprefix("<bos>"))] == expected[
            "ids"
        ]


def test_the_tiny_gemma_has_gemmas_turn_markers_as_single_pieces():
    """The tiny Gemma meshrun preset and the tests build has <start_of_turn> and <end_of_turn> as
    user-defined pieces, as Gemma's own has: SentencePiece and KerasHub's GemmaTokenizer (which
    names only <bos>, <eos> and <pad> as special) each read them as one id, and decode them back."""
    import keras_hub
    import sentencepiece

    from meshrun.text import tokenizer_training
    from presets import corpus_text, sentencepiece_proto

    proto = sentencepiece_proto(corpus_text(8_000))
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    start, end = (processor.piece_to_id(p) for p in tokenizer_training.GEMMA_SENTENCEPIECE.user_defined)
    assert (start, end) == (4, 5)
    text = "<start_of_turn>user\nHi<end_of_turn>"
    ids = processor.encode(text)
    assert ids[0] == start and ids[-1] == end and start not in ids[1:-1] and end not in ids[1:-1]
    assert processor.decode(ids) == text
    layer = keras_hub.models.GemmaTokenizer(proto=proto)
    assert np.asarray(layer.tokenize(text)).tolist() == ids


# meshrun.text.chat against transformers


@pytest.mark.parametrize("case", ALL)
def test_render_gives_transformers_text(case):
    chat = case_chat(case)
    for messages, expected in records_and_references(case):
        assert chat.render(messages) == expected["text"]
        assert chat.render(messages[:-1], add_generation_prompt=True) == expected["prompt_text"]


@pytest.mark.parametrize("case", ALL)
def test_encode_gives_transformers_ids(case):
    """Every conversation's ids and prompt ids equal apply_chat_template's (n/N in the message):
    SentencePiece-style BPEs (Mistral's Metaspace, Llama 2's Prepend) too, whose pieces between
    special tokens take a "▁" before them or not as the whole text does."""
    chat = case_chat(case)
    pairs = records_and_references(case)
    equal = prompts_equal = 0
    for messages, expected in pairs:
        encoded = chat.encode(messages)
        assert encoded.ids.dtype == np.int32 and encoded.weights.dtype == np.uint8
        assert encoded.ids.shape == encoded.weights.shape
        equal += encoded.ids.tolist() == expected["ids"]
        prompts_equal += np.asarray(chat.prompt_ids(messages[:-1])).tolist() == expected["prompt_ids"]
    assert (equal, prompts_equal) == (len(pairs), len(pairs)), (
        f"ids {equal}/{len(pairs)}, prompts {prompts_equal}"
    )


@pytest.mark.parametrize("case", ISSUE66)
def test_the_weights_are_transformers_assistant_masks(case):
    """meshrun's loss weights equal transformers' return_assistant_tokens_mask over the template's
    assistant text (its content and what follows up to the end-of-turn token), a token weighted
    where it overlaps that text, as transformers marks it."""
    chat = case_chat(case)
    ref = reference(case)
    pairs = records_and_references(case)
    equal = sum(
        chat.encode(messages).weights.tolist() == mask
        for (messages, _), mask in zip(pairs, ref["assistant_masks"], strict=True)
    )
    assert equal == len(pairs), f"{equal}/{len(pairs)}"


@pytest.mark.parametrize("case", ISSUE66)
def test_a_text_is_given_to_the_model_as_transformers_tokenizer_gives_it(case):
    """The ids data=text trains on and generate prompts with (the start token the run's framing
    puts first, then the text) equal transformers' tokenizer(text)["input_ids"]."""
    from types import SimpleNamespace

    from meshrun.data.text_tokenizer import framing_for
    from meshrun.text.examples import prompt_ids
    from meshrun.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(DATA / case), KEY)
    framing = framing_for(SimpleNamespace(end_token=None), tokenizer)
    for plain in reference(case)["plain"]:
        assert prompt_ids(tokenizer.encode, framing, plain["text"]).tolist() == plain["ids"]


def test_a_start_token_spelled_otherwise_comes_from_tokenizer_config():
    """DeepSeek-R1-Distill's start token, named in tokenizer_config.json as an AddedToken dict and
    put first by tokenizer.json's post-processor: texts and chats start with it, and a template's
    bos_token writes it."""
    from meshrun.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(DATA / "deepseek"), KEY)
    bos = "<｜begin▁of▁sentence｜>"
    assert tokenizer.start_token == bos and tokenizer.start_id == tokenizer.token_id(bos) is not None
    prompt = [{"role": "user", "content": "Hi"}]
    assert case_chat("deepseek").render(prompt, add_generation_prompt=True).startswith(bos)


def test_a_start_token_the_tokenizer_lacks_is_one_line(tmp_path):
    """A bos_token tokenizer_config.json names that the tokenizer does not have: a ConfigError
    naming the key, the file and the token."""
    import shutil

    from meshrun.errors import ConfigError
    from meshrun.text.tokenizer import load_tokenizer

    copy = shutil.copytree(DATA / "deepseek", tmp_path / "deepseek")
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["bos_token"]["content"] = "<｜no such token｜>"
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as error:
        load_tokenizer(str(copy), KEY)
    message = str(error.value)
    assert error.value.key == KEY and "\n" not in message
    assert "bos_token '<｜no such token｜>'" in message and "tokenizer_config.json" in message


@pytest.mark.parametrize("case", WITH_BOS)
def test_the_ids_start_with_exactly_one_bos(case):
    """The template writes BOS and the tokenizer would add one too: a record starts with one."""
    chat = case_chat(case)
    bos = reference(case)["ids"][0][0]
    for messages, _ in records_and_references(case):
        ids = chat.encode(messages).ids.tolist()
        assert ids[0] == bos and ids[1] != bos and ids.count(bos) == 1


def test_gemma_through_sentencepiece_gives_transformers_ids(gemma_preset_chat):
    """A KerasHub Gemma preset whose tokenizer is the case's tokenizer.model, the template given as a
    file: the same text and ids as transformers' from tokenizer.json."""
    for messages, expected in records_and_references("gemma"):
        assert gemma_preset_chat.render(messages) == expected["text"]
        assert gemma_preset_chat.encode(messages).ids.tolist() == expected["ids"]
        assert np.asarray(gemma_preset_chat.prompt_ids(messages[:-1])).tolist() == expected["prompt_ids"]


@pytest.mark.parametrize("train_on", ["all_assistant", "last_assistant"])
@pytest.mark.parametrize("case", CASES)
def test_the_weighted_positions_are_each_assistant_turn_and_its_end(case, train_on):
    """Decoding each run of weighted positions (special tokens kept) gives an assistant turn's
    content as the template renders it (Llama 3's and Gemma's trim it) and its end-of-turn token:
    every assistant turn, or with last_assistant only the last."""
    from tokenizers import Tokenizer

    chat = case_chat(case)
    ref = reference(case)
    decoder = Tokenizer.from_file(str(DATA / case / "tokenizer.json"))
    end_of_turn = ref["end_of_turn"]
    assert ref["end_of_turn_id"] in chat.end_of_turn_ids
    for messages, _ in records_and_references(case):
        encoded = chat.encode(messages, train_on=train_on)
        runs = weighted_runs(encoded.ids, encoded.weights)
        decoded = [decoder.decode(run, skip_special_tokens=False) for run in runs]
        contents = [m["content"] for m in messages if m["role"] == "assistant"]
        if case in TRIMS_CONTENT:
            contents = [content.strip() for content in contents]
        expected = [content + end_of_turn for content in contents]
        assert decoded == (expected if train_on == "all_assistant" else expected[-1:])


def weighted_runs(ids: np.ndarray, weights: np.ndarray) -> list[list[int]]:
    """The ids of each run of consecutive weighted positions."""
    runs, current = [], []
    for token, weight in zip(ids.tolist(), weights.tolist(), strict=True):
        if weight:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])
