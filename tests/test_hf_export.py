"""checkpoint.export of a run whose model.preset is a transformers dir (meshrun.hf.export): a LoRA
fine-tune of a synthetic tied Llama on a 2x4 mesh (llama_tp) writes `hf/` and `peft/`. The export
reloads through meshrun to the trained model's logits (the base with the run's adapter.lora.h5);
config.json, the tokenizer files and the generation config are the source's; shards and index
agree; the PEFT adapter applied by hand in numpy is hf/'s merged weights. A bf16 source (exported
in-process, no run) gives bf16 tensors, or those hf_dtype asks with the dtype key to match; a failed
export leaves nothing; bad options are one line with exit 2."""

import json
import math

import numpy as np
import pytest

from conftest import apply_peft, error_line_here, read_all, read_metrics, train_here
from meshrun.hf import checkpoint as hf_checkpoint
from meshrun.hf import export as hf_export
from meshrun.hf import safetensors
from presets import SHARD_BYTES, TIED_LLAMA, write_checkpoint, write_tokenizer

pytestmark = pytest.mark.integration

BF16_QWEN3 = {
    "model_type": "qwen3",
    "vocab_size": 320,
    "hidden_size": 32,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
TOKEN_IDS = np.array([[1, 5, 77, 300, 9, 42, 13, 8], [1, 250, 3, 3, 60, 61, 62, 319]])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    directory = tmp_path_factory.mktemp("source") / "tiny-llama"
    write_checkpoint(directory, TIED_LLAMA)
    write_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def run(source, tmp_path_factory):
    """A LoRA fine-tune of `source` with the export, on 2x4 under llama_tp (with LoRA dropout,
    which the export names and which changes nothing exported)."""
    run_dir = tmp_path_factory.mktemp("run")
    train_here(
        [
            "model=keras_hub",
            f"model.preset={source}",
            "model.seq_len=16",
            "model.lora.rank=4",
            "model.lora.alpha=8",
            "model.lora.dropout=0.05",
            "mesh=2x4",
            "layout=llama_tp",
            "train.verbose=0",
            "train.epochs=1",
            "train.learning_rate=0.01",
            "data.num_samples=32",
            "data.eval_samples=16",
            "checkpoint.export=true",
            f"checkpoint.hf_shard_bytes={SHARD_BYTES}",
        ],
        run_dir,
    )
    return run_dir


def logits_of(task) -> np.ndarray:
    return np.asarray(task({"token_ids": TOKEN_IDS, "padding_mask": np.ones_like(TOKEN_IDS)}))


def built(preset, lora=None):
    """The task of model.preset `preset` off the mesh (with `lora`'s adapters enabled)."""
    import keras

    from meshrun.models.hub.build import build
    from meshrun.models.hub.options import KerasHubOptions

    keras.distribution.set_distribution(None)
    keras.config.set_dtype_policy("float32")
    options = KerasHubOptions(preset=str(preset), seq_len=16)
    task = build(options)
    return task


def test_the_export_reloads_to_the_trained_models_logits(run, source):
    """hf/ through meshrun equals the base with the run's adapter.lora.h5 put back on it
    (as `meshrun generate` samples a kept adapter), and the training moved it."""
    from meshrun.models.hub.export import load_adapter
    from meshrun.models.hub.options import LoraOptions

    exported = logits_of(built(run / "hf"))
    base = built(source)
    untrained = logits_of(base)
    trained = logits_of(load_adapter(base, LoraOptions(rank=4), run / "adapter.lora.h5"))
    np.testing.assert_allclose(exported, trained, atol=1e-5, rtol=0)
    assert np.abs(exported - untrained).max() > 1e-4
    metrics = read_metrics(run)
    assert metrics["checkpoint"]["exported_preset"] == str(run / "hf")  # what meshrun generate loads
    assert metrics["checkpoint"]["exported_hf"] == str(run / "hf")
    assert metrics["checkpoint"]["exported_peft"] == str(run / "peft")
    assert not (run / "preset").exists()


def test_config_tokenizer_and_generation_files_are_the_sources(run, source):
    hf = run / "hf"
    assert (hf / "config.json").read_bytes() == (source / "config.json").read_bytes()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (hf / name).read_bytes() == (source / name).read_bytes(), name
    generation = json.loads((hf / "generation_config.json").read_text())  # the source has none
    assert generation["bos_token_id"] == 1 and generation["eos_token_id"] == 2


def test_shards_and_index_agree_and_a_tied_head_is_left_out(run, source):
    hf = run / "hf"
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in hf.glob("*.safetensors"))
    assert len(files) >= 2 and sorted(set(index["weight_map"].values())) == files
    found = {}
    for name in files:
        entries, metadata = safetensors.read_header(hf / name)
        assert metadata == {"format": "pt"}
        for tensor in entries:
            assert tensor not in found, tensor
            found[tensor] = entries[tensor]
            assert index["weight_map"][tensor] == name
    assert set(found) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(entry.nbytes for entry in found.values())
    source_names = set(hf_checkpoint.inspect(source).entries)
    assert set(found) == source_names and "lm_head.weight" not in found
    assert {entry.dtype for entry in found.values()} == {"float32"}


def peft_lora_parameters(config: dict, rank: int, modules=("q_proj", "v_proj")) -> int:
    """What PEFT's LoRA of `rank` on `modules` of a Llama of `config` trains: r * (in_features +
    out_features) for each module of each layer."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    shapes = {  # (in_features, out_features) of transformers' Linear
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, config["num_key_value_heads"] * head_dim),
        "v_proj": (hidden, config["num_key_value_heads"] * head_dim),
        "o_proj": (heads * head_dim, hidden),
    }
    return config["num_hidden_layers"] * sum(rank * sum(shapes[module]) for module in modules)


def test_the_peft_adapter_on_the_base_is_the_merged_export(run, source):
    """peft/ holds rank-4 adapters of PEFT's shapes (lora_A [r, in], lora_B [out, r]) for the run's
    model.lora.rank=4, as many parameters as the run trained and as PEFT's rank 4 on q and v has,
    and the base with it merged is hf/."""
    config = json.loads((run / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert config["base_model_name_or_path"] == str(source.resolve())
    assert config["target_modules"] == ["q_proj", "v_proj"] and config["bias"] == "none"
    assert not config["fan_in_fan_out"] and config["lora_dropout"] == 0.05
    assert config["r"] == 4 and config["lora_alpha"] / config["r"] == pytest.approx(2.0)
    adapter, _ = safetensors.read_header(run / "peft" / "adapter_model.safetensors")
    layer = "base_model.model.model.layers.0.self_attn"
    assert adapter[f"{layer}.q_proj.lora_A.weight"].shape == (4, 64)  # (r, hidden)
    assert adapter[f"{layer}.q_proj.lora_B.weight"].shape == (64, 4)  # (8 heads * 8, r)
    assert adapter[f"{layer}.v_proj.lora_B.weight"].shape == (32, 4)  # (4 key/value heads * 8, r)
    trained = read_metrics(run)["model"]["trainable_params"]
    assert trained == sum(math.prod(entry.shape) for entry in adapter.values())
    assert trained == peft_lora_parameters(TIED_LLAMA, 4) == 2 * 4 * ((64 + 64) + (64 + 32))
    exported, base = read_all(run / "hf"), read_all(source)
    by_hand = apply_peft(base, run / "peft")
    changed = 0
    for name, value in exported.items():
        np.testing.assert_allclose(value, by_hand[name], atol=1e-6, rtol=0, err_msg=name)
        changed += not np.array_equal(value, base[name])
    assert changed == 4  # q and v of 2 layers


@pytest.fixture
def bf16_task(tmp_path):
    """A bf16 Qwen 3 (untied) with a generation_config.json, as loaded, LoRA on query, value and
    the MLP's output with random adapters."""
    import keras

    from meshrun.hf import load
    from meshrun.models.hub.lora import enable_lora
    from meshrun.models.hub.options import LoraOptions

    keras.distribution.set_distribution(None)
    keras.config.set_dtype_policy("float32")
    directory = tmp_path / "qwen3"
    write_checkpoint(directory, BF16_QWEN3, shard_bytes=40_000)
    (directory / "generation_config.json").write_text('{"eos_token_id": [2, 7], "do_sample": true}\n')
    checkpoint = hf_checkpoint.inspect(directory)
    task, _ = load.build_task(checkpoint, True)
    enable_lora(task.backbone, LoraOptions(rank=2, targets=("query", "value", "feedforward_output_dense")))
    rng = np.random.default_rng(1)
    for adapter in hf_export.adapters_by_kernel(task.backbone).values():
        adapter.a.assign(rng.normal(size=adapter.a.shape) * 0.1)
        adapter.b.assign(rng.normal(size=adapter.b.shape) * 0.1)
    return task, checkpoint


def test_a_bf16_source_exports_bf16_or_what_hf_dtype_asks(bf16_task, tmp_path):
    task, checkpoint = bf16_task
    source = checkpoint.path
    same = hf_export.write_hf(task.backbone, checkpoint, tmp_path / "same", None, 40_000)
    entries = hf_checkpoint.inspect(same).entries
    assert {entry.dtype for entry in entries.values()} == {"bfloat16"} and "lm_head.weight" in entries
    assert (same / "config.json").read_bytes() == (source / "config.json").read_bytes()
    assert (same / "generation_config.json").read_bytes() == (source / "generation_config.json").read_bytes()
    wide = hf_export.write_hf(task.backbone, checkpoint, tmp_path / "wide", "float32", 40_000)
    config = json.loads((wide / "config.json").read_text())
    assert config.pop("dtype") == "float32" and "torch_dtype" not in config  # the source's key only
    source_config = json.loads((source / "config.json").read_text())
    source_config.pop("dtype")
    assert config == source_config
    narrow, full = read_all(same), read_all(wide)
    assert {entry.dtype for entry in hf_checkpoint.inspect(wide).entries.values()} == {"float32"}
    for name, value in full.items():  # the bf16 file is the float32 one rounded
        import ml_dtypes

        np.testing.assert_array_equal(narrow[name], value.astype(ml_dtypes.bfloat16).astype(np.float32))
    peft = hf_export.write_peft(task.backbone, checkpoint, tmp_path / "peft")
    by_hand = apply_peft(read_all(source), peft)
    for name, value in full.items():
        np.testing.assert_allclose(value, by_hand[name], atol=1e-6, rtol=0, err_msg=name)


def test_a_failed_export_leaves_nothing(bf16_task, tmp_path, monkeypatch):
    task, checkpoint = bf16_task
    copies = []

    def failing(array, writer):
        copies.append(1)
        if len(copies) == 5:
            raise OSError("No space left on device")
        return np.asarray(array)

    monkeypatch.setattr(hf_export, "host_copy", failing)
    with pytest.raises(OSError):
        hf_export.write_hf(task.backbone, checkpoint, tmp_path / "hf", None, 40_000)
    assert list(tmp_path.iterdir()) == [tmp_path / "qwen3"]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("checkpoint.hf_dtype=int8", "checkpoint.hf_dtype: got 'int8'; valid: float32, bfloat16 or float16"),
        ("checkpoint.hf_shard_bytes=0", "checkpoint.hf_shard_bytes: got 0; valid: a positive number"),
        ("checkpoint.hf_shard_bytes=5GB", "checkpoint.hf_shard_bytes: got '5GB'; expected int"),
    ],
)
def test_bad_export_options_are_one_line_with_exit_2(override, expected, in_tmp, capsys):
    line = error_line_here(["train", override], capsys)
    assert expected in line, line
