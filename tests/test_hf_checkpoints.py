"""Hugging Face transformers checkpoints in (meshrun.hf): each family's tiny checkpoint under
tests/data/hf/ (made with transformers itself by scripts/make_hf_reference.py, with transformers'
logits on fixed ids and its tokenization of a fixed text) loaded through meshrun's run path on a
2x4 mesh of 8 emulated devices gives transformers' logits, its tokenizer gives transformers' ids,
every weight lands on its shards alone, and each broken checkpoint is one line with exit status 2
before anything loads."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import HF_DATA as DATA
from conftest import built_on_2x4, error_line_here, fresh_session_reset, train_here

pytestmark = pytest.mark.integration

CASES = sorted(p.name for p in DATA.iterdir() if p.is_dir())
# The family layout where the checkpoint's sizes divide by the model axis, else layout=auto (the
# byte-level vocabularies of the Llama 3 and Qwen cases, 403-405 tokens, do not divide by 4).
LAYOUTS = {
    "gemma": "gemma_tp",
    "gemma2": "gemma_tp",
    "gemma3": "gemma_tp",
    "gemma2_scaled": "gemma_tp",
    "gemma3_scaled": "gemma_tp",
    "llama2": "llama_tp",
    "mistral": "llama_tp",
}
FLOAT32_BOUND = 1e-4
LENGTH = 16  # of the reference ids' rows
# bfloat16 keeps 8 significant bits: one unit in the last place (ulp) of a logit of 2 to 4 is 2**-6,
# of one of 8 to 16 2**-4. Two bfloat16 computations (meshrun's, transformers') round differently and
# end up a few such units apart at the size of the largest logit: measured 0.029 for the reference
# logits, which reach 2.24 (1.9 units of 2**-6); a bound in units scales to larger logits. What makes
# the comparison meaningful: meshrun's bfloat16 logits are as close to the float32 ones as
# transformers' own bfloat16 logits are (measured 0.0217 and 0.0228).
BFLOAT16_ULPS = 3
BFLOAT16_AS_CLOSE = 1.25  # meshrun's distance to float32 over transformers' own, at most


def bfloat16_ulp(logits: np.ndarray) -> float:
    """One unit in bfloat16's last place at the size of the largest of `logits`."""
    return 2.0 ** (np.floor(np.log2(np.abs(logits).max())) - 7)


def reference(case: str) -> tuple[dict, dict]:
    return dict(np.load(DATA / f"{case}.reference.npz")), json.loads(
        (DATA / f"{case}.reference.json").read_text()
    )


def logits_of(model, token_ids) -> np.ndarray:
    out = model({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)})
    return np.asarray(out, dtype=np.float32)


@pytest.mark.parametrize("case", [c for c in CASES if c != "llama3_bf16_sharded"])
def test_each_family_gives_transformers_logits_on_2x4(case, tmp_path, fresh_session):
    arrays, _ = reference(case)
    model, peaks = built_on_2x4(DATA / case, LAYOUTS.get(case, "auto"), tmp_path)
    assert model.backbone.weights[0].dtype == "float32"
    got = logits_of(model, arrays["token_ids"])
    assert np.abs(got - arrays["logits"]).max() < FLOAT32_BOUND
    planned = max(
        sum(
            shard.data.nbytes
            for v in model.weights
            for shard in v.value.addressable_shards
            if shard.device == d
        )
        for d in {shard.device for v in model.weights for shard in v.value.addressable_shards}
    )
    assert peaks.bytes_per_device <= 1.3 * planned, (peaks, planned)


def test_a_gemma_preset_saved_with_the_hidden_over_heads_scale_keeps_it(tmp_path, fresh_session):
    """A KerasHub preset saved from a Gemma 3 checkpoint whose query_pre_attn_scalar is hidden /
    heads (as meshrun's export writes one) builds back with that scale: transformers' logits."""
    arrays, _ = reference("gemma3_scaled")
    model, _ = built_on_2x4(DATA / "gemma3_scaled", "gemma_tp", tmp_path / "hf")
    model.save_to_preset(str(tmp_path / "preset"))
    config = json.loads((tmp_path / "preset" / "config.json").read_text())
    assert config["config"]["query_head_dim_normalize"] is False
    fresh_session_reset()
    reloaded, _ = built_on_2x4(tmp_path / "preset", "gemma_tp", tmp_path / "preset_run")
    assert np.abs(logits_of(reloaded, arrays["token_ids"]) - arrays["logits"]).max() < FLOAT32_BOUND


PROMPT_LENGTH = 6  # the prompts of the greedy generations: the first 6 reference ids of each row
# One case of each model_type, the last in name order (gemma2_scaled and gemma3_scaled, whose
# reference data has transformers' greedy ids, over gemma2 and gemma3): generation compiles a program
# of its own per case.
GENERATE_CASES = sorted(
    {json.loads((DATA / f"{case}.reference.json").read_text())["model_type"]: case for case in CASES}.values()
)


def greedy_by_hand(model, prompts: np.ndarray, length: int) -> np.ndarray:
    """The greedy continuation of each row of `prompts` up to `length` tokens in all, a token at a
    time: the argmax of the whole sequence's logits (no cache) at the last token so far."""
    ids = prompts
    while ids.shape[1] < length:
        padded = np.pad(ids, ((0, 0), (0, length - ids.shape[1])))
        logits = logits_of(model, padded)
        ids = np.concatenate([ids, logits[:, ids.shape[1] - 1].argmax(-1)[:, None].astype(ids.dtype)], 1)
    return ids


@pytest.mark.parametrize("case", GENERATE_CASES)
def test_each_family_generates_greedily_on_2x4(case, tmp_path, fresh_session):
    """What `meshrun generate` and train.sample_prompts run (KerasHub's generate with its cache,
    through meshrun.text.complete) gives the greedy tokens of the model's logits, Gemma 3's
    included; for the Gemma 2 and 3 cases whose sliding window is shorter than the sequence, the
    ids of transformers' own greedy `generate`."""
    from meshrun.text.complete import GREEDY, prompt_batch, use_sampler

    arrays, _ = reference(case)
    model, _ = built_on_2x4(DATA / case, LAYOUTS.get(case, "auto"), tmp_path)
    prompts = arrays["token_ids"][:, :PROMPT_LENGTH]
    use_sampler(model, GREEDY)
    batch = prompt_batch(list(prompts), LENGTH, 2, pad=0)
    generated = np.asarray(model.generate(batch, stop_token_ids=None)["token_ids"])
    assert generated.tolist() == greedy_by_hand(model, prompts, LENGTH).tolist()
    if "greedy_ids" in arrays:
        assert generated.tolist() == arrays["greedy_ids"].tolist()


def test_a_bfloat16_checkpoint_in_two_shards_loads_as_bfloat16_or_as_asked(tmp_path, fresh_session):
    arrays, _ = reference("llama3_bf16_sharded")
    model, _ = built_on_2x4(DATA / "llama3_bf16_sharded", "auto", tmp_path)
    assert {w.dtype for w in model.weights} == {"bfloat16"}
    got = logits_of(model, arrays["token_ids"])
    assert np.abs(got - arrays["logits"]).max() < BFLOAT16_ULPS * bfloat16_ulp(arrays["logits"])
    transformers_off = np.abs(arrays["logits"] - arrays["logits_float32"]).max()
    assert np.abs(got - arrays["logits_float32"]).max() <= BFLOAT16_AS_CLOSE * transformers_off
    fresh_session_reset()
    upcast, _ = built_on_2x4(DATA / "llama3_bf16_sharded", "auto", tmp_path / "f32", dtype="float32")
    assert {w.dtype for w in upcast.weights} == {"float32"}
    assert np.abs(logits_of(upcast, arrays["token_ids"]) - arrays["logits_float32"]).max() < FLOAT32_BOUND


@pytest.mark.parametrize("case", ["llama2", "llama3"])
def test_from_model_places_a_transformers_checkpoint_by_kerashubs_map(case, tmp_path, fresh_session):
    # llama3's 405 tokens: the model axis (4) does not divide them, so the map's embedding rule keeps
    # them whole and splits the hidden dimension over data
    arrays, _ = reference(case)
    model, _ = built_on_2x4(DATA / case, "from_model", tmp_path)
    spec = {w.path: tuple(w.value.sharding.spec) for w in model.weights}
    assert spec["transformer_layer_0/feedforward_gate_dense/kernel"] == ("data", "model")
    assert spec["token_embedding/embeddings"] == (("model", "data") if case == "llama2" else (None, "data"))
    assert np.abs(logits_of(model, arrays["token_ids"]) - arrays["logits"]).max() < FLOAT32_BOUND


@pytest.mark.parametrize("case", CASES)
def test_the_tokenizer_gives_transformers_ids(case):
    from meshrun.text.tokenizer import load_tokenizer

    _, expected = reference(case)
    tokenizer = load_tokenizer(str(DATA / case), "model.preset")
    assert tokenizer.encode([expected["text"]])[0].tolist() == expected["ids"]
    with_special = expected["ids_with_special"]
    adds_start = with_special[0] != expected["ids"][0]
    assert tokenizer.start_id == (with_special[0] if adds_start else None)
    assert tokenizer.end_id == tokenizer.token_id(expected["eos_token"])


def test_a_lora_fine_tune_of_a_transformers_checkpoint_runs_from_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    metrics = train_here(
        [
            "model=keras_hub",
            f"model.preset={DATA / 'llama2'}",
            "model.lora.rank=4",
            "model.seq_len=32",
            "mesh=2x4",
            "layout=llama_tp",
            "data=text",
            f"data.files={DATA / 'corpus.txt'}",
            "train.batch_size=8",
            "train.epochs=1",
            "train.verbose=0",
        ],
        run_dir,
    )
    assert "(transformers, float32, 1 file)" in metrics["model"]["label"]
    assert metrics["model"]["trainable_params"] < metrics["model"]["params"] / 5
    assert np.isfinite(metrics["history"]["loss"][-1])


def test_a_gemma3_run_samples_its_prompts_and_meshrun_generate_answers_them(tmp_path, capsys):
    """A LoRA run of a Gemma 3 checkpoint completes train.sample_prompts after training (no
    error.log) and `meshrun generate` on its dir, with the base and the adapter it kept, gives the
    same greedy completions."""
    from meshrun import cli

    run_dir, prompts = tmp_path / "run", ["data", "Hello world"]
    metrics = train_here(
        [
            "model=keras_hub",
            f"model.preset={DATA / 'gemma3_scaled'}",
            "model.lora.rank=4",
            "model.seq_len=16",
            "mesh=2x4",
            "layout=gemma_tp",
            "data.num_samples=16",
            "data.eval_samples=8",
            "train.batch_size=8",
            "train.epochs=1",
            "train.verbose=0",
            f"train.sample_prompts={json.dumps(prompts)}",
            "train.sample_max_length=12",
        ],
        run_dir,
    )
    assert not (run_dir / "error.log").exists()
    assert [sample["prompt"] for sample in metrics["samples"]] == prompts
    capsys.readouterr()
    cli.main(["generate", str(run_dir), *[f"--prompt={p}" for p in prompts], "--max-length", "12", "--json"])
    out = capsys.readouterr().out
    assert json.loads(out[out.index("[\n") :]) == metrics["samples"]


def broken(tmp_path, case: str, change) -> Path:
    """A copy of `case` with `change(dir)` applied."""
    copy = tmp_path / case
    shutil.copytree(DATA / case, copy)
    change(copy)
    return copy


def edit_config(**values):
    def change(directory: Path):
        config = json.loads((directory / "config.json").read_text())
        config.update(values)
        (directory / "config.json").write_text(json.dumps(config))

    return change


def drop_a_token(directory: Path):
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"].popitem()
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))


BROKEN = {
    "no weights": ("llama2", lambda d: (d / "model.safetensors").unlink(), "config.json but no weights"),
    "a missing shard": (
        "llama3_bf16_sharded",
        lambda d: (d / "model-00002-of-00002.safetensors").unlink(),
        "model.safetensors.index.json names 'model-00002-of-00002.safetensors', which is not in the dir",
    ),
    "shapes that disagree with config.json": (
        "llama2",
        edit_config(intermediate_size=96),
        "has shape [64, 32], but config.json implies [96, 32]",
    ),
    "a model_type without a converter": (
        "llama2",
        edit_config(model_type="gpt_neox"),
        "model_type 'gpt_neox', which meshrun has no converter for; valid: llama, mistral",
    ),
    "biases the backbone lacks": (
        "llama2",
        edit_config(attention_bias=True),
        "config.json has attention_bias=True, which the KerasHub backbone cannot hold: it has no such biases "
        "(valid: false)",
    ),
    "an unknown RoPE type": (
        "llama2",
        edit_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
        "rope_scaling.rope_type='yarn', which meshrun cannot map",
    ),
    "head_dim Llama cannot express": ("llama2", edit_config(head_dim=16), "head_dim=16"),
    "a Gemma attention scale neither head_dim nor hidden / heads": (
        "gemma2",
        edit_config(query_pre_attn_scalar=12),
        "query_pre_attn_scalar=12, which KerasHub's Gemma cannot express (valid: 16, head_dim, or 8, "
        "hidden_size / num_attention_heads)",
    ),
    "a Gemma attention scale other than head_dim = hidden / heads": (
        "gemma3",
        edit_config(num_attention_heads=2, num_key_value_heads=2, query_pre_attn_scalar=12),
        "query_pre_attn_scalar=12, which KerasHub's Gemma cannot express (valid: 16, head_dim and "
        "hidden_size / num_attention_heads alike)",
    ),
    "tokenizer files that disagree": (
        "llama2",
        drop_a_token,
        "tokenizer.json has 479 tokens and tokenizer.model 480",
    ),
}


def test_a_task_other_than_the_checkpoints_is_one_line(in_tmp, capsys):
    args = ["train", "model=keras_hub", f"model.preset={DATA / 'gemma'}", "model.task=LlamaCausalLM"]
    assert error_line_here(args, capsys).endswith(
        "model.task: got 'LlamaCausalLM', but model.preset is a gemma checkpoint, which builds "
        "GemmaCausalLM; valid: GemmaCausalLM, or null"
    )


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_checkpoint_is_one_line_with_exit_2_and_nothing_written(
    name, tmp_path_factory, in_tmp, capsys
):
    case, change, expected = BROKEN[name]
    preset = broken(tmp_path_factory.mktemp("broken"), case, change)
    line = error_line_here(["train", "model=keras_hub", f"model.preset={preset}", "mesh=2x4"], capsys)
    assert line.startswith("meshrun: error: model.preset: got ") and expected in line, line
    assert list(in_tmp.iterdir()) == []


def test_model_dtype_sets_a_kerashub_backbones_dtype_too(tmp_path, fresh_session):
    from meshrun.config.parse import parse_run_config
    from meshrun.models.hub.build import build

    raw = {
        "model": {
            "name": "keras_hub",
            "task": "LlamaCausalLM",
            "backbone": {
                "vocabulary_size": 64,
                "num_layers": 1,
                "num_query_heads": 2,
                "num_key_value_heads": 1,
                "hidden_dim": 16,
                "intermediate_dim": 32,
            },
            "seq_len": 8,
            "dtype": "bfloat16",
        },
        "data": {"name": "synthetic", "num_samples": 16, "eval_samples": 16},
        "mesh": {"shape": "8"},
    }
    task = build(parse_run_config(raw).model.options)
    assert {w.dtype for w in task.weights} == {"bfloat16"}


HUB_ID_LINE = (
    "meshrun: error: model.preset: got {got!r}, a Hugging Face Hub id and no local dir; meshrun downloads "
    "nothing: download it first, where there is a network (hf download meta-llama/Llama-3.2-1B --local-dir "
    "models/Llama-3.2-1B), then give model.preset=models/Llama-3.2-1B"
)
MISSING_LINE = (
    "meshrun: error: model.preset: got {got!r}{where}, which does not exist; give the dir of a transformers "
    "checkpoint (config.json, safetensors, tokenizer files) or of a KerasHub preset (save_to_preset)"
)


@pytest.mark.parametrize("preset", ["meta-llama/Llama-3.2-1B", "hf://meta-llama/Llama-3.2-1B"])
def test_a_hub_id_as_the_preset_says_how_to_download_it(preset, in_tmp, capsys):
    line = error_line_here(["train", "model=keras_hub", f"model.preset={preset}", "mesh=2x4"], capsys)
    assert line == HUB_ID_LINE.format(got=preset)
    assert list(in_tmp.iterdir()) == []


@pytest.mark.parametrize(
    "preset", ["./nope/llama", "../nope/llama", "nope/llama/x", "meta-llama/Llama-3.2-1B"]
)
def test_a_preset_path_that_is_not_there_does_not_exist(preset, in_tmp, capsys):
    (in_tmp / "meta-llama").mkdir()  # an org dir that exists: a local path, not a hub id
    line = error_line_here(["plan", "model=keras_hub", f"model.preset={preset}", "mesh=2x4"], capsys)
    assert line == MISSING_LINE.format(got=preset, where=f" ({Path(preset).absolute()})")
    absolute = in_tmp / "nope" / "llama"
    line = error_line_here(["plan", "model=keras_hub", f"model.preset={absolute}", "mesh=2x4"], capsys)
    assert line == MISSING_LINE.format(got=str(absolute), where="")
    assert [p.name for p in in_tmp.iterdir()] == ["meta-llama"]


def no_tokenizer(directory: Path):
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        (directory / name).unlink()


def test_plan_makes_the_tokenizer_checks_train_makes(tmp_path_factory, in_tmp, capsys):
    """A checkpoint dir with no tokenizer: `meshrun plan` of a data=text run fails with the line
    `meshrun train` fails with, and writes nothing."""
    preset = broken(tmp_path_factory.mktemp("no_tokenizer"), "llama2", no_tokenizer)
    args = [
        "model=keras_hub",
        f"model.preset={preset}",
        "mesh=2x4",
        "data=text",
        f"data.files={DATA / 'corpus.txt'}",
    ]
    planned = error_line_here(["plan", *args], capsys)
    assert planned.startswith("meshrun: error: model.preset: got ") and "tokenizer.json" in planned, planned
    assert planned == error_line_here(["train", *args], capsys)
    assert list(in_tmp.iterdir()) == []
