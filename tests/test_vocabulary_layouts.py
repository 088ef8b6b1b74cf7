"""Every KerasHub layout on a vocabulary no mesh axis divides (405 and 403 rows: odd, so neither 2, 4 nor
8 divides them), planned on 2x4 and 4x2 with and without LoRA (shapes alone, no weights): the
transformers checkpoints of tests/data/hf (Llama 3 untied, Qwen 2 tied with q/k/v biases) and a tiny
Gemma. Keras gets one rule per pattern (a rule bent to keep a dimension whole replaces the rule it
bends); the model's own map (layout=from_model) and the FSDP layouts plan, the embedding's rows
whole; the tensor-parallel layouts refuse the embedding in one line that names the extra rule which
keeps it whole, and plan with it."""

from __future__ import annotations

import importlib.resources
import re

import pytest
import yaml

from conftest import HF_DATA as DATA
from conftest import cli_here
from meshrun.config.parse import parse_run_config
from meshrun.placement import devices
from meshrun.run import prepare

pytestmark = pytest.mark.integration
pytest.importorskip("keras_hub")

TINY = dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=32, intermediate_dim=64)
# model options, family, vocabulary size
MODELS = {
    "llama3": ({"preset": str(DATA / "llama3")}, "llama", 405),
    "qwen2": ({"preset": str(DATA / "qwen2")}, "llama", 403),
    "gemma": (
        {"task": "GemmaCausalLM", "backbone": dict(TINY, vocabulary_size=405, head_dim=8)},
        "gemma",
        405,
    ),
}
LAYOUTS = {
    family: (f"{family}_tp", f"{family}_2d", f"{family}_fsdp", "from_model") for family in ("llama", "gemma")
}
CASES = [
    (model, layout, mesh, lora)
    for model, (_, family, _) in MODELS.items()
    for layout in LAYOUTS[family]
    for mesh in ("2x4", "4x2")
    for lora in (False, True)
]
EMBEDDINGS = {
    "token_embedding/embeddings": 0,
    "token_embedding/reverse_embeddings": 1,
}  # path: vocabulary dimension


def planned(
    model: str, layout: str, mesh: str, lora: bool, extra: dict | None = None
) -> prepare.PlannedModel:
    options, _, _ = MODELS[model]
    raw_layout = (
        {"from_model": True}
        if layout == "from_model"
        else yaml.safe_load(
            (importlib.resources.files("meshrun.configs") / "layout" / f"{layout}.yaml").read_text()
        )
    )
    raw = {
        "model": {"name": "keras_hub", **options, **({"lora": {"rank": 4}} if lora else {})},
        "mesh": {"shape": mesh},
        "layout": {**raw_layout, **({"extra_rules": extra} if extra else {})},
    }
    config = parse_run_config(raw)
    devices.prepare(config.devices, config.mesh)
    return prepare.place_for_plan(config)


@pytest.mark.parametrize("model,layout,mesh,lora", CASES)
def test_an_indivisible_vocabulary_under_every_layout(model, layout, mesh, lora):
    placed = planned(model, layout, mesh, lora)
    patterns = [rule.pattern for rule in placed.rules]
    assert len(patterns) == len(set(patterns)), patterns  # Keras gets one rule per pattern
    plan = placed.plan
    assert not [e for e in plan.errors if "is matched by" in str(e)]
    embeddings = {p.path: p for p in plan.variables if p.path in EMBEDDINGS}
    vocabulary = MODELS[model][2]
    assert {p.shape[EMBEDDINGS[path]] for path, p in embeddings.items()} == {vocabulary}
    if layout.endswith(("_tp", "_2d")):
        refused = {str(e).split(":")[0].removeprefix("layout.rules.") for e in plan.errors}
        assert refused == set(embeddings), plan.errors  # the embedding alone, strict as documented
        assert all("; 'layout.extra_rules={token_embedding/" in str(e) for e in plan.errors)
        return
    assert plan.errors == ()
    for path, p in embeddings.items():
        assert p.spec[EMBEDDINGS[path]] is None, (path, p.spec)  # rows whole, the rest as the rule says
    if layout == "from_model":
        assert placed.rules[0].pattern == "token_embedding/embeddings" and placed.rules[0].axes == (
            None,
            "data",
        )
        notes = [w for w in plan.warnings if w.startswith("rule 'token_embedding/embeddings' (from_model)")]
        assert len(notes) == 1 and f"(size {vocabulary}, shape ({vocabulary}, 32))" in notes[0]


@pytest.mark.parametrize("layout", ["llama_tp", "llama_2d"])
def test_the_extra_rule_a_refusal_names_replaces_the_layouts_rule_and_plans(layout):
    first = planned("llama3", layout, "2x4", lora=False)
    extra = {}
    for error in first.plan.errors:
        rule = re.search(r"'layout\.extra_rules=\{(.+):\[(.*)\]\}' replaces the rule", str(error))
        extra[rule[1]] = [None if axis == "null" else axis for axis in rule[2].split(",")]
    placed = planned("llama3", layout, "2x4", lora=False, extra=extra)
    assert placed.plan.errors == ()
    by_path = {p.path: p for p in placed.plan.variables}
    for path in EMBEDDINGS:
        assert by_path[path].rule == path and by_path[path].origin == "extra_rules"
    assert [r.pattern for r in placed.rules].count("token_embedding/embeddings") == 1


def test_a_pipelined_from_model_plan_bends_the_embedding_once():
    config = parse_run_config(
        {
            "model": {"name": "keras_hub", "preset": str(DATA / "llama3")},
            "mesh": {"shape": "2x1x4", "axis_names": ["stage", "data", "model"], "batch_axis": "data"},
            "layout": {"from_model": True},
        }
    )
    devices.prepare(config.devices, config.mesh)
    placed = prepare.place_for_plan(config)
    patterns = [rule.pattern for rule in placed.rules]
    assert placed.plan.errors == () and patterns.count("token_embedding/embeddings") == 1


@pytest.mark.parametrize("lora", [[], ["model.lora.rank=4"]])
def test_the_issues_from_model_plan_of_a_transformers_checkpoint_exits_0(lora, in_tmp, capsys):
    args = [
        "plan",
        "model=keras_hub",
        f"model.preset={DATA / 'llama3'}",
        "mesh=2x4",
        "layout=from_model",
        *lora,
    ]
    done = cli_here(args, capsys)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "is matched by" not in done.stdout + done.stderr
    assert "rule 'token_embedding/embeddings' (from_model) cannot split dimension 0" in " ".join(
        done.stdout.split()
    )
