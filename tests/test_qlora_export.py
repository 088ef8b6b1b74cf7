"""What a QLoRA run (model.quantize=int8|int4 under LoRA rank 4, a tiny Gemma preset on 2x4 under
gemma_tp) leaves: `preset/` is the float base with the adapters merged (each kernel the dequantized
quantized kernel + A @ B, a plain float preset KerasHub loads, no quantized dtype policy), the
adapter file holds the adapters for the float base, the log says which is which, and `meshrun
generate` rebuilds the quantized base with the adapters and answers as the run's own samples did.
A transformers model.preset (int8) writes `hf/` in float, dequantized and merged, and `peft/`."""

import json

import numpy as np
import pytest

from conftest import apply_peft, read_all, read_metrics, train_here
from meshrun import cli
from presets import TIED_LLAMA, write_checkpoint, write_tokenizer

pytestmark = pytest.mark.integration

RANK = 4
PROMPTS = ["The cat", "A bird"]
MAX_LENGTH = 16
RUN = [
    "model=keras_hub",
    "mesh=2x4",
    "model.seq_len=16",
    f"model.lora.rank={RANK}",
    "model.lora.alpha=8",  # alpha / rank = 2: in the adapter file, merged into preset/
    "train.epochs=1",
    "train.verbose=0",
    "train.learning_rate=0.01",
    "data.num_samples=32",
    "data.eval_samples=16",
    "checkpoint.export=true",
]


@pytest.fixture(scope="module")
def gemma_runs(text_files, tmp_path_factory):
    """An int4 run (that samples PROMPTS) and an int8 run of the tiny Gemma: mode -> run dir."""
    root = tmp_path_factory.mktemp("qlora")
    preset = text_files.gemma
    samples = [f"train.sample_prompts={json.dumps(PROMPTS)}", f"train.sample_max_length={MAX_LENGTH}"]
    runs = {}
    for mode, extra in (("int4", samples), ("int8", [])):
        runs[mode] = root / mode
        common = [f"model.preset={preset}", f"model.quantize={mode}", "layout=gemma_tp"]
        train_here([*RUN, *common, *extra], runs[mode])
    return preset, runs


def keras_quantized_with_adapter(preset, mode: str, adapter):
    """The float preset quantized by Keras' own `quantize(mode)` (its Dense and EinsumDense layers,
    as meshrun quantizes; Keras would quantize the embeddings too), the adapter file loaded on it
    (rank 4 on the default targets)."""
    import keras
    import keras_hub

    from meshrun.models.hub.export import load_adapter
    from meshrun.models.hub.options import LoraOptions

    keras.distribution.set_distribution(None)
    keras.config.set_dtype_policy("float32")
    task = keras_hub.models.CausalLM.from_preset(str(preset), preprocessor=None)
    task.backbone.quantize(
        mode, filters=lambda layer: type(layer) in (keras.layers.Dense, keras.layers.EinsumDense)
    )
    return load_adapter(task, LoraOptions(rank=RANK, alpha=8), adapter)


def called_by_hand(layer, x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """What a float Dense or EinsumDense with `kernel` (no bias in these models) gives for `x`."""
    if hasattr(layer, "equation"):
        return np.einsum(layer.equation, x, kernel)
    return x @ kernel


def signs_input(layer, kernel_shape: tuple) -> np.ndarray:
    """An input of +-1 for `layer` (two of every batch-like dimension): int8 quantizes it exactly."""
    if hasattr(layer, "equation"):
        inputs, rest = layer.equation.split(",")
        sizes = dict(zip(rest.split("->")[0], kernel_shape, strict=True))
        shape = [sizes.get(letter, 2) for letter in inputs]
    else:
        shape = [2, kernel_shape[0]]
    return np.where(np.random.default_rng(0).random(shape) < 0.5, -1.0, 1.0).astype("float32")


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_the_merged_preset_is_the_float_base_dequantized_with_the_adapters(gemma_runs, mode):
    """preset/'s config holds no quantized policy and loads in plain KerasHub in float32; each
    quantized kernel is dequantize(Keras' own quantize of the base kernel) + alpha / r * A @ B of
    the adapter file (reshaped to the kernel), and a float layer with it gives the adapted
    quantized layer's output."""
    import keras
    import keras_hub

    from meshrun.compat.keras.lora import adapter_of
    from meshrun.compat.keras.quantized import dequantized_kernel

    preset, runs = gemma_runs
    run_dir = runs[mode]
    metrics = read_metrics(run_dir)
    assert metrics["checkpoint"]["exported_preset"] == str(run_dir / "preset")
    assert metrics["checkpoint"]["exported_adapter"] == str(run_dir / "adapter.lora.h5")
    config = (run_dir / "preset" / "config.json").read_text()
    assert "Int4DTypePolicy" not in config and "Int8DTypePolicy" not in config and mode not in config
    merged = keras_hub.models.CausalLM.from_preset(str(run_dir / "preset"), preprocessor=None)
    kernels = {v.path: np.asarray(v.value) for v in merged.backbone.weights}
    assert {str(v.dtype) for v in merged.backbone.weights} == {"float32"}
    reference = keras_quantized_with_adapter(preset, mode, run_dir / "adapter.lora.h5")
    layers = [
        layer
        for layer in reference.backbone._flatten_layers(include_self=False)
        if type(layer) in (keras.layers.Dense, keras.layers.EinsumDense)
    ]
    assert len(layers) == 14  # q, k, v, o, gating, gating_2, linear of 2 blocks
    adapted = 0
    for layer in layers:
        kernel = kernels[f"{layer.path}/kernel"]
        expected = dequantized_kernel(layer)
        adapter = adapter_of(layer)
        if adapter is not None:
            adapted += 1
            assert np.abs(np.asarray(adapter.b.value)).max() > 0, layer.path  # trained
            expected = expected + adapter.delta(np)
        np.testing.assert_allclose(kernel, expected, atol=1e-5, rtol=0, err_msg=layer.path)
        x = signs_input(layer, kernel.shape)
        by_keras = np.asarray(layer(x))
        np.testing.assert_allclose(called_by_hand(layer, x, kernel), by_keras, atol=1e-4, rtol=0)
    assert adapted == 4  # query and value of 2 blocks


def test_the_log_says_which_file_is_which(gemma_runs):
    _, runs = gemma_runs
    log = (runs["int4"] / "train.log").read_text()
    assert (
        "preset/: float32 base (dequantized int4) with the adapters merged; "
        "adapter.lora.h5: LoRA adapters for the float base" in log
    )


def test_the_adapter_file_holds_the_adapters(gemma_runs):
    import h5py

    _, runs = gemma_runs
    found = {}
    with h5py.File(runs["int8"] / "adapter.lora.h5", "r") as file:
        file.visititems(
            lambda name, item: found.update({name: item.shape}) if hasattr(item, "shape") else None
        )
    names = sorted(name.rsplit("/", 1)[-1] for name in found if "lora_kernel" in name)
    assert names == ["lora_kernel_a"] * 4 + ["lora_kernel_b"] * 4
    # PEFT's shapes: A (hidden, r), B (r, heads * head_dim) for the query of the tiny Gemma.
    assert found["decoder_block_0/attention/query/lora_kernel_a"][1] == RANK
    assert found["decoder_block_0/attention/query/lora_kernel_b"][0] == RANK


def test_generate_rebuilds_the_quantized_base_and_answers_as_the_run_sampled(gemma_runs, capsys, monkeypatch):
    """`meshrun generate` on the int4 run takes its adapters on the base quantized as it trained
    (not the merged float preset) and gives the completions the run's samples recorded."""
    from meshrun.models.hub import build as building

    _, runs = gemma_runs
    built = []
    build = building.build

    def recording(options, *args, **kwargs):
        built.append((options.quantize, options.lora.rank))
        return build(options, *args, **kwargs)

    monkeypatch.setattr(building, "build", recording)
    metrics = read_metrics(runs["int4"])
    capsys.readouterr()
    flags = [f"--prompt={prompt}" for prompt in PROMPTS]
    cli.main(["generate", str(runs["int4"]), *flags, "--max-length", str(MAX_LENGTH), "--json"])
    answered = json.loads(capsys.readouterr().out)
    assert built and set(built) == {("int4", RANK)}  # the plan's abstract build and the model
    assert [a["completion"] for a in answered] == [s["completion"] for s in metrics["samples"]]
    assert all(a["completion"].strip() for a in answered)


def int8_dequantized(weight: np.ndarray) -> np.ndarray:
    """A transformers (out, in) weight through Keras' int8: one absmax scale per output row."""
    scale = 127.0 / (np.abs(weight).max(axis=1, keepdims=True) + np.float32(1e-7))
    return np.clip(np.round(weight * scale), -127, 127) / scale


def test_a_transformers_preset_exports_hf_in_float_dequantized_and_merged_and_peft(tmp_path):
    """An int8 QLoRA run of a transformers checkpoint: hf/ holds float32 tensors, each projection
    the int8-dequantized source weight with the PEFT adapter of peft/ merged (embeddings and norms
    as they were)."""
    source = tmp_path / "tiny-llama"
    write_checkpoint(source, TIED_LLAMA)
    write_tokenizer(source)
    run_dir = tmp_path / "run"
    train_here([*RUN, f"model.preset={source}", "model.quantize=int8", "layout=llama_tp"], run_dir)
    assert (run_dir / "peft" / "adapter_config.json").is_file()
    from meshrun.hf import checkpoint as hf_checkpoint

    entries = hf_checkpoint.inspect(run_dir / "hf").entries
    assert {entry.dtype for entry in entries.values()} == {"float32"}
    exported, base = read_all(run_dir / "hf"), read_all(source)
    projections = [name for name in base if name.endswith("proj.weight")]
    assert len(projections) == 14
    dequantized = {
        name: int8_dequantized(value) if name in projections else value for name, value in base.items()
    }
    by_hand = apply_peft(dequantized, run_dir / "peft")
    for name, value in exported.items():
        np.testing.assert_allclose(value, by_hand[name], atol=1e-5, rtol=0, err_msg=name)
    assert not np.array_equal(exported[projections[0]], base[projections[0]])
    log = (run_dir / "train.log").read_text()
    assert "hf/: float32 base (dequantized int8) with the adapters merged" in log
    assert "peft/: the PEFT form of those adapters, on the float base" in log
