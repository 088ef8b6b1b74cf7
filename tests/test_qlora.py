"""model.quantize (QLoRA): a base built straight into Keras' int8 / int4 form, its weights quantized
as they are read, laid out by rules written for float kernels, trained under LoRA on 2x4, resumed
after SIGKILL; and every bad input one line with exit 2.

Keras runs on jax with 8 emulated CPU devices (tests/conftest.py); presets are built locally
(tests/presets.py)."""

from __future__ import annotations

import json
import signal

import keras
import numpy as np
import pytest

from conftest import (
    HF_DATA,
    adapter_weights,
    built_on_2x4,
    error_line_here,
    read_metrics,
    stop_after,
    train_here,
)
from meshrun import cli, quantize
from meshrun.compat.keras.models import sublayers
from meshrun.config.layout_schema import MeshConfig
from meshrun.models.hub.build import build
from meshrun.models.hub.options import KerasHubOptions, LoraOptions
from meshrun.placement.quantized import carried_axes
from meshrun.specs.quantized import COLUMNS, ROWS, QuantizedOf
from presets import corpus_text, gemma_preset, llama3_preset

FAST = ["train.verbose=0", "train.batch_size=8", "train.learning_rate=0.01"]
MESH = MeshConfig(shape=(2, 4), axis_names=("batch", "model"), batch_axis="batch")


@pytest.fixture(scope="module")
def presets_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("qlora")
    text = corpus_text()
    (root / "corpus.txt").write_text(text)
    gemma_preset(root / "gemma", text, num_key_value_heads=4)
    llama3_preset(root / "llama", text)
    return root


# --- the quantized values: Keras' own ------------------------------------------------------------


def keras_quantized(layer_of, mode: str):
    """A layer made by `layer_of()`, built, its kernel drawn, then quantized by Keras itself; and
    the float kernel it was quantized from."""
    layer = layer_of()
    kernel = np.random.default_rng(0).normal(size=layer.kernel.shape).astype("float32")
    layer.kernel.assign(kernel)
    layer.quantize(mode)
    return layer, kernel


# A layer, and the shape of an input it takes (its first dimensions the batch's and the tokens').
LAYERS = {
    "dense": (lambda: keras.layers.Dense(40), (2, 300)),
    "llama_query": (
        lambda: keras.layers.EinsumDense("btd,dnh->btnh", output_shape=(None, 4, 16)),
        (2, 3, 300),
    ),
    "gemma_query": (
        lambda: keras.layers.EinsumDense("btd,ndh->btnh", output_shape=(None, 4, 16)),
        (2, 3, 300),
    ),
    "attention_output": (
        lambda: keras.layers.EinsumDense("btnh,nhd->btd", output_shape=(None, 48)),
        (2, 3, 4, 80),
    ),
}


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_a_kernel_quantized_as_it_loads_equals_keras_own_quantize(kind, mode, monkeypatch):
    """quantize_into, a few columns or blocks of rows at a time (a block of 2 KiB here, so every
    layer is cut into several), gives Keras' `quantize(mode)` values, scales and zero points bit
    for bit: 300 reduced rows make int4's last block of 128 a partial one."""
    make, input_shape = LAYERS[kind]

    def built():
        layer = make()
        layer.build((None, *input_shape[1:]))
        return layer

    reference, kernel = keras_quantized(built, mode)
    monkeypatch.setattr(quantize, "CHUNK_BYTES", 2048)
    with quantize.quantized_layers(mode):
        ours = built()
    quantize.quantize_into(ours, kernel)
    assert [v.path.split("/")[-1] for v in ours.weights] == [v.path.split("/")[-1] for v in reference.weights]
    for mine, theirs in zip(ours.weights, reference.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs), err_msg=mine.path)
    x = np.random.default_rng(1).normal(size=input_shape).astype("float32")
    np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(reference(x)))


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("family", ["gemma", "llama"])
def test_a_preset_loaded_quantized_equals_the_float_preset_quantized_by_keras(presets_dir, family, mode):
    """A tiny Gemma and Llama preset built by meshrun with model.quantize hold exactly what Keras'
    quantize makes of the float preset (every Dense and EinsumDense layer), and give its logits."""
    import keras_hub

    keras.backend.clear_session()
    reference = keras_hub.models.CausalLM.from_preset(
        str(presets_dir / family), preprocessor=None, compile=False
    )
    for layer in sublayers(reference.backbone):
        if type(layer) in (keras.layers.Dense, keras.layers.EinsumDense):
            layer.quantize(mode)
    keras.backend.clear_session()
    ours = build(KerasHubOptions(preset=str(presets_dir / family), quantize=mode, lora=LoraOptions(rank=4)))
    expected = {v.path: np.asarray(v) for v in reference.backbone.weights}
    found = {v.path: np.asarray(v) for v in ours.backbone.weights if "lora_kernel" not in v.path}
    assert found.keys() == expected.keys()
    assert len(quantize.quantized(ours.backbone)) == 14  # 2 blocks x (4 attention + 3 feed-forward)
    for path, value in expected.items():
        np.testing.assert_array_equal(found[path], value, err_msg=path)
    tokens = {"token_ids": np.arange(16)[None] % 300, "padding_mask": np.ones((1, 16), bool)}
    np.testing.assert_array_equal(np.asarray(ours(tokens)), np.asarray(reference(tokens)))


def keras_quantized_backbone(backbone, mode: str) -> dict:
    """Every variable of `backbone` (LoRA's left out) after Keras quantizes each of its Dense and
    EinsumDense layers itself."""
    for layer in sublayers(backbone):
        if type(layer) in (keras.layers.Dense, keras.layers.EinsumDense):
            layer.quantize(mode)
    return {v.path: np.asarray(v) for v in backbone.weights}


@pytest.mark.integration
@pytest.mark.usefixtures("fresh_session")
@pytest.mark.parametrize("case, layout", [("llama2", "llama_tp"), ("gemma", "gemma_tp")])
def test_a_transformers_checkpoint_loads_on_2x4_as_keras_quantizes_it(case, layout, tmp_path):
    """A transformers checkpoint read shard by shard onto 2x4 with model.quantize=int4 holds what
    Keras' quantize makes of the same checkpoint loaded in float on one device, bit for bit; no
    device held more than 1.3x its share while it loaded."""
    from meshrun.hf import checkpoint as hf_checkpoint
    from meshrun.hf import load
    from meshrun.placement import distribution

    ours, peaks = built_on_2x4(HF_DATA / case, layout, tmp_path, quantize="int4", lora={"rank": 4})
    found = {v.path: np.asarray(v) for v in ours.backbone.weights if "lora_kernel" not in v.path}
    held = max(
        sum(s.data.nbytes for v in ours.weights for s in v.value.addressable_shards if s.device == device)
        for device in {s.device for v in ours.weights for s in v.value.addressable_shards}
    )
    assert peaks.bytes_per_device <= 1.3 * held, (peaks, held)
    distribution.reset()
    keras.backend.clear_session()
    reference, _ = load.build_task(hf_checkpoint.inspect(HF_DATA / case), load_weights=True)
    expected = keras_quantized_backbone(reference.backbone, "int4")
    assert found.keys() == expected.keys()
    for path, value in expected.items():
        np.testing.assert_array_equal(found[path], value, err_msg=path)


# --- layouts carried over to the quantized variables ------------------------------------------------


def test_a_llama_query_rule_carries_to_int4s_rows_and_packed_columns():
    """Llama's (hidden, heads, head_dim) query kernel reduces over hidden: int4 reshapes it to
    hidden rows and heads x head_dim columns, so both of the rule's axes carry over; the scales
    run along the columns."""
    kernel = QuantizedOf("q/kernel", (64, 4, 16), "kernel", (ROWS, COLUMNS), rows=64, packed=True)
    scale = QuantizedOf("q/kernel", (64, 4, 16), "scale", (None, COLUMNS), rows=64)
    assert carried_axes(kernel, ("batch", "model", None), MESH) == (("batch", "model"), [])
    assert carried_axes(scale, ("batch", "model", None), MESH) == ((None, "model"), [])


def test_a_gemma_query_rule_keeps_the_heads_and_replicates_what_the_reshape_mixes():
    """Gemma's (heads, hidden, head_dim) query kernel reduces over hidden, but int4's row-major
    reshape to (hidden, heads x head_dim) puts the heads in blocks of rows: the heads' axis carries
    to the rows, the hidden axis (now mixed into both dimensions) is replicated and reported."""
    kernel = QuantizedOf("q/kernel", (4, 64, 16), "kernel", (ROWS, COLUMNS), rows=64, packed=True)
    assert carried_axes(kernel, ("model", "batch", None), MESH) == (("model", None), [(1, "batch")])


def test_packed_columns_split_only_into_an_even_number_of_columns():
    """A Dense kernel of 12 outputs packs into 6 bytes a row: 4 devices would split pairs, so the
    columns stay whole; 2 devices take 6 columns (3 bytes) each."""
    kernel = QuantizedOf("d/kernel", (8, 12), "kernel", (ROWS, COLUMNS), rows=8, packed=True)
    assert carried_axes(kernel, (None, "model"), MESH) == ((None, None), [(1, "model")])
    assert carried_axes(kernel, (None, "batch"), MESH) == ((None, "batch"), [])


# --- the acceptance: tiny Gemma and Llama, int8 and int4, LoRA rank 4 on 2x4 ----------------

ACCEPTANCE = {
    "gemma int4 gemma_tp": ("gemma", "int4", ["layout=gemma_tp"]),
    "llama int8 llama_tp": ("llama", "int8", ["layout=llama_tp"]),
    "gemma int8 auto": ("gemma", "int8", ["layout=auto", "layout.min_bytes=1024"]),
    "llama int4 auto": ("llama", "int4", ["layout=auto", "layout.min_bytes=1024"]),
}


def qlora_run(presets_dir, family: str, mode: str, layout: list[str], *extra: str) -> list[str]:
    return [
        "model=keras_hub",
        f"model.preset={presets_dir / family}",
        f"model.quantize={mode}",
        "model.lora.rank=4",
        "mesh=2x4",
        *layout,
        "data=text",
        f"data.files={presets_dir / 'corpus.txt'}",
        "data.eval_fraction=0.1",
        *FAST,
        *extra,
    ]


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(ACCEPTANCE))
def test_a_quantized_base_trains_its_adapters_on_2x4(presets_dir, tmp_path, name):
    """Loss falls; the plan's bytes per device equal the live arrays' within 5%; loading held no
    device above 1.3x its planned bytes; the quantized kernels are sharded by the carried rules."""
    family, mode, layout = ACCEPTANCE[name]
    metrics = train_here(qlora_run(presets_dir, family, mode, layout, "train.epochs=3"), tmp_path)
    losses = metrics["history"]["loss"]
    assert losses[-1] < losses[0], losses
    memory = metrics["memory"]
    assert memory["params_bytes_per_device"] == pytest.approx(
        memory["planned_params_bytes_per_device"], rel=0.05
    )
    assert memory["load_peak_bytes_per_device"] <= 1.3 * memory["planned_params_bytes_per_device"]
    plan = json.loads((tmp_path / "plan.json").read_text())
    kernels = [v for v in plan["variables"] if v["path"].endswith("attention/query/kernel")]
    assert kernels and all(v["dtype"] == "int8" for v in kernels)
    assert any(axis is not None for v in kernels for axis in v["spec"]), kernels  # sharded, not replicated


@pytest.mark.integration
def test_a_qlora_run_killed_mid_epoch_resumes_exactly(presets_dir, tmp_path):
    """int4 QLoRA, killed with SIGKILL mid-epoch (a real process) and run again: the adapters,
    their optimizer state and the data position come back, and the run ends with the losses and
    adapters of the run never interrupted."""
    checkpoints = tmp_path / "checkpoints"
    command = [
        "train",
        *qlora_run(
            presets_dir,
            "gemma",
            "int4",
            ["layout=gemma_tp"],
            "train.epochs=2",
            "checkpoint.every_steps=5",
            "checkpoint.keep=2",
        ),
    ]
    cli.main([*command, f"hydra.run.dir={tmp_path / 'whole'}"])
    resumed = [*command, f"checkpoint.dir={checkpoints}"]
    stop_after(
        resumed, tmp_path / "killed", checkpoints, at_step=10, stop=signal.SIGKILL, returncode=-signal.SIGKILL
    )
    cli.main([*resumed, f"hydra.run.dir={tmp_path / 'final'}"])
    metrics, reference = read_metrics(tmp_path / "final"), read_metrics(tmp_path / "whole")
    assert (
        metrics["status"] == "ok"
        and 10 <= metrics["checkpoint"]["resumed_at_step"] < reference["train"]["updates"]
    )
    assert metrics["checkpoint"]["resumed_at_step"] % reference["train"]["steps_per_epoch"] != 0  # mid-epoch
    assert metrics["history"]["loss"] == pytest.approx(reference["history"]["loss"], abs=1e-6)
    assert metrics["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], abs=1e-6)
    adapters = [adapter_weights(tmp_path / name / "adapter.lora.h5") for name in ("final", "whole")]
    assert adapters[0].keys() == adapters[1].keys()
    for key, value in adapters[0].items():
        np.testing.assert_allclose(value, adapters[1][key], atol=1e-6, rtol=0)


# --- own models ---------------------------------------------------------------------------------------

OWN_MODELS = """
import keras


def mlp():
    inputs = keras.Input((32,))
    x = keras.layers.Dense(64, activation="relu", name="up")(inputs)
    x = keras.layers.LayerNormalization(name="norm")(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="head")(x))


def convs():
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
"""


@pytest.mark.integration
def test_an_own_model_trains_around_its_quantized_dense_layers(in_tmp):
    """model=python with model.quantize=int4: the Dense kernels are int4 (drawn, then quantized)
    and frozen, laid out by the rules written for their float form; the biases and the norm train."""
    (in_tmp / "qmodels.py").write_text(OWN_MODELS)
    train_here(
        [
            "model=python",
            "model.factory=qmodels:mlp",
            "model.quantize=int4",
            "train.loss=sparse_categorical_crossentropy",
            "mesh=2x4",
            "layout.rules={up/kernel:[null,model],head/kernel:[model,null]}",
            "data=synthetic",
            "train.epochs=2",
            "train.verbose=0",
        ],
        in_tmp / "run",
    )
    plan = json.loads((in_tmp / "run" / "plan.json").read_text())
    by_path = {v["path"]: v for v in plan["variables"]}
    assert by_path["up/kernel"]["dtype"] == "int8" and by_path["up/kernel"]["shape"] == [32, 32]
    assert by_path["up/kernel"]["spec"] == [None, "model"] and not by_path["up/kernel"]["trainable"]
    assert by_path["head/kernel"]["spec"] == ["model", None]  # 64 rows over 4 devices
    trainable = {path for path, v in by_path.items() if v["trainable"]}
    assert trainable == {"up/bias", "head/bias", "norm/gamma", "norm/beta"}


# --- bad inputs: one line, exit 2 ---------------------------------------------------------------------

BAD = {
    "an unknown mode": (
        ["model.quantize=int3"],
        ["model.quantize: got 'int3'", "valid: int8 or int4, or null"],
    ),
    "a calibrated mode": (["model.quantize=gptq"], ["model.quantize: got 'gptq'", "calibration"]),
    "full fine-tuning": (
        ["model.quantize=int8", "model.lora.rank=null"],
        ["model.quantize: got 'int8' with model.lora.rank=null", "quantized weights cannot train"],
    ),
    "pipeline stages": (
        [
            "model.quantize=int8",
            "model.lora.rank=4",
            "mesh=2x2x2",
            "mesh.axis_names=[stage,data,model]",
            "mesh.batch_axis=data",
        ],
        ["model.quantize: got 'int8' with pipeline stages"],
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_quantize_input_is_one_line_with_exit_2(presets_dir, name, in_tmp, capsys):
    args, expected = BAD[name]
    line = error_line_here(
        ["train", "model=keras_hub", f"model.preset={presets_dir / 'gemma'}", *args],
        capsys,
    )
    for part in expected:
        assert part in line, (part, line)
    assert list(in_tmp.iterdir()) == []


def test_a_model_with_nothing_to_quantize_is_one_line(in_tmp, capsys):
    (in_tmp / "qmodels.py").write_text(OWN_MODELS)
    line = error_line_here(
        ["train", "model=python", "model.factory=qmodels:convs", "model.quantize=int4", "train.loss=mse"],
        capsys,
    )
    assert "model.quantize: got 'int4', but qmodels:convs has no Dense or EinsumDense layer" in line
    assert "valid for it: null" in line
    assert sorted(p.name for p in in_tmp.iterdir()) == ["qmodels.py"]
