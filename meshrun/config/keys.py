"""Every dotted key a config may set, and which model or data choices own a key: what the parser's
errors suggest for a key it does not know ('did you mean', 'data.path is a key of data=arrays')."""

from __future__ import annotations

import dataclasses
import typing

from meshrun.config.schema import (
    CacheConfig,
    CheckpointConfig,
    DevicesConfig,
    DistributedConfig,
    EarlyStoppingConfig,
    PipelineConfig,
    ProfileConfig,
    TrainConfig,
)
from meshrun.specs import sinks
from meshrun.specs.data import SOURCES
from meshrun.specs.model import MODELS
from meshrun.wording import did_you_mean, one_of

MESH_KEYS = ("shape", "axis_names", "batch_axis", "dcn")
LAYOUT_KEYS = (
    "rules",
    "extra_rules",
    "optional",
    "replicate_if_indivisible",
    "from_model",
    "auto",
    "min_bytes",
    "fsdp",
)


def known_keys() -> list[str]:
    """Every dotted key a config may set (for 'did you mean' suggestions)."""
    keys = [
        *(f"mesh.{k}" for k in MESH_KEYS),
        *(f"layout.{k}" for k in LAYOUT_KEYS),
        "model.name",
        "data.name",
        "resume",
    ]
    sections = (
        ("train", TrainConfig),
        ("devices", DevicesConfig),
        ("cache", CacheConfig),
        ("distributed", DistributedConfig),
        ("checkpoint", CheckpointConfig),
        ("profile", ProfileConfig),
        ("pipeline", PipelineConfig),
        ("train.early_stopping", EarlyStoppingConfig),
    )
    for section, cls in sections:
        keys += [f"{section}.{f.name}" for f in dataclasses.fields(cls)]
    keys += [f"logging.{name}" for name in sinks.switch_names()]
    for name in MODELS.names():
        keys += _field_keys("model", MODELS.get(name).options)
    for name in SOURCES.names():
        keys += [f"data.{f.name}" for f in dataclasses.fields(SOURCES.get(name).options)]
    return sorted(set(keys))


def _field_keys(prefix: str, cls) -> list[str]:
    """`prefix.name` for every field of dataclass `cls`, and the fields of a nested one (model.lora.rank)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        keys.append(f"{prefix}.{f.name}")
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _field_keys(f"{prefix}.{f.name}", hints[f.name])
    return keys


def choices_with_key(key: str) -> list[str]:
    """The model and data choices that have `key` as an option ('data.path' -> ['data=arrays']):
    a key the chosen model or data source lacks may belong to another one."""
    group, _, name = key.partition(".")
    owners = {
        "model": lambda: {n: MODELS.get(n).options for n in MODELS.names()},
        "data": lambda: {n: SOURCES.get(n).options for n in SOURCES.names()},
    }
    if group not in owners:
        return []
    return [
        f"{group}={choice}"
        for choice, options in owners[group]().items()
        if name in {f.name for f in dataclasses.fields(options)}
    ]


def other_choice_hint(key: str) -> str:
    """Says which model or data choices have `key` ('data.path is a key of data=arrays; add
    data=arrays'), or '' when none has it."""
    owners = choices_with_key(key)
    if not owners:
        return ""
    return f"{key} is a key of {one_of(owners)}; add {owners[0] if len(owners) == 1 else 'one of them'}"


def unknown_key_hint(key: str) -> str:
    """What to say about an unknown `key`: the choice that owns it, ending in '; ', else the key it
    is most likely a typo of (did_you_mean's text, '' when none is close)."""
    other = other_choice_hint(key)
    return f"{other}; " if other else did_you_mean(key, known_keys())
