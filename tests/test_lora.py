"""LoRA fine-tuning of a KerasHub causal LM (model.lora) on 8 emulated CPU devices: a tiny Gemma
preset (tests/presets.py) trained with rank-4 adapters on mesh 2x4 under gemma_tp. Only the adapters
train (the plan, the optimizer's slots and metrics.json say so), as many parameters as PEFT's
adapters of that rank on the same layers; the exported preset loads in plain KerasHub with the
adapters merged and the preset's tokenizer, and the base preset with the exported adapter gives the
same logits; a LoRA run on text stopped by SIGTERM and by SIGKILL resumes with
the losses and adapters of an uninterrupted run; rules that catch adapters warn; bad values are one line with
exit 2."""

import json
import math
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import INSTRUCTION_PROMPT, adapter_weights, read_metrics, stop_after, train_here
from meshrun import cli
from presets import gemma_preset

pytestmark = pytest.mark.integration

RANK, ALPHA = 4, 8.0  # alpha / rank = 2: the merges must scale the update
LORA = [f"model.lora.rank={RANK}", f"model.lora.alpha={ALPHA}"]
DROPOUT = 0.1  # model.lora.dropout of the exported run: the merge holds the adapters as trained
FAST = [
    "train.verbose=0",
    "train.epochs=2",
    "data.num_samples=64",
    "data.eval_samples=16",
    "model.seq_len=16",
]
ON_2X4 = ["mesh=2x4", "layout=gemma_tp"]


@pytest.fixture(scope="module")
def base_preset(text_files):
    """A tiny Gemma preset with its SentencePiece tokenizer and preprocessor (4 query and 4
    key/value heads, so that gemma_tp divides them over a model axis of 4)."""
    return text_files.gemma


@pytest.fixture(scope="module")
def lora_run(base_preset, tmp_path_factory):
    """The LoRA run of two epochs, exported: its metrics and run dir."""
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    return train_here(
        [
            "model=keras_hub",
            f"model.preset={base_preset}",
            *LORA,
            f"model.lora.dropout={DROPOUT}",
            *ON_2X4,
            *FAST,
            "checkpoint.export=true",
        ],
        run_dir,
    ), run_dir


def is_adapter(path: str) -> bool:
    return path.rsplit("/", 1)[-1] in ("lora_kernel_a", "lora_kernel_b")


def peft_parameters(preset, rank: int) -> int:
    """What PEFT's LoRA of `rank` on the query and value projections of a Gemma trains: r * (in +
    out) per projection, in = hidden, out = heads * head_dim (the query's heads, the key/value heads)."""
    config = json.loads((preset / "config.json").read_text())["config"]
    hidden, head_dim = config["hidden_dim"], config["head_dim"]
    query = rank * (hidden + config["num_query_heads"] * head_dim)
    value = rank * (hidden + config["num_key_value_heads"] * head_dim)
    return config["num_layers"] * (query + value)


def test_only_the_adapters_train_and_the_optimizer_keeps_state_for_them_alone(lora_run, base_preset):
    metrics, run_dir = lora_run
    adapters = {path: placed for path, placed in metrics["sharding"].items() if is_adapter(path)}
    # PEFT's adapters: A (in, r) and B (r, out) over the flattened heads, not one A per head.
    config = json.loads((base_preset / "config.json").read_text())["config"]
    hidden, heads = config["hidden_dim"], config["num_query_heads"] * config["head_dim"]
    assert adapters["decoder_block_0/attention/query/lora_kernel_a"]["shape"] == [hidden, RANK]
    assert adapters["decoder_block_0/attention/query/lora_kernel_b"]["shape"] == [RANK, heads]
    assert sorted(adapters) == sorted(
        f"decoder_block_{i}/attention/{layer}/lora_kernel_{ab}"
        for i in range(2)
        for layer in ("query", "value")
        for ab in "ab"
    )
    adapter_params = sum(math.prod(placed["shape"]) for placed in adapters.values())
    model = metrics["model"]
    assert model["trainable_params"] == adapter_params == peft_parameters(base_preset, RANK)
    assert adapter_params < model["params"] / 5
    assert model["label"].endswith(f"LoRA rank {RANK}") and model["options"]["lora"] == {
        "rank": RANK,
        "alpha": ALPHA,
        "targets": None,
        "dropout": DROPOUT,
    }
    losses = metrics["history"]["loss"]
    assert losses[-1] < losses[0], losses  # LoRA dropout on, the adapters learn
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["model"]["trainable_params"] == adapter_params
    # The plan counts every variable, LoRA dropout's seed state (2 uint32) too; count_params weights alone.
    assert plan["model"]["frozen_params"] == model["params"] - adapter_params + 2
    assert {v["path"] for v in plan["variables"] if v["trainable"]} == set(adapters)
    mirrored = {slot["reference"] for slot in plan["optimizer_variables"] if "reference" in slot}
    assert mirrored == set(adapters)  # Adam's two moments of every adapter, of nothing else
    assert plan["lora_adapters"] == {
        "variables": 8,
        "params": adapter_params,
        "placed_by_rules": 0,
        "bytes_per_device": 4 * adapter_params,
    }
    assert all(
        placed["spec"] == [None] * len(placed["shape"]) and placed["rule"] is None
        for placed in adapters.values()
    )
    assert metrics["memory"]["planned_optimizer_bytes_per_device"] < 3 * 4 * adapter_params
    assert (
        metrics["memory"]["optimizer_bytes_per_device"]
        == metrics["memory"]["planned_optimizer_bytes_per_device"]
    )
    # The preset went onto its shards (tests/test_load_onto_shards.py): no device held more than its planned
    # weights.
    assert (
        metrics["memory"]["load_peak_bytes_per_device"]
        <= 1.3 * metrics["memory"]["planned_params_bytes_per_device"]
    )
    assert metrics["memory"]["load_peak_host_bytes"] > 0
    assert (
        metrics["flops"]["analytic_formula"] == "(4·N+2·T)·tokens"
    )  # frozen weights get no weight gradients
    assert 0.7 < metrics["flops"]["analytic_over_xla"] < 1.3


# Run by a plain Python with no meshrun imported: the exported preset, the base preset with the
# exported adapter's update added by hand (A (in, r) @ B (r, out), alpha / r, reshaped to the kernel),
# and model.keras, on the same tokens.
CHECK_EXPORTS = """
import json, sys
import h5py
import numpy as np
import keras, keras_hub
base_dir, run_dir = sys.argv[1], sys.argv[2]
tokens = {"token_ids": (np.arange(32).reshape(2, 16) * 7 + 3) % 512,
          "padding_mask": np.ones((2, 16), "int32")}
merged = keras_hub.models.CausalLM.from_preset(run_dir + "/preset")
base = keras_hub.models.CausalLM.from_preset(base_dir)
base_logits = np.asarray(base(tokens))
base_weights = {v.path: np.asarray(v) for v in base.backbone.variables}
merged_weights = {v.path: np.asarray(v) for v in merged.backbone.variables}
merged_off, adapted = 0.0, []
with h5py.File(run_dir + "/adapter.lora.h5", "r") as adapter:
    scale = adapter.attrs["alpha"] / adapter.attrs["rank"]
    rank = int(adapter.attrs["rank"])
    for variable in base.backbone.variables:
        layer = variable.path.rsplit("/", 1)[0]
        if variable.path.endswith("/kernel") and layer in adapter:
            a, b = adapter[layer]["lora_kernel_a"][()], adapter[layer]["lora_kernel_b"][()]
            heads, hidden, head_dim = variable.shape  # Gemma's q/v kernel: (heads, hidden, head_dim)
            assert a.shape == (hidden, rank) and b.shape == (rank, heads * head_dim)
            update = (scale * a @ b).reshape(hidden, heads, head_dim).transpose(1, 0, 2)
            variable.assign(base_weights[variable.path] + update)
            off = np.abs(merged_weights[variable.path] - np.asarray(variable)).max()
            merged_off = max(merged_off, float(off))
            adapted.append(layer)
changed = sorted(p for p, value in merged_weights.items() if not np.array_equal(value, base_weights[p]))
text = "Instruction: What colour is the sky?"
print(json.dumps({
    "merged_vs_adapter": float(np.abs(np.asarray(merged(tokens)) - np.asarray(base(tokens))).max()),
    "merged_vs_base": float(np.abs(np.asarray(merged(tokens)) - base_logits).max()),
    "keras_file_vs_merged": float(np.abs(np.asarray(keras.saving.load_model(run_dir + "/model.keras")(tokens))
                                         - np.asarray(merged(tokens))).max()),
    "merged_kernels_off": merged_off, "changed": changed, "adapted": sorted(adapted),
    "preprocessor": type(merged.preprocessor).__name__,
    "same_tokens": (np.asarray(merged.preprocessor.tokenizer(text)).tolist()
                    == np.asarray(base.preprocessor.tokenizer(text)).tolist()),
    "meshrun_imported": "meshrun" in sys.modules,
}))
"""


def test_the_exports_load_in_plain_keras_hub_merged_and_as_base_plus_adapter(lora_run, base_preset, tmp_path):
    """The preset holds the adapters merged (the base's weights but the adapted kernels, which
    equal base + alpha / r * A @ B of the adapter file, reshaped to the kernel) and the base
    preset's tokenizer; base + adapter gives its logits, which differ from the base's; model.keras
    holds the same model. The run trained
    with LoRA dropout, which leaves the merge as it is: base + scale * A @ B of the trained adapters."""
    metrics, run_dir = lora_run
    assert metrics["checkpoint"]["exported"] == str(run_dir / "model.keras")
    assert metrics["checkpoint"]["exported_preset"] == str(run_dir / "preset")
    assert metrics["checkpoint"]["exported_adapter"] == str(run_dir / "adapter.lora.h5")
    saved_config = (run_dir / "preset" / "config.json").read_text() + (
        run_dir / "preset" / "task.json"
    ).read_text()
    assert "lora" not in saved_config
    metadata = json.loads((run_dir / "preset" / "metadata.json").read_text())
    assert metadata["parameter_count"] == metrics["model"]["params"] - metrics["model"]["trainable_params"]
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".partial")]
    done = subprocess.run(
        [sys.executable, "-c", CHECK_EXPORTS, str(base_preset), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["merged_vs_adapter"] < 1e-4 < found["merged_vs_base"], found
    assert found["keras_file_vs_merged"] < 1e-5, found
    assert found["merged_kernels_off"] < 1e-6, found
    assert found["changed"] == sorted(
        f"decoder_block_{i}/attention/{layer}/kernel" for i in range(2) for layer in ("query", "value")
    )
    assert found["adapted"] == [
        f"decoder_block_{i}/attention/{layer}" for i in range(2) for layer in ("query", "value")
    ]
    assert (
        found["preprocessor"] == "GemmaCausalLMPreprocessor"
        and found["same_tokens"]
        and not found["meshrun_imported"]
    )


def test_meshrun_puts_the_adapter_file_back_on_the_base_and_refuses_another_rank(lora_run, base_preset):
    """load_adapter (what `meshrun generate` runs) on the base preset gives the merged preset's
    logits; the same file for a run of another rank is refused."""
    import keras
    import keras_hub

    from meshrun.models.hub.export import AdapterFileMismatch, load_adapter
    from meshrun.models.hub.options import LoraOptions

    _, run_dir = lora_run
    keras.distribution.set_distribution(None)
    keras.config.set_dtype_policy("float32")
    tokens = {
        "token_ids": (np.arange(32).reshape(2, 16) * 7 + 3) % 512,
        "padding_mask": np.ones((2, 16), "int32"),
    }
    merged = keras_hub.models.CausalLM.from_preset(str(run_dir / "preset"), preprocessor=None)
    base = keras_hub.models.CausalLM.from_preset(str(base_preset), preprocessor=None)
    lora = LoraOptions(rank=RANK, alpha=ALPHA, dropout=DROPOUT)
    load_adapter(base, lora, run_dir / "adapter.lora.h5")
    np.testing.assert_allclose(np.asarray(base(tokens)), np.asarray(merged(tokens)), atol=1e-4, rtol=0)
    other = keras_hub.models.CausalLM.from_preset(str(base_preset), preprocessor=None)
    with pytest.raises(AdapterFileMismatch, match="no adapters of rank 2"):
        load_adapter(other, LoraOptions(rank=2), run_dir / "adapter.lora.h5")


def test_a_lora_fine_tune_stopped_by_sigterm_then_killed_resumes_exactly(text_files, tmp_path):
    """A LoRA fine-tune on text (the model's dropout and LoRA dropout on, so training draws random
    numbers) is stopped by SIGTERM, run again and killed with SIGKILL mid-epoch (both real
    processes), then run a third time: it restores the adapters, their optimizer state, the data
    position and the RNG (the LoRA dropout's seed generator included) each time, and ends with the
    losses, eval loss and adapters of the run never interrupted."""
    from presets import corpus_text

    preset = gemma_preset(tmp_path / "preset", corpus_text(), num_key_value_heads=4, dropout=0.1)
    checkpoints = tmp_path / "checkpoints"
    command = [
        "train",
        "model=keras_hub",
        f"model.preset={preset}",
        *LORA,
        "model.lora.dropout=0.1",
        *ON_2X4,
        "data=text",
        f"data.files=[{text_files.instructions}]",
        f"data.prompt='{INSTRUCTION_PROMPT}'",
        "data.completion='{response}'",
        "data.eval_fraction=0.1",
        f"data.cache_dir={tmp_path / 'tokens'}",
        "train.epochs=2",
        "train.batch_size=8",
        "train.verbose=0",
        "train.learning_rate=0.01",
        "checkpoint.every_steps=5",
        "checkpoint.keep=2",
        "checkpoint.export=true",
    ]
    cli.main([*command, f"hydra.run.dir={tmp_path / 'whole'}"])  # the run never interrupted, in this process
    assert read_metrics(tmp_path / "whole")["status"] == "ok"
    resumed = [*command, f"checkpoint.dir={checkpoints}"]
    stop_after(resumed, tmp_path / "stopped", checkpoints, at_step=20, stop=signal.SIGTERM, returncode=143)
    stop_after(
        resumed, tmp_path / "killed", checkpoints, at_step=50, stop=signal.SIGKILL, returncode=-signal.SIGKILL
    )
    cli.main(
        [*resumed, f"hydra.run.dir={tmp_path / 'final'}"]
    )  # the third run, in this process (the resume is not about a process)
    assert read_metrics(tmp_path / "final")["status"] == "ok"
    stopped, metrics, reference = (read_metrics(tmp_path / name) for name in ("stopped", "final", "whole"))
    assert stopped["status"] == "preempted" and stopped["train"]["stopped"]["signal"] == "SIGTERM"
    assert 50 <= metrics["checkpoint"]["resumed_at_step"] < reference["train"]["updates"]
    assert metrics["checkpoint"]["resumed_at_step"] % reference["train"]["steps_per_epoch"] != 0  # mid-epoch
    assert metrics["history"]["loss"] == pytest.approx(reference["history"]["loss"], abs=1e-6)
    assert metrics["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], abs=1e-6)
    adapters = [adapter_weights(tmp_path / name / "adapter.lora.h5") for name in ("final", "whole")]
    assert adapters[0].keys() == adapters[1].keys() and sum(is_adapter(key) for key in adapters[0]) == 8
    for key, value in adapters[0].items():
        np.testing.assert_allclose(value, adapters[1][key], atol=1e-6, rtol=0)


def plan_json(args: list[str], capsys) -> dict:
    try:
        cli.main(["plan", "model=keras_hub", *args, "model.seq_len=16", "--json"])
    except SystemExit as exit_info:
        assert exit_info.code == 2
    return json.loads(capsys.readouterr().out)


def test_a_rule_that_catches_adapters_is_a_warning_and_one_they_do_not_divide_is_an_error(
    base_preset, capsys
):
    """A rule written for the MLP's kernels that also matches the adapters of a LoRA on them
    places them (a warning naming the rule); an adapter dimension the mesh cannot divide is a
    layout error like any other."""
    preset = f"model.preset={base_preset}"
    catching = plan_json(
        [
            preset,
            *LORA,
            "model.lora.targets=[ffw_gating]",
            "mesh=2x4",
            "layout.rules={decoder_block_\\d+/ffw_gating.*:[null,model]}",
        ],
        capsys,
    )
    assert catching["status"] == "ok", catching["errors"]
    warned = [w for w in catching["warnings"] if "LoRA adapter" in w]
    assert len(warned) == 1, catching["warnings"]
    assert warned[0].startswith(
        "rule 'decoder_block_\\d+/ffw_gating.*' (rules) also places the LoRA adapter "
        "decoder_block_0/ffw_gating/lora_kernel_a and 3 more adapter variables"
    ), warned[0]
    assert catching["lora_adapters"]["placed_by_rules"] == 4
    indivisible = plan_json(
        [
            preset,
            *LORA,
            "mesh=1x8",
            "layout.rules={decoder_block_\\d+/attention/query/lora_kernel_a:[null,model]}",
        ],
        capsys,
    )
    assert indivisible["status"] == "error"
    assert any("lora_kernel_a" in e and "(size 4" in e for e in indivisible["errors"]), indivisible["errors"]


def test_lora_in_the_plan_text(base_preset, capsys):
    cli.main(["plan", "model=keras_hub", f"model.preset={base_preset}", *LORA, *ON_2X4, "model.seq_len=16"])
    out = capsys.readouterr().out
    assert "trains" in out and "frozen" in out
    assert "optimizer state only for those" in out and "all replicated (they are small)" in out


BAD = {
    "rank 0": (["model.lora.rank=0"], "model.lora.rank: got 0; valid: a positive integer"),
    "negative alpha": (
        ["model.lora.rank=4", "model.lora.alpha=-2"],
        "model.lora.alpha: got -2; valid: a positive number",
    ),
    "alpha without a rank": (
        ["model.lora.alpha=16"],
        "model.lora.alpha: got 16 with model.lora.rank=null, which leaves LoRA off",
    ),
    "dropout of 1": (
        ["model.lora.rank=4", "model.lora.dropout=1"],
        "model.lora.dropout: got 1; valid: a number in [0, 1) (the share of each adapter's input dropped in "
        "training), 0 for none",
    ),
    "negative dropout": (
        ["model.lora.rank=4", "model.lora.dropout=-0.1"],
        "model.lora.dropout: got -0.1; valid: a number in [0, 1)",
    ),
    "dropout without a rank": (
        ["model.lora.dropout=0.1"],
        "model.lora.dropout: got 0.1 with model.lora.rank=null, which leaves LoRA off; set model.lora.rank",
    ),
    "dropout with pipeline stages": (
        [
            "model.lora.rank=4",
            "model.lora.dropout=0.1",
            "mesh=2x4",
            "mesh.axis_names=[stage,data]",
            "mesh.batch_axis=data",
        ],
        "model.lora.dropout: got 0.1 with pipeline stages, which cannot hand on dropout's random state yet; "
        "set model.lora.dropout=0, or train without a stage axis",
    ),
    "a misspelt key": (
        ["model.lora.rnak=4"],
        "model.lora.rnak: no such key (got override 'model.lora.rnak=4'); did you mean model.lora.rank?",
    ),
    "a layer the backbone lacks": (
        ["model.lora.rank=4", "model.lora.targets=[quary,value]"],
        "model.lora.targets: got ['quary', 'value'], but GemmaBackbone has no Dense or EinsumDense layer "
        "named 'quary'; did you mean query? valid: attention_output, "
        "ffw_gating, ffw_gating_2, ffw_linear, key, query or value",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_lora_values_are_one_line_with_exit_2(name, in_tmp, capsys):
    args, expected = BAD[name]
    gemma = [
        "model.task=GemmaCausalLM",
        "model.backbone={vocabulary_size:256,num_layers:1,num_query_heads:2,num_key_value_heads:1,hidden_dim:32,intermediate_dim:64,head_dim:16}",
    ]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "model=keras_hub", *gemma, *args, "model.seq_len=16", "train.verbose=0"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"meshrun: error: {expected}"), lines[0]
    assert list(in_tmp.iterdir()) == []


# --- LoRA dropout (model.lora.dropout) on the layers themselves -----------------------------------

TINY_GEMMA = dict(
    vocabulary_size=256,
    num_layers=1,
    num_query_heads=2,
    num_key_value_heads=1,
    hidden_dim=32,
    intermediate_dim=64,
    head_dim=16,
    dropout=0.0,
)
TOKENS = {"token_ids": np.arange(32).reshape(2, 16) * 7 % 256, "padding_mask": np.ones((2, 16), "int32")}


def tiny_gemma(dropout: float, targets=("query", "value", "ffw_gating", "attention_output")):
    """A one-block GemmaBackbone with rank-4 adapters (alpha 8) on `targets` (none when empty),
    its weights drawn from seed 1."""
    import keras
    import keras_hub

    from meshrun.models.hub.lora import enable_lora
    from meshrun.models.hub.options import LoraOptions

    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GemmaBackbone(**TINY_GEMMA)
    if targets:
        enable_lora(backbone, LoraOptions(rank=RANK, alpha=ALPHA, targets=targets, dropout=dropout))
    return backbone


def test_lora_dropout_changes_training_alone_and_only_through_the_adapters():
    """With B = 0 (as LoRA starts) the training output is the base's exactly: the dropout touches
    the adapters' path alone. With trained adapters, training draws a new mask each call, while
    inference is exactly the model without LoRA dropout. One seed generator serves every layer."""
    from meshrun.models.hub.lora import adapted_layers

    dropping, plain = tiny_gemma(0.5), tiny_gemma(0.0)
    seeds = [v.path for v in dropping.variables if "seed" in v.path]
    assert seeds == ["lora_dropout/seed_generator_state"]
    assert not [v for v in plain.variables if "seed" in v.path]
    np.testing.assert_array_equal(np.asarray(dropping(TOKENS, training=True)), np.asarray(plain(TOKENS)))
    rng = np.random.default_rng(0)
    for mine, theirs in zip(adapted_layers(dropping), adapted_layers(plain), strict=True):
        b = rng.normal(scale=0.3, size=mine.lora_kernel_b.shape)
        mine.lora_kernel_b.assign(b)
        theirs.lora_kernel_b.assign(b)
    inference = np.asarray(dropping(TOKENS))
    np.testing.assert_array_equal(inference, np.asarray(plain(TOKENS)))
    np.testing.assert_array_equal(np.asarray(dropping(TOKENS, training=False)), inference)
    first, second = (np.asarray(dropping(TOKENS, training=True)) for _ in range(2))
    assert np.abs(first - inference).max() > 1e-3 and np.abs(second - first).max() > 1e-3


def adapted_alone(layer, shape):
    """`layer` as the one layer of a model on inputs of `shape`, its bias drawn, with a rank-2
    adapter of alpha 6 (scale 3) whose B is drawn too, dropping 0.4 of its input in training: the
    model, the adapter, the seed generator of its masks, and the kernel and bias before the adapter."""
    import keras

    from meshrun.compat.keras.lora import add_adapter, drop_inputs

    inputs = keras.Input(batch_shape=shape)
    model = keras.Model(inputs, layer(inputs))
    rng = np.random.default_rng(0)
    if layer.bias is not None:
        layer.bias.assign(rng.normal(size=layer.bias.shape))
    kernel, bias = np.asarray(layer.kernel), 0 if layer.bias is None else np.asarray(layer.bias)
    adapter = add_adapter(layer, 2, 6)
    adapter.b.assign(rng.normal(size=adapter.b.shape))
    seeds = keras.random.SeedGenerator(3)
    drop_inputs(layer, 0.4, seeds)
    return model, adapter, seeds, kernel, bias


LAYERS = {  # a layer, its input's shape, what it computes of x and its kernel, and PEFT's (in, out)
    "dense with an activation": (lambda k: k.layers.Dense(6, activation="tanh"), (2, 3, 5), None, (5, 6)),
    "q/k/v (hidden, heads, head_dim)": (
        lambda k: k.layers.EinsumDense("btd,dnh->btnh", (3, 2, 4), bias_axes="nh"),
        (2, 3, 5),
        "btd,dnh->btnh",
        (5, 8),
    ),
    "Gemma's q/k/v (heads, hidden, head_dim)": (
        lambda k: k.layers.EinsumDense("btd,ndh->btnh", (3, 2, 4)),
        (2, 3, 5),
        "btd,ndh->btnh",
        (5, 8),
    ),
    "output (heads, head_dim, hidden)": (
        lambda k: k.layers.EinsumDense("btnh,nhd->btd", (3, 5)),
        (2, 3, 2, 4),
        "btnh,nhd->btd",
        (8, 5),
    ),
    "output axes in another order": (
        lambda k: k.layers.EinsumDense("abd,dn->anb", (6, 3)),
        (2, 3, 5),
        "abd,dn->anb",
        (5, 6),
    ),
}


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_an_adapter_is_peft_s_and_its_dropout_gives_peft_s_formula(kind):
    """An adapted layer's A is (in, r) and B (r, out) over its kernel as a matrix (PEFT's, r * (in +
    out) parameters), whatever axes its kernel has. In training it gives activation(x W + b + scale
    * dropout(x) A B), PEFT's lora_dropout, with the mask its seed generator draws; outside
    training, that of the merged kernel W + scale * A B reshaped to the kernel."""
    import keras

    keras.utils.set_random_seed(2)
    make, shape, equation, (fan_in, fan_out) = LAYERS[kind]
    layer = make(keras)
    model, adapter, seeds, kernel, bias = adapted_alone(layer, shape)
    assert adapter.a.shape == (fan_in, 2) and adapter.b.shape == (2, fan_out)
    assert adapter.geometry.parameters(2) == 2 * (fan_in + fan_out)
    assert np.abs(np.asarray(adapter.a)).max() <= 1 / math.sqrt(fan_in)  # PEFT's kaiming_uniform(a=sqrt(5))
    x = np.random.default_rng(1).normal(size=shape).astype("float32")
    replay = keras.random.SeedGenerator(0)
    replay.state.assign(seeds.state)  # the state the mask is drawn from
    trained = np.asarray(model(x, training=True))
    dropped = np.asarray(keras.random.dropout(x, 0.4, seed=replay))
    update = adapter.delta(np)
    assert update.shape == kernel.shape

    def applied(inputs, weights):
        return np.einsum(equation, inputs, weights) if equation else inputs @ weights

    activation = np.tanh if equation is None else (lambda outputs: outputs)
    expected = activation(applied(x, kernel) + bias + applied(dropped, update))
    np.testing.assert_allclose(trained, expected, atol=1e-5, rtol=1e-5)
    merged = activation(applied(x, kernel + update) + bias)
    np.testing.assert_allclose(np.asarray(model(x)), merged, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_a_quantized_layer_adds_its_adapter_and_drops_its_input(mode):
    """A quantized EinsumDense (QLoRA) adds its adapter to its quantized call, its input dropped in
    training: its dequantized kernel's output + scale * dropout(x) A B, and outside training that
    of the dequantized kernel + scale * A B; B gets a gradient."""
    import jax
    import keras

    from meshrun.compat.keras.lora import add_adapter, drop_inputs
    from meshrun.compat.keras.quantized import dequantized_kernel

    keras.utils.set_random_seed(2)
    layer = keras.layers.EinsumDense("btd,dnh->btnh", (3, 2, 4))
    inputs = keras.Input(batch_shape=(2, 3, 5))
    model = keras.Model(inputs, layer(inputs))
    layer.quantize(mode)
    adapter = add_adapter(layer, 2, 6)
    adapter.b.assign(np.random.default_rng(0).normal(size=adapter.b.shape))
    seeds = keras.random.SeedGenerator(3)
    drop_inputs(layer, 0.4, seeds)
    # int8 quantizes its inputs too: +-1 inputs are quantized exactly.
    x = np.where(np.random.default_rng(1).random((2, 3, 5)) < 0.5, -1.0, 1.0).astype("float32")
    kernel, update = dequantized_kernel(layer), adapter.delta(np)
    replay = keras.random.SeedGenerator(0)
    replay.state.assign(seeds.state)
    trained = np.asarray(model(x, training=True))
    dropped = np.asarray(keras.random.dropout(x, 0.4, seed=replay))
    expected = np.einsum(layer.equation, x, kernel) + np.einsum(layer.equation, dropped, update)
    np.testing.assert_allclose(trained, expected, atol=1e-4, rtol=1e-4)
    merged = np.einsum(layer.equation, x, kernel + update)
    np.testing.assert_allclose(np.asarray(model(x)), merged, atol=1e-4, rtol=1e-4)

    def loss(b):
        values = [b if v is adapter.b else v.value for v in model.trainable_variables]
        outputs, _ = model.stateless_call(values, [v.value for v in model.non_trainable_variables], x)
        return (outputs**2).sum()

    assert np.abs(np.asarray(jax.grad(loss)(adapter.b.value))).max() > 0


@pytest.mark.unit
def test_a_kernel_per_head_takes_no_adapter():
    from meshrun.compat.keras.lora import geometry

    with pytest.raises(ValueError, match="keeps a kernel axis in both its input and its output"):
        geometry("btnh,nhd->btnd", (2, 4, 5))


def test_an_adapter_loaded_to_sample_gets_no_lora_dropout(tmp_path):
    """`meshrun generate` puts a dropout run's adapter file on the base model without LoRA dropout:
    no seed generator, and the logits of the trained model at inference."""
    import keras_hub

    from meshrun.models.hub.export import load_adapter, save_adapter
    from meshrun.models.hub.options import LoraOptions

    targets = ("query", "value")
    lora = LoraOptions(rank=RANK, alpha=ALPHA, targets=targets, dropout=0.1)
    trained = tiny_gemma(0.1, targets)
    for b in (v for v in trained.variables if v.path.endswith("lora_kernel_b")):
        b.assign(np.full(b.shape, 0.05))
    path = save_adapter(trained, lora, tmp_path / "adapter.lora.h5")
    base = keras_hub.models.GemmaCausalLM(backbone=tiny_gemma(0.0, targets=()), preprocessor=None)
    load_adapter(base, lora, path)
    assert not [v.path for v in base.backbone.variables if "seed" in v.path]
    np.testing.assert_allclose(
        np.asarray(base.backbone(TOKENS)), np.asarray(trained(TOKENS)), atol=1e-5, rtol=1e-5
    )
