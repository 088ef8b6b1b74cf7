"""model=keras_hub: KerasHub causal LMs by class and backbone arguments (or a local preset) through
the CLI on 8 emulated CPU devices: a tiny Llama and a tiny Gemma with their own layout maps
(layout=from_model) and with meshrun's layouts give the same losses on every mesh; the loss counts
only real tokens; a checkpoint resumes on another mesh; the export loads with plain Keras and
keras_hub; the plan warns about KerasHub's known-wrong maps; bad input is one line with exit 2."""

import json
import math
import shutil
import sys

import numpy as np
import pytest

from conftest import read_metrics, train_here
from meshrun import cli
from meshrun.measure import run_measured
from meshrun.wording import format_bytes

pytestmark = pytest.mark.integration

GIB = 1 << 30
HUB = ["model=keras_hub"]
# The Llama and the Gemma of one block each (a block more compiles seconds more in each of their runs
# and is read by no check); the multi-query Gemma has two, its tests read the second block.
LLAMA_SIZES = (
    "vocabulary_size:256,num_layers:1,num_query_heads:8,num_key_value_heads:4,"
    "hidden_dim:64,intermediate_dim:128"
)
LLAMA = ["model.task=LlamaCausalLM", f"model.backbone={{{LLAMA_SIZES}}}"]
GEMMA = [
    "model.task=GemmaCausalLM",
    "model.backbone={vocabulary_size:256,num_layers:1,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128,head_dim:8}",
]
# One eval batch, so the eval loss is the loss of one batch (checked by hand below).
FAST = [
    "train.verbose=0",
    "train.epochs=2",
    "data.num_samples=64",
    "data.eval_samples=16",
    "model.seq_len=16",
]
# Gemma 2B's attention in small: 8 query heads and one key/value head (multi-query), LoRA on top.
GEMMA_MQA = [
    "model.task=GemmaCausalLM",
    "model.lora.rank=4",
    "model.backbone={vocabulary_size:256,num_layers:2,num_query_heads:8,num_key_value_heads:1,hidden_dim:64,intermediate_dim:128,head_dim:8}",
]
# (model, layout, mesh): each model on two meshes, under its own map and under meshrun's layout; the
# multi-query Gemma under gemma_tp on 1x8 (its key/value head whole), against FSDP, which splits no head.
RUNS = [
    ("llama", "from_model", "2x4"),
    ("llama", "llama_tp", "8x1"),
    ("gemma", "from_model", "8x1"),
    ("gemma", "gemma_tp", "2x4"),
    ("gemma_mqa", "gemma_fsdp", "8x1"),
    ("gemma_mqa", "gemma_tp", "1x8"),
]
MODELS = {"llama": LLAMA, "gemma": GEMMA, "gemma_mqa": GEMMA_MQA}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every (model, layout, mesh) of RUNS trained in this process; the llama_tp run also exports,
    the Llama's from_model run checkpoints every epoch (into its run dir)."""
    out = tmp_path_factory.mktemp("hub")
    results = {}
    for model, layout, mesh in RUNS:
        run_dir = out / f"{model}-{layout}-{mesh}"
        extra = {
            "llama_tp": ["checkpoint.export=true"],
            "from_model": ["checkpoint.every_epoch=true"] if model == "llama" else [],
        }
        args = [*MODELS[model], f"layout={layout}", f"mesh={mesh}", *FAST, *extra.get(layout, [])]
        results[(model, layout, mesh)] = (train_here([*HUB, *args], run_dir), run_dir)
    return results


@pytest.mark.smoke
@pytest.mark.hub
@pytest.mark.parametrize("model", ["llama", "gemma", "gemma_mqa"])
def test_losses_agree_across_meshes_and_layouts(runs, model):
    mine = [key for key in RUNS if key[0] == model]
    reference = runs[mine[0]][0]
    assert len(reference["history"]["loss"]) == 2
    for key in mine[1:]:
        metrics = runs[key][0]
        assert metrics["history"]["loss"] == pytest.approx(reference["history"]["loss"], abs=1e-4), key
        assert metrics["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], abs=1e-4), key
    assert reference["eval"]["perplexity"] == pytest.approx(math.exp(reference["eval"]["loss"]), rel=1e-6)


def test_from_model_places_by_kerashubs_map_with_its_origin(runs):
    metrics, run_dir = runs[("llama", "from_model", "2x4")]
    query = metrics["sharding"]["transformer_layer_0/self_attention/query/kernel"]
    assert query["spec"] == ["model", "data", None]  # KerasHub's own rule: hidden over model, heads over data
    assert (
        query["origin"] == "from_model"
        and query["rule"] == "transformer_layer.*self_attention.*(query|key|value).kernel"
    )
    assert (
        metrics["sharding"]["token_embedding/reverse_embeddings"]["rule"] is None
    )  # no rule in KerasHub's map
    assert metrics["layout"]["from_model"] is True and set(metrics["layout"]["origins"].values()) == {
        "from_model"
    }
    plan = json.loads((run_dir / "plan.json").read_text())
    planned = {v["path"]: v for v in plan["variables"]}
    for path, placed in metrics["sharding"].items():
        assert (
            placed["spec"] == planned[path]["spec"]
            and placed["bytes_per_device"] == planned[path]["bytes_per_device"]
        ), path


def test_meshruns_llama_layout_is_megatron_style(runs):
    sharding = runs[("llama", "llama_tp", "8x1")][0]["sharding"]
    assert sharding["transformer_layer_0/self_attention/query/kernel"]["spec"] == [None, "model", None]
    assert sharding["transformer_layer_0/self_attention/attention_output/kernel"]["spec"] == [
        "model",
        None,
        None,
    ]
    assert sharding["token_embedding/reverse_embeddings"]["spec"] == [None, "model"]
    gemma = runs[("gemma", "gemma_tp", "2x4")][0]["sharding"]
    assert gemma["decoder_block_0/attention/query/kernel"]["spec"] == [
        "model",
        None,
        None,
    ]  # Gemma: heads first
    assert gemma["decoder_block_0/ffw_gating_2/kernel"]["spec"] == [None, "model"]


def test_a_one_key_value_head_gemma_trains_with_lora_under_gemma_tp_on_1x8(runs):
    """Gemma 2B's shape of attention under the fine-tune page's layout: the key/value kernels
    stay whole on every device (one note in the plan says so), the query heads are split, the
    adapters train, and the run placed everything where its plan said."""
    metrics, run_dir = runs[("gemma_mqa", "gemma_tp", "1x8")]
    sharding = metrics["sharding"]
    assert sharding["decoder_block_1/attention/key/kernel"]["spec"] == [None, None, None]
    assert (
        sharding["decoder_block_1/attention/value/kernel"]["rule"]
        == r"decoder_block_\d+/attention/(query|key|value)/kernel"
    )
    assert sharding["decoder_block_1/attention/query/kernel"]["spec"] == ["model", None, None]
    assert 0 < metrics["model"]["trainable_params"] < metrics["model"]["params"]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["status"] == "ok"
    assert [w for w in plan["warnings"] if w.startswith("rule '")] == [
        r"rule 'decoder_block_\d+/attention/(query|key|value)/kernel' "
        r"cannot split dimension 0 of 'decoder_block_0/attention/key/kernel' "
        "(size 1, shape (1, 64, 8)) over mesh axis 'model' of size 8, so it keeps that dimension whole, "
        "replicated over 'model'; the same for 3 more paths (8.00 KiB in all)"
    ]
    planned = {v["path"]: v for v in plan["variables"]}
    for path, placed in sharding.items():
        assert (
            placed["spec"] == planned[path]["spec"]
            and placed["bytes_per_device"] == planned[path]["bytes_per_device"]
        ), path


def test_a_hub_model_reports_tokens_and_flops_like_the_zoo_lm(runs):
    metrics = runs[("llama", "llama_tp", "8x1")][0]
    assert metrics["model"]["label"] == "LlamaCausalLM"
    assert metrics["model"]["inputs"] == [
        {"name": "token_ids", "shape": [16], "dtype": "int32"},
        {"name": "padding_mask", "shape": [16], "dtype": "int32"},
    ]
    assert metrics["timing"]["tokens_per_s"] == pytest.approx(metrics["timing"]["samples_per_s"] * 16)
    assert 0.5 < metrics["flops"]["analytic_over_xla"] < 1.5
    assert metrics["data"]["family"] == "padded_tokens"
    assert set(metrics["eval"]) == {"loss", "accuracy", "perplexity"}


def test_the_loss_counts_only_real_tokens_and_the_export_loads_with_keras_hub(runs):
    """The exported model (plain Keras + keras_hub, no meshrun) on the run's one eval batch: its
    masked mean cross-entropy by hand equals the run's eval loss, and differs from the mean over
    every position (what KerasHub's default loss computes)."""
    import keras
    import keras_hub  # noqa: F401  (registers the classes the .keras file names)

    from meshrun.data.registry import DataContext
    from meshrun.data.synthetic import padded_tokens
    from meshrun.models.registry import InputSpec
    from meshrun.run.build import Signature

    metrics, run_dir = runs[("llama", "llama_tp", "8x1")]
    model = keras.saving.load_model(run_dir / "model.keras")
    assert type(model).__name__ == "LlamaCausalLM"
    signature = Signature(
        inputs=(InputSpec("token_ids", (16,), "int32"),), outputs=(InputSpec(None, (16, 256)),)
    )
    context = DataContext(
        model=None, model_options=None, batch_size=16, seed=metrics["train"]["seed"], signature=signature
    )
    features, labels, weights = padded_tokens(context, 16, seed=context.seed + 1)  # the eval split's seed
    assert 0 < weights.mean() < 1  # some padding
    logits = np.asarray(model.predict(features, batch_size=16, verbose=0), dtype=np.float64)
    top = logits.max(-1, keepdims=True)
    log_sum = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    cross_entropy = log_sum - np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    masked = (cross_entropy * weights).sum() / weights.sum()
    assert metrics["eval"]["loss"] == pytest.approx(masked, abs=1e-4)
    assert abs(cross_entropy.mean() - masked) > 1e-3


def test_a_hub_checkpoint_resumes_on_another_mesh_and_layout(runs, tmp_path):
    reference, run_dir = runs[("llama", "from_model", "2x4")]
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(run_dir / "checkpoints", checkpoints)
    shutil.rmtree(
        checkpoints / "8"
    )  # the first epoch's checkpoint (4 steps) is left, as a run of one epoch leaves it
    resumed = train_here(
        [
            *HUB,
            *LLAMA,
            *FAST,
            "checkpoint.every_epoch=true",
            f"checkpoint.dir={checkpoints}",
            "layout=llama_tp",
            "mesh=8x1",
        ],
        tmp_path / "resumed",
    )
    assert resumed["checkpoint"]["resumed_at_step"] == 4
    assert resumed["history"]["loss"] == pytest.approx(reference["history"]["loss"], abs=1e-4)
    assert resumed["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], abs=1e-4)


def test_arrays_feed_a_hub_model_named_inputs_and_sample_weights(runs, tmp_path):
    """A .npz of token_ids, padding_mask, labels and weights (as KerasHub's preprocessor makes them);
    the loss follows the weights: zero weights on every label of half the rows change it."""
    rng = np.random.default_rng(0)
    count, length = 64, 16
    tokens = rng.integers(1, 256, (count, length + 1)).astype("int32")
    weights = np.ones((count, length), "float32")
    arrays = dict(
        token_ids=tokens[:, :-1], padding_mask=np.ones((count, length), "int32"), labels=tokens[:, 1:]
    )
    np.savez(tmp_path / "tokens.npz", **arrays, weights=weights)
    half = weights.copy()
    half[::2] = 0.0
    np.savez(tmp_path / "half.npz", **arrays, weights=half)
    # The mesh and layout of a run of `runs`: the same step, found in the compilation cache.
    args = [
        *LLAMA,
        "model.seq_len=16",
        "data=arrays",
        "data.features_key=[token_ids,padding_mask]",
        "data.labels_key=labels",
        "data.sample_weight_key=weights",
        "mesh=8x1",
        "layout=llama_tp",
        "train.epochs=1",
        "train.verbose=0",
    ]
    full = train_here([*HUB, *args, f"data.path={tmp_path / 'tokens.npz'}"], tmp_path / "full")
    masked = train_here([*HUB, *args, f"data.path={tmp_path / 'half.npz'}"], tmp_path / "half")
    assert full["model"]["inputs"][0]["name"] == "token_ids" and full["data"]["read_by_rows"] is True
    assert full["eval"]["loss"] != pytest.approx(masked["eval"]["loss"], abs=1e-3)


def test_a_local_preset_brings_its_weights(runs, tmp_path):
    """A preset saved by KerasHub trains with its own weights (a learning rate of 1e-12 leaves
    them as they were: the export equals the preset)."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.LlamaBackbone(
        **{k: int(v) for k, v in (p.split(":") for p in LLAMA_SIZES.split(","))}
    )
    keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None, compile=False).save_to_preset(
        str(tmp_path / "preset")
    )
    saved = {v.path: np.asarray(v) for v in backbone.variables}
    keras.backend.clear_session()
    metrics = train_here(
        [
            *HUB,
            f"model.preset={tmp_path / 'preset'}",
            "mesh=8x1",
            "layout=llama_tp",
            *FAST,
            "train.epochs=1",
            "train.learning_rate=1e-12",
            "checkpoint.export=true",
        ],
        tmp_path / "run",
    )
    label = (
        f"LlamaCausalLM (preset {tmp_path / 'preset'})"  # the preset's own class, not the generic CausalLM
    )
    assert metrics["model"]["label"] == label
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["model"]["name"] == label
    exported = keras.saving.load_model(tmp_path / "run" / "model.keras")
    for variable in exported.backbone.variables:
        np.testing.assert_allclose(
            np.asarray(variable), saved[variable.path], atol=1e-6, err_msg=variable.path
        )


def plan_json(args: list[str], capsys) -> dict:
    try:
        cli.main(["plan", *HUB, *args, "--json"])
    except SystemExit as exit_info:
        assert exit_info.code == 2
    return json.loads(capsys.readouterr().out)


def test_the_plan_points_at_kerashubs_wrong_llama_map(capsys):
    big_vocab = [
        LLAMA[0],
        "model.backbone={vocabulary_size:8192,num_layers:2,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128}",
    ]
    plan = plan_json([*big_vocab, "mesh=2x4", "layout=from_model"], capsys)
    assert plan["status"] == "ok"
    heads, head = (
        [w for w in plan["warnings"] if "attention heads" in w],
        [w for w in plan["warnings"] if "untied output head" in w],
    )
    assert (
        len(heads) == 1
        and "over the batch axis 'data'" in heads[0]
        and "keras-hub #2795" in heads[0]
        and "layout=llama_tp" in heads[0]
    )
    assert len(head) == 1 and "token_embedding/reverse_embeddings" in head[0] and "2.00 MiB" in head[0]
    fixed = plan_json(
        [
            *big_vocab,
            "mesh=2x4",
            "layout=from_model",
            "layout.extra_rules={token_embedding/reverse_embeddings:[null,model]}",
        ],
        capsys,
    )
    placed = {v["path"]: v for v in fixed["variables"]}
    assert placed["token_embedding/reverse_embeddings"]["origin"] == "extra_rules"
    assert not [w for w in fixed["warnings"] if "untied output head" in w]
    ours = plan_json([*big_vocab, "mesh=2x4", "layout=llama_tp"], capsys)
    assert ours["status"] == "ok" and not [
        w for w in ours["warnings"] if "attention heads" in w or "untied" in w
    ]
    assert ours["per_device"]["params_bytes"] < plan["per_device"]["params_bytes"]


def test_kerashubs_map_on_a_batch_axis_that_does_not_divide_the_heads_keeps_them_whole_with_a_note(capsys):
    """KerasHub's map is written for a whole family: what the mesh cannot divide stays whole (here
    the 4 key/value heads KerasHub's Llama map puts on a batch axis of 8), the plan says so."""
    plan = plan_json([*LLAMA, "mesh=8x1", "layout=from_model"], capsys)
    assert plan["status"] == "ok", plan["errors"]
    placed = {v["path"]: v for v in plan["variables"]}
    assert placed["transformer_layer_0/self_attention/key/kernel"]["spec"] == ["model", None, None]
    assert placed["transformer_layer_0/self_attention/query/kernel"]["spec"] == [
        "model",
        "data",
        None,
    ]  # 8 query heads: split
    assert (
        "rule 'transformer_layer.*self_attention.*(query|key|value).kernel' (from_model) cannot split "
        "dimension 1 of 'transformer_layer_0/self_attention/key/kernel' (size 4"
    ) in plan["warnings"][0]


FAMILY_LAYOUTS = [
    (task, layout)
    for task in ("LlamaCausalLM", "MistralCausalLM", "QwenCausalLM")
    for layout in ("llama_tp", "llama_fsdp", "llama_2d")
]
FAMILY_LAYOUTS += [("GemmaCausalLM", layout) for layout in ("gemma_tp", "gemma_fsdp", "gemma_2d")]


@pytest.mark.parametrize("task,layout", FAMILY_LAYOUTS)
def test_meshruns_family_layouts_split_every_matrix_of_their_models(task, layout, capsys):
    """Planned on 2x4: no lint error, and every weight matrix is split (what stays whole on every
    device is the norms and, under FSDP, Qwen's small q/k/v biases)."""
    backbone = GEMMA[1] if task == "GemmaCausalLM" else LLAMA[1]
    plan = plan_json([f"model.task={task}", backbone, "mesh=2x4", f"layout={layout}"], capsys)
    assert plan["status"] == "ok", plan["errors"]
    whole = [
        v["path"]
        for v in plan["variables"]
        if len(v["shape"]) >= 2 and v["bytes_per_device"] == v["bytes"] and not v["path"].endswith("/bias")
    ]
    assert whole == []


@pytest.mark.e2e
def test_a_7b_llama_plans_fast_in_little_memory(tmp_path):
    sizes = (
        "vocabulary_size:32000,num_layers:32,num_query_heads:32,num_key_value_heads:32,"
        "hidden_dim:4096,intermediate_dim:11008"
    )
    done = run_measured(
        [
            "plan",
            *HUB,
            "model.task=LlamaCausalLM",
            f"model.backbone={{{sizes}}}",
            "mesh=1x8",
            "layout=llama_tp",
            "--json",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert 0 < done.peak_rss_bytes < 2 * GIB, format_bytes(done.peak_rss_bytes)
    assert done.wall_s < 60, f"{done.wall_s:.1f} s"
    plan = json.loads(done.stdout)
    assert plan["model"]["params"] == 6_738_415_616
    norms = (2 * 32 + 1) * 4096  # two per block and the final one: replicated; everything else split 8 ways
    assert plan["per_device"]["params_bytes"] == 4 * ((plan["model"]["params"] - norms) // 8 + norms)
    assert plan["errors"] == [] and plan["warnings"] == []


# Trains as `meshrun train ARGS` would, in this fresh process, then says whether TensorFlow came and
# keras_hub got it.
TRAIN_AND_SAY_TENSORFLOW = """
import json, sys
from meshrun import cli
from meshrun.compat.keras_hub import keras_hub_has_tensorflow
cli.main(["train", *sys.argv[1:]])
print(json.dumps({"tensorflow": "tensorflow" in sys.modules, "keras_hub has it": keras_hub_has_tensorflow()}))
"""


@pytest.mark.e2e
def test_keras_hub_imported_without_tensorflow_gets_it_when_tfrecord_data_comes(tmp_path):
    """The model is built (keras_hub imported without TensorFlow) before data=tfrecord imports
    TensorFlow; keras_hub gets it then, so its fit takes the tf.data pipeline (it would raise on
    inputs of rank 0 otherwise)."""
    import subprocess

    tf = pytest.importorskip("tensorflow", reason="data=tfrecord needs TensorFlow")
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(tmp_path / "train.tfrecord")) as writer:
        for ids in rng.integers(1, 256, (64, 17)):
            feature = {"token_ids": ids[:16], "padding_mask": np.ones(16, np.int64), "labels": ids[1:]}
            example = {
                k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in feature.items()
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=example)).SerializeToString())
    args = [
        *HUB,
        *LLAMA,
        "model.seq_len=16",
        "layout=from_model",
        "mesh=2x4",
        "train.verbose=0",
        "train.epochs=1",
        "data=tfrecord",
        f"data.files={tmp_path / 'train.tfrecord'}",
        "data.inputs=[token_ids,padding_mask]",
        "data.label=labels",
        "data.features={token_ids:{dtype:int64,shape:[16]},padding_mask:{dtype:int64,shape:[16]},labels:{dtype:int64,shape:[16]}}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_AND_SAY_TENSORFLOW, *args], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"tensorflow": True, "keras_hub has it": True}
    metrics = read_metrics(tmp_path / "run")
    assert metrics["status"] == "ok" and metrics["data"]["loader"] == "tf.data", metrics.get("error")


BAD = {
    "unknown class": (
        ["model.task=LlamaCausalLN", LLAMA[1]],
        ["model.task: got 'LlamaCausalLN'; did you mean LlamaCausalLM?"],
    ),
    "not a causal LM": (
        ["model.task=BertTextClassifier", LLAMA[1]],
        ["model.task: got 'BertTextClassifier', which is not a causal language model"],
    ),
    "backbone argument it does not take": (
        [
            LLAMA[0],
            "model.backbone={vocabulary_size:256,num_layers:2,num_query_heads:8,num_key_value_heads:4,hiden_dim:64,intermediate_dim:128}",
        ],
        ["model.backbone: got 'hiden_dim', which LlamaBackbone does not take; did you mean hidden_dim?"],
    ),
    "backbone argument missing": (
        [
            LLAMA[0],
            "model.backbone={vocabulary_size:256,num_layers:2,num_query_heads:8,num_key_value_heads:4,intermediate_dim:128}",
        ],
        ["model.backbone: is missing hidden_dim: LlamaBackbone requires it"],
    ),
    "backbone that raises": (
        [
            LLAMA[0],
            "model.backbone={vocabulary_size:0,num_layers:2,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128}",
        ],
        [
            "model.backbone: LlamaBackbone(vocabulary_size=0",
            "raised ValueError: `input_dim` must be a positive integer",
        ],
    ),
    "no layout map of its own": (
        ["model.task=MistralCausalLM", LLAMA[1], "layout=from_model", "mesh=2x4"],
        [
            "layout.from_model: got true, but KerasHub's MistralBackbone has no get_layout_map",
            "layout=llama_tp",
        ],
    ),
    "no layout map and no family": (
        [
            "model.task=GPT2CausalLM",
            "model.backbone={vocabulary_size:256,num_layers:2,num_heads:4,hidden_dim:64,intermediate_dim:128}",
            "layout=from_model",
            "mesh=2x4",
        ],
        [
            "layout.from_model: got true, but KerasHub's GPT2Backbone has no get_layout_map",
            "use layout=auto (rules derived from its variables",
        ],
    ),
    "from_model on a 1-D mesh": (
        [*LLAMA, "layout=from_model", "mesh=8"],
        ["layout.from_model: got true on mesh axes ['data']"],
    ),
    "rules with from_model": (
        [*LLAMA, "layout=from_model", "mesh=2x4", "layout.rules={x:[null]}"],
        ["layout.rules: got 1 rule with layout.from_model=true"],
    ),
    "no task": ([LLAMA[1]], ["model.task: is required"]),
    "no backbone": ([LLAMA[0]], ["model.backbone: is required with model.task=LlamaCausalLM"]),
    "a preset handle": (
        ["model.preset=llama3_8b_en"],
        ["model.preset: got 'llama3_8b_en', a preset handle; meshrun downloads nothing"],
    ),
    "a zoo model under from_model": (
        ["model=transformer", "layout=from_model", "mesh=2x4"],
        ["layout.from_model: got true, but transformer has no layout map of its own", "transformer_tp"],
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_hub_input_is_one_line_with_exit_2(name, in_tmp, capsys):
    args, expected = BAD[name]
    model = [] if args[0].startswith("model=") else HUB
    with pytest.raises(SystemExit) as exit_info:
        cli.main(
            ["train", *model, *args, "model.seq_len=16", "train.verbose=0"]
            if model
            else ["train", *args, "train.verbose=0"]
        )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("meshrun: error: "), err
    for part in expected:
        assert part in lines[0], (part, lines[0])
    assert list(in_tmp.iterdir()) == []


def test_without_keras_hub_the_model_says_how_to_install_it(in_tmp, capsys, monkeypatch):
    monkeypatch.setitem(
        sys.modules, "keras_hub", None
    )  # what `import keras_hub` meets when it is not installed
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", *HUB, *LLAMA, "model.seq_len=16", "train.verbose=0"])
    line = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2
    assert (
        line == "meshrun: error: model: model=keras_hub needs the keras-hub "
        "package, which is not installed: pip install 'meshrun[hub]'"
    )
