"""Each default is written once: the typed schema (and each model's and data source's options) holds
every default and a one-line doc per key, the YAML options under configs/ and recipes/ write none of
them again, and the config reference page is generated from the schema (no jax)."""

import dataclasses
import importlib.resources
import typing
from pathlib import Path

import pytest
import yaml

from conftest import composed_config
from meshrun.config import layout_schema, reference, schema
from meshrun.config.fields import default_of, defaults_of, doc_of
from meshrun.specs.data import SOURCES
from meshrun.specs.model import MODELS

ROOT = Path(__file__).parents[1]
CONFIGS = importlib.resources.files("meshrun.configs")


def config_classes():
    """Every dataclass whose fields are config keys: the schema's, each model's and source's options
    (and the dataclasses nested in them)."""
    found = [cls for _, cls in reference.SECTIONS] + [schema.RunConfig, schema.EarlyStoppingConfig]
    found += [MODELS.get(n).options for n in MODELS.names()]
    found += [SOURCES.get(n).options for n in SOURCES.names()]
    for cls in list(found):
        hints = typing.get_type_hints(cls)
        found += [hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])]
    return sorted(set(found), key=lambda c: c.__qualname__)


@pytest.mark.parametrize("cls", config_classes(), ids=lambda c: c.__name__)
def test_every_config_key_has_a_one_line_doc(cls):
    for f in dataclasses.fields(cls):
        doc = doc_of(f)
        assert doc and "\n" not in doc, f"{cls.__name__}.{f.name} has no one-line doc: use setting(..., doc)"


def test_composed_sections_are_the_schema_defaults():
    config = composed_config()
    for section, cls in schema.COMPOSED_SECTIONS.items():
        got = config if section == "run" else config[section]
        for key, default in defaults_of(cls).items():
            assert got[key] == default, f"{section}.{key}: composed {got[key]!r}, schema {default!r}"


@pytest.mark.parametrize("name", MODELS.names())
def test_each_model_composes_its_options_defaults(name):
    model = composed_config(f"model={name}")["model"]
    assert model == {"name": name, **defaults_of(MODELS.get(name).options)}


def data_options():
    return sorted(
        p.name.removesuffix(".yaml") for p in (CONFIGS / "data").iterdir() if p.name.endswith(".yaml")
    )


@pytest.mark.parametrize("option", data_options())
def test_each_data_option_composes_its_source_defaults_and_its_differences(option):
    written = yaml.safe_load((CONFIGS / "data" / f"{option}.yaml").read_text())
    data = composed_config(f"data={option}")["data"]
    assert data == {**defaults_of(SOURCES.get(written["name"]).options), **written}


def yaml_files():
    """Every YAML file of the config tree and the recipes, as (name relative to configs/, content)."""
    folders = [ROOT / "configs", ROOT / "recipes"]
    return sorted(
        (str(p.relative_to(folder.parent)), yaml.safe_load(p.read_text()) or {})
        for folder in folders
        for p in folder.rglob("*.yaml")
        if "hydra" not in p.parts
    )


def schema_defaults_of(path: str, content: dict) -> list[tuple[str, dict]]:
    """The schema defaults a YAML file's keys are compared against, as (section, defaults): a recipe
    and the primary config write sections (train: {...}); a group's option is its section."""
    parts = Path(path).parts
    sections = {s: defaults_of(c) for s, c in schema.COMPOSED_SECTIONS.items() if s != "run"}
    if parts[0] == "recipes" or path == "configs/meshrun.yaml":  # @package _global_
        found = [(s, d) for s, d in sections.items() if s in content]
        found.append(("", defaults_of(schema.RunConfig)))
        return found
    group = parts[1]
    if group in sections:
        return [(group, sections[group])]
    if group == "model" and content.get("name") in MODELS.names():
        return [("model", defaults_of(MODELS.get(content["name"]).options))]
    if group == "data" and content.get("name") in SOURCES.names():
        return [("data", defaults_of(SOURCES.get(content["name"]).options))]
    return []


def restated(content: dict, prefix: str, defaults: dict):
    """The keys of `content` under `prefix` that write a schema default again: (key, written, default)."""
    section = content.get(prefix, {}) if prefix else content
    if not isinstance(section, dict):
        return
    for key, value in section.items():
        if key in defaults:
            if isinstance(defaults[key], dict) and isinstance(value, dict) and defaults[key]:
                yield from ((f"{key}.{k}", w, d) for k, w, d in restated(value, "", defaults[key]))
            else:
                yield key, value, defaults[key]


@pytest.mark.parametrize("path,content", yaml_files(), ids=lambda v: v if isinstance(v, str) else "")
def test_no_yaml_writes_a_schema_default_again(path, content):
    """A group's default option (train/default.yaml, model/<name>.yaml, data/<source>.yaml) writes no
    schema key at all: the schema composes under it. Any other option or recipe writes a key only to
    differ from the schema (a value equal to the default is a second home for it), except the seeds'
    recipes, which spell out the seeds' batch and epochs. Either way, a file that writes a default
    disagreeing with the schema's in a default option fails."""
    problems = []
    is_default_option = Path(path).stem in ("default", "off") or (
        Path(path).parts[1] in ("model", "data") and Path(path).stem == content.get("name")
    )
    in_sections = Path(path).parts[0] == "recipes" or path == "configs/meshrun.yaml"
    for prefix, defaults in schema_defaults_of(path, content):
        for key, written, default in restated(content, prefix if in_sections else "", defaults):
            dotted = f"{prefix}.{key}" if prefix else key
            if is_default_option:
                problems.append(f"{dotted}: written {written!r}; the schema's default is {default!r}")
            elif written == default and not path.startswith("recipes/"):
                problems.append(f"{dotted}: writes the schema's default {default!r} again")
    assert not problems, f"{path}: " + "; ".join(problems)


def test_sample_prompts_default_is_the_empty_list():
    field = {f.name: f for f in dataclasses.fields(schema.TrainConfig)}["sample_prompts"]
    assert default_of(field) == [] and composed_config()["train"]["sample_prompts"] == []


def test_layout_min_bytes_written_form_parses_to_the_default():
    from meshrun.config.typed import parse_size

    field = {f.name: f for f in dataclasses.fields(layout_schema.LayoutConfig)}["min_bytes"]
    assert parse_size("layout.min_bytes", default_of(field)) == field.default


def flat(defaults: dict, prefix: str) -> list[str]:
    """Dotted keys of a defaults mapping, nested sections as their keys (train.early_stopping.mode)."""
    keys = []
    for key, value in defaults.items():
        nested = isinstance(value, dict) and value and all(isinstance(k, str) for k in value)
        keys += flat(value, f"{prefix}.{key}") if nested else [f"{prefix}.{key}"]
    return keys


def test_every_default_has_a_row_on_the_reference_page():
    page = reference.render()
    keys = [k for s, c in schema.COMPOSED_SECTIONS.items() if s != "run" for k in flat(defaults_of(c), s)]
    keys += [k for n in MODELS.names() for k in flat(defaults_of(MODELS.get(n).options), "model")]
    keys += [k for n in SOURCES.names() for k in flat(defaults_of(SOURCES.get(n).options), "data")]
    for key in keys:
        assert f"| `{key}` |" in page, f"{key} has no row on {reference.PAGE}"


def test_reference_page_is_current():
    committed = (ROOT / reference.PAGE).read_text()
    assert committed == reference.render(), (
        f"{reference.PAGE} is stale: regenerate it with `{reference.COMMAND}` from the repository root"
    )
