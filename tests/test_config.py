"""Config composition: every option of every group composes into a valid RunConfig (no jax)."""

import importlib.resources

import pytest
from hydra import compose, initialize_config_module
from hydra.core.plugins import Plugins
from omegaconf import OmegaConf

from meshrun import cli
from meshrun.errors import ConfigError
from meshrun.schema import LayoutRule, parse_run_config

GROUPS = ("mesh", "layout", "model", "data", "train", "devices", "recipe")


def group_options(group):
    """Option names of a config group, read from the installed package's config tree."""
    folder = importlib.resources.files("meshrun.configs") / group
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def composed(*overrides):
    Plugins.instance().register(cli.MeshShapeSource)
    with initialize_config_module(config_module="meshrun.configs", version_base="1.3"):
        cfg = compose(config_name="meshrun", overrides=list(overrides))
    return parse_run_config(OmegaConf.to_container(cfg, resolve=True))


def test_every_group_has_options():
    for group in GROUPS:
        assert group_options(group), f"config group {group} is empty"


@pytest.mark.parametrize(
    "group,option",
    [(g, o) for g in GROUPS for o in group_options(g)],
)
def test_every_option_composes(group, option):
    # dense_model's rules need a model axis, which the default 1-D mesh lacks.
    extra = ["mesh=2x4"] if (group, option) == ("layout", "dense_model") else []
    config = composed(f"{group}={option}", *extra)
    assert config.model.name == "dense_model"


def test_defaults_are_the_seeds_data_parallel_setup():
    config = composed()
    assert config.mesh.shape == (-1,)
    assert config.mesh.axis_names == ("data",)
    assert config.layout.rules == ()
    assert config.train.batch_size == 16 and config.train.loss == "mse"
    assert config.model.options.hidden == 200 and config.model.options.d1_bias is False


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
    config = composed(*cli.prepare_overrides([f"mesh={shape}"]))
    assert config.mesh.shape == expected_shape
    assert config.mesh.axis_names == expected_names
    assert config.mesh.batch_axis == "data"


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
    overrides = cli.prepare_overrides(["mesh=2x4", "layout=dense_model", "layout.rules={d1/kernel:[null,model]}"])
    config = composed(*overrides)
    assert config.layout.rules == (LayoutRule("d1/kernel", (None, "model")),)


def test_unknown_appended_key_is_rejected_with_suggestion():
    with pytest.raises(ConfigError, match=r"^train\.epoch: unknown key \(got 3\); did you mean train\.epochs\?"):
        composed("+train.epoch=3")
