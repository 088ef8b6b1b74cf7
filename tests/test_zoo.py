"""The model zoo on 8 emulated CPU devices: every model with each of its layouts trains on two mesh
shapes (2x4, both axes split; 1x8, all on the model axis; a data axis alone is trained throughout the
rest of the suite); what a run places equals the plan (spec and bytes of every variable, optimizer
state); with a fixed seed the per-epoch losses do not depend on the mesh shape; FLOPs and memory
are reported."""

import math

import pytest

from conftest import layout_rules, train_in_process
from meshrun.models import get_model, model_names, zoo_model_names
from meshrun.specs.model import SYNTHETIC_FAMILIES

pytestmark = pytest.mark.integration

MESHES = ("2x4", "1x8")
# The zoo's models as the registry lists them (not the specs that build the user's models): a new
# model is trained here with each of its layouts without a change to this file.
ZOO = zoo_model_names()
COMBOS = [(model, layout) for model in ZOO for layout in get_model(model).layouts]


# The zoo's models are small: layout=auto shards variables of 1 KiB or more, and fully, so that on 2x4
# it splits over both axes and on 1x8 over the model axis.
AUTO = {"auto": True, "min_bytes": "1KiB", "fsdp": True}


def raw_config(model, layout, shape):
    return {
        "mesh": {"shape": shape},
        "layout": AUTO if layout == "auto" else {"rules": layout_rules(layout)},
        "model": {"name": model},
        "data": {"num_samples": 64, "eval_samples": 32},
        "train": {"epochs": 2, "verbose": 0},
    }


class Runs(dict):
    """(model, layout, shape) -> that run, trained in this process when a test first asks for it
    (so a test run alone, or a file split across workers, trains only the runs its tests read)."""

    def __missing__(self, key):
        self[key] = train_in_process(raw_config(*key))
        return self[key]


@pytest.fixture(scope="module")
def runs():
    """Every (model, layout) on every mesh shape, each trained once in this process when first read."""
    return Runs()


def test_every_model_has_layouts_and_matching_data():
    assert {"dense_model", "cnn", "transformer", "two_tower"} <= set(ZOO)
    assert set(model_names()) - set(ZOO) == {"python", "keras_hub"}
    assert get_model("transformer").layouts[:3] == ("transformer_tp", "transformer_fsdp", "transformer_2d")
    assert {get_model(m).data for m in ZOO} >= {"regression", "images", "tokens", "id_pairs"}
    for model in ZOO:
        spec = get_model(model)
        assert spec.layouts and spec.data in SYNTHETIC_FAMILIES, model


@pytest.mark.parametrize("model,layout", COMBOS)
def test_placed_variables_equal_the_plan(runs, model, layout):
    for shape in MESHES:
        result = runs[(model, layout, shape)]
        placed = result.metrics["sharding"]
        planned = {p.path: p for p in result.plan.variables}
        assert set(placed) == set(planned), (shape, set(placed) ^ set(planned))
        for path, plan in planned.items():
            assert placed[path]["spec"] == list(plan.spec), (shape, path)
            assert placed[path]["bytes_per_device"] == plan.bytes_per_device, (shape, path)
            assert placed[path]["rule"] == plan.rule, (shape, path)
        memory = result.metrics["memory"]
        assert memory["params_bytes_per_device"] == memory["planned_params_bytes_per_device"], shape
        assert memory["optimizer_bytes_per_device"] == memory["planned_optimizer_bytes_per_device"], shape


@pytest.mark.parametrize("model,layout", COMBOS)
def test_losses_agree_across_mesh_shapes(runs, model, layout):
    reference = runs[(model, layout, MESHES[0])].metrics
    assert len(reference["history"]["loss"]) == 2
    for shape in MESHES[1:]:
        metrics = runs[(model, layout, shape)].metrics
        assert metrics["history"]["loss"] == pytest.approx(reference["history"]["loss"], abs=1e-4), shape
        assert metrics["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], abs=1e-4), shape


@pytest.mark.parametrize("model", ZOO)
def test_auto_layout_trains_like_the_replicated_run(runs, model):
    for shape in MESHES:
        auto, replicated = runs[(model, "auto", shape)].metrics, runs[(model, "replicated", shape)].metrics
        assert auto["history"]["loss"] == pytest.approx(replicated["history"]["loss"], abs=1e-4), shape
        assert auto["eval"]["loss"] == pytest.approx(replicated["eval"]["loss"], abs=1e-4), shape
        origins = {v["origin"] for v in auto["sharding"].values() if v["rule"]}
        assert origins == {"auto"}, shape
        assert auto["memory"]["params_bytes_per_device"] < replicated["memory"]["params_bytes_per_device"], (
            shape
        )


@pytest.mark.parametrize("model,layout", [c for c in COMBOS if c[1] != "replicated"])
def test_layouts_shard_something_on_the_model_axis_mesh(runs, model, layout):
    result = runs[(model, layout, "2x4")]
    sharded = [p for p in result.plan.variables if not p.replicated]
    assert sharded, f"{layout} shards nothing for {model}"
    replicated = runs[(model, "replicated", "2x4")]
    assert result.plan.params_bytes_per_device < replicated.plan.params_bytes_per_device


def test_tensor_parallel_layout_is_megatron_style(runs):
    placed = runs[("transformer", "transformer_tp", "1x8")].metrics["sharding"]
    assert placed["block_0/attention/query/kernel"]["spec"] == [None, "model", None]
    assert placed["block_1/attention/attention_output/kernel"]["spec"] == ["model", None, None]
    assert placed["block_0/mlp_up/kernel"]["spec"] == [None, "model"]
    assert placed["block_0/mlp_down/kernel"]["spec"] == ["model", None]
    assert placed["token_embedding/embeddings"]["spec"] == ["model", None]
    assert placed["block_0/ln_1/gamma"]["spec"] == [None]
    fsdp = runs[("transformer", "transformer_fsdp", "2x4")].metrics["sharding"]
    assert fsdp["block_0/mlp_up/kernel"]["spec"] == ["data", None]
    two_d = runs[("transformer", "transformer_2d", "2x4")].metrics["sharding"]
    assert two_d["block_0/mlp_up/kernel"]["spec"] == ["data", "model"]
    assert two_d["block_0/mlp_up/kernel"]["bytes_per_device"] == 64 * 256 * 4 // 8


def test_embedding_tables_are_split_row_wise(runs):
    placed = runs[("two_tower", "two_tower", "1x8")].metrics["sharding"]
    table = placed["user_embedding/embeddings"]
    assert table["spec"] == ["model", None]
    assert table["bytes_per_device"] == 8192 * 32 * 4 // 8


@pytest.mark.parametrize("model,layout", COMBOS)
def test_flops_and_memory_are_reported(runs, model, layout):
    for shape in MESHES:
        result = runs[(model, layout, shape)]
        flops, memory = result.metrics["flops"], result.metrics["memory"]
        assert flops["per_step"] > 0 and flops["per_s"] > 0, (model, layout, shape)
        assert flops["per_step_per_device"] > 0  # on 1x8 every device runs the whole batch
        # CPU devices have no known peak: no MFU, never a made-up number.
        assert flops["peak_per_device"] is None and flops["mfu"] is None
        assert memory["peak_bytes_per_device"] >= memory["compiled"]["argument_bytes"] > 0
        assert memory["live_peak_bytes_per_device"] is None  # CPU reports no live peak


def test_transformer_reports_tokens_and_the_analytic_flops(runs):
    metrics = runs[("transformer", "transformer_tp", "2x4")].metrics
    timing, flops = metrics["timing"], metrics["flops"]
    assert timing["tokens_per_s"] == pytest.approx(timing["samples_per_s"] * 32)
    options = metrics["model"]["options"]
    assert options["seq_len"] == 32 and options["tied_head"] is True
    # 6 * N * tokens: N counts the parameters in matmuls (the tied embedding as the head, no
    # position embedding); XLA counts attention's score products and elementwise work on top.
    matmul_params = metrics["model"]["params"] - 32 * 64
    assert flops["analytic_per_step"] == 6 * matmul_params * 16 * 32
    assert 0.6 < flops["analytic_over_xla"] < 1.0
    assert runs[("cnn", "cnn", "2x4")].metrics["timing"]["tokens_per_s"] is None


def test_each_model_trains_with_its_own_loss(runs):
    losses = {model: runs[(model, get_model(model).layouts[0], "2x4")].metrics for model in ZOO}
    assert losses["dense_model"]["train"]["loss"] == "mse"
    assert losses["transformer"]["train"]["loss"] == "next_token_crossentropy"
    # Cross-entropy starts near log(classes) for a fresh classifier and goes down.
    assert losses["transformer"]["history"]["loss"][0] == pytest.approx(math.log(512), rel=0.1)
    assert losses["cnn"]["history"]["loss"][0] == pytest.approx(math.log(10), rel=0.2)
    assert losses["two_tower"]["history"]["loss"][0] == pytest.approx(math.log(2), rel=0.1)
    for metrics in losses.values():
        assert metrics["history"]["loss"][-1] < metrics["history"]["loss"][0]
