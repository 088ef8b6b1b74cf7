"""The configs meshrun serves Hydra beside its YAML tree (meshrun/configs/): mesh shapes made on
demand (`mesh=2x4`), a group option given as a YAML file's path (`layout=./my_layout.yaml`), each
model's and data option's config over its options' defaults, a switch for every log sink, and the
defaults of each section of the typed schema; and the search-path plugin that puts them where Hydra
looks. meshrun.app runs Hydra over them; like it, this module imports neither jax nor keras.
"""

from __future__ import annotations

import builtins
import importlib.resources
import os
import re

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from meshrun.config.fields import defaults_of
from meshrun.config.schema import COMPOSED_SECTIONS, DataConfig
from meshrun.logs import sinks
from meshrun.specs.data import SOURCES
from meshrun.specs.model import MODELS

CONFIG_MODULE = "meshrun.configs"
SCHEMA_GROUP = "schema"  # the schema's defaults, one config per section (register_config_sources)


class ServedConfigs(ConfigSource):
    """What meshrun's own config sources share: configs made on request, none to list."""

    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)

    def result(self, config) -> ConfigResult:
        return ConfigResult(
            config=config,
            path=f"{self.scheme()}://{self.path}",
            provider=self.provider,
            header={"package": None},
        )

    def available(self) -> bool:
        return True

    def list(self, config_path: str, results_filter: ObjectType | None) -> builtins.list[str]:
        return []


class MeshShapeSource(ServedConfigs):
    """Serves `mesh=AxB[xC]` for any shape: Hydra asks it for `mesh/<name>` configs whose name
    starts with a digit (or -digit) and gets `shape: <name>`; meshrun.config parses and checks it."""

    @staticmethod
    def scheme() -> str:
        return "meshrun-shapes"

    def load_config(self, config_path: str) -> ConfigResult:
        name = config_path.rsplit("/", 1)[-1].removesuffix(".yaml")
        return self.result(OmegaConf.create({"shape": name, "axis_names": None, "batch_axis": None}))

    def is_group(self, config_path: str) -> bool:
        return config_path.strip("/") in ("", "mesh")

    def is_config(self, config_path: str) -> bool:
        group, _, name = config_path.strip("/").rpartition("/")
        return group == "mesh" and re.match(r"^-?\d", name.removesuffix(".yaml")) is not None


class FileOptionSource(ServedConfigs):
    """Serves a config group option given as the path of a YAML file (`layout=./my_layout.yaml`,
    `layout=/abs/saved.yaml`, such as `meshrun plan --save-layout` writes): Hydra asks it for
    `<group>/<path>` and gets the file's content as that group's config."""

    @staticmethod
    def scheme() -> str:
        return "meshrun-files"

    def load_config(self, config_path: str) -> ConfigResult:
        return self.result(OmegaConf.load(option_file(config_path)))

    def is_group(self, config_path: str) -> bool:
        return config_path.strip("/") == ""

    def is_config(self, config_path: str) -> bool:
        return option_file(config_path) is not None


YAML_SUFFIXES = (".yaml", ".yml")


def option_file(config_path: str) -> str | None:
    """The YAML file a config path `<group>/<file path>` names (Hydra may add `.yaml` once more),
    or None when it names no existing YAML file."""
    _, _, rest = config_path.partition("/")
    for candidate in (rest, rest.removesuffix(".yaml")):
        if candidate.endswith(YAML_SUFFIXES) and os.path.isfile(candidate):
            return candidate
    return None


def written_option(group: str, option: str):
    """configs/<group>/<option>.yaml of meshrun's own config tree, or None where there is none."""
    path = importlib.resources.files(CONFIG_MODULE) / group / f"{option}.yaml"
    return OmegaConf.load(path) if path.is_file() else None


class ModelConfigSource(ServedConfigs):
    """Serves the config of each registered model, `model/<name>`: the defaults of its options
    dataclass (the one place they are written), then configs/model/<name>.yaml (what differs), with
    the model's default layout (ModelSpec.default_layout, the one place it is stated) selected, as
    the option of the layout group unless the command line or a recipe picks another."""

    @staticmethod
    def scheme() -> str:
        return "meshrun-models"

    def load_config(self, config_path: str) -> ConfigResult:
        name = config_path.rsplit("/", 1)[-1].removesuffix(".yaml")
        spec = MODELS.get(name)
        layout = {"defaults": [{"override /layout@_global_.layout": spec.default_layout}]}
        written = written_option("model", name) or {}
        return self.result(OmegaConf.merge(layout, {"name": name, **defaults_of(spec.options)}, written))

    def is_group(self, config_path: str) -> bool:
        return config_path.strip("/") in ("", "model")

    def is_config(self, config_path: str) -> bool:
        group, _, name = config_path.strip("/").rpartition("/")
        return group == "model" and name.removesuffix(".yaml") in MODELS.names()


class DataConfigSource(ServedConfigs):
    """Serves each option of the data group, `data/<option>`: the defaults of the options dataclass
    of the source its configs/data/<option>.yaml names (`name`; data=classes is the synthetic
    source), then that file (what differs from them)."""

    @staticmethod
    def scheme() -> str:
        return "meshrun-data"

    def load_config(self, config_path: str) -> ConfigResult:
        written = written_option("data", config_path.rsplit("/", 1)[-1].removesuffix(".yaml"))
        name = written.get("name", DataConfig.name) if written is not None else DataConfig.name
        return self.result(OmegaConf.merge({"name": name, **defaults_of(SOURCES.get(name).options)}, written))

    def is_group(self, config_path: str) -> bool:
        return config_path.strip("/") in ("", "data")

    def is_config(self, config_path: str) -> bool:
        group, _, option = config_path.strip("/").rpartition("/")
        if group != "data" or "/" in option:
            return False
        written = written_option("data", option.removesuffix(".yaml"))
        return written is not None and written.get("name", DataConfig.name) in SOURCES.names()


class MeshrunSearchPath(SearchPathPlugin):
    """Adds meshrun's generated configs (mesh shapes, option files) to Hydra's search path as a
    plugin rather than in configs/meshrun.yaml, so that a user's `hydra.searchpath=[file://DIR]`,
    which replaces that list, adds their config groups without taking meshrun's away."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.prepend(provider="meshrun", path=f"{ModelConfigSource.scheme()}://models")
        search_path.prepend(provider="meshrun", path=f"{DataConfigSource.scheme()}://data")
        search_path.append(provider="meshrun", path=f"{MeshShapeSource.scheme()}://mesh")
        search_path.append(provider="meshrun", path=f"{FileOptionSource.scheme()}://files")


def register_config_sources() -> None:
    """Puts meshrun's generated configs where Hydra looks: mesh shapes on demand, each model's and
    data option's config over its options' defaults, `logging/sinks`, an off switch for every
    registered log sink (configs/logging/default.yaml includes it), so that a new sink needs no
    config file of its own, and `schema/<section>`, the defaults of each section of the typed schema
    (meshrun.config.schema.COMPOSED_SECTIONS), which configs/meshrun.yaml places under the
    section's group option.

    The schema is the one home of every default: Hydra composes it as a structured (dict) config
    from ConfigStore, rather than YAML generated from it, so that no default is written twice, not
    even by a generator, and a group's options (and a user's, through hydra.searchpath) write only
    what differs. Every path that composes a config (a run, a multirun's jobs, `meshrun sweep`,
    --help, the processes meshrun or a scheduler starts: each runs meshrun's CLI) comes here first.
    """
    Plugins.instance().register(MeshShapeSource)
    Plugins.instance().register(ModelConfigSource)
    Plugins.instance().register(DataConfigSource)
    Plugins.instance().register(FileOptionSource)
    Plugins.instance().register(MeshrunSearchPath)
    ConfigStore.instance().store(
        group="logging", name="sinks", node={name: False for name in sinks.switch_names()}, provider="meshrun"
    )
    for section, cls in COMPOSED_SECTIONS.items():
        ConfigStore.instance().store(
            group=SCHEMA_GROUP, name=section, node=defaults_of(cls), provider="meshrun"
        )
