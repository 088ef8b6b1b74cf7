"""Completions of prompts by KerasHub causal LMs: `train.sample_prompts` at the end of a run and
`meshrun generate RUN_DIR`, on a 2x4 mesh of 8 emulated CPU devices, with a tiny Gemma preset whose
SentencePiece tokenizer is trained on local text (tests/presets.py). A completion is greedy from the
ids a prompt is trained as ([start] + encode(prompt)), checked against a token-by-token argmax of
the model's logits; it stops at the end token, also where the end token is the pad; one prompt on a
batch axis of 2 completes; the CLI completes from a run's checkpoint, from an exported preset and
from a LoRA run's kept adapter, and only from what the run's metrics.json says it wrote; every
tokenizer family the tests build (Gemma's SentencePiece, GPT-2, Llama 3, Mistral's Tekken, a
tokenizer.json with no pad token) samples and generates the greedy tokens of the run's weights;
bad input is one line with exit 2."""

import json
import shutil
from io import StringIO

import numpy as np
import pytest

from conftest import error_line_here, layout_rules, one_error_line, read_metrics, run_meshrun, train_here
from meshrun import cli

pytestmark = pytest.mark.integration

PROMPT = "The cat"
PROMPTS = [
    PROMPT,
    "A",
    "Every morning the old farmer walks",
]  # three lengths: a batch of 4 rows on a batch axis of 2
MAX_LENGTH = 24
RUN = [
    "model=keras_hub",
    "mesh=2x4",
    "layout=gemma_tp",
    "model.seq_len=32",
    "train.epochs=1",
    "train.verbose=0",
    "data.num_samples=32",
    "data.eval_samples=16",
]
# LoRA at rank 4 with alpha / rank = 2 (folded into what a run exports or keeps), completing PROMPTS:
# `trained` and the fine-tunes without export train, evaluate and sample the same programs, so the
# fine-tunes find them compiled.
LORA_RUN = [
    *RUN,
    "model.lora.rank=4",
    "model.lora.alpha=8",
    f"train.sample_prompts={json.dumps(PROMPTS)}",
    f"train.sample_max_length={MAX_LENGTH}",
]


@pytest.fixture(scope="module")
def preset(text_files):
    """A tiny Gemma preset (4 query and 4 key/value heads: gemma_tp splits them over the model axis)."""
    return text_files.gemma


@pytest.fixture(scope="module")
def tokenizer(preset):
    from meshrun.text.tokenizer import load_tokenizer

    return load_tokenizer(str(preset), "model.preset")


@pytest.fixture(scope="module")
def trained(preset, tmp_path_factory):
    """A LoRA run of the preset on 2x4 (alpha / rank = 2) that checkpoints, exports and completes
    PROMPTS; its run dir and metrics."""
    run_dir = tmp_path_factory.mktemp("runs") / "trained"
    metrics = train_here(
        [
            *LORA_RUN,
            f"model.preset={preset}",
            "checkpoint.every_epoch=true",
            "checkpoint.export=true",
        ],
        run_dir,
    )
    return run_dir, metrics


@pytest.fixture(scope="module")
def by_hand(preset, tokenizer):
    """The preset's greedy continuation of each of PROMPTS (ids, up to MAX_LENGTH tokens in all,
    no stop) worked out a token at a time: the argmax of the model's logits after [start] +
    encode(prompt) and the tokens chosen so far, on one device (no distribution)."""
    import keras_hub

    model = keras_hub.models.CausalLM.from_preset(str(preset), preprocessor=None)
    return [
        greedy_by_hand(model, [tokenizer.start_id, *tokenizer.encode([prompt])[0].tolist()], MAX_LENGTH)
        for prompt in PROMPTS
    ]


def greedy_by_hand(model, prompt_ids: list[int], max_length: int, end: int | None = None) -> list[int]:
    """The greedy continuation of `prompt_ids` up to `max_length` tokens in all, or up to the end
    token (left out), a token at a time: the argmax of the model's logits at the last token so far,
    on one row of `max_length` tokens (causal: the padding after it changes nothing)."""
    ids = list(prompt_ids)
    while len(ids) < max_length:
        token_ids = np.zeros((1, max_length), "int32")
        token_ids[0, : len(ids)] = ids
        padding_mask = (np.arange(max_length) < len(ids))[None].astype("int32")
        logits = model.predict_on_batch({"token_ids": token_ids, "padding_mask": padding_mask})
        token = int(np.argmax(logits[0, len(ids) - 1]))
        if token == end:
            break
        ids.append(token)
    return ids[len(prompt_ids) :]


def up_to(ids: list[int], end: int) -> list[int]:
    return ids[: ids.index(end)] if end in ids else ids


def test_prompts_are_encoded_as_training_encodes_them(tokenizer):
    from meshrun.text.complete import encode_prompts, prompt_batch
    from meshrun.text.examples import Framing

    framing = Framing(start=tokenizer.start_id, end=tokenizer.end_id, pad=tokenizer.pad_id)
    encoded = encode_prompts(tokenizer, framing, PROMPTS, MAX_LENGTH, "key", "length_key")
    for prompt, ids in zip(PROMPTS, encoded, strict=True):
        assert ids.tolist() == [tokenizer.start_id, *tokenizer.encode([prompt])[0].tolist()]
    batch = prompt_batch(
        encoded[:1], MAX_LENGTH, multiple=2, pad=tokenizer.pad_id
    )  # one prompt, batch axis of 2
    assert (
        batch["token_ids"].shape == (2, MAX_LENGTH)
        and batch["padding_mask"].sum(axis=1).tolist() == [len(encoded[0])] * 2
    )
    assert batch["token_ids"][0, len(encoded[0]) :].tolist() == [tokenizer.pad_id] * (
        MAX_LENGTH - len(encoded[0])
    )


def test_completions_on_a_2x4_mesh_are_greedy_and_stop_at_the_end_token(preset, tokenizer, by_hand):
    """The preset under gemma_tp on 2x4: each prompt's completion (a batch of 3 padded to 4, and one
    prompt alone, padded to 2) is the greedy continuation worked out by hand; with an end token,
    the completion stops before its first occurrence, also when the end token is the pad id (as
    GPT-2's and a tokenizer.json's with no pad token are: KerasHub's generate would take the
    padding for tokens already generated, and return '')."""
    import jax
    import keras
    import keras_hub

    from meshrun.config.layout_schema import LayoutRule, MeshConfig
    from meshrun.placement import distribution as distribution_lib
    from meshrun.text.complete import complete
    from meshrun.text.examples import Framing

    mesh = MeshConfig(shape=(2, 4), axis_names=("data", "model"), batch_axis="data")
    rules = tuple(LayoutRule(pattern, tuple(axes)) for pattern, axes in layout_rules("gemma_tp").items())
    keras.distribution.set_distribution(distribution_lib.make_distribution(mesh, rules, jax.devices()))
    try:
        model = keras_hub.models.CausalLM.from_preset(str(preset), preprocessor=None, compile=False)
        assert model.get_layer("token_embedding").embeddings.value.sharding.spec[0] == "model"
        endless = Framing(start=tokenizer.start_id, end=None, pad=tokenizer.pad_id)
        completions = complete(model, tokenizer, endless, PROMPTS, MAX_LENGTH, 2, "key", "length_key")
        assert completions == [tokenizer.decode(ids) for ids in by_hand]
        # a token the model does generate, after another: the first change in a continuation
        which, at = next(
            (i, j) for i, ids in enumerate(by_hand) for j in range(1, len(ids)) if ids[j] != ids[0]
        )
        end, prompt = by_hand[which][at], PROMPTS[which]
        stopping = Framing(start=tokenizer.start_id, end=end, pad=tokenizer.pad_id)
        (alone,) = complete(model, tokenizer, stopping, [prompt], MAX_LENGTH, 2, "key", "length_key")
        assert alone == tokenizer.decode(up_to(by_hand[which], end)) and len(up_to(by_hand[which], end)) >= 1
        padded_with_the_end = Framing(start=tokenizer.start_id, end=end, pad=end)
        (same,) = complete(
            model, tokenizer, padded_with_the_end, [prompt], MAX_LENGTH, 2, "key", "length_key"
        )
        assert same == alone
    finally:
        distribution_lib.reset()


def test_a_run_completes_its_prompts_after_training(trained):
    """Three prompts, on a batch axis of 2: recorded in metrics.json and shown in the run's summary."""
    from rich.console import Console

    from meshrun.report.render import summary_table
    from meshrun.specs.metrics import RunMetrics

    _, metrics = trained
    assert [sample["prompt"] for sample in metrics["samples"]] == PROMPTS
    console = Console(file=StringIO(), width=200)
    console.print(summary_table(RunMetrics.from_json(metrics)))
    for sample in metrics["samples"]:
        assert (
            isinstance(sample["completion"], str)
            and f"{sample['prompt']!r} -> {sample['completion']!r}" in console.file.getvalue()
        )


def test_meshrun_generate_completes_from_the_runs_export(trained, capsys):
    """The run's exported preset (LoRA merged into the kernels) gives the completions the run
    recorded at the end of training, a line each (all of PROMPTS: the program the gemma family's
    case below runs on the same export, compiled once)."""
    run_dir, metrics = trained
    assert (run_dir / "preset" / "config.json").is_file()
    capsys.readouterr()
    cli.main(
        [
            "generate",
            str(run_dir),
            *[f"--prompt={prompt}" for prompt in PROMPTS],
            "--max-length",
            str(MAX_LENGTH),
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"{PROMPT!r} -> {metrics['samples'][0]['completion']!r}"
    assert lines == [f"{sample['prompt']!r} -> {sample['completion']!r}" for sample in metrics["samples"]]


def test_meshrun_generate_completes_from_the_runs_checkpoint(trained, tmp_path):
    """A copy of the run dir without its exports (elsewhere: the paths its metrics.json records are
    read inside the copy): the command, in a process of its own, reads the checkpoint at the end of
    training (its LoRA adapters apart) and gives the recorded completion."""
    run_dir, metrics = trained
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("preset", "adapter.lora.h5"))
    done = run_meshrun(
        ["generate", str(copy), "--prompt", PROMPT, "--max-length", str(MAX_LENGTH), "--json"], tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == metrics["samples"][:1]
    assert not done.stderr.strip()  # no library chatter


@pytest.mark.e2e
def test_a_gemma_run_that_exports_prints_nothing_on_stderr(preset, tmp_path):
    """A Gemma run in a process of its own that loads no tokenizer before its export: the
    SentencePiece inside TensorFlow Text prints a LOG(INFO) line on loading Gemma's tokenizer to
    export it, which the run leaves out (and every other line it would print on stderr)."""
    done = run_meshrun(
        [
            "train",
            "model=keras_hub",
            f"model.preset={preset}",
            "mesh=2x1",
            "layout=replicated",
            "model.seq_len=16",
            "train.epochs=1",
            "train.verbose=0",
            "train.batch_size=8",
            "data.num_samples=8",
            "data.eval_samples=8",
            "checkpoint.export=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
    )
    assert done.returncode == 0 and (tmp_path / "run" / "preset" / "tokenizer.json").is_file(), done.stderr[
        -2000:
    ]
    assert done.stderr == ""


def test_meshrun_generate_loads_only_what_the_runs_metrics_json_says_it_wrote(trained, tmp_path, capsys):
    """A stale preset/ and adapter in the dir of a run whose metrics.json says it exported nothing
    (what a fine-tune without export left in a dir an earlier run had exported into): the command
    reads the checkpoint the run saved and gives its recorded completion, never the stale files."""
    run_dir, metrics = trained
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "preset" / "config.json").write_text('{"stale": "an earlier run\'s preset"}')
    (copy / "adapter.lora.h5").write_bytes(b"an earlier run's adapter")
    unexported = {
        **metrics,
        "checkpoint": {
            **metrics["checkpoint"],
            "exported": None,
            "exported_preset": None,
            "exported_adapter": None,
        },
    }
    (copy / "metrics.json").write_text(json.dumps(unexported))
    cli.main(["generate", str(copy), "--prompt", PROMPT, "--max-length", str(MAX_LENGTH), "--json"])
    assert json.loads(capsys.readouterr().out) == metrics["samples"][:1]


def fine_tune(preset, run_dir, *args: str) -> tuple:
    """A LoRA run of the preset on 2x4 without export or checkpoints (alpha / rank = 2), completing
    PROMPTS: its run dir and metrics."""
    cli.main(["train", *LORA_RUN, f"model.preset={preset}", *args, f"hydra.run.dir={run_dir}"])
    return run_dir, read_metrics(run_dir)


DRAWN = ["train.sample_temperature=3", "train.sample_top_k=100", "train.sample_seed=11"]
DRAWN_FLAGS = ["--temperature", "3", "--top-k", "100", "--seed", "11"]


def test_a_lora_fine_tune_without_export_keeps_its_adapter_and_generate_samples_it(preset, tmp_path, capsys):
    """The adapter file is the run's one weights file (recorded in metrics.json); `meshrun generate`
    puts it on the base preset (alpha / rank folded in) and, drawing with the settings and seed the
    run's samples were drawn with (a high temperature: the tiny model's tokens vary), gives the
    completions the run recorded, and those settings."""
    run_dir, metrics = fine_tune(preset, tmp_path / "run", *DRAWN)
    assert metrics["status"] == "ok" and metrics["checkpoint"]["exported_adapter"] == str(
        run_dir / "adapter.lora.h5"
    )
    assert metrics["checkpoint"]["exported"] is None and metrics["checkpoint"]["exported_preset"] is None
    assert sorted(p.name for p in run_dir.iterdir() if p.suffix in (".h5", ".keras") or p.is_dir()) == [
        ".hydra",
        "adapter.lora.h5",
    ]
    drawn = {"sampler": "top_k", "temperature": 3.0, "top_k": 100, "top_p": None, "seed": 11}
    assert [sample["sampling"] for sample in metrics["samples"]] == [drawn] * len(PROMPTS)
    capsys.readouterr()
    cli.main(
        [
            "generate",
            str(run_dir),
            *[f"--prompt={prompt}" for prompt in PROMPTS],
            "--max-length",
            str(MAX_LENGTH),
            *DRAWN_FLAGS,
            "--json",
        ]
    )
    assert json.loads(capsys.readouterr().out) == metrics["samples"]
    _keras_hub_format_adapter(run_dir / "adapter.lora.h5")
    line = error_line_here(["generate", str(run_dir), "--prompt", PROMPTS[0]], capsys)
    assert line == (
        "meshrun: error: RUN_DIR: adapter.lora.h5 is not an adapter file meshrun writes (format None, valid: "
        "'meshrun-lora'; the KerasHub save_lora_weights files that runs kept before meshrun's LoRA took "
        "PEFT's rank are not): train the fine-tune again"
    )


def _keras_hub_format_adapter(path) -> None:
    """Makes a kept adapter file look like one an earlier meshrun kept (KerasHub's
    save_lora_weights): no format, rank or alpha attributes."""
    import h5py

    with h5py.File(path, "a") as file:
        for key in list(file.attrs):
            del file.attrs[key]


def test_generate_with_the_same_seed_gives_the_same_text_in_another_process(trained, tmp_path, capsys):
    """Drawn at a high temperature from the run's export: the same seed gives the same completions
    in this process and in a process of its own, another seed other text (on some prompt)."""
    run_dir, _ = trained
    generate = [
        "generate",
        str(run_dir),
        *[f"--prompt={prompt}" for prompt in PROMPTS],
        "--max-length",
        str(MAX_LENGTH),
        "--json",
    ]
    capsys.readouterr()
    cli.main([*generate, *DRAWN_FLAGS])
    here = json.loads(capsys.readouterr().out)
    cli.main([*generate, *DRAWN_FLAGS[:-1], "12"])
    other_seed = json.loads(capsys.readouterr().out)
    done = run_meshrun([*generate, *DRAWN_FLAGS], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == here
    assert [sample["completion"] for sample in other_seed] != [sample["completion"] for sample in here]
    assert here[0]["sampling"]["seed"] == 11 and other_seed[0]["sampling"]["seed"] == 12


def test_a_lora_fine_tune_told_not_to_keep_its_adapter_leaves_no_weights(preset, tmp_path, capsys):
    run_dir, metrics = fine_tune(preset, tmp_path / "run", "checkpoint.keep_adapter=false")
    assert metrics["status"] == "ok" and metrics["checkpoint"]["exported_adapter"] is None
    assert not (run_dir / "adapter.lora.h5").exists()
    assert f"RUN_DIR: '{run_dir}' has no saved weights" in error_line_here(
        ["generate", str(run_dir), "--prompt", PROMPT], capsys
    )


def test_bad_generate_input_is_one_line_with_exit_2(trained, tmp_path, capsys):
    run_dir, _ = trained
    run = str(run_dir)
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run_dir / ".hydra", unfinished / ".hydra")
    no_weights = tmp_path / "no-weights"
    shutil.copytree(
        run_dir, no_weights, ignore=shutil.ignore_patterns("preset", "adapter.lora.h5", "checkpoints")
    )
    other_model = tmp_path / "dense"
    (other_model / ".hydra").mkdir(parents=True)
    (other_model / ".hydra" / "config.yaml").write_text("model:\n  name: dense_model\n")
    cases = {
        ("generate", "--prompt", "x"): "RUN_DIR: is required",
        ("generate", run): "--prompt: is required",
        ("generate", run, "--prompt", "x", "--max-length", "one"): "--max-length: got 'one'",
        ("generate", run, "--prompt", "x", "--top-k", "0"): "--top-k: got 0; expected a whole number",
        (
            "generate",
            run,
            "--prompt",
            "x",
            "--top-k",
            "600",
        ): "--top-k: got 600, more than the model's vocabulary",
        ("generate", run, "--prompt", "x", "--beam", "1"): "--beam: not a flag of meshrun generate",
        ("generate", run, "--prompt", "--json"): "--prompt: got nothing; give TEXT after it",
        ("generate", str(tmp_path / "nowhere"), "--prompt", "x"): "which is not a directory",
        ("generate", str(tmp_path), "--prompt", "x"): "holds no .hydra/config.yaml",
        ("generate", str(other_model), "--prompt", "x"): "a run of model=dense_model",
        (
            "generate",
            str(unfinished),
            "--prompt",
            "x",
        ): f"RUN_DIR: got '{unfinished}', which holds no metrics.json: its run did not finish",
        (
            "generate",
            str(no_weights),
            "--prompt",
            "x",
        ): f"RUN_DIR: '{no_weights}' has no saved weights (its metrics.json names none",
        (
            "generate",
            run,
            "--prompt",
            PROMPTS[2],
            "--max-length",
            "4",
        ): "which leaves no room to complete it within --max-length=4",
    }
    for args, expected in cases.items():
        assert expected in error_line_here(list(args), capsys), args
    done = run_meshrun(
        ["generate", str(tmp_path / "nowhere"), "--prompt", "x"], tmp_path
    )  # the program itself
    assert "RUN_DIR: got" in one_error_line(done)
    cli.main(["generate", "--help"])
    assert capsys.readouterr().out.startswith("usage: meshrun generate RUN_DIR --prompt TEXT")


PRESET_RUN = ["model=keras_hub", "model.preset=PRESET", "mesh=2x4", "layout=gemma_tp", "model.seq_len=32"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["model=dense_model", "mesh=2x4"], "train.sample_prompts: got 1 prompt with model=dense_model"),
        (
            [
                "model=keras_hub",
                "model.task=GemmaCausalLM",
                "mesh=2x4",
                "model.seq_len=16",
                "model.backbone={vocabulary_size:512,num_layers:1,num_query_heads:4,num_key_value_heads:4,hidden_dim:32,intermediate_dim:64,head_dim:8}",
            ],
            "train.sample_prompts: needs a tokenizer: model.preset or data.tokenizer",
        ),
        (
            [*PRESET_RUN, "train.sample_max_length=3"],
            "which leaves no room to complete it within train.sample_max_length=3",
        ),
        ([*PRESET_RUN, "train.sample_max_length=1"], "train.sample_max_length: got 1"),
        (
            [*PRESET_RUN, "train.sample_top_k=100000"],
            "train.sample_top_k: got 100000, more than the model's vocabulary of",
        ),
    ],
)
def test_bad_sample_prompts_are_one_line_before_training(args, expected, preset, in_tmp, capsys):
    args = [arg.replace("PRESET", str(preset)) for arg in args]
    line = error_line_here(
        ["train", *args, f"train.sample_prompts=['{PROMPTS[2]}']", "train.verbose=0"], capsys
    )
    assert expected in line
    assert not list(in_tmp.rglob("metrics.json"))  # rejected before anything ran


# --- every tokenizer family: the samples and meshrun generate give the greedy tokens ---------------

FAMILY_RUN = [
    "model=keras_hub",
    "mesh=2x1",
    "layout=replicated",
    "model.seq_len=16",
    "train.epochs=1",
    "train.verbose=0",
    "train.batch_size=8",
    "checkpoint.export=true",
    f"train.sample_prompts={json.dumps(PROMPTS)}",
    f"train.sample_max_length={MAX_LENGTH}",
]
SYNTHETIC = ["data.num_samples=8", "data.eval_samples=8"]
# A Llama built from model.backbone, trained with data=text on a tokenizer.json alone: the tokenizer
# has no pad token, so the run pads with its end token (the tiny Llama).
HF_LLAMA = [
    "model.task=LlamaCausalLM",
    "data=text",
    "model.backbone={vocabulary_size:512,num_layers:2,num_query_heads:4,num_key_value_heads:2,hidden_dim:64,intermediate_dim:128}",
]
FAMILIES = ("gemma", "gpt2", "llama3", "tekken", "hf_tokenizer_json")


@pytest.fixture(scope="module")
def families(text_files, tmp_path_factory) -> dict:
    """The arguments of a run of each tokenizer family the tests build (tests/presets.py) but
    Gemma's, whose run is `trained`."""
    from presets import hf_tokenizer_json, llama3_preset, mistral_tekken_preset

    root = tmp_path_factory.mktemp("families")
    text = text_files.corpus.read_text()
    few_rows = root / "few_rows.txt"  # 2 KB of it: a few steps' rows of 17 tokens
    few_rows.write_text(text[:2000])
    return {
        "gpt2": [*SYNTHETIC, f"model.preset={text_files.gpt2}"],
        "llama3": [*SYNTHETIC, f"model.preset={llama3_preset(root / 'llama3', text)}"],
        "tekken": [*SYNTHETIC, f"model.preset={mistral_tekken_preset(root / 'tekken', text)}"],
        "hf_tokenizer_json": [
            *HF_LLAMA,
            f"data.tokenizer={hf_tokenizer_json(root / 'hf', text)}",
            f"data.files=[{few_rows}]",
        ],
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_every_tokenizer_family_samples_and_generates_the_greedy_tokens(
    family, families, trained, tmp_path, capsys
):
    """A run of each family completes PROMPTS at the end of training, and meshrun generate does from
    the run's export, with the tokens a greedy argmax of the exported weights gives, up to the end
    token: never '' where the tokenizer's pad is its end token (the tokenizer.json)."""
    import keras_hub

    from meshrun.config.parse import parse_run_config
    from meshrun.run.sampling import load_run_tokenizer
    from meshrun.text.complete import GREEDY

    run_dir = trained[0] if family == "gemma" else tmp_path / "run"
    if family != "gemma":
        cli.main(["train", *FAMILY_RUN, *families[family], f"hydra.run.dir={run_dir}"])
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "ok", metrics["error"]
    capsys.readouterr()
    cli.main(
        [
            "generate",
            str(run_dir),
            *[f"--prompt={prompt}" for prompt in PROMPTS],
            "--max-length",
            str(MAX_LENGTH),
            "--json",
        ]
    )
    out = capsys.readouterr().out
    generated = json.loads(out[out.index("[\n") :])  # after the log lines of this process's runs

    tokenizer, framing = load_run_tokenizer(parse_run_config(saved_config(run_dir)), "key")
    model = keras_hub.models.CausalLM.from_preset(str(run_dir / "preset"), preprocessor=None)
    expected = []
    for prompt in PROMPTS:
        ids = greedy_by_hand(
            model,
            [
                *([framing.start] if framing.start is not None else []),
                *tokenizer.encode([prompt])[0].tolist(),
            ],
            MAX_LENGTH,
            framing.end,
        )
        assert ids, prompt  # the weights generate tokens before the end token
        expected.append({"prompt": prompt, "completion": tokenizer.decode(ids), "sampling": GREEDY.record()})
    assert metrics["samples"] == expected
    assert generated == expected


def saved_config(run_dir) -> dict:
    """The config a run saved (.hydra/config.yaml), as a dict."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)
