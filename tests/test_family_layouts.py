"""meshrun's family layouts (gemma_*, llama_*) and the models' own maps (layout=from_model) on the
real shapes of the models people fine-tune, planned on 1x8 and 1x16 (shapes alone, no weights):
Gemma 2B (8 query heads, 1 key/value head), Gemma 7B (16/16), Llama 3 8B (32/8) and Qwen 2.5 3B
(16/2). Every one plans; a head dimension the model axis cannot divide stays whole (replicated over
that axis) with one note per rule, every other dimension is split as the rule says, and the bytes
per device are those of shape arithmetic."""

from __future__ import annotations

import importlib.resources
import math

import pytest
import yaml

from meshrun.config.parse import parse_run_config
from meshrun.placement import devices
from meshrun.run import prepare

pytestmark = pytest.mark.integration
pytest.importorskip("keras_hub")

# (task, backbone arguments, family, head dimension of its q/k/v kernels): KerasHub's configs of the presets.
MODELS = {
    "gemma_2b": (
        "GemmaCausalLM",
        dict(
            vocabulary_size=256000,
            num_layers=18,
            num_query_heads=8,
            num_key_value_heads=1,
            hidden_dim=2048,
            intermediate_dim=32768,
            head_dim=256,
        ),
        "gemma",
        0,
    ),
    "gemma_7b": (
        "GemmaCausalLM",
        dict(
            vocabulary_size=256000,
            num_layers=28,
            num_query_heads=16,
            num_key_value_heads=16,
            hidden_dim=3072,
            intermediate_dim=49152,
            head_dim=256,
        ),
        "gemma",
        0,
    ),
    "llama3_8b": (
        "Llama3CausalLM",
        dict(
            vocabulary_size=128256,
            num_layers=32,
            num_query_heads=32,
            num_key_value_heads=8,
            hidden_dim=4096,
            intermediate_dim=14336,
        ),
        "llama",
        1,
    ),
    "qwen2.5_3b": (
        "QwenCausalLM",
        dict(
            vocabulary_size=151936,
            num_layers=36,
            num_query_heads=16,
            num_key_value_heads=2,
            hidden_dim=2048,
            intermediate_dim=11008,
        ),
        "qwen",
        1,
    ),
}
PARAMS = {
    "gemma_2b": 2_506_172_416,
    "gemma_7b": 8_537_680_896,
    "llama3_8b": 8_030_261_248,
    "qwen2.5_3b": 3_085_938_688,
}
LAYOUTS = {
    "gemma": ("gemma_tp", "gemma_2d", "from_model"),
    "llama": ("llama_tp", "llama_2d", "from_model"),
    "qwen": ("llama_tp", "llama_2d", "from_model"),
}
MESHES = ("1x8", "1x16")
CASES = [(model, mesh, layout) for model in MODELS for mesh in MESHES for layout in LAYOUTS[MODELS[model][2]]]


@pytest.fixture(scope="module")
def planned():
    """The plan of every case. Each model is described (built abstractly, 2-4 s) once and planned
    on every mesh and layout: `describe` is memoized here, its result is the real one."""
    described = {}
    real = prepare.describe

    def once(spec, options, *args, **kwargs):
        key = repr(options)
        if key not in described:
            described[key] = real(spec, options, *args, **kwargs)
        return described[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prepare, "describe", once)
        return {case: _plan(*case) for case in CASES}


def _plan(model: str, mesh: str, layout: str) -> prepare.PlannedModel:
    task, backbone, _, _ = MODELS[model]
    raw = {
        "model": {"name": "keras_hub", "task": task, "backbone": backbone},
        "mesh": {"shape": mesh},
        "layout": {"from_model": True} if layout == "from_model" else layout_config(layout),
    }
    config = parse_run_config(raw)
    devices.prepare(config.devices, config.mesh)
    return prepare.place_for_plan(config)


def layout_config(name: str) -> dict:
    """The layout config `name` as meshrun ships it."""
    return yaml.safe_load(
        (importlib.resources.files("meshrun.configs") / "layout" / f"{name}.yaml").read_text()
    )


@pytest.mark.parametrize("model,mesh,layout", CASES)
def test_every_real_configuration_plans_and_splits_all_it_can(planned, model, mesh, layout):
    plan = planned[(model, mesh, layout)].plan
    written = {rule.pattern: rule for rule in planned[(model, mesh, layout)].written_rules}
    assert plan.errors == (), plan.errors
    assert plan.params == PARAMS[model]
    bent = set()
    for placed in (p for p in plan.variables if p.rule):
        asked = written[placed.rule].axes
        for dim, (size, axis) in enumerate(zip(placed.shape, asked, strict=True)):
            whole = axis is not None and size % plan.mesh.axis_size(axis) != 0
            assert placed.spec[dim] == (None if whole else axis), (placed.path, dim)
            bent |= {placed.rule} if whole else set()
        per_device = 4 * math.prod(
            size // plan.mesh.axis_size(axis) if axis else size
            for size, axis in zip(placed.shape, placed.spec, strict=True)
        )
        assert placed.bytes_per_device == per_device, placed.path
    notes = [w for w in plan.warnings if w.startswith("rule '")]
    assert sorted(note.split("'")[1] for note in notes) == sorted(
        bent
    )  # one note per rule that left a dimension whole
    assert not [
        w for w in plan.warnings if "attention" in w and "is replicated: every one" in w
    ]  # the notes say it


@pytest.mark.parametrize("mesh", MESHES)
def test_gemma_2b_under_gemma_tp_keeps_its_one_key_value_head_whole_and_splits_the_rest(planned, mesh):
    plan = planned[("gemma_2b", mesh, "gemma_tp")].plan
    placed = {p.path: p for p in plan.variables}
    model_axis = plan.mesh.axis_size("model")
    key = placed["decoder_block_17/attention/key/kernel"]
    assert (key.shape, key.spec, key.rule) == (
        (1, 2048, 256),
        (None, None, None),
        r"decoder_block_\d+/attention/(query|key|value)/kernel",
    )
    query = placed["decoder_block_0/attention/query/kernel"].spec
    assert query == (
        ("model", None, None) if model_axis == 8 else (None, None, None)
    )  # 8 query heads: split 8 ways, not 16
    kv = 18 * 2 * 2048 * 256
    norms = (2 * 18 + 1) * 2048
    attention = 18 * 2 * 8 * 2048 * 256  # query and output projection: split by heads where 8 divide
    split = PARAMS["gemma_2b"] - kv - norms - (attention if model_axis == 16 else 0)
    assert plan.params_bytes_per_device == 4 * (
        split // model_axis + kv + norms + (attention if model_axis == 16 else 0)
    )
    first, *more = [w for w in plan.warnings if w.startswith("rule '")]
    named = (
        "query/kernel' (size 8" if model_axis == 16 else "key/kernel' (size 1"
    )  # the rule's first path it cannot split
    assert f"cannot split dimension 0 of 'decoder_block_0/attention/{named}" in first
    assert f"over mesh axis 'model' of size {model_axis}, so it keeps that dimension whole" in first
    assert len(more) == (
        1 if model_axis == 16 else 0
    )  # on 16 devices the output projection's 8 heads stay whole too
