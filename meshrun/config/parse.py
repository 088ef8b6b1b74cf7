"""Turns a composed config (a plain dict) into a RunConfig, rejecting unknown keys and values of
the wrong type with a `ConfigError` that names the key and suggests the likely one. Range checks
that need several values together are in `meshrun.config.checks`."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from meshrun.config.checks import check_distributed_values, check_rule_axes, check_values
from meshrun.config.schema import (
    DEFAULT_AUTO_MIN_BYTES,
    DEFAULT_AXIS_NAMES,
    DISTRIBUTED_MODES,
    FILL,
    RESUME_MODES,
    TOP_LEVEL_KEYS,
    CacheConfig,
    CheckpointConfig,
    DataConfig,
    DevicesConfig,
    DistributedConfig,
    EarlyStoppingConfig,
    LayoutConfig,
    LayoutRule,
    LoggingConfig,
    MeshConfig,
    ModelConfig,
    ProfileConfig,
    RunConfig,
    TrainConfig,
)
from meshrun.errors import ConfigError
from meshrun.specs import sinks
from meshrun.specs.data import SOURCES
from meshrun.specs.model import MODELS
from meshrun.wording import did_you_mean, format_shape, one_of


def parse_run_config(raw: Mapping[str, Any]) -> RunConfig:
    """Builds a RunConfig from a composed config, or raises ConfigError naming the bad key."""
    _reject_unknown(raw, TOP_LEVEL_KEYS, prefix="")
    mesh = parse_mesh(_section(raw, "mesh"))
    config = RunConfig(
        mesh=mesh,
        layout=parse_layout(_section(raw, "layout"), mesh),
        model=parse_model(_section(raw, "model")),
        data=parse_data(_section(raw, "data")),
        train=_parse_dataclass(TrainConfig, _with_duration(_section(raw, "train"), "max_time", "train"), "train"),
        devices=_parse_dataclass(DevicesConfig, _section(raw, "devices"), "devices"),
        cache=_parse_dataclass(CacheConfig, _section(raw, "cache"), "cache"),
        distributed=parse_distributed(_section(raw, "distributed")),
        checkpoint=_parse_dataclass(CheckpointConfig, _section(raw, "checkpoint"), "checkpoint"),
        logging=parse_logging(_section(raw, "logging")),
        profile=_parse_dataclass(ProfileConfig, _section(raw, "profile"), "profile"),
        resume=_parse_resume(raw.get("resume")),
    )
    check_values(config)
    return config


def known_keys() -> list[str]:
    """Every dotted key a config may set (for 'did you mean' suggestions)."""
    keys = ["mesh.shape", "mesh.axis_names", "mesh.batch_axis", *(f"layout.{k}" for k in LAYOUT_KEYS), "model.name", "data.name", "resume"]
    sections = (("train", TrainConfig), ("devices", DevicesConfig), ("cache", CacheConfig), ("distributed", DistributedConfig),
                ("checkpoint", CheckpointConfig), ("profile", ProfileConfig), ("train.early_stopping", EarlyStoppingConfig))
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
    owners = {"model": lambda: {n: MODELS.get(n).options for n in MODELS.names()},
              "data": lambda: {n: SOURCES.get(n).options for n in SOURCES.names()}}
    if group not in owners:
        return []
    return [f"{group}={choice}" for choice, options in owners[group]().items()
            if name in {f.name for f in dataclasses.fields(options)}]


def other_choice_hint(key: str) -> str:
    """Says which model or data choices have `key` ('data.path is a key of data=arrays; add
    data=arrays'), or '' when none has it."""
    owners = choices_with_key(key)
    if not owners:
        return ""
    return f"{key} is a key of {one_of(owners)}; add {owners[0] if len(owners) == 1 else 'one of them'}"


# --- mesh ---------------------------------------------------------------------------------------

_SHAPE_TEXT = re.compile(r"^-?\d+(x-?\d+)*$")


def parse_mesh_shape(value: Any) -> tuple[int, ...]:
    """Reads a mesh shape written `AxB[xC]` or as a list of integers; -1 may stand once."""
    if isinstance(value, str):
        text = value.strip()
        if not _SHAPE_TEXT.match(text):
            raise ConfigError(
                "mesh.shape",
                f"got {value!r}; write the shape as AxB[xC] with positive integers "
                "(e.g. mesh=2x4) or pick a named mesh (data_parallel, model_parallel)",
            )
        dims = [int(part) for part in text.split("x")]
    elif isinstance(value, (list, tuple)) and value:
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
            raise ConfigError("mesh.shape", f"got {list(value)!r}; every dimension must be an integer")
        dims = list(value)
    else:
        raise ConfigError("mesh.shape", f"got {value!r}; expected AxB[xC] or a list of integers")
    if any(d <= 0 and d != FILL for d in dims) or dims.count(FILL) > 1:
        raise ConfigError(
            "mesh.shape",
            f"got {format_shape(dims)}; every dimension must be a positive integer "
            "(one dimension may be -1 to take all remaining devices)",
        )
    return tuple(dims)


def parse_mesh(raw: Mapping[str, Any]) -> MeshConfig:
    """Validates the mesh section: shape, axis names (defaults by rank) and batch axis."""
    _reject_unknown(raw, ("shape", "axis_names", "batch_axis"), prefix="mesh")
    shape = parse_mesh_shape(raw.get("shape"))
    names = raw.get("axis_names")
    if names is None:
        if len(shape) not in DEFAULT_AXIS_NAMES:
            raise ConfigError(
                "mesh.axis_names",
                f"a {len(shape)}-D mesh {format_shape(shape)} has no default axis names; "
                f"give {len(shape)} names, e.g. mesh.axis_names=[{','.join(_example_names(len(shape)))}]",
            )
        names = DEFAULT_AXIS_NAMES[len(shape)]
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError("mesh.axis_names", f"got {names!r}; expected a list of non-empty names")
    names = tuple(names)
    if len(names) != len(shape):
        raise ConfigError(
            "mesh.axis_names",
            f"got {list(names)} ({len(names)} names) for the {len(shape)}-D mesh "
            f"{format_shape(shape)}; give exactly {len(shape)} names",
        )
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            "mesh.axis_names", f"got {list(names)}; axis names must be unique, {one_of(duplicates)} repeats"
        )
    batch_axis = raw.get("batch_axis")
    if batch_axis is None:
        batch_axis = names[0]
    if batch_axis not in names:
        raise ConfigError(
            "mesh.batch_axis", f"got {batch_axis!r}; valid: one of the mesh axes {one_of(names)}"
        )
    return MeshConfig(shape=shape, axis_names=names, batch_axis=batch_axis)


def _example_names(rank: int) -> list[str]:
    return ["data", "model", "seq", "expert", "stage"][:rank] + [f"axis{i}" for i in range(5, rank)]


# --- layout -------------------------------------------------------------------------------------


LAYOUT_KEYS = ("rules", "extra_rules", "optional", "from_model", "auto", "min_bytes", "fsdp")


def parse_layout(raw: Mapping[str, Any], mesh: MeshConfig) -> LayoutConfig:
    """Validates the layout section: `rules` and `extra_rules` (compilable regexes, list values, axes
    that exist in the mesh), `optional` (patterns of `rules` that may match nothing), and what may
    replace `rules`: `from_model` (the model's own layout map) or `auto` (rules derived from the
    model's variables, with `min_bytes` and `fsdp`)."""
    _reject_unknown(raw, LAYOUT_KEYS, prefix="layout")
    from_model, auto, fsdp = (_switch(raw, f"layout.{name}") for name in ("from_model", "auto", "fsdp"))
    optional = raw.get("optional") or ()
    if isinstance(optional, str) or not all(isinstance(p, str) for p in optional):
        raise ConfigError("layout.optional", f"got {optional!r}; expected a list of patterns of layout.rules")
    rules = _parse_rules(raw, "rules", mesh, optional=frozenset(optional))
    replaced_by = "layout.from_model" if from_model else "layout.auto" if auto else None
    if from_model and auto:
        raise ConfigError("layout.auto", "got true with layout.from_model=true; choose one: the model's own map (layout=from_model) or derived rules (layout=auto)")
    if replaced_by and rules:
        raise ConfigError(
            "layout.rules",
            f"got {len(rules)} rule{'s' if len(rules) > 1 else ''} with {replaced_by}=true, which gives the rules; "
            "add yours on top with layout.extra_rules={...}",
        )
    min_bytes = parse_size("layout.min_bytes", raw.get("min_bytes", DEFAULT_AUTO_MIN_BYTES))
    return LayoutConfig(rules=rules, extra_rules=_parse_rules(raw, "extra_rules", mesh), from_model=from_model,
                        auto=auto, min_bytes=min_bytes, fsdp=fsdp)


def _switch(raw: Mapping[str, Any], key: str) -> bool:
    value = raw.get(key.rpartition(".")[2]) or False
    if not isinstance(value, bool):
        raise ConfigError(key, f"got {value!r}; expected true or false")
    return value


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_SIZE_TEXT = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-z]*)$")


def parse_size(key: str, value: Any) -> int:
    """Bytes from a size written as a number of bytes or with a unit: 1MiB, 512KiB, 1.5GiB (KB, MB and GB are powers of 1000)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    found = _SIZE_TEXT.match(str(value).strip().lower()) if isinstance(value, (str, float)) and not isinstance(value, bool) else None
    if found and found.group(2) in _SIZE_UNITS:
        return int(float(found.group(1)) * _SIZE_UNITS[found.group(2)])
    raise ConfigError(key, f"got {value!r}; expected a size in bytes: a number, or a number with a unit such as 512KiB, 1MiB or 1.5GiB")


def _parse_rules(raw: Mapping[str, Any], origin: str, mesh: MeshConfig, optional: frozenset = frozenset()) -> tuple[LayoutRule, ...]:
    rules_raw = raw.get(origin) or {}
    if not isinstance(rules_raw, Mapping):
        raise ConfigError(f"layout.{origin}", f"got {rules_raw!r}; expected a mapping of regex -> list of axes")
    rules = []
    for pattern, axes in rules_raw.items():
        key = f"layout.{origin}.{pattern}"
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigError(key, f"is not a valid regular expression ({err})") from None
        if not isinstance(axes, (list, tuple)):
            raise ConfigError(
                key, f"got {axes!r}; expected a list with one mesh axis or null per dimension"
            )
        check_rule_axes(key, tuple(axes), mesh)
        rules.append(LayoutRule(pattern=str(pattern), axes=tuple(axes), origin=origin, optional=pattern in optional))
    return tuple(rules)


# --- model --------------------------------------------------------------------------------------


def parse_model(raw: Mapping[str, Any]) -> ModelConfig:
    """Looks the model up in the registry and validates its options against its dataclass."""
    name = raw.get("name")
    names = MODELS.names()
    if name not in names:
        raise ConfigError("model.name", f"got {name!r}; available models: {one_of(names)}")
    spec = MODELS.get(name)
    options_raw = {k: v for k, v in raw.items() if k != "name"}
    values = _parse_dataclass(spec.options, options_raw, "model", as_kwargs=True)
    options = spec.options(**values)  # the options' own checks raise ConfigError on model.<key>
    return ModelConfig(name=name, options=options)


def parse_data(raw: Mapping[str, Any]) -> DataConfig:
    """Looks the data source up in the registry and validates its options against its dataclass."""
    name = raw.get("name", "synthetic")
    names = SOURCES.names()
    if name not in names:
        raise ConfigError("data.name", f"got {name!r}; available data sources: {one_of(names)}")
    spec = SOURCES.get(name)
    values = _parse_dataclass(spec.options, {k: v for k, v in raw.items() if k != "name"}, "data", as_kwargs=True)
    return DataConfig(name=name, options=spec.options(**values))


def _parse_resume(value: Any) -> str | None:
    if value is None or isinstance(value, str) and value.strip():
        return value
    raise ConfigError("resume", f"got {value!r}; valid: {one_of(RESUME_MODES)} or the path of a checkpoint dir")


def parse_logging(raw: Mapping[str, Any]) -> LoggingConfig:
    """Validates the logging section: a true/false switch for each optional sink of the step log."""
    switches = sinks.switch_names()
    _reject_unknown(raw, switches, prefix="logging")
    for name, value in raw.items():
        _check_type(f"logging.{name}", value, bool)
    return LoggingConfig(sinks=frozenset(name for name, on in raw.items() if on))


# --- distributed --------------------------------------------------------------------------------

EXPLICIT_KEYS = ("coordinator", "num_processes", "process_id")


def parse_distributed(raw: Mapping[str, Any]) -> DistributedConfig:
    """Validates the distributed section on its own (its fit with the mesh is checked with the
    whole config). YAML reads a bare `off` as false, which means the mode off here too."""
    raw = dict(raw)
    if raw.get("mode") is False:
        raw["mode"] = "off"
    config = _parse_dataclass(DistributedConfig, raw, "distributed")
    if config.mode not in DISTRIBUTED_MODES:
        raise ConfigError("distributed.mode", f"got {config.mode!r}; valid: {one_of(DISTRIBUTED_MODES)}")
    given = [k for k in EXPLICIT_KEYS if getattr(config, k) is not None]
    if given and config.mode == "off":
        config = dataclasses.replace(config, mode="explicit")
    if config.mode == "explicit":
        missing = [k for k in EXPLICIT_KEYS if getattr(config, k) is None]
        if missing:
            raise ConfigError(
                f"distributed.{missing[0]}",
                f"is missing: an explicit multi-process job needs {', '.join(f'distributed.{k}' for k in EXPLICIT_KEYS)}",
            )
    check_distributed_values(config)
    if config.launches_locally and config.mode != "off":
        raise ConfigError(
            "distributed.local_processes",
            f"got {config.local_processes} with distributed.mode={config.mode}; meshrun starts local processes "
            "itself, so leave distributed.mode off and unset coordinator, num_processes and process_id",
        )
    return config


# --- generic dataclass parsing ------------------------------------------------------------------


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_TEXT = re.compile(r"^(\d+(?:\.\d+)?[smhd])+$")


def parse_duration(key: str, value: Any) -> float | None:
    """Seconds from a duration written as a number of seconds, `90m`, `1h30m`, `2h` or `H:MM:SS`."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower()
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}", text):
        seconds = 0.0
        for part in text.split(":"):
            seconds = seconds * 60 + int(part)
        return seconds
    if _DURATION_TEXT.match(text):
        return sum(float(amount) * _DURATION_UNITS[unit] for amount, unit in re.findall(r"(\d+(?:\.\d+)?)([smhd])", text))
    raise ConfigError(key, f"got {value!r}; expected seconds or a duration such as 90m, 1h30m, 2h or 1:30:00")


def _with_duration(raw: Mapping[str, Any], name: str, prefix: str) -> Mapping[str, Any]:
    """`raw` with its duration `name` turned into seconds."""
    if name not in raw:
        return raw
    return {**raw, name: parse_duration(f"{prefix}.{name}", raw[name])}


def _section(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(name, f"got {value!r}; expected a config section (a mapping)")
    return value


def _reject_unknown(raw: Mapping[str, Any], allowed, prefix: str) -> None:
    for key in raw:
        if key in allowed:
            continue
        dotted = f"{prefix}.{key}" if prefix else str(key)
        other = other_choice_hint(dotted)
        hint = f"{other}; " if other else did_you_mean(dotted, known_keys())
        valid = [f"{prefix}.{a}" if prefix else a for a in allowed]
        raise ConfigError(dotted, f"unknown key (got {raw[key]!r}); {hint}valid keys: {one_of(valid)}")


def _parse_dataclass(cls, raw: Mapping[str, Any], prefix: str, as_kwargs: bool = False):
    """Checks keys and value types of `raw` against dataclass `cls`; returns an instance (or the
    checked keyword arguments when `as_kwargs`)."""
    allowed = [f.name for f in dataclasses.fields(cls)]
    _reject_unknown(raw, allowed, prefix=prefix)
    hints = typing.get_type_hints(cls)
    values = {name: _check_type(f"{prefix}.{name}", raw[name], hints[name]) for name in allowed if name in raw}
    return values if as_kwargs else cls(**values)


def _check_type(key: str, value: Any, expected: Any) -> Any:
    origin = typing.get_origin(expected)
    args = typing.get_args(expected)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_type(key, value, inner)
    if dataclasses.is_dataclass(expected):
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"got {value!r}; expected a section with keys {one_of([f.name for f in dataclasses.fields(expected)])}")
        return _parse_dataclass(expected, value, key)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"got {value!r}; expected a list")
        return tuple(_check_type(key, item, args[0]) for item in value)
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif expected is str:
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        raise ConfigError(key, f"got {value!r}; expected {getattr(expected, '__name__', expected)}")
    return value
