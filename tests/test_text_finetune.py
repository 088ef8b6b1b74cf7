"""data=text end to end: a pretrained KerasHub preset (built here: a tiny Gemma with a SentencePiece
vocabulary of 512, 2 layers, 4 heads, and a tiny GPT-2 with a byte-level BPE) fine-tuned on local
text on a 2x4 mesh of 8 emulated CPU devices. The acceptance run: plain text, LoRA rank 4, exports;
the token cache misses, then hits; the mask matches the tokens trained; a model learns to end its
completions; packing is visible; every input of the tokens is in the cache key; bad input is one
line, exit 2, and leaves nothing in the cache."""

import json
import math
import os

import numpy as np
import pytest

from conftest import INSTRUCTION_PROMPT, read_metrics, train_here
from meshrun import cli
from meshrun.errors import ConfigError
from meshrun.text.cache import PROBES
from presets import corpus_text, sentencepiece_proto

pytestmark = pytest.mark.integration

PROMPT = INSTRUCTION_PROMPT
TEMPLATES = [f"data.prompt='{PROMPT}'", "data.completion='{response}'"]
GEMMA_RUN = [
    "model=keras_hub",
    "mesh=2x4",
    "layout=gemma_tp",
    "data=text",
    "train.verbose=0",
    "train.batch_size=8",
]


@pytest.fixture(scope="module")
def files(text_files):
    return text_files.root


@pytest.fixture(scope="module")
def gemma(text_files):
    return text_files.gemma


@pytest.fixture(scope="module")
def gpt2(text_files):
    return text_files.gpt2


@pytest.fixture(scope="module")
def acceptance(gemma, files, tmp_path_factory):
    """The issue's acceptance run, twice: the Gemma preset LoRA-tuned (rank 4) on the plain-text
    file, exporting, with its tokens cached in a dir of its own; then a rerun on the same text."""
    out = tmp_path_factory.mktemp("runs")
    args = [
        *GEMMA_RUN,
        f"model.preset={gemma}",
        f"data.files={files / 'corpus.txt'}",
        "data.eval_fraction=0.1",
        f"data.cache_dir={out / 'tokens'}",
        "model.lora.rank=4",
        "train.epochs=2",
        "train.learning_rate=0.01",
        "checkpoint.export=true",
    ]
    first = train_here(args, out / "first")
    again = train_here([*args, "checkpoint.export=false", "train.epochs=1"], out / "again")
    return first, again, out


def test_a_lora_fine_tune_on_text_trains_exports_and_caches_its_tokens(acceptance):
    first, again, out = acceptance
    data = first["data"]
    assert data["cache"] == "miss" and again["data"]["cache"] == "hit"
    assert (
        data["tokens"] == again["data"]["tokens"] > 10_000
        and data["packed"] is True
        and data["padding_fraction"] == 0.0
    )
    assert data["tokenizer"].startswith("GemmaTokenizer (SentencePiece)") and data["loader"] == "grain"
    assert first["model"]["trainable_params"] < first["model"]["params"] / 5
    losses = first["history"]["loss"]
    assert losses[1] < losses[0]
    assert first["eval"]["perplexity"] == pytest.approx(math.exp(first["eval"]["loss"]), rel=1e-6)
    assert data["eval_source"].startswith("10% of the examples")
    assert (out / "first" / "preset" / "config.json").is_file() and (
        out / "first" / "adapter.lora.h5"
    ).is_file()
    [verdict] = (out / "tokens" / PROBES).iterdir()  # the tokenizer's check, kept beside its tokens
    assert json.loads(verdict.read_text())["agrees"] is True


@pytest.fixture(scope="module")
def gemma_verdicts(gemma, tmp_path_factory):
    """A token cache dir holding only the verdict of the check of the Gemma preset's tokenizer (made
    once here for the tests that start from a checked tokenizer)."""
    from meshrun.text.tokenizer import load_tokenizer

    cache_dir = tmp_path_factory.mktemp("gemma_verdicts")
    load_tokenizer(str(gemma), "model.preset", str(cache_dir))
    assert sorted(p.relative_to(cache_dir).as_posix() for p in cache_dir.rglob("*") if p.is_dir()) == [PROBES]
    return cache_dir


# Trains as `meshrun train ARGS` would, in this fresh process, then says which packages it imported.
TRAIN_AND_SAY_IMPORTS = """
import json, sys
from meshrun import cli
cli.main(["train", *sys.argv[1:]])
print(json.dumps({name: name in sys.modules for name in ("keras_hub", "tensorflow", "tensorflow_text")}))
"""


@pytest.mark.e2e
def test_a_fine_tune_whose_tokenizer_was_checked_before_imports_no_tensorflow(
    gemma, gemma_verdicts, files, tmp_path
):
    """keras_hub imported without TensorFlow, the preset read without it, the tokenizer's check
    read from the token cache, the model exported without it: a KerasHub fine-tune on text whose
    tokenizer needs nothing of TensorFlow's goes without its 2-4 s and 500 MiB (issue 50)."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(gemma_verdicts, tmp_path / "tokens")  # the check, made and kept by an earlier load
    args = [
        *GEMMA_RUN,
        f"model.preset={gemma}",
        f"data.files={files / 'corpus.txt'}",
        f"data.cache_dir={tmp_path / 'tokens'}",
        "model.lora.rank=4",
        "train.epochs=1",
        "checkpoint.export=true",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_AND_SAY_IMPORTS, *args], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "keras_hub": True,
        "tensorflow": False,
        "tensorflow_text": False,
    }
    assert read_metrics(tmp_path / "run")["data"]["tokenizer"].startswith("GemmaTokenizer (SentencePiece)")
    assert (tmp_path / "run" / "model.keras").is_file() and (
        tmp_path / "run" / "preset" / "tokenizer.json"
    ).is_file()


def logits(model, ids) -> np.ndarray:
    """The model's logits for rows of token ids, by its jit-compiled predict step (one program;
    calling the model eagerly compiles each of its operations apart, seconds in all)."""
    return np.asarray(model.predict_on_batch({"token_ids": ids, "padding_mask": np.ones_like(ids)}))


def test_the_merged_preset_and_base_plus_adapter_agree_and_differ_from_the_base(acceptance, gemma):
    import keras_hub

    from meshrun.models.hub.export import load_adapter
    from meshrun.models.hub.options import LoraOptions

    run_dir = acceptance[2] / "first"
    ids = np.arange(3, 35, dtype=np.int32)[None, :]
    merged = keras_hub.models.CausalLM.from_preset(str(run_dir / "preset"), preprocessor=None)
    base = keras_hub.models.CausalLM.from_preset(str(gemma), preprocessor=None)
    base_logits = logits(base, ids)
    adapted = logits(load_adapter(base, LoraOptions(rank=4), run_dir / "adapter.lora.h5"), ids)
    np.testing.assert_allclose(logits(merged, ids), adapted, atol=1e-4)
    assert np.abs(adapted - base_logits).max() > 1e-3


def test_generate_completes_a_one_line_prompt_of_the_finished_run(acceptance, capsys):
    run_dir = acceptance[2] / "first"
    capsys.readouterr()
    cli.main(["generate", str(run_dir), "--prompt", "The old farmer", "--max-length", "24", "--json"])
    [result] = json.loads(capsys.readouterr().out)
    assert (
        result["prompt"] == "The old farmer"
        and isinstance(result["completion"], str)
        and result["completion"].strip()
    )


# --- issue 37: the mask, the end token, packing, the cache key ----------------------------------


def tokens_of(options_args: dict, preset, seq_len: int = 48):
    """The token rows data=text makes of `options_args` with the preset's tokenizer, through the
    same code a run uses: (arrays by name, metadata, framing, tokenizer)."""
    from meshrun.data import text, text_tokenizer, text_tokens
    from meshrun.text.tokenizer import load_tokenizer

    options = text.TextOptions(**options_args)
    tokenizer = load_tokenizer(str(preset), "model.preset")
    framing = text_tokenizer.framing_for(options, tokenizer)
    made = text_tokens.tokenize_cached(options, tokenizer, framing, seq_len)
    return {name: np.asarray(array[:]) for name, array in made.arrays.items()}, made, framing, tokenizer


def test_a_token_cache_its_group_can_write_is_refused_unless_shared(gpt2, files, tmp_path):
    from meshrun.data import text, text_tokenizer, text_tokens
    from meshrun.text.tokenizer import load_tokenizer

    group = tmp_path / "tokens"
    group.mkdir(mode=0o770)
    os.chmod(group, 0o770)
    options = text.TextOptions(
        files=(str(files / "instructions.jsonl"),),
        prompt="{instruction}",
        completion="{response}",
        cache_dir=str(group),
    )
    tokenizer = load_tokenizer(str(gpt2), "model.preset")
    framing = text_tokenizer.framing_for(options, tokenizer)
    with pytest.raises(ConfigError) as caught:
        text_tokens.tokenize_cached(options, tokenizer, framing, 48)
    assert caught.value.key == "data.cache_dir" and f"chmod g-w {group}, or cache.shared=true" in str(
        caught.value
    )
    assert list(group.iterdir()) == []
    assert text_tokens.tokenize_cached(
        options, tokenizer, framing, 48, shared=True
    ).arrays  # the user trusts the group


@pytest.mark.parametrize("prompt", ["Q: {instruction} A: ", "Q: {instruction} A:"])
def test_the_mask_weighs_exactly_the_completion_tokens_and_the_prompt_is_encoded_as_at_sampling(
    gpt2, files, tmp_path, prompt
):
    """With a byte-level BPE, tokenizing prompt + completion as one text merges across the
    boundary; meshrun trains on the ids it computed the mask for, with the prompt encoded alone."""
    from meshrun.text.complete import encode_prompts

    records = [json.loads(line) for line in (files / "instructions.jsonl").read_text().splitlines()[:40]]
    arrays, _, framing, tokenizer = tokens_of(
        {
            "files": (str(files / "instructions.jsonl"),),
            "prompt": prompt,
            "completion": "{response}",
            "cache_dir": str(tmp_path),
        },
        gpt2,
    )
    # the rows go on past the 40 records read (the file has more)
    for row, length, weights, record in zip(
        arrays["train_tokens"], arrays["train_lengths"], arrays["train_weights"], records, strict=False
    ):
        prompt_text = prompt.format(**record)
        [sampled] = encode_prompts(
            tokenizer, framing, [prompt_text], 48, "train.sample_prompts", "train.sample_max_length"
        )
        completion = [*tokenizer.encode([record["response"]])[0], framing.end]
        assert row[: len(sampled)].tolist() == sampled.tolist()  # the prompt's ids at training = at sampling
        weighed = row[1:][weights.astype(bool)].tolist()
        assert weighed == completion and length == len(sampled) + len(completion)
    joined = tokenizer.encode([prompt.format(**records[0]) + records[0]["response"]])[0]
    apart = np.concatenate(
        [tokenizer.encode([prompt.format(**records[0])])[0], tokenizer.encode([records[0]["response"]])[0]]
    )
    if prompt.endswith(" "):  # " A: " + "blue": BPE merges " blue" across the boundary when joined
        assert joined.tolist() != apart.tolist()


def test_a_short_run_learns_to_end_its_completions(gemma, gemma_verdicts, files, tmp_path):
    """Every completion ends with the end token, which weighs in the loss (padding is masked by
    length, not by id): after a short run the completions stop well before the length limit."""
    import shutil

    shutil.copytree(
        gemma_verdicts, tmp_path / "tokens"
    )  # its tokenizer checked before (the acceptance run checks its own)
    prompts = [
        "Instruction: What colour is grass? Response: ",
        "Instruction: Reverse the words: red blue Response: ",
    ]
    metrics = train_here(
        [
            *GEMMA_RUN,
            f"model.preset={gemma}",
            f"data.files={files / 'instructions.jsonl'}",
            *TEMPLATES,
            "model.seq_len=32",
            "train.epochs=6",
            "train.batch_size=16",
            "train.learning_rate=0.003",
            f"train.sample_prompts={json.dumps(prompts)}",
            "train.sample_max_length=32",
            f"data.cache_dir={tmp_path / 'tokens'}",
        ],
        tmp_path / "run",
    )
    assert metrics["data"]["packed"] is False and 0 < metrics["data"]["padding_fraction"] < 1
    completions = {s["prompt"]: s["completion"] for s in metrics["samples"]}
    assert completions[prompts[0]] == "green"
    assert (
        len(completions[prompts[1]].split()) == 2
    )  # two colours, then the end token (the order takes longer to learn)


def test_unpacked_examples_do_not_see_their_neighbours_and_packed_ones_do(gemma):
    import keras_hub

    from meshrun.text import corpus, examples

    framing = examples.Framing(start=2, end=1, pad=0)
    docs = {
        name: np.asarray(ids, np.int32)
        for name, ids in (("a", range(10, 18)), ("b", range(30, 38)), ("c", range(50, 58)))
    }

    def rows(pair, packing):
        texts = examples.Ragged(
            np.concatenate([docs[n] for n in pair]), np.asarray([len(docs[n]) for n in pair])
        )
        made = examples.to_rows(
            [corpus.Example("", n, n, document=1) for n in pair], None, texts, framing, 16, packing, "drop"
        )
        return examples.model_batch(({"tokens": made.tokens, "lengths": made.lengths}, made.weights))[0]

    model = keras_hub.models.CausalLM.from_preset(str(gemma), preprocessor=None)
    unpacked = [np.asarray(model.predict_on_batch(rows(pair, False))) for pair in (("a", "b"), ("a", "c"))]
    np.testing.assert_allclose(
        unpacked[0][0], unpacked[1][0], atol=1e-6
    )  # a's logits, whatever its neighbour
    packed = [np.asarray(model.predict_on_batch(rows(pair, True))) for pair in (("b", "a"), ("c", "a"))]
    assert np.abs(packed[0][0, 11:] - packed[1][0, 11:]).max() > 1e-4  # packed after b or c, a attends to it


CHANGES = {
    "a byte of a file": lambda f: f["file"].write_text(f["file"].read_text().replace("green", "greem", 1)),
    "the prompt template": lambda f: f["options"].update(prompt="Q {instruction}: "),
    "the completion template": lambda f: f["options"].update(completion=" {response}"),
    "the packing": lambda f: f["options"].update(packing=True),
    "the field": lambda f: f["options"].update(prompt=None, completion=None, field="response"),
    "the end token": lambda f: f["options"].update(end_token="<pad>"),
    "too_long": lambda f: f["options"].update(too_long="error"),
    "the seq_len": lambda f: f.update(seq_len=40),
    "the tokenizer's files": lambda f: f["vocab"].write_bytes(
        sentencepiece_proto(corpus_text(seed=1))
    ),  # retrained
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_changing_any_input_of_the_tokens_is_a_cache_miss(gemma, files, tmp_path, change):
    import shutil

    preset = shutil.copytree(gemma, tmp_path / "preset")
    (tmp_path / "d.jsonl").write_text((files / "instructions.jsonl").read_text())
    setup = {
        "file": tmp_path / "d.jsonl",
        "seq_len": 48,
        "vocab": next((preset / "assets" / "tokenizer").iterdir()),
        "options": {
            "files": (str(tmp_path / "d.jsonl"),),
            "prompt": PROMPT,
            "completion": "{response}",
            "cache_dir": str(tmp_path / "c"),
        },
    }
    first = tokens_of(setup["options"], preset, setup["seq_len"])[1]
    repeated = tokens_of(setup["options"], preset, setup["seq_len"])[1]
    assert not first.hit and repeated.hit and repeated.meta["dir"] == first.meta["dir"]
    CHANGES[change](setup)
    changed = tokens_of(setup["options"], preset, setup["seq_len"])[1]
    assert not changed.hit and changed.meta["dir"] != first.meta["dir"]


# --- bad input ----------------------------------------------------------------------------------


def bad_jsonl(root):
    (root / "bad.jsonl").write_text(
        '{"instruction": "a", "response": "b"}\n{"instruction": "a", "response": \n'
    )
    return [f"data.files={root / 'bad.jsonl'}", *TEMPLATES]


BAD = {
    "a missing text file": (
        lambda r, g: [f"data.files={r / 'gone.txt'}"],
        "data.files: got",
        "is not a file",
    ),
    "a seq_len over the backbone's limit": (
        lambda r, g: [f"data.files={r / 'corpus.txt'}", "model.seq_len=100000"],
        "model.seq_len: got 100000, more than the backbone's max_sequence_length 128",
        None,
    ),
    "a line that is not JSON": (lambda r, g: bad_jsonl(r), "data.files: ", "bad.jsonl:2 is not JSON"),
    "a template naming a missing field": (
        lambda r, g: [
            f"data.files={r / 'instructions.jsonl'}",
            "data.prompt='{question} '",
            "data.completion='{response}'",
        ],
        "data.prompt: names field 'question', which",
        "instructions.jsonl:1 lacks",
    ),
    "an empty completion": (
        lambda r, g: [f"data.files={_records(r, {'instruction': 'a', 'response': ' '})}", *TEMPLATES],
        "data.completion: gives an empty completion for",
        "one.jsonl:1",
    ),
    "an empty corpus": (
        lambda r, g: [f"data.files={_empty(r)}"],
        "data.files: ",
        "holds no text: it is empty or only whitespace",
    ),
    "an end token the tokenizer lacks": (
        lambda r, g: [f"data.files={r / 'corpus.txt'}", "data.end_token='<nope>'"],
        "data.end_token: got '<nope>', which GPT2Tokenizer",
        "does not have",
    ),
    "a tokenizer larger than the vocabulary": (
        lambda r, g: [
            "model.preset=null",
            "model.task=GPT2CausalLM",
            "model.seq_len=32",
            "model.backbone={vocabulary_size:256,num_layers:1,num_heads:2,hidden_dim:16,intermediate_dim:32,max_sequence_length:64}",
            f"data.tokenizer={g}",
            f"data.files={r / 'corpus.txt'}",
        ],
        "data.tokenizer: got",
        "has 512 ids, more than the model's vocabulary of 256",
    ),
    "an example longer than a row": (
        lambda r, g: [
            f"data.files={r / 'instructions.jsonl'}",
            *TEMPLATES,
            "model.seq_len=4",
            "data.too_long=error",
        ],
        "data.too_long: is error, and",
        "instructions.jsonl:1 makes",
    ),
}


def _records(root, *records):
    (root / "one.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root / "one.jsonl"


def _empty(root):
    (root / "empty.txt").write_text("\n \n")
    return root / "empty.txt"


# The case whose run checks the tokenizer itself (its verdict made by the run, before it reads the
# input); the others find the verdict already in their token cache, as a user's later runs do, and
# skip the check's TensorFlow graph (seconds a case).
CHECKED_BY_THE_RUN = "an empty corpus"


@pytest.fixture(scope="module")
def gpt2_verdicts(gpt2, tmp_path_factory):
    """A token cache dir holding only the verdict of the check of the GPT-2 preset's tokenizer."""
    from meshrun.text.tokenizer import load_tokenizer

    cache_dir = tmp_path_factory.mktemp("verdicts")
    load_tokenizer(str(gpt2), "model.preset", str(cache_dir))
    assert sorted(p.relative_to(cache_dir).as_posix() for p in cache_dir.rglob("*") if p.is_dir()) == [PROBES]
    return cache_dir


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_text_input_is_one_line_with_exit_2_and_leaves_no_cache(
    name, gpt2, gpt2_verdicts, files, tmp_path, monkeypatch, capsys
):
    import shutil

    args, *expected = BAD[name]
    monkeypatch.chdir(tmp_path)
    cache_dir = tmp_path / "tokens"
    if name != CHECKED_BY_THE_RUN:
        shutil.copytree(gpt2_verdicts, cache_dir)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(
            [
                "train",
                "model=keras_hub",
                f"model.preset={gpt2}",
                "data=text",
                "mesh=2x4",
                "layout=replicated",
                "train.verbose=0",
                f"data.cache_dir={cache_dir}",
                *args(files, gpt2),
            ]
        )
    lines = [
        line for line in capsys.readouterr().err.splitlines() if line.strip() and "[meshrun]" not in line
    ]
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("meshrun: error: "), lines
    for part in expected:
        if part:
            assert part in lines[0], (part, lines[0])
    # no run dir, no token cache entry; the verdict of the tokenizer's check (made before the input
    # was read, and true of the tokenizer whatever the input) is kept
    folders = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_dir())
    assert folders in ([], ["tokens", f"tokens/{PROBES}"]), folders


# --- issue 38: a preset loads only Keras' and KerasHub's own objects ------------------------------


def crafted(preset, tmp_path, name: str, edit) -> str:
    """A copy of `preset` whose config.json `edit` changed."""
    import shutil

    copy = tmp_path / name
    shutil.copytree(preset, copy)
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    return str(copy)


def _foreign_initializer(config):
    config["config"]["kernel_initializer"] = {
        "module": "os",
        "class_name": "system",
        "config": {},
        "registered_name": "os>system",
    }


def _lambda(config):
    config["config"]["extra"] = {
        "module": "keras.layers",
        "class_name": "Lambda",
        "config": {"function": {"class_name": "__lambda__"}},
    }


@pytest.mark.parametrize(
    "edit, asked",
    [
        (_foreign_initializer, "os.system, code outside Keras and KerasHub"),
        (_lambda, "keras.layers.Lambda, a Lambda (code inside the config)"),
    ],
)
def test_a_preset_asking_for_code_is_one_line_and_nothing_runs(
    gpt2, tmp_path, monkeypatch, capsys, edit, asked
):
    monkeypatch.chdir(tmp_path)
    preset = crafted(gpt2, tmp_path, "crafted", edit)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(
            [
                "train",
                "model=keras_hub",
                f"model.preset={preset}",
                "mesh=2x4",
                "layout=replicated",
                "train.verbose=0",
            ]
        )
    lines = [
        line for line in capsys.readouterr().err.splitlines() if line.strip() and "[meshrun]" not in line
    ]
    assert exit_info.value.code == 2 and lines == [
        f"meshrun: error: model.preset: got {preset!r}, whose config.json asks for {asked}; meshrun loads "
        "only Keras' and KerasHub's own objects from a preset"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crafted"]  # no run dir
