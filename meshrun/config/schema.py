"""Typed run configuration: the dataclasses every library module takes. `meshrun.config.parse`
turns a composed config (a plain dict) into them and `meshrun.config.checks` holds the value checks,
so that every bad value is a `ConfigError` naming its key before anything runs.

Nothing here imports jax or keras. Checks that need the model's variables (layout rules against
shapes) live in `meshrun.placement.layout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshrun.config.fields import setting
from meshrun.config.layout_schema import LayoutConfig, MeshConfig
from meshrun.errors import ConfigError
from meshrun.specs.rundir import CHECKPOINTS_DIR
from meshrun.wording import one_of

PLATFORMS = ("auto", "cpu", "gpu", "tpu")
VERBOSITY = (0, 1, 2)
HF_DTYPES = ("float32", "bfloat16", "float16")  # checkpoint.hf_dtype


@dataclass(frozen=True)
class ModelConfig:
    """Which registered model to build, and its options (the model's own dataclass)."""

    name: str = setting(doc="The registered model to build (model=NAME).")
    options: Any = setting(doc="The model's own options (model.<key>): its options dataclass.")


@dataclass(frozen=True)
class DataConfig:
    """Which registered data source feeds the run, and its options (the source's own dataclass)."""

    name: str = setting(
        "synthetic", "The registered data source; each option of the data group names its source."
    )
    options: Any = setting(
        None, "The source's own options (data.<key>): its options dataclass, filled in by the parser."
    )


PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
LR_SCHEDULES = ("constant", "cosine", "linear")
REMAT_POLICIES = ("none", "blocks", "full", "activations")  # train.remat


@dataclass(frozen=True)
class EarlyStoppingConfig:
    """Stop training once `monitor` (a logged metric: loss, accuracy, val_loss, ...; None: never
    stop early) has not improved by `min_delta` for `patience` epochs; `mode` min, max or auto
    (max for accuracy-like names, else min)."""

    monitor: str | None = setting(
        None, "The logged metric to watch (loss, accuracy, val_loss, ...); null: never stop early."
    )
    patience: int = setting(3, "Epochs without an improvement of min_delta before training stops.")
    min_delta: float = setting(0.0, "The smallest change of `monitor` that counts as an improvement.")
    mode: str = setting("auto", "min, max or auto (max for accuracy-like names, else min).")


@dataclass(frozen=True)
class TrainConfig:
    """How to train: global batch size, epochs, optimizer, learning rate and its schedule
    (constant, cosine with `warmup_steps` of linear warm-up, or linear decay, both ending at
    `min_learning_rate`), gradient clipping by global norm, the Keras dtype policy, what the
    backward pass recomputes (`remat`), loss (None:
    the model's own), metrics, seed, console verbosity, whether a NaN/Inf loss stops the run,
    gradient accumulation (`grad_accum_steps` steps of `batch_size` per optimizer update), evaluation
    every `eval_every` epochs (and of the float base a quantized one was made from:
    `eval_float_base`), a wall-clock budget (`max_time`), early stopping, and prompts the
    trained model completes at the end (`sample_prompts`, within `sample_max_length` tokens, greedy
    or drawn with `sample_temperature`, `sample_top_k`, `sample_top_p` and `sample_seed`)."""

    batch_size: int = setting(
        16, "The global batch: split evenly over the mesh's batch axis, whose size must divide it."
    )
    epochs: int = setting(3, "Passes over the training data; the evaluation follows them.")
    optimizer: str = setting("adam", "The Keras optimizer, by name.")
    learning_rate: float = setting(0.001, "The learning rate (the one lr_schedule starts from).")
    lr_schedule: str = setting(
        "constant",
        "constant, cosine (after warmup_steps of linear warm-up from 0) or linear; cosine and linear "
        "decay over the whole run to min_learning_rate.",
    )
    warmup_steps: int = setting(0, "Steps of linear warm-up from 0 (lr_schedule=cosine only).")
    min_learning_rate: float = setting(0.0, "Where cosine and linear decay end: 0 to learning_rate.")
    clip_norm: float | None = setting(None, "Clip gradients to this global norm; null: no clipping.")
    precision: str = setting(
        "float32",
        "float32, mixed_bfloat16 or mixed_float16 (Keras dtype policies; float16 gets dynamic loss scaling).",
    )
    remat: str = setting(
        "none",
        "What the backward pass recomputes instead of keeping: none; blocks (each repeated block: the "
        "zoo transformer's, a KerasHub backbone's transformer layers, a model=python factory's "
        "repeated_blocks); full (every layer, each inside its owner); activations (every layer's "
        "activation function, Keras' RematScope activations). With pipeline stages, blocks and full "
        "recompute each stacked block, as pipeline.remat=true does.",
    )
    loss: str | None = setting(
        None,
        "A Keras loss, by name; null: the model's own (mse for dense_model, cross-entropy for the others).",
    )
    metrics: tuple[str, ...] | None = setting(
        None,
        "A list of Keras metric names; null: the model's own with its own loss (accuracy for the "
        "classifiers), else accuracy for a cross-entropy loss.",
    )
    seed: int = setting(1337, "The run's random seed (data=synthetic generates its data from it too).")
    verbose: int = setting(
        1,
        "0: quiet (CI logs), 1: a progress bar per epoch with step time and throughput (a line per "
        "epoch when the output is not a terminal), 2: one line per epoch.",
    )
    stop_on_nan: bool = setting(
        True,
        "Stop at the first step whose loss is NaN or infinite, naming it (checkpoints keep the last "
        "good state).",
    )
    grad_accum_steps: int = setting(
        1,
        "Accumulate the gradients of this many steps (each of batch_size samples) into one optimizer "
        "update of batch_size x grad_accum_steps samples; schedules and warmup_steps count steps, not "
        "updates.",
    )
    eval_every: int | None = setting(
        None,
        "Evaluate on the eval data every N epochs during training (val_* metrics in the logs and "
        "history); null: only the final evaluation after training.",
    )
    eval_float_base: bool = setting(
        True,
        "With model.quantize: before the quantized model is built, build the float base on the same "
        "mesh (planned on its own), evaluate it once on the eval data and free it, for metrics.json's "
        "quantize record (the quantization error training starts from); skipped with a warning where "
        "its plan does not fit the devices; false: never.",
    )
    max_time: float | None = setting(
        None,
        "Wall-clock budget from process start: seconds, or 90m, 2h, 1:30:00 (null: none); training "
        "stops at the first step past it, saves a checkpoint there (resume=auto continues) and still "
        "evaluates.",
    )
    early_stopping: EarlyStoppingConfig = setting(
        doc="Stop once `monitor` has not improved by min_delta for `patience` epochs "
        "(train.early_stopping.<key>).",
        factory=EarlyStoppingConfig,
    )
    sample_prompts: tuple[str, ...] | None = setting(
        (),
        "Prompts the trained model completes after training and evaluation (KerasHub causal LMs "
        "only; greedy unless sample_temperature, sample_top_k or sample_top_p say otherwise, up to the "
        "end token or the tokenizer's stop tokens), printed in the run's summary and recorded in "
        "metrics.json (samples), with data.tokenizer's tokenizer, else model.preset's; later: meshrun "
        "generate RUN_DIR --prompt TEXT. E.g. 'train.sample_prompts=[Once upon a time,The cat]'.",
    )
    sample_max_length: int | None = setting(
        None, "Tokens of prompt and completion together; null: model.seq_len."
    )
    sample_temperature: float | None = setting(
        None,
        "The sampling temperature (0 or more; above 1 more varied); 0: greedy; null: greedy, unless "
        "sample_top_k or sample_top_p is set, then 1.0.",
    )
    sample_top_k: int | None = setting(
        None, "Draw each token from the k most likely ones (1 or more; 1 is greedy); null: no limit."
    )
    sample_top_p: float | None = setting(
        None,
        "Draw each token from the fewest most likely ones whose probabilities add up to p (over 0, up "
        "to 1; within sample_top_k where both are set); null: no limit.",
    )
    sample_seed: int = setting(
        0, "The seed of the draws (0 to 2**32 - 1): the same seed gives the same text; unused when greedy."
    )


@dataclass(frozen=True)
class DevicesConfig:
    """Which platform to run on, how many CPU devices to emulate for a mesh holding -1, the
    peak FLOP/s of one device where meshrun's table does not know the device kind, and the memory
    of one device in GiB for planning (None: what the accelerator reports; unknown on CPU). A job
    whose planned bytes per device exceed it does not run."""

    platform: str = setting(
        "auto", "auto (the accelerator if there is one, else emulated CPU devices), cpu, gpu or tpu."
    )
    cpu_devices: int = setting(
        8, "How many CPU devices to emulate when the mesh shape holds -1 (e.g. mesh=data_parallel)."
    )
    peak_flops: float | None = setting(
        None,
        "Dense peak FLOP/s of one device, for flops.mfu, where meshrun's table does not know the device "
        "kind; null: the table's (CPU devices have no peak and no MFU).",
    )
    memory_gib: float | None = setting(
        None,
        "The memory of one device in GiB, for planning (null: what the accelerator reports; unknown on "
        "CPU). With it the plan counts the train step's peak per device (state, batch and the step's own "
        "memory, the step compiled on abstract inputs); a job whose peak exceeds it does not run: one "
        "line, exit 2, and in a multirun or sweep a `does not fit` row.",
    )

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

    enabled: bool = setting(
        True,
        "Use XLA's persistent compilation cache: a repeated run of the same config loads its compiled "
        "programs instead of compiling them again.",
    )
    dir: str | None = setting(
        None, "The cache dir; null: $XDG_CACHE_HOME/meshrun/xla (or ~/.cache/meshrun/xla)."
    )
    shared: bool = setting(
        False,
        "The cache holds code jax runs, so meshrun uses it (and data=text's token cache) only when no "
        "one but its owner can write to it; true also accepts a dir its group can write to (a team's "
        "cache), with a warning.",
    )


@dataclass(frozen=True)
class CheckpointConfig:
    """Sharded checkpoints (Orbax): each process writes its own shards, and a checkpoint counts once
    every process has finished it, so one cut short by a kill is never resumed from. Every
    `every_steps` training steps and/or at the end of every epoch,
    keeping the newest `keep`, written in the background (`async_save`), into `dir` (None: the run
    dir's checkpoints/). `every_epoch` left None means yes when a dir is given without every_steps:
    naming a checkpoint dir asks for checkpoints. `export` also writes the final model as model.keras
    into the run dir. `keep_adapter`: a LoRA run writes its adapters (adapter.lora.h5) into the run
    dir at its end, export or not, so that it can always be sampled (meshrun generate). A run whose
    model.preset is a transformers checkpoint exports it as one too (<run dir>/hf/, `hf_dtype`,
    `hf_shard_bytes`; meshrun.hf.export)."""

    every_steps: int | None = setting(None, "Save every N training steps; null: not by steps.")
    every_epoch: bool | None = setting(
        None,
        "Save at the end of every epoch; null: yes when `dir` is given and every_steps is not, so "
        "naming a checkpoint dir is enough to get checkpoints.",
    )
    keep: int = setting(3, "How many of the newest checkpoints to keep.")
    dir: str | None = setting(
        None,
        "Where checkpoints go (null: <run dir>/checkpoints); with a dir, `resume` defaults to auto, so "
        "running the same command again continues from the newest checkpoint.",
    )
    async_save: bool = setting(True, "Write checkpoints in the background while training goes on.")
    export: bool = setting(
        False, "Also write the final model to <run dir>/model.keras (plain Keras loads it)."
    )
    keep_adapter: bool = setting(
        True,
        "A LoRA run writes its adapters to <run dir>/adapter.lora.h5 at its end (export or not; a few "
        "MiB), so that `meshrun generate` can always sample it.",
    )
    hf_dtype: str | None = setting(
        None,
        "The dtype of the tensors an export of a transformers model.preset writes to <run dir>/hf/ "
        "(float32, bfloat16 or float16); null: the checkpoint's own.",
    )
    hf_shard_bytes: int = setting(
        5 * 1000**3,
        "The most bytes of tensors in each safetensors file of <run dir>/hf/ (a larger tensor goes "
        "alone); transformers' own default max_shard_size.",
    )

    def __post_init__(self):
        if self.hf_dtype is not None and self.hf_dtype not in HF_DTYPES:
            raise ConfigError(
                "checkpoint.hf_dtype",
                f"got {self.hf_dtype!r}; valid: {one_of(HF_DTYPES)}, or null for the checkpoint's own",
            )
        if self.hf_shard_bytes <= 0:
            raise ConfigError(
                "checkpoint.hf_shard_bytes",
                f"got {self.hf_shard_bytes}; valid: a positive number of bytes (e.g. 5000000000)",
            )

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

    sinks: frozenset[str] = setting(
        doc="The sinks switched on: logging.<name>=true for each (every switch is false by default).",
        factory=frozenset,
        composed=False,
    )


@dataclass(frozen=True)
class ProfileConfig:
    """A JAX profiler trace of training steps `steps` = (first, last), counted from 1 as in
    log.jsonl, for TensorBoard's profile plugin or Perfetto, written into `dir` (None: <run
    dir>/profile); None: no trace."""

    steps: tuple[int, ...] | None = setting(
        None,
        "[first, last] training steps to trace, counted from 1 as in log.jsonl, e.g. "
        "profile.steps=[10,20] (leave the first step out to skip compilation); null: no trace.",
    )
    dir: str | None = setting(None, "Where the trace goes; null: <run dir>/profile.")


@dataclass(frozen=True)
class PipelineConfig:
    """Pipeline stages (meshrun.pipeline): a mesh axis named `axis` holds the model's repeated blocks
    (the transformer's block_N, the blocks of a model=python factory's repeated_blocks) in as many
    contiguous stages as it is long, e.g. `meshrun train model=transformer mesh=4x2
    mesh.axis_names=[stage,data] mesh.batch_axis=data` (a mesh without that axis: no pipeline); each batch
    is cut into `microbatches` microbatches handed from stage to stage (None: as many as there are
    stages), `repeats` > 1 gives each device that many non-adjacent stages (the circular schedule:
    a smaller idle share), and `remat` recomputes each block's activations in the backward pass
    instead of keeping them."""

    axis: str = setting(
        "stage",
        "The mesh axis whose stages split the model's repeated blocks; a mesh without it: no pipeline, "
        "and these keys do nothing.",
    )
    microbatches: int | None = setting(
        None,
        "Each batch is cut into this many, handed from stage to stage (GPipe): a step's idle share is "
        "(stages - 1) / (microbatches + stages - 1); null: one per stage.",
    )
    repeats: int = setting(
        1,
        "More than 1 gives each device that many non-adjacent stages (the circular schedule): the idle "
        "share falls to (stages - 1) / (repeats * microbatches + stages - 1); microbatches must then be "
        "a multiple of the stages, and the blocks of stages * repeats.",
    )
    remat: bool = setting(
        False,
        "Recompute each block's activations in the backward pass instead of keeping them "
        "(train.remat=blocks or full sets it).",
    )

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

    mode: str = setting(
        "off",
        "off: one process; auto: each process reads its place in the job from SLURM (srun, sbatch, "
        "submitit), KERAS_DISTRIBUTION_* or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, "
        "JAX_PROCESS_ID (with none of them: one process); explicit: set by coordinator, "
        "num_processes and process_id.",
    )
    local_processes: int = setting(
        1,
        "meshrun starts this many processes on this machine, each with an even share of the mesh's "
        "devices (CPU: emulated).",
    )
    coordinator: str | None = setting(
        None, "host:port of process 0's coordinator, for a job started by hand, one command per process."
    )
    num_processes: int | None = setting(None, "How many processes a job started by hand has.")
    process_id: int | None = setting(None, "This process's number in a job started by hand, from 0.")
    port: int | None = setting(None, "The coordinator's port for local_processes; null: a free one.")
    timeout_s: int = setting(120, "Seconds a process waits for every process of the job to join.")
    bind_address: str | None = setting(
        None,
        "HOST:PORT where process 0's coordinator listens; null: loopback for a job on this machine, "
        "else the coordinator's address where it is this host's, else every interface.",
    )

    @property
    def launches_locally(self) -> bool:
        """Whether meshrun starts the job's processes itself, on this machine."""
        return self.local_processes > 1


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs, validated."""

    mesh: MeshConfig = setting(doc="The device mesh (mesh=OPTION or mesh=AxB).", composed=False)
    layout: LayoutConfig = setting(doc="The layout rules (layout=OPTION).", composed=False)
    model: ModelConfig = setting(doc="The model and its options (model=NAME).", composed=False)
    data: DataConfig = setting(
        doc="The data source and its options (data=OPTION).", factory=DataConfig, composed=False
    )
    train: TrainConfig = setting(doc="How to train.", factory=TrainConfig, composed=False)
    devices: DevicesConfig = setting(doc="Platform and devices.", factory=DevicesConfig, composed=False)
    cache: CacheConfig = setting(doc="XLA's compilation cache.", factory=CacheConfig, composed=False)
    distributed: DistributedConfig = setting(
        doc="The job's processes.", factory=DistributedConfig, composed=False
    )
    checkpoint: CheckpointConfig = setting(
        doc="Sharded checkpoints.", factory=CheckpointConfig, composed=False
    )
    logging: LoggingConfig = setting(doc="Copies of the step log.", factory=LoggingConfig, composed=False)
    profile: ProfileConfig = setting(doc="A profiler trace.", factory=ProfileConfig, composed=False)
    pipeline: PipelineConfig = setting(doc="Pipeline stages.", factory=PipelineConfig, composed=False)
    resume: str | None = setting(
        None,
        "Where training starts: auto (the newest checkpoint in checkpoint.dir, if any), never, or the "
        "path of a checkpoint dir (or of one numbered step in it); null: auto with checkpoint.dir or in "
        "a requeued job, else never.",
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


# The config sections whose defaults Hydra composes from the schema: meshrun.hydra_sources stores
# each as the config `schema/<name>`, which configs/meshrun.yaml places under its group's option, so
# that a group's options write only what differs. `run` holds the top-level keys (resume).
COMPOSED_SECTIONS = {
    "mesh": MeshConfig,
    "layout": LayoutConfig,
    "train": TrainConfig,
    "devices": DevicesConfig,
    "cache": CacheConfig,
    "distributed": DistributedConfig,
    "checkpoint": CheckpointConfig,
    "profile": ProfileConfig,
    "pipeline": PipelineConfig,
    "run": RunConfig,
}
