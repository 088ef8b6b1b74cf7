"""Typed run configuration: the dataclasses every library module takes. `meshrun.config.parse`
turns a composed config (a plain dict) into them and `meshrun.config.checks` holds the value checks,
so that every bad value is a `ConfigError` naming its key before anything runs.

Nothing here imports jax or keras. Checks that need the model's variables (layout rules against
shapes) live in `meshrun.placement.layout`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from meshrun.errors import ConfigError
from meshrun.specs.rundir import CHECKPOINTS_DIR
from meshrun.wording import format_shape

PLATFORMS = ("auto", "cpu", "gpu", "tpu")
VERBOSITY = (0, 1, 2)
DEFAULT_AXIS_NAMES = {1: ("data",), 2: ("data", "model")}
FILL = -1  # a mesh dimension of -1 takes every device the others leave


@dataclass(frozen=True)
class MeshConfig:
    """The device mesh: its shape (one dimension may be -1, filled at device setup), axis names,
    the axis the batch is split over, and how many slices each axis spans across the job's
    processes (`dcn`; None: the default for the job, meshrun.config.slices)."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    batch_axis: str
    dcn: tuple[int, ...] | None = None

    def resolved(self, device_count: int) -> MeshConfig:
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
    def size(self) -> int | None:
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


AxisSpec = Optional[str]  # noqa: UP045 (a runtime alias, read by get_type_hints like the fields)


# Where a layout rule came from: written in the layout config (a layout file or layout.rules),
# added on top of it (layout.extra_rules), taken from the model's own layout map (from_model), or
# derived from the model's variables and the mesh (auto), or, for a stacked variable of pipelined
# blocks that no rule places, its stage axis alone (pipeline).
RULE_ORIGINS = ("rules", "extra_rules", "from_model", "auto", "pipeline")
DEFAULT_AUTO_MIN_BYTES = 1 << 20
# A replicated variable at least this large, on a mesh of more than one device, gets a warning (the plan's).
LARGE_REPLICATED_BYTES = 1 << 20


@dataclass(frozen=True)
class LayoutRule:
    """One layout rule: a regex matched against variable and `<layer>/output` paths with
    re.fullmatch, and the mesh axis (or None) for each dimension of what it matches. `origin` says
    where it came from (RULE_ORIGINS); an `optional` rule may match nothing (a family layout's rule
    for a variable some members lack, or a rule of the model's own map), where any other rule that
    matches nothing is an error. A rule that may `replicate_if_indivisible` (a family layout's rule
    over attention heads, or one of the model's own map) leaves a dimension whole over a mesh axis
    that does not divide it (Gemma 2B's one key/value head on a model axis of 8), where any other
    rule's indivisible dimension is an error. meshrun derives exact rules (the path as pattern) from
    written ones: for a pipelined stacked weight, and for a path whose dimension a rule left whole;
    `derived_from` names the written rule's pattern (what plans show)."""

    pattern: str
    axes: tuple[AxisSpec, ...]
    origin: str = "rules"
    optional: bool = False
    replicate_if_indivisible: bool = False
    derived_from: str | None = None

    @property
    def key(self) -> str:
        """The config key a problem with this rule is reported under."""
        if self.origin in ("from_model", "auto"):
            return f"layout.{self.origin}"
        return f"layout.{self.origin}.{self.derived_from or self.pattern}"


@dataclass(frozen=True)
class LayoutConfig:
    """The layout rules in the order they were written, those added on top (`extra_rules`), and
    whether the model's own layout map (`from_model`) or rules derived from its variables (`auto`,
    meshrun.placement.auto: variables of at least `min_bytes`, fully sharded over the batch axis
    too with `fsdp`) replace `rules`; both are resolved once the model and mesh are known
    (meshrun.run.prepare.layout_rules)."""

    rules: tuple[LayoutRule, ...] = ()
    extra_rules: tuple[LayoutRule, ...] = ()
    from_model: bool = False
    auto: bool = False
    min_bytes: int = DEFAULT_AUTO_MIN_BYTES
    fsdp: bool = False


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

    monitor: str | None = None
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
    every `eval_every` epochs, a wall-clock budget (`max_time`), early stopping, and prompts the
    trained model completes at the end (`sample_prompts`, within `sample_max_length` tokens)."""

    batch_size: int = 16
    epochs: int = 3
    optimizer: str = "adam"
    learning_rate: float = 0.001
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_learning_rate: float = 0.0
    clip_norm: float | None = None
    precision: str = "float32"
    loss: str | None = None  # None: the model's own loss
    metrics: tuple[str, ...] | None = (
        None  # None: the model's own (with its loss), else accuracy for cross-entropy
    )
    seed: int = 1337
    verbose: int = 1
    stop_on_nan: bool = True
    grad_accum_steps: int = 1
    eval_every: int | None = None
    max_time: float | None = None  # seconds from process start; the config may say "90m", "2h", "1:30:00"
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    sample_prompts: tuple[str, ...] | None = (
        None  # completed after training (KerasHub causal LMs; meshrun.run.sampling)
    )
    sample_max_length: int | None = None  # tokens of prompt and completion together; None: model.seq_len


@dataclass(frozen=True)
class DevicesConfig:
    """Which platform to run on, how many CPU devices to emulate for a mesh holding -1, the
    peak FLOP/s of one device where meshrun's table does not know the device kind, and the memory
    of one device in GiB for planning (None: what the accelerator reports; unknown on CPU). A job
    whose planned bytes per device exceed it does not run."""

    platform: str = "auto"
    cpu_devices: int = 8
    peak_flops: float | None = None
    memory_gib: float | None = None

    @property
    def memory_bytes(self) -> int | None:
        """devices.memory_gib in bytes (None: not given)."""
        return None if self.memory_gib is None else int(self.memory_gib * (1 << 30))


@dataclass(frozen=True)
class CacheConfig:
    """XLA's persistent compilation cache: on by default, in `dir` (None: the user's cache dir,
    $XDG_CACHE_HOME/meshrun/xla or ~/.cache/meshrun/xla). Like the token cache, it is used only
    when no one but its owner can write to it, or its group too with `shared`
    (meshrun.system.trust)."""

    enabled: bool = True
    dir: str | None = None
    shared: bool = False


@dataclass(frozen=True)
class CheckpointConfig:
    """Sharded checkpoints: every `every_steps` training steps and/or at the end of every epoch,
    keeping the newest `keep`, written in the background (`async_save`), into `dir` (None: the run
    dir's checkpoints/). `every_epoch` left None means yes when a dir is given without every_steps:
    naming a checkpoint dir asks for checkpoints. `export` also writes the final model as model.keras
    into the run dir. `keep_adapter`: a LoRA run writes its adapters (adapter.lora.h5) into the run
    dir at its end, export or not, so that it can always be sampled (meshrun generate)."""

    every_steps: int | None = None
    every_epoch: bool | None = None
    keep: int = 3
    dir: str | None = None
    async_save: bool = True
    export: bool = False
    keep_adapter: bool = True

    def directory(self, run_dir: str | Path) -> Path:
        """Where the run's checkpoints go: `dir`, else <run dir>/checkpoints (absolute)."""
        return (
            Path(self.dir).expanduser().resolve() if self.dir else Path(run_dir).resolve() / CHECKPOINTS_DIR
        )

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
    """Which copies of the step log a run writes besides log.jsonl (always written): the sinks
    switched on with `logging.<name>=true`, by name (meshrun.logs.sinks registers them: tensorboard,
    csv, ...)."""

    sinks: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ProfileConfig:
    """A JAX profiler trace of training steps `steps` = (first, last), counted from 1 as in
    log.jsonl, written into `dir` (None: <run dir>/profile); None: no trace."""

    steps: tuple[int, ...] | None = None
    dir: str | None = None


@dataclass(frozen=True)
class PipelineConfig:
    """Pipeline stages (meshrun.pipeline): a mesh axis named `axis` holds the model's repeated blocks
    in as many contiguous stages as it is long (a mesh without that axis: no pipeline); each batch
    is cut into `microbatches` microbatches handed from stage to stage (None: as many as there are
    stages), `repeats` > 1 gives each device that many non-adjacent stages (the circular schedule:
    a smaller idle share), and `remat` recomputes each block's activations in the backward pass
    instead of keeping them."""

    axis: str = "stage"
    microbatches: int | None = None
    repeats: int = 1
    remat: bool = False

    def stages(self, mesh: MeshConfig) -> int:
        """How many stages `mesh` gives the blocks (0: the mesh has no stage axis, no pipeline)."""
        return mesh.axis_size(self.axis) if self.axis in mesh.axis_names else 0

    def microbatches_on(self, mesh: MeshConfig) -> int:
        """The microbatch count on `mesh`, the stage count where none was given."""
        return self.microbatches or max(self.stages(mesh), 1)


RESUME_MODES = ("auto", "never")


DISTRIBUTED_MODES = ("off", "auto", "explicit")


@dataclass(frozen=True)
class DistributedConfig:
    """How many processes form the job and how they find each other: `off` (one process),
    `auto` (read SLURM's or the KERAS_DISTRIBUTION_* / JAX_* environment), `explicit` (the
    coordinator, num_processes and process_id given here; setting them implies it), or
    `local_processes` processes started on this machine by meshrun itself. `timeout_s` bounds
    how long a process waits for the others to join; `port` is the coordinator's port for
    local_processes (None: a free one); `bind_address` (HOST:PORT) is where process 0's coordinator
    listens (None: loopback for a job on this machine, else the address the coordinator names
    where it is this host's, else every interface: meshrun.launch.join.listen_address)."""

    mode: str = "off"
    local_processes: int = 1
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    port: int | None = None
    timeout_s: int = 120
    bind_address: str | None = None

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
    data: DataConfig = field(default_factory=DataConfig)  # meshrun.config.parse fills in the source's options
    train: TrainConfig = field(default_factory=TrainConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    resume: str | None = (
        None  # auto, never or a checkpoint path; None: auto with checkpoint.dir or when requeued, else never
    )

    def resume_mode(self, requeued: bool = False) -> str:
        """auto, never or a path: what `resume` means once its default is filled in (auto with a
        checkpoint dir, or in a job its scheduler `requeued`, whose run dir holds its checkpoints)."""
        if self.resume is not None:
            return self.resume
        return "auto" if self.checkpoint.dir or requeued else "never"


TOP_LEVEL_KEYS = (
    "mesh",
    "layout",
    "model",
    "data",
    "train",
    "devices",
    "cache",
    "distributed",
    "checkpoint",
    "logging",
    "profile",
    "pipeline",
    "resume",
)
