"""Config composition: every option of every group composes into a valid RunConfig (no jax)."""

import importlib.resources
import re
from pathlib import Path

import pytest

from conftest import composed_config
from meshrun import app
from meshrun.config.layout_schema import LayoutRule
from meshrun.config.parse import parse_run_config
from meshrun.errors import ConfigError
from meshrun.models import get_model, model_names

GROUPS = ("mesh", "layout", "model", "data", "train", "devices", "recipe")


def group_options(group):
    """Option names of a config group, read from the installed package's config tree."""
    folder = importlib.resources.files("meshrun.configs") / group
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def composed(*overrides):
    """The RunConfig that `overrides` compose into."""
    return parse_run_config(composed_config(*overrides, resolve=True))


def test_every_group_has_options():
    for group in GROUPS:
        assert group_options(group), f"config group {group} is empty"


def model_of_layout(layout):
    """The model a layout config is written for (replicated and auto fit them all)."""
    owners = [name for name in model_names() if layout in get_model(name).layouts]
    return owners[0] if layout in ("replicated", "auto") else owners[-1]


# Data sources that read the user's files or code, and models that are the user's, need to be told where.
REQUIRED = {
    ("data", "arrays"): ["data.path=train.npz"],
    ("data", "tfrecord"): [
        "data.files=train-*.tfrecord",
        "data.features={x:{dtype:float32,shape:[784]},y:{dtype:int64,shape:[]}}",
    ],
    ("data", "python"): ["data.factory=mydata:make"],
    ("model", "python"): ["model.factory=mymodels:build"],
    ("model", "keras_hub"): ["model.task=LlamaCausalLM", "model.backbone={vocabulary_size:512}"],
    ("data", "text"): [f"data.files={Path(__file__).parents[1] / 'README.md'}"],
    ("recipe", "finetune_lora"): [
        "model.task=GemmaCausalLM",
        "model.backbone={vocabulary_size:512}",
        f"data.files={Path(__file__).parents[1] / 'README.md'}",
    ],
}


@pytest.mark.parametrize(
    "group,option",
    [(g, o) for g in GROUPS for o in group_options(g) if g != "layout"],
)
def test_every_option_composes(group, option):
    config = composed(*app.prepare_overrides([f"{group}={option}", *REQUIRED.get((group, option), [])]))
    if group == "model":
        assert config.model.name == option


@pytest.mark.parametrize("layout", group_options("layout"))
def test_every_layout_composes_with_its_model(layout):
    model = model_of_layout(layout)
    config = composed(
        *app.prepare_overrides(
            [f"model={model}", f"layout={layout}", "mesh=2x4", *REQUIRED.get(("model", model), [])]
        )
    )
    assert config.model.name == model


@pytest.mark.parametrize("name", model_names())
def test_each_model_brings_its_default_layout(name):
    spec = get_model(name)
    assert spec.layouts, name
    assert set(spec.layouts) <= set(group_options("layout")), name
    required = REQUIRED.get(("model", name), [])
    config = composed(*app.prepare_overrides([f"model={name}", *required]))
    expected = composed(*app.prepare_overrides([f"model={name}", f"layout={spec.default_layout}", *required]))
    assert config.layout == expected.layout, name


def test_command_line_and_recipe_layouts_win_over_the_models_default():
    assert (
        composed("model=transformer", "layout=transformer_fsdp").layout
        == composed("model=transformer", "layout=transformer_fsdp", "model.preset=tiny").layout
    )
    assert composed("model=transformer", "layout=replicated").layout.rules == ()
    assert composed("recipe=seeds_data_parallel").layout.rules == ()


def test_defaults_are_the_seeds_data_parallel_setup():
    config = composed()
    assert config.mesh.shape == (-1, 1)
    assert config.mesh.axis_names == ("data", "model")
    assert config.layout.rules == ()
    assert config.train.batch_size == 16 and config.train.loss is None
    assert config.model.options.hidden == 200 and config.model.options.d1_bias is False


def test_presets_fill_what_is_not_set():
    config = composed("model=transformer", "model.preset=7b", "model.layers=2")
    options = config.model.options
    assert (options.layers, options.d_model, options.heads, options.vocab) == (2, 4096, 32, 32000)
    assert options.tied_head is False
    two_tower = composed("model=two_tower", "model.preset=large").model.options
    assert (two_tower.num_users, two_tower.num_items, two_tower.embedding_dim) == (
        100_000_000,
        10_000_000,
        128,
    )


@pytest.mark.parametrize(
    "shape,expected_shape,expected_names",
    [
        ("8", (8,), ("data",)),
        ("2x4", (2, 4), ("data", "model")),
        ("1x8", (1, 8), ("data", "model")),
        ("8x1", (8, 1), ("data", "model")),
    ],
)
def test_any_mesh_shape_is_a_mesh_option(shape, expected_shape, expected_names):
    config = composed(*app.prepare_overrides([f"mesh={shape}"]))
    assert config.mesh.shape == expected_shape
    assert config.mesh.axis_names == expected_names
    assert config.mesh.batch_axis == "data"


@pytest.mark.parametrize(
    "written, expected_shape", [("[2,4]", (2, 4)), ("[8]", (8,)), ("[1, 8]", (1, 8)), ("[-1,2]", (-1, 2))]
)
def test_a_mesh_written_as_a_list_is_that_shape(written, expected_shape):
    assert composed(*app.prepare_overrides([f"mesh={written}"])).mesh.shape == expected_shape


def test_a_sweep_of_meshes_written_as_lists_sweeps_those_shapes():
    assert app.prepare_overrides(["-m", "mesh=[2,4],[4,2]"]) == ["-m", "mesh=2x4,4x2"]


def test_a_users_search_path_adds_their_groups_and_keeps_meshruns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf" / "layout").mkdir(parents=True)
    (tmp_path / "conf" / "layout" / "mine.yaml").write_text("rules:\n  d1/kernel: [null, model]\n")
    (tmp_path / "saved.yaml").write_text("rules:\n  d2/kernel: [model, null]\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    mine = composed(*app.prepare_overrides([searchpath, "layout=mine", "mesh=1x8"]))
    assert (mine.mesh.shape, [r.pattern for r in mine.layout.rules]) == ((1, 8), ["d1/kernel"])
    saved = composed(*app.prepare_overrides([searchpath, "layout=./saved.yaml", "mesh=[2,4]"]))
    assert (saved.mesh.shape, [r.pattern for r in saved.layout.rules]) == ((2, 4), ["d2/kernel"])


def test_three_axis_mesh_takes_names_and_batch_axis():
    config = composed("mesh=2x2x2", "mesh.axis_names=[data,seq,model]", "mesh.batch_axis=seq")
    assert config.mesh.shape == (2, 2, 2)
    assert config.mesh.batch_axis == "seq"


def test_dense_model_layout_holds_the_seeds_rules():
    config = composed("mesh=2x4", "layout=dense_model")
    assert config.layout.rules == (
        LayoutRule("d1/kernel", (None, "model")),
        LayoutRule("d2/output", ("data", None)),
    )


def test_recipe_overrides_groups_and_keys():
    config = composed("recipe=seeds_model_parallel")
    assert config.mesh.shape == (2, 4)
    assert [r.pattern for r in config.layout.rules] == ["d1/kernel", "d2/output"]


def test_model_sizes_are_configurable():
    config = composed("model.hidden=64", "model.input_shape=[8,8,1]", "model.num_classes=4")
    assert config.model.options.hidden == 64
    assert config.model.options.input_shape == (8, 8, 1)
    assert config.model.options.label_shape == (4,)


def test_layout_rules_override_replaces_the_rules():
    overrides = app.prepare_overrides(
        ["mesh=2x4", "layout=dense_model", "layout.rules={d1/kernel:[null,model]}"]
    )
    config = composed(*overrides)
    assert config.layout.rules == (LayoutRule("d1/kernel", (None, "model")),)


def test_unknown_appended_key_is_rejected_with_suggestion():
    with pytest.raises(
        ConfigError, match=r"^train\.epoch: unknown key \(got 3\); did you mean train\.epochs\?"
    ):
        composed("+train.epoch=3")


def test_sizes_in_configs_recipes_readme_and_docs_use_the_plans_binary_units():
    repo = Path(__file__).parents[1]
    docs = [path for path in repo.glob("docs/**/*.md") if "_build" not in path.relative_to(repo).parts]
    texts = [*repo.glob("configs/**/*.yaml"), *repo.glob("recipes/*.yaml"), repo / "README.md", *docs]
    decimal = re.compile(r"\b\d[\d.,]*\s?(?:GB|MB|KB|kB)\b")
    found = [
        f"{path.relative_to(repo)}: {m.group()}" for path in texts for m in decimal.finditer(path.read_text())
    ]
    assert found == [], "write GiB/MiB/KiB as the plan does"
