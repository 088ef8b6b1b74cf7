"""Makes the reference renderings and token ids of conversations under tests/data/chat/ (issue 54):
what transformers' `apply_chat_template` gives for a few conversations through three real chat
templates, for meshrun's chat code to be checked against (tests/test_chat_reference.py).

For each case it writes:

- tests/data/chat/<case>/: a tiny tokenizer as transformers saves it (tokenizer.json and
  tokenizer_config.json, with the family's real `chat_template` and its bos/eos/pad tokens; for
  gemma also tokenizer.model, the SentencePiece model transformers converted tokenizer.json from);
- tests/data/chat/<case>.reference.json: the conversations (`records`), and for each the rendered
  text and ids (`apply_chat_template(messages, tokenize=False)` and `tokenize=True`), and the text
  and ids of the conversation less its last assistant turn with `add_generation_prompt=True`
  (`prompt_text`, `prompt_ids`), the tokens that matter and the versions that made them.

The cases and where each template's text was taken from (verbatim):

- llama3: a byte-level BPE with Llama 3's split and its five special tokens, BOS added by the
  post-processor as Meta's tokenizer.json does, and the chat_template of
  meta-llama/Meta-Llama-3-8B-Instruct's tokenizer_config.json (Llama 3, not 3.1: no date and tools
  block), as vLLM prints it ("Using default chat template") and many repositories quote it.
- gemma: a SentencePiece model set up as the tiny Gemma `meshrun preset` makes (meshrun's own
  tokenizer_training.sentencepiece_proto with GEMMA_SENTENCEPIECE: <pad> 0, <eos> 1, <bos> 2,
  <unk> 3, then the user-defined <start_of_turn> and <end_of_turn>), converted by transformers
  into GemmaTokenizerFast, and the chat_template of google/gemma-2b-it (the same text as
  google/gemma-2-2b-it's), which refuses a system turn: gemma's conversations have none.
- chatml: a byte-level BPE as Qwen2Tokenizer makes it (NFC, Qwen's split) with <|endoftext|>,
  <|im_start|>, <|im_end|>, and the chat_template of Qwen/Qwen2.5-0.5B-Instruct's
  tokenizer_config.json, tool branches included, which puts Qwen's default system prompt first when
  a conversation has none.

- mistral (issue 66): a SentencePiece BPE set up as Mistral's (meshrun's MISTRAL_SENTENCEPIECE: a
  dummy prefix, <unk> 0, <s> 1, </s> 2) converted by transformers' LlamaTokenizer (legacy=False:
  a Metaspace pre-tokenizer that puts "▁" before the first piece only), and the chat_template of
  mistralai/Mistral-7B-Instruct-v0.2 (the same as Mixtral-8x7B-Instruct-v0.1's), which refuses a
  system turn: mistral's conversations have none.
- llama2 (issue 66): the same SentencePiece model in the legacy form of Llama 2's tokenizer.json (a
  Prepend("▁") and Replace(" ", "▁") normalizer, no pre-tokenizer: "▁" before every piece between
  special tokens, as SentencePiece puts its dummy prefix), its bos/eos/unk as AddedToken dicts, and
  the chat_template of meta-llama/Llama-2-7b-chat-hf (<<SYS>> inside the first user turn); half of
  its conversations have a system turn. Its tokenizer_class is PreTrainedTokenizerFast, so that
  transformers reads tokenizer.json as written: transformers 5 rebuilds a LlamaTokenizer's pipeline
  (a Metaspace pre-tokenizer, which puts no "▁" before a text that starts with a space, and with
  legacy=false none after a special token), and then encodes otherwise than the file it loaded.
- deepseek (issue 66): a byte-level BPE (Qwen's split) whose start token is DeepSeek-R1-Distill's
  <｜begin▁of▁sentence｜>, named in tokenizer_config.json as an AddedToken dict and put first by the
  post-processor, with <｜User｜>, <｜Assistant｜> and <｜end▁of▁sentence｜> (the eos and pad), and
  a chat template modelled on DeepSeek-R1-Distill's (its user, assistant and system branches; the
  generation prompt without the later "<think>\n", which meshrun cannot train with).

For the issue 66 cases the reference json also holds `assistant_masks`: transformers'
`return_assistant_tokens_mask` rendered with a copy of the template whose assistant text (the content
and what follows up to the end-of-turn token, what meshrun weighs) is in a {% generation %} block,
checked to render the same text; and `plain`: texts and `tokenizer(text)["input_ids"]`.

Tokenizers are trained on tests/data/hf/corpus.txt plus the texts of tests/presets.py's
chat_records (so the words of conversations are single tokens), and built by
scripts/reference_tokenizers.py, which make_hf_reference.py shares; everything is deterministic: a
rerun writes the same files. CI never runs this script and transformers is not a test dependency.
Made with transformers 5.24.0, tokenizers 0.23.3, sentencepiece 0.2.3, jinja2 3.1.6 (Python 3.11),
in the venv of scripts/make_hf_reference.py (its docstring says how to make it):

    /work/refvenv/bin/python scripts/make_chat_reference.py                    # every case
    /work/refvenv/bin/python scripts/make_chat_reference.py --cases gemma
    /work/refvenv/bin/python scripts/make_chat_reference.py --cases mistral,llama2,deepseek
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import jinja2
import sentencepiece
import tokenizers
import transformers

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # meshrun's tokenizer training and tests/presets.py

import presets  # noqa: E402
import reference_tokenizers  # noqa: E402
from meshrun.text import tokenizer_training  # noqa: E402

DATA = ROOT / "tests" / "data" / "chat"
CORPUS = ROOT / "tests" / "data" / "hf" / "corpus.txt"
CHAT_RECORDS = 40  # chat_records trained on beside the corpus
CHAT_REPEATS = 8
BPE_VOCAB = 480  # the 256 bytes and 224 merges; the special tokens come after
SP_VOCAB = 512

# meta-llama/Meta-Llama-3-8B-Instruct, tokenizer_config.json "chat_template"
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Qwen/Qwen2.5-0.5B-Instruct, tokenizer_config.json "chat_template" (the same in every Qwen2.5
# Instruct size): the JSON string as the file has it, decoded below.
QWEN25_TEMPLATE_JSON = (
    r'"{%- if tools %}\n    {{- \'<|im_start|>system\\n\' }}\n    {%- if messages[0][\'role\'] =='
    r" 'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are"
    r" Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    {{-"
    r" \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n"
    r"\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\""
    r" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n"
    r"    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object"
    r" with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    r"{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call>"
    r"<|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{-"
    r" '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    r"        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful"
    r" assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}"
    r"\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first)"
    r" or (message.role == \"assistant\" and not message.tool_calls) %}\n        {{-"
    r" '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    r"    {%- elif message.role == \"assistant\" %}\n        {{- \'<|im_start|>\' + message.role }}"
    r"\n        {%- if message.content %}\n            {{- '\\n' + message.content }}\n"
    r"        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n"
    r"            {%- if tool_call.function is defined %}\n"
    r"                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    r"            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    r"            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    r"            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}"
    r"\n    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or"
    r" (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- \'<|im_start|>user\' }}\n"
    r"        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n"
    r"        {{- '\\n</tool_response>' }}\n        {%- if loop.last or"
    r" (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- \'<|im_end|>\\n\' }}\n"
    r"        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n"
    r"    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
    '"'
)
QWEN25_TEMPLATE = json.loads(QWEN25_TEMPLATE_JSON.replace("\\'", "'"))

# mistralai/Mistral-7B-Instruct-v0.2 tokenizer_config.json "chat_template" (Mixtral-8x7B-Instruct-v0.1's too)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# meta-llama/Llama-2-7b-chat-hf tokenizer_config.json "chat_template"
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)
DEEPSEEK_BOS, DEEPSEEK_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
DEEPSEEK_SPECIALS = (DEEPSEEK_BOS, DEEPSEEK_EOS, "<｜User｜>", "<｜Assistant｜>")
# modelled on deepseek-ai/DeepSeek-R1-Distill-Qwen-7B's (not verbatim: no tool branches)
DEEPSEEK_TEMPLATE = (
    "{% set ns = namespace(system_prompt='') %}{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}"
    "{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}{%- endif %}{%- endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)
# Each issue 66 template with what meshrun weighs of an assistant turn in a {% generation %} block.
GENERATION_TEMPLATES = {
    "mistral": MISTRAL_TEMPLATE.replace(
        "{{ message['content'] + eos_token}}",
        "{% generation %}{{ message['content'] + eos_token}}{% endgeneration %}",
    ),
    "llama2": LLAMA2_TEMPLATE.replace(
        "{{ ' '  + content.strip() + ' ' + eos_token }}",
        "{{ ' ' }}{% generation %}{{ content.strip() + ' ' + eos_token }}{% endgeneration %}",
    ),
    "deepseek": DEEPSEEK_TEMPLATE.replace(
        "{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}",
        "{{ '<｜Assistant｜>' }}{% generation %}{{ content + '<｜end▁of▁sentence｜>' }}{% endgeneration %}",
    ),
}
PLAIN_TEXTS = ("What colour is the sky?", "  Plums are purple,\n\nand ash is grey.  ", "naïve café 🙂")
CONVERSATIONS = 20  # in each issue 66 case

SOURCES = {
    "llama3": "meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json chat_template",
    "gemma": "google/gemma-2b-it tokenizer_config.json chat_template (same as google/gemma-2-2b-it)",
    "chatml": "Qwen/Qwen2.5-0.5B-Instruct tokenizer_config.json chat_template",
    "mistral": "mistralai/Mistral-7B-Instruct-v0.2 tokenizer_config.json chat_template",
    "llama2": "meta-llama/Llama-2-7b-chat-hf tokenizer_config.json chat_template",
    "deepseek": "modelled on deepseek-ai/DeepSeek-R1-Distill-Qwen-7B's chat_template (no tool branches)",
}
END_OF_TURN = {
    "llama3": "<|eot_id|>",
    "gemma": "<end_of_turn>",
    "chatml": "<|im_end|>",
    "mistral": "</s>",
    "llama2": "</s>",
    "deepseek": DEEPSEEK_EOS,
}


def turn(role: str, content: str) -> dict:
    return {"role": role, "content": content}


# The conversations: one turn; three turns with a system prompt; contents with spaces and newlines
# around them (Llama 3's and Gemma's templates trim them, ChatML's keeps them); non-ASCII text.
SYSTEM = turn("system", "You answer in one word.")
ONE_TURN = [turn("user", "What colour is the sky?"), turn("assistant", "blue")]
THREE_TURNS = [
    turn("user", "What colour is grass?"),
    turn("assistant", "green"),
    turn("user", "What colour is coal?"),
    turn("assistant", "black"),
    turn("user", "And snow?"),
    turn("assistant", "white"),
]
SPACES = [
    turn("user", "  What colour is a plum?\n\n"),
    turn("assistant", " purple\n"),
    turn("user", "\nWhy?  "),
    turn("assistant", "  Plums are purple,  and ash is grey.  \n"),
]
NON_ASCII = [
    turn("user", "De quelle couleur est la neige à Zürich? ❄"),
    turn("assistant", "Blanche — white 🙂"),
    turn("user", "東京の空は?"),
    turn("assistant", "青い (blue), naïve café"),
]


def conversations(case: str) -> list[list[dict]]:
    """The case's conversations: Gemma 1/2's and Mistral's templates refuse a system turn, so
    theirs have none; an issue 66 case has CONVERSATIONS, the four above and chat_records (a system
    turn on about half of them where the template takes one)."""
    system = case not in ("gemma", "mistral")
    four = [ONE_TURN, [SYSTEM, *THREE_TURNS] if system else THREE_TURNS, SPACES, NON_ASCII]
    if case not in GENERATION_TEMPLATES:
        return four
    more = presets.chat_records(CONVERSATIONS - len(four), seed=66, system=system)
    return four + [record["messages"] for record in more]


def training_texts() -> list[str]:
    """What the tiny tokenizers are trained on: the corpus in chunks of a few paragraphs (so blank
    lines are in it, as after Llama 3's headers) and, CHAT_REPEATS times, chat_records' contents on
    lines of their own after the role words the templates write (so they are single tokens)."""
    paragraphs = CORPUS.read_text().split("\n\n")
    chunks = ["\n\n".join(paragraphs[i : i + 4]) for i in range(0, len(paragraphs), 4)]
    chats = [
        "\n".join(f"{m['role']}\n\n{m['content']}" for m in record["messages"]) + "\nmodel\n"
        for record in presets.chat_records(CHAT_RECORDS)
    ]
    return chunks + chats * CHAT_REPEATS


# Tokenizers


def llama3_tokenizer(work: Path):
    """Llama 3's format, eos <|eot_id|> as the Instruct model's tokenizer_config.json names it."""
    return reference_tokenizers.llama3_tokenizer(
        training_texts(),
        BPE_VOCAB,
        eos_token="<|eot_id|>",
        model_max_length=8192,
        chat_template=LLAMA3_TEMPLATE,
    )


def chatml_tokenizer(work: Path):
    """Qwen 2.5's format, with Qwen 2.5's template."""
    return reference_tokenizers.chatml_tokenizer(training_texts(), BPE_VOCAB, QWEN25_TEMPLATE)


def gemma_tokenizer(work: Path):
    """Gemma's format: tokenizer.model made by meshrun's training (the tiny Gemma's setup, turn
    markers included) and tokenizer.json as transformers converts it (GemmaTokenizerFast)."""
    work.mkdir(parents=True)
    proto = tokenizer_training.sentencepiece_proto(
        training_texts(), SP_VOCAB, tokenizer_training.GEMMA_SENTENCEPIECE, "vocabulary"
    )
    model = work / "tokenizer.model"
    model.write_bytes(proto)
    # Gemma's has <mask>; this one has no such piece (transformers would add it)
    return reference_tokenizers.gemma_tokenizer(model, mask_token=None)


def sentencepiece_bpe(work: Path) -> Path:
    """A dir holding a tokenizer.model set up as Mistral's and Llama 2's (a dummy prefix, <unk>
    <s> </s>), trained by meshrun's tokenizer training."""
    work.mkdir(parents=True)
    proto = tokenizer_training.sentencepiece_proto(
        training_texts(), SP_VOCAB, tokenizer_training.MISTRAL_SENTENCEPIECE, "vocabulary"
    )
    (work / "tokenizer.model").write_bytes(proto)
    return work


def mistral_tokenizer(work: Path):
    """Mistral's format: a Metaspace BPE as transformers' LlamaTokenizer (legacy=False) converts it."""
    return _sentencepiece_style(work, legacy=False, model_max_length=32768, chat_template=MISTRAL_TEMPLATE)


def llama2_tokenizer(work: Path):
    """Llama 2's format (its tokenizer.json written in the legacy form by finish_llama2)."""
    return _sentencepiece_style(work, legacy=True, model_max_length=4096, chat_template=LLAMA2_TEMPLATE)


def _sentencepiece_style(work: Path, *, legacy: bool, model_max_length: int, chat_template: str):
    """sentencepiece_bpe's model as transformers' LlamaTokenizer loads it, adding <s> first."""
    return transformers.LlamaTokenizer.from_pretrained(
        sentencepiece_bpe(work),
        legacy=legacy,
        add_prefix_space=True,
        add_bos_token=True,
        model_max_length=model_max_length,
        chat_template=chat_template,
    )


def deepseek_tokenizer(work: Path):
    """DeepSeek-R1-Distill's format: a byte-level BPE with Qwen's split, its four special tokens
    after the BPE vocabulary, the start token put first by the post-processor."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = reference_tokenizers.byte_level_bpe(
        training_texts(),
        BPE_VOCAB,
        PRETOKENIZE_REGEX,
        DEEPSEEK_SPECIALS,
        DEEPSEEK_BOS,
        ignore_merges=False,
        prefix_space=False,
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=DEEPSEEK_BOS,
        eos_token=DEEPSEEK_EOS,
        pad_token=DEEPSEEK_EOS,
        clean_up_tokenization_spaces=False,
        model_max_length=16384,
        chat_template=DEEPSEEK_TEMPLATE,
    )


TOKENIZERS = {
    "llama3": llama3_tokenizer,
    "gemma": gemma_tokenizer,
    "chatml": chatml_tokenizer,
    "mistral": mistral_tokenizer,
    "llama2": llama2_tokenizer,
    "deepseek": deepseek_tokenizer,
}


def added_token(content: str) -> dict:
    """A special token as tokenizer_config.json spells it in its AddedToken form (Llama 2's, DeepSeek's)."""
    return {
        "__type": "AddedToken",
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
    }


def finish_llama2(out: Path) -> None:
    """Llama 2's files as Meta's repository has them: tokenizer.json with the legacy Prepend and
    Replace normalizer and no pre-tokenizer, and tokenizer_config.json with add_bos_token and its
    special tokens as AddedToken dicts; PreTrainedTokenizerFast reads the tokenizer.json as written
    (the module's docstring says why)."""
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    tokenizer["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    tokenizer["pre_tokenizer"] = None
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False) + "\n")
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.update(
        add_bos_token=True,
        add_eos_token=False,
        tokenizer_class="PreTrainedTokenizerFast",
        bos_token=added_token("<s>"),
        eos_token=added_token("</s>"),
        unk_token=added_token("<unk>"),
    )
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def finish_deepseek(out: Path) -> None:
    """DeepSeek-R1-Distill's tokenizer_config.json: its special tokens as AddedToken dicts and
    add_bos_token (which transformers 5 drops where a tokenizer.json is beside it)."""
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.update(
        add_bos_token=True,
        add_eos_token=False,
        bos_token=added_token(DEEPSEEK_BOS),
        eos_token=added_token(DEEPSEEK_EOS),
        pad_token=added_token(DEEPSEEK_EOS),
    )
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


FINISH = {"llama2": finish_llama2, "deepseek": finish_deepseek}


# References


def ids_of(tok, messages: list[dict], **kwargs) -> list[int]:
    encoded = tok.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def rendering(tok, messages: list[dict]) -> dict:
    """transformers' text and ids of a conversation, and of its prompt (less the last assistant
    turn, with the generation prompt)."""
    prompt = messages[:-1]
    return {
        "text": tok.apply_chat_template(messages, tokenize=False),
        "ids": ids_of(tok, messages),
        "prompt_text": tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True),
        "prompt_ids": ids_of(tok, prompt, add_generation_prompt=True),
    }


def masks_and_plain(case: str, tok, records: list[dict], rendered: list[dict]) -> dict:
    """An issue 66 case's `assistant_masks` (its generation template, checked to render the same
    text and ids) and `plain` texts with transformers' ids for them, special tokens added."""
    masks = []
    for record, expected in zip(records, rendered, strict=True):
        out = tok.apply_chat_template(
            record["messages"],
            chat_template=GENERATION_TEMPLATES[case],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        if list(out["input_ids"]) != expected["ids"]:
            raise SystemExit(f"{case}: the generation template renders {record} otherwise")
        masks.append(list(out["assistant_masks"]))
    plain = [{"text": text, "ids": list(tok(text)["input_ids"])} for text in PLAIN_TEXTS]
    return {"assistant_masks": masks, "plain": plain}


def check(case: str, tok, reloaded, records: list[dict], rendered: list[dict]) -> dict:
    """Stops where the saved tokenizer renders otherwise than the one made, or where the ids do
    not start with exactly one BOS (llama3, gemma); for gemma, compares tokenizer.json's ids with
    SentencePiece's own; returns figures for the report."""
    figures = {}
    for record, expected in zip(records, rendered, strict=True):
        if rendering(reloaded, record["messages"]) != expected:
            raise SystemExit(f"{case}: the saved tokenizer renders {record} otherwise")
        if tok.bos_token is not None:
            bos = tok.convert_tokens_to_ids(tok.bos_token)
            if expected["ids"][0] != bos or expected["ids"][1] == bos:
                raise SystemExit(f"{case}: {expected['ids'][:3]} does not start with one BOS ({bos})")
    if case == "gemma":
        processor = sentencepiece.SentencePieceProcessor(model_file=str(DATA / case / "tokenizer.model"))
        bos = processor.bos_id()
        figures["sentencepiece_ids_equal"] = [
            [bos, *processor.encode(r["text"].removeprefix("<bos>"))] == r["ids"] for r in rendered
        ]
    figures["ids"] = [len(r["ids"]) for r in rendered]
    return figures


def make_case(case: str, work: Path) -> dict:
    """Writes one case's dir and reference json; returns figures for the report."""
    out = DATA / case
    if out.exists():
        shutil.rmtree(out)
    tok = TOKENIZERS[case](work / case)
    reference_tokenizers.save_tokenizer(tok, out, case)
    if case in FINISH:  # the files as the family's own are written, read back by transformers
        FINISH[case](out)
        tok = transformers.AutoTokenizer.from_pretrained(out)
    records = [{"messages": messages} for messages in conversations(case)]
    rendered = [rendering(tok, r["messages"]) for r in records]
    figures = check(case, tok, transformers.AutoTokenizer.from_pretrained(out), records, rendered)
    extra = masks_and_plain(case, tok, records, rendered) if case in GENERATION_TEMPLATES else {}
    reference = {
        "case": case,
        "template_source": SOURCES[case],
        "tokenizer_class": type(tok).__name__,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "end_of_turn": END_OF_TURN[case],
        "end_of_turn_id": tok.convert_tokens_to_ids(END_OF_TURN[case]),
        "records": records,
        **{key: [r[key] for r in rendered] for key in ("text", "ids", "prompt_text", "prompt_ids")},
        **({"sentencepiece_ids_equal": figures["sentencepiece_ids_equal"]} if case == "gemma" else {}),
        **extra,
        "versions": reference_tokenizers.versions(transformers, tokenizers, sentencepiece, jinja2),
    }
    (DATA / f"{case}.reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    figures["bytes"] = sum(p.stat().st_size for p in out.iterdir())
    figures["files"] = sorted(p.name for p in out.iterdir())
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(TOKENIZERS), help="comma-separated case names")
    names = parser.parse_args(argv).cases.split(",")
    unknown = sorted(set(names) - set(TOKENIZERS))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; cases: {', '.join(TOKENIZERS)}")
    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            print(json.dumps({name: make_case(name, Path(work))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
