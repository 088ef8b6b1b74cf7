"""The config sections with rules of their own, each read from its plain mapping into its schema
type: the mesh (shape text, default axis names, batch axis), the layout (rules, and what may replace
them), the model and data source (looked up by name, their options checked against their own
dataclasses), the logging switches, the distributed set-up and `resume`. The sections that are just
a dataclass's fields are read by meshrun.config.typed.parse_dataclass alone.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from meshrun.config.checks import check_distributed_values, check_rule_axes
from meshrun.config.keys import LAYOUT_KEYS, MESH_KEYS
from meshrun.config.layout_schema import (
    DEFAULT_AUTO_MIN_BYTES,
    DEFAULT_AXIS_NAMES,
    FILL,
    LayoutConfig,
    LayoutRule,
    MeshConfig,
)
from meshrun.config.schema import (
    DISTRIBUTED_MODES,
    RESUME_MODES,
    DataConfig,
    DistributedConfig,
    LoggingConfig,
    ModelConfig,
)
from meshrun.config.slices import check_dcn_shape
from meshrun.config.typed import check_type, parse_dataclass, parse_size, reject_unknown, switch
from meshrun.errors import ConfigError
from meshrun.specs import sinks
from meshrun.specs.data import SOURCES
from meshrun.specs.model import MODELS
from meshrun.wording import format_shape, one_of

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
    reject_unknown(raw, MESH_KEYS, prefix="mesh")
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
    mesh = MeshConfig(shape=shape, axis_names=names, batch_axis=batch_axis, dcn=_parse_dcn(raw.get("dcn")))
    check_dcn_shape(mesh)
    return mesh


def _parse_dcn(value: Any) -> tuple[int, ...] | None:
    """`mesh.dcn`: slice counts per axis, as a list of positive integers or AxB[xC]; null: the default."""
    if value is None:
        return None
    if isinstance(value, str) and _SHAPE_TEXT.match(value.strip()):
        value = [int(part) for part in value.strip().split("x")]
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value)
    ):
        return tuple(value)
    raise ConfigError(
        "mesh.dcn",
        f"got {value!r}; expected one positive slice count per mesh axis, e.g. mesh.dcn=[2,1] "
        "(the first axis spans 2 processes), or null for the default",
    )


def _example_names(rank: int) -> list[str]:
    return ["data", "model", "seq", "expert", "stage"][:rank] + [f"axis{i}" for i in range(5, rank)]


# --- layout -------------------------------------------------------------------------------------


def parse_layout(raw: Mapping[str, Any], mesh: MeshConfig) -> LayoutConfig:
    """Validates the layout section: `rules` and `extra_rules` (compilable regexes, list values, axes
    that exist in the mesh), `optional` (patterns of `rules` that may match nothing),
    `replicate_if_indivisible` (patterns of `rules` that leave a dimension their mesh axis does not
    divide whole instead of failing: a family layout's rules over attention heads), and what may
    replace `rules`: `from_model` (the model's own layout map) or `auto` (rules derived from the
    model's variables, with `min_bytes` and `fsdp`)."""
    reject_unknown(raw, LAYOUT_KEYS, prefix="layout")
    from_model, auto, fsdp = (switch(raw, f"layout.{name}") for name in ("from_model", "auto", "fsdp"))
    optional = _patterns_of_rules(raw, "optional")
    lenient = _patterns_of_rules(raw, "replicate_if_indivisible")
    rules = _parse_rules(raw, "rules", mesh, optional=optional, lenient=lenient)
    replaced_by = "layout.from_model" if from_model else "layout.auto" if auto else None
    if from_model and auto:
        raise ConfigError(
            "layout.auto",
            "got true with layout.from_model=true; choose one: the model's own map (layout=from_model) or "
            "derived rules (layout=auto)",
        )
    if replaced_by and rules:
        raise ConfigError(
            "layout.rules",
            f"got {len(rules)} rule{'s' if len(rules) > 1 else ''} with {replaced_by}=true, which gives the "
            "rules; "
            "add yours on top with layout.extra_rules={...}",
        )
    min_bytes = parse_size("layout.min_bytes", raw.get("min_bytes", DEFAULT_AUTO_MIN_BYTES))
    return LayoutConfig(
        rules=rules,
        extra_rules=_parse_rules(raw, "extra_rules", mesh),
        from_model=from_model,
        auto=auto,
        min_bytes=min_bytes,
        fsdp=fsdp,
    )


def _patterns_of_rules(raw: Mapping[str, Any], key: str) -> frozenset:
    """The patterns listed under layout.`key` (optional, replicate_if_indivisible): patterns of
    layout.rules. One that is not (layout.rules replaced on the command line) marks nothing."""
    patterns = raw.get(key) or ()
    if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(f"layout.{key}", f"got {patterns!r}; expected a list of patterns of layout.rules")
    return frozenset(patterns)


def _parse_rules(
    raw: Mapping[str, Any],
    origin: str,
    mesh: MeshConfig,
    optional: frozenset = frozenset(),
    lenient: frozenset = frozenset(),
) -> tuple[LayoutRule, ...]:
    """The rules under key `origin` (rules or extra_rules): each a compilable regex with a list of
    mesh axes (or null), one per dimension; those in `optional` may match nothing, those in
    `lenient` may leave a dimension their axis does not divide whole (replicated over it)."""
    rules_raw = raw.get(origin) or {}
    if not isinstance(rules_raw, Mapping):
        raise ConfigError(
            f"layout.{origin}", f"got {rules_raw!r}; expected a mapping of regex -> list of axes"
        )
    rules = []
    for pattern, axes in rules_raw.items():
        key = f"layout.{origin}.{pattern}"
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigError(key, f"is not a valid regular expression ({err})") from None
        if not isinstance(axes, (list, tuple)):
            raise ConfigError(key, f"got {axes!r}; expected a list with one mesh axis or null per dimension")
        check_rule_axes(key, tuple(axes), mesh)
        rules.append(
            LayoutRule(
                pattern=str(pattern),
                axes=tuple(axes),
                origin=origin,
                optional=pattern in optional,
                replicate_if_indivisible=pattern in lenient,
            )
        )
    return tuple(rules)


# --- model and data -----------------------------------------------------------------------------


def parse_model(raw: Mapping[str, Any]) -> ModelConfig:
    """Looks the model up in the registry and validates its options against its dataclass."""
    name = raw.get("name")
    names = MODELS.names()
    if name not in names:
        raise ConfigError("model.name", f"got {name!r}; available models: {one_of(names)}")
    spec = MODELS.get(name)
    options_raw = {k: v for k, v in raw.items() if k != "name"}
    values = parse_dataclass(spec.options, options_raw, "model", as_kwargs=True)
    options = spec.options(**values)  # the options' own checks raise ConfigError on model.<key>
    return ModelConfig(name=name, options=options)


def parse_data(raw: Mapping[str, Any]) -> DataConfig:
    """Looks the data source up in the registry and validates its options against its dataclass."""
    name = raw.get("name", DataConfig.name)  # the schema states the default source
    names = SOURCES.names()
    if name not in names:
        raise ConfigError("data.name", f"got {name!r}; available data sources: {one_of(names)}")
    spec = SOURCES.get(name)
    values = parse_dataclass(
        spec.options, {k: v for k, v in raw.items() if k != "name"}, "data", as_kwargs=True
    )
    return DataConfig(name=name, options=spec.options(**values))


# --- logging, resume ----------------------------------------------------------------------------


def parse_logging(raw: Mapping[str, Any]) -> LoggingConfig:
    """Validates the logging section: a true/false switch for each optional sink of the step log."""
    switches = sinks.switch_names()
    reject_unknown(raw, switches, prefix="logging")
    for name, value in raw.items():
        check_type(f"logging.{name}", value, bool)
    return LoggingConfig(sinks=frozenset(name for name, on in raw.items() if on))


def parse_resume(value: Any) -> str | None:
    """`resume`: auto, never or the path of a checkpoint dir; None when not given."""
    if value is None or isinstance(value, str) and value.strip():
        return value
    raise ConfigError(
        "resume", f"got {value!r}; valid: {one_of(RESUME_MODES)} or the path of a checkpoint dir"
    )


# --- distributed --------------------------------------------------------------------------------

EXPLICIT_KEYS = ("coordinator", "num_processes", "process_id")


def parse_distributed(raw: Mapping[str, Any]) -> DistributedConfig:
    """Validates the distributed section on its own (its fit with the mesh is checked with the
    whole config). YAML reads a bare `off` as false, which means the mode off here too."""
    raw = dict(raw)
    if raw.get("mode") is False:
        raw["mode"] = "off"
    config = parse_dataclass(DistributedConfig, raw, "distributed")
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
                "is missing: an explicit multi-process job needs "
                f"{', '.join(f'distributed.{k}' for k in EXPLICIT_KEYS)}",
            )
    check_distributed_values(config)
    if config.launches_locally and config.mode != "off":
        raise ConfigError(
            "distributed.local_processes",
            f"got {config.local_processes} with distributed.mode={config.mode}; meshrun starts local "
            "processes "
            "itself, so leave distributed.mode off and unset coordinator, num_processes and process_id",
        )
    return config
