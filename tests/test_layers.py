"""The layers' promises that a reader relies on: the config schema loads a handful of meshrun
modules and no jax, and composing a config imports only the components it names (the registries
load their plugins by name, from the tables in meshrun.specs)."""

import json
import subprocess
import sys
import textwrap

import pytest

from meshrun.registry import Registry


def _loaded_after(code: str) -> dict:
    """The meshrun modules and heavy libraries a fresh interpreter holds after running `code`."""
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        heavy = sorted(m for m in ("jax", "keras", "tensorflow", "keras_hub") if m in sys.modules)
        print(json.dumps({"meshrun": sorted(m for m in sys.modules if m.startswith("meshrun")),
                          "heavy": heavy}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_config_schema_loads_at_most_12_meshrun_modules_and_no_jax():
    loaded = _loaded_after("import meshrun.config.schema")
    assert len(loaded["meshrun"]) <= 12, loaded["meshrun"]
    assert loaded["heavy"] == []


def test_parsing_a_config_imports_the_chosen_model_and_data_source_and_no_other():
    loaded = _loaded_after("""
        from meshrun.config.parse import parse_run_config
        parse_run_config({"mesh": {"shape": "2x4"}, "model": {"name": "dense_model"},
                          "data": {"name": "synthetic"}})
    """)
    models = [
        m for m in loaded["meshrun"] if m.startswith("meshrun.models.") and m != "meshrun.models.registry"
    ]
    sources = [
        m
        for m in loaded["meshrun"]
        if m.startswith("meshrun.data.")
        and m.rsplit(".", 1)[1] in ("arrays", "python_source", "synthetic", "text", "tfrecord")
    ]
    assert models == ["meshrun.models.dense_model"]
    assert sources == ["meshrun.data.synthetic"]
    assert loaded["heavy"] == []


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A module on sys.path that registers a spec named `one` into the registry it is handed."""
    (tmp_path / "meshrun_test_plugin.py").write_text(
        textwrap.dedent("""
        from dataclasses import dataclass
        from tests_registry_target import REGISTRY

        @dataclass(frozen=True)
        class Spec:
            name: str

        REGISTRY.register(Spec("one"))
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "meshrun_test_plugin"
    for name in ("meshrun_test_plugin", "tests_registry_target"):
        sys.modules.pop(name, None)


def test_a_registry_imports_a_names_module_on_first_use_and_refuses_names_it_has_no_module_for(plugin_module):
    registry = Registry("widget", {"one": plugin_module, "two": "meshrun_no_such_module"})
    target = type(sys)("tests_registry_target")
    target.REGISTRY = registry
    sys.modules["tests_registry_target"] = target
    assert registry.names() == ["one", "two"]
    assert plugin_module not in sys.modules  # nothing loads until a name is asked for
    assert registry.get("one").name == "one"
    assert plugin_module in sys.modules
    with pytest.raises(ValueError, match="widget 'one' is registered twice"):
        registry.register(registry.get("one"))
    with pytest.raises(ValueError, match="widget 'three' is not in the table of widgets"):
        registry.register(type(registry.get("one"))("three"))
    with pytest.raises(ModuleNotFoundError):
        registry.get("two")
    with pytest.raises(KeyError):
        registry.get("four")


def test_every_name_in_the_tables_registers_itself_from_its_module():
    from meshrun.specs.data import SOURCES
    from meshrun.specs.model import MODELS
    from meshrun.specs.sinks import SINKS

    for registry in (MODELS, SOURCES, SINKS):
        assert [spec.name for spec in registry.all()] == registry.names()


def test_a_model_whose_data_names_no_synthetic_family_is_refused_at_registration():
    from meshrun.models.registry import ModelSpec, get_model, register_model

    cnn = get_model("cnn")
    typo = ModelSpec(
        name="cnn", options=cnn.options, build=cnn.build, layouts=cnn.layouts, data="image", loss=None
    )
    with pytest.raises(ValueError) as refused:
        register_model(typo)
    assert str(refused.value) == (
        "model 'cnn': data='image' is not a synthetic data family (meshrun.data.synthetic.FAMILIES); "
        "valid: classes, id_pairs, images, padded_tokens, regression, shaped or tokens"
    )
    assert get_model("cnn") is cnn  # nothing registered


def test_the_synthetic_families_models_may_name_are_the_ones_data_synthetic_generates():
    from meshrun.data.synthetic import FAMILIES
    from meshrun.specs.model import SYNTHETIC_FAMILIES

    assert sorted(FAMILIES) == sorted(SYNTHETIC_FAMILIES)
