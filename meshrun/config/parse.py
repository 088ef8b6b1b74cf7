"""Turns a composed config (a plain dict) into a RunConfig, rejecting unknown keys and values of
the wrong type with a `ConfigError` that names the key and suggests the likely one.

The parser's parts, by job: meshrun.config.typed reads typed values out of any mapping (a dataclass's
fields, durations, sizes), meshrun.config.sections reads the sections with rules of their own,
meshrun.config.keys knows every key (for the suggestions), and meshrun.config.checks holds the range
checks that need several values together. Their public functions are importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshrun.config.checks import check_values
from meshrun.config.keys import LAYOUT_KEYS, choices_with_key, known_keys, other_choice_hint
from meshrun.config.schema import (
    TOP_LEVEL_KEYS,
    CacheConfig,
    CheckpointConfig,
    DevicesConfig,
    PipelineConfig,
    ProfileConfig,
    RunConfig,
    TrainConfig,
)
from meshrun.config.sections import (
    EXPLICIT_KEYS,
    parse_data,
    parse_distributed,
    parse_layout,
    parse_logging,
    parse_mesh,
    parse_mesh_shape,
    parse_model,
    parse_resume,
)
from meshrun.config.typed import (
    parse_dataclass,
    parse_duration,
    parse_size,
    reject_unknown,
    section,
    with_duration,
)

__all__ = [
    "EXPLICIT_KEYS",
    "LAYOUT_KEYS",
    "choices_with_key",
    "known_keys",
    "other_choice_hint",
    "parse_data",
    "parse_distributed",
    "parse_duration",
    "parse_layout",
    "parse_logging",
    "parse_mesh",
    "parse_mesh_shape",
    "parse_model",
    "parse_run_config",
    "parse_size",
]


def parse_run_config(raw: Mapping[str, Any]) -> RunConfig:
    """Builds a RunConfig from a composed config, or raises ConfigError naming the bad key."""
    reject_unknown(raw, TOP_LEVEL_KEYS, prefix="")
    mesh = parse_mesh(section(raw, "mesh"))
    config = RunConfig(
        mesh=mesh,
        layout=parse_layout(section(raw, "layout"), mesh),
        model=parse_model(section(raw, "model")),
        data=parse_data(section(raw, "data")),
        train=parse_dataclass(
            TrainConfig, with_duration(section(raw, "train"), "max_time", "train"), "train"
        ),
        devices=parse_dataclass(DevicesConfig, section(raw, "devices"), "devices"),
        cache=parse_dataclass(CacheConfig, section(raw, "cache"), "cache"),
        distributed=parse_distributed(section(raw, "distributed")),
        checkpoint=parse_dataclass(CheckpointConfig, section(raw, "checkpoint"), "checkpoint"),
        logging=parse_logging(section(raw, "logging")),
        profile=parse_dataclass(ProfileConfig, section(raw, "profile"), "profile"),
        pipeline=parse_dataclass(PipelineConfig, section(raw, "pipeline"), "pipeline"),
        resume=parse_resume(raw.get("resume")),
    )
    check_values(config)
    return config
