"""Typed run configuration: the dataclasses every library module takes, and the one place that
turns a composed config (a plain dict) into them, rejecting bad values with a `ConfigError`.

Nothing here imports jax or keras, so every check in this module runs before devices are set up.
Checks that need the model's variables (layout rules against shapes) live in `meshrun.layout`.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from meshrun import data as data_sources
from meshrun.errors import ConfigError, closest, one_of
from meshrun.models import registry

PLATFORMS = ("auto", "cpu", "gpu", "tpu")
VERBOSITY = (0, 1, 2)
DEFAULT_AXIS_NAMES = {1: ("data",), 2: ("data", "model")}
FILL = -1  # a mesh dimension of -1 takes every device the others leave


@dataclass(frozen=True)
class MeshConfig:
    """The device mesh: its shape (one dimension may be -1, filled at device setup), axis names
    and the axis the batch is split over."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    batch_axis: str

    def resolved(self, device_count: int) -> "MeshConfig":
        """This mesh with a -1 dimension replaced so the product is `device_count`."""
        if FILL not in self.shape:
            return self
        known = 1
        for size in self.shape:
            if size != FILL:
                known *= size
        if device_count % known:
            raise ConfigError(
                "mesh.shape",
                f"got {format_shape(self.shape)}: the other dimensions ({known}) do not divide "
                f"the {device_count} available devices",
            )
        return dataclasses.replace(
            self, shape=tuple(device_count // known if s == FILL else s for s in self.shape)
        )

    @property
    def size(self) -> Optional[int]:
        """How many devices the mesh needs, or None while it still holds a -1."""
        if FILL in self.shape:
            return None
        total = 1
        for size in self.shape:
            total *= size
        return total

    def axis_size(self, axis: str) -> int:
        """The number of devices along mesh axis `axis`."""
        return self.shape[self.axis_names.index(axis)]


AxisSpec = Optional[str]


# Where a layout rule came from: written in the layout config (a layout file or layout.rules),
# added on top of it (layout.extra_rules), or taken from the model's own layout map (from_model).
RULE_ORIGINS = ("rules", "extra_rules", "from_model")


@dataclass(frozen=True)
class LayoutRule:
    """One layout rule: a regex matched against variable and `<layer>/output` paths with
    re.fullmatch, and the mesh axis (or None) for each dimension of what it matches. `origin` says
    where it came from (RULE_ORIGINS); an `optional` rule may match nothing (a family layout's rule
    for a variable some members lack, or a rule of the model's own map), where any other rule that
    matches nothing is an error."""

    pattern: str
    axes: tuple[AxisSpec, ...]
    origin: str = "rules"
    optional: bool = False

    @property
    def key(self) -> str:
        """The config key a problem with this rule is reported under."""
        return "layout.from_model" if self.origin == "from_model" else f"layout.{self.origin}.{self.pattern}"


@dataclass(frozen=True)
class LayoutConfig:
    """The layout rules in the order they were written, those added on top (`extra_rules`), and
    whether the model's own layout map replaces `rules` (`from_model`, resolved once the model and
    mesh are known: meshrun.build.layout_rules)."""

    rules: tuple[LayoutRule, ...] = ()
    extra_rules: tuple[LayoutRule, ...] = ()
    from_model: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """Which registered model to build, and its options (the model's own dataclass)."""

    name: str
    options: Any


@dataclass(frozen=True)
class DataConfig:
    """Which registered data source feeds the run, and its options (the source's own dataclass)."""

    name: str = "synthetic"
    options: Any = None


PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
LR_SCHEDULES = ("constant", "cosine", "linear")


@dataclass(frozen=True)
class EarlyStoppingConfig:
    """Stop training once `monitor` (a logged metric: loss, accuracy, val_loss, ...; None: never
    stop early) has not improved by `min_delta` for `patience` epochs; `mode` min, max or auto
    (max for accuracy-like names, else min)."""

    monitor: Optional[str] = None
    patience: int = 3
    min_delta: float = 0.0
    mode: str = "auto"


@dataclass(frozen=True)
class TrainConfig:
    """How to train: global batch size, epochs, optimizer, learning rate and its schedule
    (constant, cosine with `warmup_steps` of linear warm-up, or linear decay, both ending at
    `min_learning_rate`), gradient clipping by global norm, the Keras dtype policy, loss (None:
    the model's own), metrics, seed, console verbosity, whether a NaN/Inf loss stops the run,
    gradient accumulation (`grad_accum_steps` steps of `batch_size` per optimizer update), evaluation
    every `eval_every` epochs, a wall-clock budget (`max_time`) and early stopping."""

    batch_size: int = 16
    epochs: int = 3
    optimizer: str = "adam"
    learning_rate: float = 0.001
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_learning_rate: float = 0.0
    clip_norm: Optional[float] = None
    precision: str = "float32"
    loss: Optional[str] = None  # None: the model's own loss
    metrics: Optional[tuple[str, ...]] = None  # None: the model's own (with its loss), else accuracy for cross-entropy
    seed: int = 1337
    verbose: int = 1
    stop_on_nan: bool = True
    grad_accum_steps: int = 1
    eval_every: Optional[int] = None
    max_time: Optional[float] = None  # seconds from process start; the config may say "90m", "2h", "1:30:00"
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)


@dataclass(frozen=True)
class DevicesConfig:
    """Which platform to run on, how many CPU devices to emulate for a mesh holding -1, and the
    peak FLOP/s of one device where meshrun's table does not know the device kind."""

    platform: str = "auto"
    cpu_devices: int = 8
    peak_flops: Optional[float] = None


@dataclass(frozen=True)
class CacheConfig:
    """XLA's persistent compilation cache: on by default, in `dir` (None: the user's cache dir,
    $XDG_CACHE_HOME/meshrun/xla or ~/.cache/meshrun/xla)."""

    enabled: bool = True
    dir: Optional[str] = None


@dataclass(frozen=True)
class CheckpointConfig:
    """Sharded checkpoints: every `every_steps` training steps and/or at the end of every epoch,
    keeping the newest `keep`, written in the background (`async_save`), into `dir` (None: the run
    dir's checkpoints/). `every_epoch` left None means yes when a dir is given without every_steps:
    naming a checkpoint dir asks for checkpoints. `export` also writes the final model as model.keras
    into the run dir."""

    every_steps: Optional[int] = None
    every_epoch: Optional[bool] = None
    keep: int = 3
    dir: Optional[str] = None
    async_save: bool = True
    export: bool = False

    @property
    def saves_every_epoch(self) -> bool:
        """Whether a checkpoint is written at the end of every epoch."""
        return self.every_epoch if self.every_epoch is not None else bool(self.dir) and not self.every_steps

    @property
    def saves(self) -> bool:
        """Whether the run writes checkpoints at all."""
        return bool(self.every_steps) or self.saves_every_epoch


@dataclass(frozen=True)
class LoggingConfig:
    """Optional copies of the step log (log.jsonl is always written): TensorBoard event files in
    <run dir>/tensorboard and CSV files (steps.csv, epochs.csv) in the run dir."""

    tensorboard: bool = False
    csv: bool = False


@dataclass(frozen=True)
class ProfileConfig:
    """A JAX profiler trace of training steps `steps` = (first, last), counted from 1 as in
    log.jsonl, written into `dir` (None: <run dir>/profile); None: no trace."""

    steps: Optional[tuple[int, ...]] = None
    dir: Optional[str] = None


RESUME_MODES = ("auto", "never")


DISTRIBUTED_MODES = ("off", "auto", "explicit")


@dataclass(frozen=True)
class DistributedConfig:
    """How many processes form the job and how they find each other: `off` (one process),
    `auto` (read SLURM's or the KERAS_DISTRIBUTION_* / JAX_* environment), `explicit` (the
    coordinator, num_processes and process_id given here; setting them implies it), or
    `local_processes` processes started on this machine by meshrun itself. `timeout_s` bounds
    how long a process waits for the others to join; `port` is the coordinator's port for
    local_processes (None: a free one)."""

    mode: str = "off"
    local_processes: int = 1
    coordinator: Optional[str] = None
    num_processes: Optional[int] = None
    process_id: Optional[int] = None
    port: Optional[int] = None
    timeout_s: int = 120

    @property
    def launches_locally(self) -> bool:
        """Whether meshrun starts the job's processes itself, on this machine."""
        return self.local_processes > 1


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs, validated."""

    mesh: MeshConfig
    layout: LayoutConfig
    model: ModelConfig
    data: DataConfig = field(default_factory=lambda: parse_data({}))
    train: TrainConfig = field(default_factory=TrainConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    resume: Optional[str] = None  # auto, never or a checkpoint path; None: auto with checkpoint.dir, else never

    @property
    def resume_mode(self) -> str:
        """auto, never or a path: what `resume` means once its default is filled in."""
        if self.resume is not None:
            return self.resume
        return "auto" if self.checkpoint.dir else "never"


TOP_LEVEL_KEYS = ("mesh", "layout", "model", "data", "train", "devices", "cache", "distributed", "checkpoint", "logging", "profile", "resume")


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
        logging=_parse_dataclass(LoggingConfig, _section(raw, "logging"), "logging"),
        profile=_parse_dataclass(ProfileConfig, _section(raw, "profile"), "profile"),
        resume=_parse_resume(raw.get("resume")),
    )
    _check_values(config)
    return config


def known_keys() -> list[str]:
    """Every dotted key a config may set (for 'did you mean' suggestions)."""
    keys = ["mesh.shape", "mesh.axis_names", "mesh.batch_axis", "layout.rules", "layout.extra_rules", "layout.optional",
            "layout.from_model", "model.name", "data.name", "resume"]
    sections = (("train", TrainConfig), ("devices", DevicesConfig), ("cache", CacheConfig), ("distributed", DistributedConfig),
                ("checkpoint", CheckpointConfig), ("logging", LoggingConfig), ("profile", ProfileConfig),
                ("train.early_stopping", EarlyStoppingConfig))
    for section, cls in sections:
        keys += [f"{section}.{f.name}" for f in dataclasses.fields(cls)]
    for name in registry.model_names():
        keys += [f"model.{f.name}" for f in dataclasses.fields(registry.get_model(name).options)]
    for name in data_sources.source_names():
        keys += [f"data.{f.name}" for f in dataclasses.fields(data_sources.get_source(name).options)]
    return sorted(set(keys))


def choices_with_key(key: str) -> list[str]:
    """The model and data choices that have `key` as an option ('data.path' -> ['data=arrays']):
    a key the chosen model or data source lacks may belong to another one."""
    group, _, name = key.partition(".")
    owners = {"model": lambda: {n: registry.get_model(n).options for n in registry.model_names()},
              "data": lambda: {n: data_sources.get_source(n).options for n in data_sources.source_names()}}
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


def format_shape(shape) -> str:
    """Writes a shape the way users type it: 2x4."""
    return "x".join(str(d) for d in shape)


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


def parse_layout(raw: Mapping[str, Any], mesh: MeshConfig) -> LayoutConfig:
    """Validates the layout section: `rules` and `extra_rules` (compilable regexes, list values, axes
    that exist in the mesh), `optional` (patterns of `rules` that may match nothing) and
    `from_model` (the model's own layout map instead of `rules`)."""
    _reject_unknown(raw, ("rules", "extra_rules", "optional", "from_model"), prefix="layout")
    from_model = raw.get("from_model") or False
    if not isinstance(from_model, bool):
        raise ConfigError("layout.from_model", f"got {from_model!r}; expected true or false")
    optional = raw.get("optional") or ()
    if isinstance(optional, str) or not all(isinstance(p, str) for p in optional):
        raise ConfigError("layout.optional", f"got {optional!r}; expected a list of patterns of layout.rules")
    rules = _parse_rules(raw, "rules", mesh, optional=frozenset(optional))
    if from_model and rules:
        raise ConfigError(
            "layout.rules",
            f"got {len(rules)} rule{'s' if len(rules) > 1 else ''} with layout.from_model=true, where the model gives the rules; "
            "add yours on top with layout.extra_rules={...}",
        )
    return LayoutConfig(rules=rules, extra_rules=_parse_rules(raw, "extra_rules", mesh), from_model=from_model)


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


def check_rule_axes(key: str, axes: tuple, mesh: MeshConfig) -> None:
    """ConfigError on `key` when a rule names an axis the mesh lacks or uses one axis twice."""
    for axis in axes:
        if axis is not None and axis not in mesh.axis_names:
            raise ConfigError(
                key,
                f"got axis {axis!r}, which is not in the mesh; valid: {one_of([*mesh.axis_names, 'null'])}",
            )
    used = [a for a in axes if a is not None]
    if len(set(used)) != len(used):
        raise ConfigError(key, f"got {list(axes)}; a mesh axis may shard only one dimension")


# --- model --------------------------------------------------------------------------------------


def parse_model(raw: Mapping[str, Any]) -> ModelConfig:
    """Looks the model up in the registry and validates its options against its dataclass."""
    name = raw.get("name")
    names = registry.model_names()
    if name not in names:
        raise ConfigError("model.name", f"got {name!r}; available models: {one_of(names)}")
    spec = registry.get_model(name)
    options_raw = {k: v for k, v in raw.items() if k != "name"}
    values = _parse_dataclass(spec.options, options_raw, "model", as_kwargs=True)
    options = spec.options(**values)  # the options' own checks raise ConfigError on model.<key>
    return ModelConfig(name=name, options=options)


def parse_data(raw: Mapping[str, Any]) -> DataConfig:
    """Looks the data source up in the registry and validates its options against its dataclass."""
    name = raw.get("name", "synthetic")
    names = data_sources.source_names()
    if name not in names:
        raise ConfigError("data.name", f"got {name!r}; available data sources: {one_of(names)}")
    spec = data_sources.get_source(name)
    values = _parse_dataclass(spec.options, {k: v for k, v in raw.items() if k != "name"}, "data", as_kwargs=True)
    return DataConfig(name=name, options=spec.options(**values))


def _parse_resume(value: Any) -> Optional[str]:
    if value is None or isinstance(value, str) and value.strip():
        return value
    raise ConfigError("resume", f"got {value!r}; valid: {one_of(RESUME_MODES)} or the path of a checkpoint dir")


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
    _check_distributed_values(config)
    if config.launches_locally and config.mode != "off":
        raise ConfigError(
            "distributed.local_processes",
            f"got {config.local_processes} with distributed.mode={config.mode}; meshrun starts local processes "
            "itself, so leave distributed.mode off and unset coordinator, num_processes and process_id",
        )
    return config


def _check_distributed_values(config: DistributedConfig) -> None:
    if config.local_processes < 1:
        raise ConfigError("distributed.local_processes", f"got {config.local_processes}; expected a positive integer (1: one process)")
    if config.num_processes is not None and config.num_processes < 1:
        raise ConfigError("distributed.num_processes", f"got {config.num_processes}; expected a positive integer")
    if config.process_id is not None and config.num_processes is not None and not 0 <= config.process_id < config.num_processes:
        raise ConfigError(
            "distributed.process_id",
            f"got {config.process_id}; valid: 0 to {config.num_processes - 1} (distributed.num_processes={config.num_processes})",
        )
    if config.coordinator is not None and not re.fullmatch(r"[\w.\-]+:\d{1,5}|\[[0-9a-fA-F:]+\]:\d{1,5}", config.coordinator):
        raise ConfigError("distributed.coordinator", f"got {config.coordinator!r}; expected host:port of process 0, e.g. node01:12345")
    if config.port is not None and not 0 < config.port < 65536:
        raise ConfigError("distributed.port", f"got {config.port}; expected a TCP port, 1 to 65535 (null: pick a free one)")
    if config.timeout_s <= 0:
        raise ConfigError("distributed.timeout_s", f"got {config.timeout_s}; expected a positive number of seconds")


def check_processes(mesh: MeshConfig, devices: DevicesConfig, processes: int, key: str) -> None:
    """The job's devices must split evenly over its processes (each holds the same number). For
    a mesh holding -1 that is known before jax starts only for emulated CPU devices."""
    if mesh.size is None and devices.platform != "cpu" and key != "distributed.local_processes":
        return
    total = mesh.size or devices.cpu_devices
    if total % processes:
        valid = [n for n in range(1, total + 1) if total % n == 0]
        what = f"mesh {format_shape(mesh.shape)}'s {total} devices" if mesh.size else f"devices.cpu_devices={total}"
        raise ConfigError(key, f"got {processes}, but {what} do not split evenly over {processes} processes; valid: {one_of(valid)}")


# --- generic dataclass parsing ------------------------------------------------------------------


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_TEXT = re.compile(r"^(\d+(?:\.\d+)?[smhd])+$")


def parse_duration(key: str, value: Any) -> Optional[float]:
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
        suggestions = [] if other else closest(dotted, known_keys(), n=1)
        hint = f"{other}; " if other else f"did you mean {suggestions[0]}? " if suggestions else ""
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


def _check_values(config: RunConfig) -> None:
    """Range checks that the types alone do not cover."""
    positive = {
        "train.batch_size": config.train.batch_size,
        "train.epochs": config.train.epochs,
        "devices.cpu_devices": config.devices.cpu_devices,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(key, f"got {value}; expected a positive integer")
    if config.train.learning_rate <= 0:
        raise ConfigError("train.learning_rate", f"got {config.train.learning_rate}; expected a positive number")
    if config.devices.peak_flops is not None and config.devices.peak_flops <= 0:
        raise ConfigError("devices.peak_flops", f"got {config.devices.peak_flops}; expected a positive FLOP/s figure, e.g. 9.89e14")
    _check_training_values(config.train)
    _check_profile(config.profile)
    if config.train.verbose not in VERBOSITY:
        raise ConfigError("train.verbose", f"got {config.train.verbose}; valid: {one_of(VERBOSITY)}")
    if config.devices.platform not in PLATFORMS:
        raise ConfigError("devices.platform", f"got {config.devices.platform!r}; valid: {one_of(PLATFORMS)}")
    check_batch(config.train.batch_size, config.mesh)
    checkpoint = config.checkpoint
    if checkpoint.every_steps is not None and checkpoint.every_steps <= 0:
        raise ConfigError("checkpoint.every_steps", f"got {checkpoint.every_steps}; expected a positive number of steps (null: none)")
    if checkpoint.keep <= 0:
        raise ConfigError("checkpoint.keep", f"got {checkpoint.keep}; expected a positive number of checkpoints to keep")
    distributed = config.distributed
    if distributed.launches_locally:
        if config.devices.platform not in ("auto", "cpu"):
            raise ConfigError(
                "distributed.local_processes",
                f"got {distributed.local_processes} with devices.platform={config.devices.platform}; local processes emulate "
                "CPU devices only: on accelerators run one process (it uses every device) or start one per host with distributed=auto",
            )
        check_processes(config.mesh, config.devices, distributed.local_processes, "distributed.local_processes")
    elif distributed.num_processes is not None:
        check_processes(config.mesh, config.devices, distributed.num_processes, "distributed.num_processes")
    synthetic = config.data.options
    if config.data.name == "synthetic":  # other sources count their samples when they load
        for key in ("num_samples", "eval_samples"):
            if getattr(synthetic, key) < config.train.batch_size:
                raise ConfigError(
                    f"data.{key}",
                    f"got {getattr(synthetic, key)}; fewer samples than one global batch (train.batch_size={config.train.batch_size})",
                )


def _check_training_values(train: TrainConfig) -> None:
    if train.precision not in PRECISIONS:
        raise ConfigError("train.precision", f"got {train.precision!r}; valid: {one_of(PRECISIONS)}")
    if train.lr_schedule not in LR_SCHEDULES:
        raise ConfigError("train.lr_schedule", f"got {train.lr_schedule!r}; valid: {one_of(LR_SCHEDULES)}")
    if train.warmup_steps < 0:
        raise ConfigError("train.warmup_steps", f"got {train.warmup_steps}; expected 0 or more steps")
    if train.warmup_steps and train.lr_schedule != "cosine":
        raise ConfigError("train.warmup_steps", f"got {train.warmup_steps} with train.lr_schedule={train.lr_schedule}; warm-up comes with cosine")
    if not 0 <= train.min_learning_rate <= train.learning_rate:
        raise ConfigError("train.min_learning_rate", f"got {train.min_learning_rate}; valid: 0 to train.learning_rate ({train.learning_rate})")
    if train.clip_norm is not None and train.clip_norm <= 0:
        raise ConfigError("train.clip_norm", f"got {train.clip_norm}; expected a positive global norm (null: no clipping)")
    if train.grad_accum_steps < 1:
        raise ConfigError("train.grad_accum_steps", f"got {train.grad_accum_steps}; expected 1 (no accumulation) or more steps per update")
    if train.eval_every is not None and train.eval_every < 1:
        raise ConfigError("train.eval_every", f"got {train.eval_every}; expected a positive number of epochs (null: evaluate at the end only)")
    if train.max_time is not None and train.max_time <= 0:
        raise ConfigError("train.max_time", f"got {train.max_time:g}; expected a positive duration such as 3600, 90m or 1:30:00 (null: no limit)")
    _check_early_stopping(train.early_stopping, train.eval_every)


EARLY_STOPPING_MODES = ("auto", "min", "max")


def _check_early_stopping(early: EarlyStoppingConfig, eval_every: Optional[int]) -> None:
    key = "train.early_stopping"
    if early.mode not in EARLY_STOPPING_MODES:
        raise ConfigError(f"{key}.mode", f"got {early.mode!r}; valid: {one_of(EARLY_STOPPING_MODES)}")
    if early.patience < 0:
        raise ConfigError(f"{key}.patience", f"got {early.patience}; expected 0 or more epochs")
    if early.min_delta < 0:
        raise ConfigError(f"{key}.min_delta", f"got {early.min_delta}; expected 0 or more")
    if early.monitor is not None and early.monitor.startswith("val_") and eval_every is None:
        raise ConfigError(
            f"{key}.monitor",
            f"got {early.monitor!r} with train.eval_every=null; val_ metrics exist only when training evaluates: "
            f"set train.eval_every=1, or monitor a training metric such as loss",
        )


def _check_profile(profile: ProfileConfig) -> None:
    steps = profile.steps
    if steps is None:
        return
    if len(steps) != 2 or not 1 <= steps[0] <= steps[1]:
        raise ConfigError("profile.steps", f"got {list(steps)}; expected [first, last] training steps with 1 <= first <= last, e.g. [10,20]")


def check_batch(batch_size: int, mesh: MeshConfig) -> None:
    """The global batch must split evenly over the batch axis (checked again once -1 is filled)."""
    if FILL in mesh.shape and mesh.shape[mesh.axis_names.index(mesh.batch_axis)] == FILL:
        return
    size = mesh.axis_size(mesh.batch_axis)
    if batch_size % size:
        lower = batch_size - batch_size % size
        valid = f"{lower} or {lower + size}" if lower else str(size)
        raise ConfigError(
            "train.batch_size",
            f"got {batch_size}, which does not divide by the batch axis {mesh.batch_axis!r} of size "
            f"{size}; use a multiple of {size}, e.g. {valid}",
        )
