"""The tiny tokenizers the reference scripts make, in the formats of Llama 3 (byte-level BPE in
tokenizer.json), Qwen (ChatML: Qwen2Tokenizer) and Gemma (SentencePiece converted by transformers),
and how they are saved: one home for what scripts/make_hf_reference.py (tests/data/hf/) and
scripts/make_chat_reference.py (tests/data/chat/) share. Each script passes what differs: the texts
the BPE is trained on, its vocabulary size, the eos token, the chat template.

Imported by those two scripts only (run as scripts, their directory is on sys.path), in their venv
(transformers, tokenizers, sentencepiece; the docstring of make_hf_reference.py says how to make it).
It does not import torch, so that make_chat_reference.py does not need it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import tokenizers
import transformers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# google/gemma-2b-it (and google/gemma-2-2b-it), tokenizer_config.json "chat_template"
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)


def versions(*modules: ModuleType) -> dict:
    """The versions of what made the data, in the order given, written into each reference json."""
    return {module.__name__: module.__version__ for module in modules}


def train_byte_level_bpe(
    texts: Iterable[str], vocab_size: int, split_regex: str, normalizer=None
) -> tuple[dict, list]:
    """A byte-level BPE (vocab, merges) of `vocab_size` trained on `texts` with the given
    pre-tokenizer split."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        min_frequency=2,
    )
    tok.train_from_iterator(texts, trainer)
    state = json.loads(tok.to_str())["model"]
    return state["vocab"], [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]


def byte_level_bpe(
    texts: Iterable[str],
    vocab_size: int,
    split: str,
    specials: Iterable[str],
    bos: str,
    *,
    ignore_merges: bool,
    prefix_space: bool,
) -> tokenizers.Tokenizer:
    """A byte-level BPE trained on `texts` with pre-tokenizer `split`, `specials` after its
    vocabulary and `bos` put before every text by its post-processor: Llama 3's form (ignore_merges,
    prefix_space: its post-processor's byte-level options) and DeepSeek-R1-Distill's (Qwen's split)."""
    vocab, merges = train_byte_level_bpe(texts, vocab_size, split)
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=prefix_space, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(add_prefix_space=prefix_space, trim_offsets=False, use_regex=prefix_space),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, tok.token_to_id(bos))],
            ),
        ]
    )
    return tok


def llama3_tokenizer(
    texts: Iterable[str], vocab_size: int, *, eos_token: str, model_max_length: int, chat_template: str
):
    """Llama 3's format: byte-level BPE in tokenizer.json, PreTrainedTokenizerFast, BOS added by the
    post-processor (a template writes it too: apply_chat_template encodes without special tokens),
    <|begin_of_text|> etc. after the BPE vocabulary."""
    bos = "<|begin_of_text|>"
    tok = byte_level_bpe(
        texts, vocab_size, LLAMA3_SPLIT, LLAMA3_SPECIALS, bos, ignore_merges=True, prefix_space=True
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos_token,
        clean_up_tokenization_spaces=True,
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=model_max_length,
        chat_template=chat_template,
    )


def chatml_tokenizer(texts: Iterable[str], vocab_size: int, chat_template: str):
    """Qwen's format: Qwen2Tokenizer (NFC, Qwen's split, byte-level BPE), no BOS, ChatML's specials
    after the BPE vocabulary, <|im_end|> the eos (the end of a turn) and <|endoftext|> the pad."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    vocab, merges = train_byte_level_bpe(texts, vocab_size, PRETOKENIZE_REGEX, normalizers.NFC())
    tok = transformers.Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        errors="replace",
        chat_template=chat_template,
        model_max_length=32768,
    )
    # Qwen's order: <|endoftext|>, <|im_start|>, <|im_end|> right after the BPE vocabulary
    tok.add_special_tokens({"additional_special_tokens": list(CHATML_SPECIALS[1:])})
    tok.eos_token = "<|im_end|>"
    return tok


def gemma_tokenizer(sentencepiece_model: Path, **kwargs):
    """Gemma's format: `sentencepiece_model` (a tokenizer.model with Gemma's specials and turn
    markers) and tokenizer.json as transformers converts it (GemmaTokenizerFast), with Gemma's chat
    template; `kwargs` go to from_pretrained beside Gemma's own."""
    tok = transformers.GemmaTokenizer.from_pretrained(
        sentencepiece_model.parent,
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
        chat_template=GEMMA_CHAT_TEMPLATE,
        add_bos_token=True,
        model_max_length=8192,
        **kwargs,
    )
    tok.sentencepiece_model = sentencepiece_model  # save_pretrained (transformers 5) leaves it out
    return tok


def save_tokenizer(tok, out: Path, kind: str) -> None:
    """Writes the tokenizer's files into `out` as transformers saves them (the chat template inside
    tokenizer_config.json), tokenizer.model too where there is one, with a clean tokenizer_config."""
    tok.save_pretrained(out, save_jinja_files=False)
    if hasattr(tok, "sentencepiece_model"):
        shutil.copyfile(tok.sentencepiece_model, out / "tokenizer.model")
    clean_tokenizer_config(out / "tokenizer_config.json", kind)


def clean_tokenizer_config(path: Path, kind: str) -> None:
    """Drops what transformers 5 writes about where the tokenizer was loaded from (a temporary path:
    a rerun would differ), and names Llama 3's tokenizer class as Meta's files do (transformers 5
    writes TokenizersBackend, its new name for PreTrainedTokenizerFast)."""
    config = json.loads(path.read_text())
    for key in ("vocab_file", "is_local", "local_files_only"):
        config.pop(key, None)
    if kind == "llama3":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
