"""Makes the tiny Hugging Face transformers checkpoints under tests/data/hf/ and transformers' own
reference logits and tokenization for them (issue 53), and checks a meshrun export with transformers.

For each case (one per model family and format quirk: Llama 2/3, RoPE scaling in both spellings, tied
heads, a bf16 checkpoint in two shards, Mistral, Gemma 1/2/3, Gemma 2/3 with
query_pre_attn_scalar = hidden / heads and sliding windows shorter than the sequence, Qwen 2/3) it writes:

- tests/data/hf/<case>/: a `save_pretrained` dir (config.json, safetensors, tokenizer files,
  generation_config.json), built with transformers' own config, model and tokenizer classes;
- tests/data/hf/<case>.reference.npz: `token_ids` int32 [2, 16] and transformers' `logits` float32
  [2, 16, vocab] in the checkpoint's dtype (plus `logits_float32` for the bf16 case, and for the
  Gemma 2/3 `_scaled` cases `greedy_ids` int32 [2, 16], transformers' greedy `generate` from the
  first 6 of `token_ids`);
- tests/data/hf/<case>.reference.json: the tokenization of a fixed text, the specials and versions.

Tokenizers are trained on tests/data/hf/corpus.txt (committed, fixed once); the Llama 3, ChatML and
Gemma ones are built by scripts/reference_tokenizers.py, which make_chat_reference.py shares. Everything
is seeded: a rerun writes the same files. meshrun's tests read these files with meshrun's own code; CI
never runs this script, and transformers and torch are not test dependencies. Made with transformers 5.24.0,
torch 2.13.0+cpu, tokenizers 0.23.3, sentencepiece 0.2.3, peft 0.21.2, safetensors 0.8.0 (Python 3.11).

To rerun it, in a venv of its own (not meshrun's; install torch first, so nothing pulls a CUDA build):

    /root/.pyenv/versions/3.11.7/bin/python -m venv /work/refvenv
    /work/refvenv/bin/pip install torch==2.13.0
    /work/refvenv/bin/pip install transformers peft safetensors sentencepiece tokenizers numpy protobuf
    /work/refvenv/bin/python scripts/make_hf_reference.py make                    # every case
    /work/refvenv/bin/python scripts/make_hf_reference.py make --cases llama3,qwen2

To check a meshrun export (`<run>/hf/`, and `<run>/peft/` for a LoRA run) with transformers itself:

    /work/refvenv/bin/python scripts/make_hf_reference.py check-export --case tests/data/hf/llama3 \\
        --hf RUN/hf [--peft RUN/peft [--rank R] [--params N]] [--expect LOGITS.npy]

It prints the largest absolute difference between the logits of each pair (the export against the
base case plus the PEFT adapter, each against --expect) and whether the export's tokenizer gives
the reference ids of the reference text; for --peft also the adapter's `r` and its parameters as PEFT
loads them beside PEFT's count for its targets (r * (in + out) per adapted Linear). Exit 1 when a
difference is over --tol (1e-4), the ids differ, or the adapter's r or count is not --rank or --params.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sentencepiece
import tokenizers
import torch
import transformers

import reference_tokenizers

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf"
CORPUS = DATA / "corpus.txt"
TEXT = "  Hello,  world! It's 2024: naïve café, Ünïcödé façade — 12345 tokens.\nDon't stop:  ok?"
SEED = 53
BATCH, LENGTH = 2, 16
PROMPT_LENGTH = 6  # the prompt of a case's greedy generation (Case.greedy): the first 6 of token_ids
BPE_VOCAB = 400  # the 256 bytes and 144 merges; specials come after
SP_VOCAB = 480
NOISE = 0.1  # norm weights and biases perturbed by this much (std) so that they matter
INIT_RANGE = 0.1

# Not quite Meta's text (" + message" where Meta's has "+ message": it renders the same), kept so that
# the data made with it does not change; make_chat_reference.py has Meta's own.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # small, so that at head_dim 8 one frequency is scaled in the smooth band and two in full
    "original_max_position_embeddings": 512,
}
SMALL = dict(
    hidden_size=32,
    num_hidden_layers=2,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    initializer_range=INIT_RANGE,
)


@dataclass(frozen=True)
class Case:
    """One tiny checkpoint: its family, tokenizer kind, config and what is special about it."""

    name: str
    model_class: str
    config_class: str
    tokenizer: str  # llama3 | chatml | llama2 | gemma
    config: dict = field(default_factory=dict)
    dtype: str = "float32"
    embed_scale: float = 1.0  # embeddings multiplied by this after init (small: eps matters)
    shard_size: str | None = None
    rope_v4_spelling: bool = False  # config.json rewritten to transformers 4's rope_theta/rope_scaling
    greedy: bool = False  # the npz has transformers' greedy `generate` ids too (`greedy_ids`)


LLAMA3 = dict(rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
LLAMA3_SCALED = dict(rms_norm_eps=1e-5, rope_parameters={"rope_theta": 500000.0, **LLAMA3_SCALING})
CASES = {
    c.name: c
    for c in (
        Case("llama3", "LlamaForCausalLM", "LlamaConfig", "llama3", LLAMA3, embed_scale=0.01),
        Case(
            "llama3_rope4", "LlamaForCausalLM", "LlamaConfig", "llama3", LLAMA3_SCALED, rope_v4_spelling=True
        ),
        Case(
            "llama3_tied_rope5",
            "LlamaForCausalLM",
            "LlamaConfig",
            "llama3",
            {**LLAMA3_SCALED, "tie_word_embeddings": True},
        ),
        Case(
            "llama3_bf16_sharded",
            "LlamaForCausalLM",
            "LlamaConfig",
            "llama3",
            LLAMA3,
            dtype="bfloat16",
            shard_size="60KB",
        ),
        Case("llama2", "LlamaForCausalLM", "LlamaConfig", "llama2", dict(rms_norm_eps=1e-5)),
        Case(
            "mistral",
            "MistralForCausalLM",
            "MistralConfig",
            "llama2",
            dict(head_dim=16, sliding_window=None, rms_norm_eps=1e-5),
        ),
        Case("gemma", "GemmaForCausalLM", "GemmaConfig", "gemma", dict(head_dim=16)),
        Case(
            "gemma2",
            "Gemma2ForCausalLM",
            "Gemma2Config",
            "gemma",
            dict(
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=64,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0,
            ),
        ),
        Case(
            "gemma3",
            "Gemma3ForCausalLM",
            "Gemma3TextConfig",
            "gemma",
            dict(
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=64,
                rope_parameters={
                    "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                },
            ),
        ),
        # Gemma 2 27B's and Gemma 3 27B's scale: query_pre_attn_scalar = hidden_size / heads (8), not
        # head_dim (16); sliding windows shorter than the 16-token sequence (Gemma 3: 6 layers, so
        # that its 6th is a full-attention one)
        Case(
            "gemma2_scaled",
            "Gemma2ForCausalLM",
            "Gemma2Config",
            "gemma",
            dict(
                head_dim=16,
                query_pre_attn_scalar=8,
                sliding_window=4,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0,
            ),
            greedy=True,
        ),
        Case(
            "gemma3_scaled",
            "Gemma3ForCausalLM",
            "Gemma3TextConfig",
            "gemma",
            dict(
                num_hidden_layers=6,
                head_dim=16,
                query_pre_attn_scalar=8,
                sliding_window=6,
                rope_parameters={
                    "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                },
            ),
            greedy=True,
        ),
        Case("qwen2", "Qwen2ForCausalLM", "Qwen2Config", "chatml", dict(tie_word_embeddings=True)),
        Case(
            "qwen3",
            "Qwen3ForCausalLM",
            "Qwen3Config",
            "chatml",
            dict(head_dim=16, tie_word_embeddings=False, rms_norm_eps=1e-6),
        ),
    )
}


# Tokenizers


def corpus_lines() -> list[str]:
    """The corpus line by line, newlines kept: what tokenizers' `train([CORPUS])` reads."""
    return CORPUS.read_text().splitlines(keepends=True)


def train_sentencepiece(out: Path, gemma: bool) -> Path:
    """A SentencePiece BPE model with byte fallback, Llama 2's settings (or Gemma's), as tokenizer.model."""
    prefix = out / "sp"
    common = dict(
        input=str(CORPUS),
        model_prefix=str(prefix),
        vocab_size=SP_VOCAB,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        num_threads=1,
        minloglevel=2,
        max_sentence_length=100000,
    )
    if gemma:
        sentencepiece.SentencePieceTrainer.train(
            **common,
            add_dummy_prefix=False,
            pad_id=0,
            eos_id=1,
            bos_id=2,
            unk_id=3,
            pad_piece="<pad>",
            eos_piece="<eos>",
            bos_piece="<bos>",
            unk_piece="<unk>",
            user_defined_symbols=["<mask>", "<start_of_turn>", "<end_of_turn>"],
        )
    else:
        sentencepiece.SentencePieceTrainer.train(
            **common, add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1
        )
    model = out / "tokenizer.model"
    model.write_bytes(without_paths(Path(f"{prefix}.model").read_bytes()))
    return model


def without_paths(serialized: bytes) -> bytes:
    """The model proto with the trainer's input and output paths made fixed (a temporary dir and
    the checkout's path would make every rerun differ)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(serialized)
    del proto.trainer_spec.input[:]
    proto.trainer_spec.input.append("tests/data/hf/corpus.txt")
    proto.trainer_spec.model_prefix = "tokenizer"
    return proto.SerializeToString(deterministic=True)


def sentencepiece_tokenizer(kind: str, work: Path):
    """Llama 2's (or Gemma's) format: tokenizer.model from sentencepiece, and tokenizer.json as
    transformers converts it (LlamaTokenizer / GemmaTokenizer)."""
    work.mkdir()
    sp_model = train_sentencepiece(work, gemma=kind == "gemma")
    if kind == "gemma":
        return reference_tokenizers.gemma_tokenizer(sp_model)
    tok = transformers.LlamaTokenizer.from_pretrained(
        work, legacy=False, add_prefix_space=True, add_bos_token=True, model_max_length=4096
    )
    tok.sentencepiece_model = sp_model  # save_pretrained of transformers 5 leaves it out: copied by hand
    return tok


def make_tokenizer(kind: str, work: Path):
    """The tokenizer of a case's kind."""
    if kind == "llama3":
        return reference_tokenizers.llama3_tokenizer(
            corpus_lines(),
            BPE_VOCAB,
            eos_token="<|end_of_text|>",
            model_max_length=131072,
            chat_template=LLAMA3_CHAT_TEMPLATE,
        )
    if kind == "chatml":
        return reference_tokenizers.chatml_tokenizer(corpus_lines(), BPE_VOCAB, CHATML_TEMPLATE)
    return sentencepiece_tokenizer(kind, work)


# Models


def generation_ids(kind: str, tok) -> dict:
    """The ids generation_config.json carries, as the real checkpoints of the family have them."""
    ids = tok.convert_tokens_to_ids
    if kind == "llama3":
        return dict(
            bos_token_id=ids("<|begin_of_text|>"), eos_token_id=[ids("<|end_of_text|>"), ids("<|eot_id|>")]
        )
    if kind == "chatml":
        return dict(
            bos_token_id=ids("<|endoftext|>"),
            eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")],
            pad_token_id=ids("<|endoftext|>"),
        )
    if kind == "gemma":
        return dict(bos_token_id=ids("<bos>"), eos_token_id=ids("<eos>"), pad_token_id=ids("<pad>"))
    return dict(bos_token_id=ids("<s>"), eos_token_id=ids("</s>"))


def build_model(case: Case, tok):
    """The case's model, seeded, with norms and biases perturbed so that every weight matters."""
    gen = generation_ids(case.tokenizer, tok)
    eos = gen["eos_token_id"]
    config = getattr(transformers, case.config_class)(
        **{**SMALL, **case.config},  # a case's config may change SMALL's (Gemma 3's layer count)
        vocab_size=len(tok),
        bos_token_id=gen["bos_token_id"],
        eos_token_id=eos,
        pad_token_id=gen.get("pad_token_id"),
    )
    torch.manual_seed(SEED)
    model = getattr(transformers, case.model_class)(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(NOISE * torch.randn_like(param))
        model.get_input_embeddings().weight.mul_(case.embed_scale)
    model.generation_config = transformers.GenerationConfig(**gen)
    if case.dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    return model


def token_ids(vocab_size: int) -> np.ndarray:
    """The fixed token ids the reference logits are computed on."""
    return np.random.default_rng(SEED).integers(0, vocab_size, size=(BATCH, LENGTH)).astype(np.int32)


def forward(model, ids: np.ndarray) -> np.ndarray:
    """Logits as float32, no padding, attention over every position."""
    with torch.no_grad():
        x = torch.from_numpy(ids.astype(np.int64))
        return model(input_ids=x, attention_mask=torch.ones_like(x)).logits.float().numpy()


def greedy_ids(out: Path, ids: np.ndarray) -> np.ndarray:
    """transformers' greedy `generate` (its KV cache, a sliding window's cache included) from the
    first PROMPT_LENGTH of each row of `ids` up to LENGTH tokens in all, prompt included, never
    stopping early: int32 [BATCH, LENGTH]."""
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="auto").eval()
    prompt = torch.from_numpy(ids[:, :PROMPT_LENGTH].astype(np.int64))
    with torch.no_grad():
        generated = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_length=LENGTH,
            do_sample=False,
            eos_token_id=None,
        )
    if generated.shape != (BATCH, LENGTH):
        raise SystemExit(f"{out.name}: generate gave shape {tuple(generated.shape)}")
    return generated.numpy().astype(np.int32)


def write_v4_rope_spelling(config_path: Path) -> None:
    """Rewrites rope_parameters as transformers 4 spelt it: top-level rope_theta and rope_scaling."""
    config = json.loads(config_path.read_text())
    params = dict(config.pop("rope_parameters"))
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = params
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_case(case: Case, work: Path) -> dict:
    """Writes one case's dir, reference npz and json; returns figures for the report."""
    out = DATA / case.name
    if out.exists():
        shutil.rmtree(out)
    tok = make_tokenizer(case.tokenizer, work / case.name)
    model = build_model(case, tok)
    kwargs = {"max_shard_size": case.shard_size} if case.shard_size else {}
    model.save_pretrained(out, **kwargs)
    reference_tokenizers.save_tokenizer(tok, out, case.tokenizer)
    if case.rope_v4_spelling:
        write_v4_rope_spelling(out / "config.json")
    ids = token_ids(model.config.vocab_size)
    logits, figures = reload_and_check(case, out, tok, ids, in_memory=forward(model, ids))
    arrays = {"token_ids": ids, "logits": logits}
    if case.dtype == "bfloat16":
        upcast = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        arrays["logits_float32"] = forward(upcast, ids)
    if case.greedy:
        arrays["greedy_ids"] = greedy_ids(out, ids)
    np.savez(DATA / f"{case.name}.reference.npz", **arrays)
    reference = tokenization_reference(case, tok, model.config.model_type)
    (DATA / f"{case.name}.reference.json").write_text(
        json.dumps(reference, indent=2, ensure_ascii=False) + "\n"
    )
    figures.update(discrimination(case, out, ids, logits))
    return figures


def tokenization_reference(case: Case, tok, model_type: str) -> dict:
    """The reference tokenization of TEXT and the specials."""
    ids = tok(TEXT, add_special_tokens=False).input_ids
    return {
        "case": case.name,
        "model_type": model_type,
        "dtype": case.dtype,
        "text": TEXT,
        "ids": ids,
        "ids_with_special": tok(TEXT, add_special_tokens=True).input_ids,
        "tokens": tok.convert_ids_to_tokens(ids),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "special_ids": special_ids(tok),
        **sentencepiece_reference(case, ids),
        "versions": reference_tokenizers.versions(transformers, torch, tokenizers, sentencepiece),
    }


def special_ids(tok) -> dict:
    """Every special token (the named ones and the added ones, such as <|eot_id|>) and its id."""
    ids = {t: tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens}
    ids.update({t.content: i for i, t in tok.added_tokens_decoder.items() if t.special})
    return dict(sorted(ids.items(), key=lambda item: item[1]))


def sentencepiece_reference(case: Case, ids: list[int]) -> dict:
    """For the SentencePiece families: the ids tokenizer.model itself gives, which transformers'
    tokenizer.json need not match (Metaspace adds no "▁" to a text that starts with a space)."""
    model = DATA / case.name / "tokenizer.model"
    if not model.exists():
        return {}
    sp_ids = sentencepiece.SentencePieceProcessor(model_file=str(model)).encode(TEXT)
    return {"sentencepiece_ids": sp_ids, "sentencepiece_ids_equal": sp_ids == ids}


def reload_and_check(case: Case, out: Path, tok, ids: np.ndarray, in_memory: np.ndarray):
    """Loads the dir back with the Auto classes (the reference logits are that model's) and checks it
    is the model that was saved: the same logits in float32 (bf16 is cast after the in-memory forward,
    and an in-memory cast would round RoPE's inverse frequencies too), the same tokenization."""
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="auto").eval()
    expected_dtype = getattr(torch, case.dtype)
    if model.dtype != expected_dtype:
        raise SystemExit(f"{case.name}: loads as {model.dtype}, not {expected_dtype}")
    logits = forward(model, ids)
    diff = float(np.abs(logits - in_memory).max())
    if case.dtype == "float32" and diff != 0.0:
        raise SystemExit(f"{case.name}: reloaded logits differ by {diff}")
    reloaded = transformers.AutoTokenizer.from_pretrained(out)
    if reloaded(TEXT).input_ids != tok(TEXT).input_ids:
        raise SystemExit(f"{case.name}: the reloaded tokenizer gives other ids")
    return logits, {
        "dtype": str(model.dtype),
        "reload_vs_in_memory": diff,
        "logits_abs_mean": float(np.abs(logits).mean()),
        "files": sorted(p.name for p in out.iterdir()),
        "bytes": sum(p.stat().st_size for p in out.iterdir()),
        "layer_types": getattr(model.config, "layer_types", None),
        "tokenizer_class": type(reloaded).__name__,
    }


def discrimination(case: Case, out: Path, ids: np.ndarray, logits: np.ndarray) -> dict:
    """How far the logits move when what the case is about is lost (eps, RoPE scaling, softcaps)."""
    figures = {}
    variants = {}
    if case.config.get("rms_norm_eps") == 1e-5:
        variants["eps_1e-6"] = {"rms_norm_eps": 1e-6}
    if "rope_parameters" in case.config and case.config["rope_parameters"].get("rope_type") == "llama3":
        variants["no_rope_scaling"] = {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    if case.config.get("attn_logit_softcapping"):
        variants["no_softcaps"] = {"attn_logit_softcapping": None, "final_logit_softcapping": None}
    if case.config.get("query_pre_attn_scalar", case.config.get("head_dim")) != case.config.get("head_dim"):
        variants["scalar_head_dim"] = {"query_pre_attn_scalar": case.config["head_dim"]}
    if (case.config.get("sliding_window") or LENGTH) < LENGTH:
        variants["window_of_the_sequence"] = {"sliding_window": LENGTH}
    for label, change in variants.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="auto", **change).eval()
        moved = forward(model, ids)
        figures[label] = {
            "max_abs": float(np.abs(moved - logits).max()),
            "argmax_changed": float((moved.argmax(-1) != logits.argmax(-1)).mean()),
        }
    return figures


def make(names: list[str]) -> None:
    """Writes the named cases and prints what the report needs."""
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            figures = save_case(CASES[name], Path(work))
            print(json.dumps({name: figures}, indent=None))


# check-export


def check_export(args) -> int:
    """Loads an export with transformers (and base + PEFT adapter) and compares logits and ids."""
    case = Path(args.case)
    ref_npz = np.load(case.parent / f"{case.name}.reference.npz")
    reference = json.loads((case.parent / f"{case.name}.reference.json").read_text())
    ids = ref_npz["token_ids"]
    dtype = getattr(torch, args.dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.hf, dtype=dtype).eval()
    hf_logits = forward(model, ids)
    failures = 0
    pairs = {}
    if args.peft:
        import peft

        base = transformers.AutoModelForCausalLM.from_pretrained(case, dtype=dtype).eval()
        adapted = peft.PeftModel.from_pretrained(base, args.peft).eval()
        failures += report_adapter(adapted, args)
        pairs["hf vs base + peft"] = (hf_logits, forward(adapted, ids))
    if args.expect:
        expected = np.load(args.expect)
        pairs["hf vs --expect"] = (hf_logits, expected)
        if args.peft:
            pairs["base + peft vs --expect"] = (pairs["hf vs base + peft"][1], expected)
    for label, (mine, other) in pairs.items():
        diff = float(np.abs(mine - other).max())
        ok = diff <= args.tol
        failures += not ok
        print(f"{label}: max abs difference {diff:.3g} ({'ok' if ok else f'over {args.tol:g}'})")
    diff = float(np.abs(hf_logits - ref_npz["logits"]).max())
    print(f"hf vs the case's reference logits (information; training moves them): {diff:.3g}")
    tok = transformers.AutoTokenizer.from_pretrained(args.hf)
    for key, special in (("ids", False), ("ids_with_special", True)):
        same = tok(reference["text"], add_special_tokens=special).input_ids == reference[key]
        failures += not same
        print(f"tokenizer {key}: {'same as the reference' if same else 'DIFFERENT from the reference'}")
    return 1 if failures else 0


def report_adapter(adapted, args) -> int:
    """Prints the PEFT adapter's `r`, its LoRA parameters as PEFT loaded them, and PEFT's count for
    its targets by formula (r * (in + out) per adapted Linear); returns the failures: a count or r
    other than --rank and --params expect, or tensors that do not match the formula."""
    config = adapted.peft_config["default"]
    loaded = sum(p.numel() for name, p in adapted.named_parameters() if ".lora_" in name)
    by_formula = sum(
        module.r["default"] * (module.in_features + module.out_features)
        for _, module in adapted.named_modules()
        if hasattr(module, "lora_A") and "default" in getattr(module, "r", {})
    )
    print(f"peft: r {config.r}, lora_alpha {config.lora_alpha}, targets {sorted(config.target_modules)}")
    print(f"peft: {loaded:,} adapter parameters loaded; r * (in + out) over its targets: {by_formula:,}")
    failures = int(loaded != by_formula)
    for flag, found in (("--rank", config.r), ("--params", loaded)):
        wanted = getattr(args, flag.removeprefix("--"))
        if wanted is not None and wanted != found:
            print(f"peft: {flag} {wanted} expected, found {found}")
            failures += 1
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    make_parser = sub.add_parser("make", help="write the cases (all by default)")
    make_parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    check = sub.add_parser("check-export", help="check an export with transformers and PEFT")
    check.add_argument("--case", required=True, help="the case dir the export came from")
    check.add_argument("--hf", required=True, help="the export's hf/ dir")
    check.add_argument("--peft", help="the export's peft/ dir (an adapter for --case)")
    check.add_argument("--expect", help="an .npy of logits [2, 16, vocab] the export should give")
    check.add_argument("--rank", type=int, help="the r the PEFT adapter must have (model.lora.rank)")
    check.add_argument("--params", type=int, help="the adapter parameters it must have (meshrun's trainable)")
    check.add_argument("--tol", type=float, default=1e-4)
    check.add_argument("--dtype", default="float32", help="dtype the models are loaded in")
    args = parser.parse_args(argv)
    if args.command == "check-export":
        return check_export(args)
    make((getattr(args, "cases", None) or ",".join(CASES)).split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
