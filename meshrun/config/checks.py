"""Range checks of a parsed config: values that are well typed but out of range, or that do not fit
together (a batch that the batch axis does not divide, a rule naming an axis the mesh lacks). Each
raises a ConfigError naming the key, the value and what would be valid."""

from __future__ import annotations

import re

from meshrun.config.layout_schema import FILL, MeshConfig
from meshrun.config.schema import (
    LR_SCHEDULES,
    PLATFORMS,
    PRECISIONS,
    REMAT_POLICIES,
    VERBOSITY,
    CheckpointConfig,
    DevicesConfig,
    DistributedConfig,
    EarlyStoppingConfig,
    PipelineConfig,
    ProfileConfig,
    RunConfig,
    TrainConfig,
)
from meshrun.config.slices import check_dcn, with_dcn
from meshrun.errors import ConfigError
from meshrun.wording import did_you_mean, format_shape, one_of

_HOST_PORT = re.compile(r"[\w.\-]+:\d{1,5}|\[[0-9a-fA-F:]+\]:\d{1,5}")  # host:port or [v6]:port


def check_values(config: RunConfig) -> None:
    """Range checks that the types alone do not cover."""
    _check_positive(config)
    _check_training_values(config.train)
    _check_remat(config.train)
    _check_profile(config.profile)
    if config.train.verbose not in VERBOSITY:
        raise ConfigError("train.verbose", f"got {config.train.verbose}; valid: {one_of(VERBOSITY)}")
    if config.devices.platform not in PLATFORMS:
        raise ConfigError("devices.platform", f"got {config.devices.platform!r}; valid: {one_of(PLATFORMS)}")
    check_batch(config.train.batch_size, config.mesh)
    check_pipeline(config.pipeline, config.mesh, config.train.batch_size)
    _check_checkpoint(config.checkpoint)
    _check_process_count(config)
    _check_slices(config)
    _check_synthetic_samples(config)


def _check_positive(config: RunConfig) -> None:
    """The counts and figures that must be positive: batch size, epochs, CPU devices, the learning
    rate, and the devices' peak FLOP/s and memory where given."""
    positive = {
        "train.batch_size": config.train.batch_size,
        "train.epochs": config.train.epochs,
        "devices.cpu_devices": config.devices.cpu_devices,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(key, f"got {value}; expected a positive integer")
    if config.train.learning_rate <= 0:
        raise ConfigError(
            "train.learning_rate", f"got {config.train.learning_rate}; expected a positive number"
        )
    if config.devices.peak_flops is not None and config.devices.peak_flops <= 0:
        raise ConfigError(
            "devices.peak_flops",
            f"got {config.devices.peak_flops}; expected a positive FLOP/s figure, e.g. 9.89e14",
        )
    if config.devices.memory_gib is not None and config.devices.memory_gib <= 0:
        raise ConfigError(
            "devices.memory_gib",
            f"got {config.devices.memory_gib}; expected the memory of one device in GiB, a positive number "
            "such as 80",
        )


def _check_checkpoint(checkpoint: CheckpointConfig) -> None:
    """How often checkpoints are written and how many are kept: positive numbers."""
    if checkpoint.every_steps is not None and checkpoint.every_steps <= 0:
        raise ConfigError(
            "checkpoint.every_steps",
            f"got {checkpoint.every_steps}; expected a positive number of steps (null: none)",
        )
    if checkpoint.keep <= 0:
        raise ConfigError(
            "checkpoint.keep", f"got {checkpoint.keep}; expected a positive number of checkpoints to keep"
        )


def _check_process_count(config: RunConfig) -> None:
    """The processes a job runs (local ones emulate CPU devices only) against the mesh and devices."""
    distributed = config.distributed
    if distributed.launches_locally:
        if config.devices.platform not in ("auto", "cpu"):
            raise ConfigError(
                "distributed.local_processes",
                f"got {distributed.local_processes} with devices.platform={config.devices.platform}; local "
                "processes emulate CPU devices only: on accelerators run one process (it uses every "
                "device) or start one per host with distributed=auto",
            )
        check_processes(
            config.mesh, config.devices, distributed.local_processes, "distributed.local_processes"
        )
    elif distributed.num_processes is not None:
        check_processes(config.mesh, config.devices, distributed.num_processes, "distributed.num_processes")


def _check_synthetic_samples(config: RunConfig) -> None:
    """data=synthetic makes at least one global batch of training and of eval samples (other sources
    count their samples when they load)."""
    if config.data.name != "synthetic":
        return
    synthetic = config.data.options
    for key in ("num_samples", "eval_samples"):
        if getattr(synthetic, key) < config.train.batch_size:
            raise ConfigError(
                f"data.{key}",
                f"got {getattr(synthetic, key)}; fewer samples than one global batch "
                f"(train.batch_size={config.train.batch_size})",
            )


def _check_remat(train: TrainConfig) -> None:
    """train.remat is one of the policies (whether the model has blocks to recompute is known once
    it is built: meshrun.run.build)."""
    if train.remat not in REMAT_POLICIES:
        raise ConfigError(
            "train.remat",
            f"got {train.remat!r}; {did_you_mean(train.remat, REMAT_POLICIES)}"
            f"valid: {one_of(REMAT_POLICIES)}",
        )


def _check_training_values(train: TrainConfig) -> None:
    if train.precision not in PRECISIONS:
        raise ConfigError("train.precision", f"got {train.precision!r}; valid: {one_of(PRECISIONS)}")
    if train.lr_schedule not in LR_SCHEDULES:
        raise ConfigError("train.lr_schedule", f"got {train.lr_schedule!r}; valid: {one_of(LR_SCHEDULES)}")
    if train.warmup_steps < 0:
        raise ConfigError("train.warmup_steps", f"got {train.warmup_steps}; expected 0 or more steps")
    if train.warmup_steps and train.lr_schedule != "cosine":
        raise ConfigError(
            "train.warmup_steps",
            f"got {train.warmup_steps} with train.lr_schedule={train.lr_schedule}; warm-up comes with cosine",
        )
    if not 0 <= train.min_learning_rate <= train.learning_rate:
        raise ConfigError(
            "train.min_learning_rate",
            f"got {train.min_learning_rate}; valid: 0 to train.learning_rate ({train.learning_rate})",
        )
    if train.clip_norm is not None and train.clip_norm <= 0:
        raise ConfigError(
            "train.clip_norm", f"got {train.clip_norm}; expected a positive global norm (null: no clipping)"
        )
    if train.grad_accum_steps < 1:
        raise ConfigError(
            "train.grad_accum_steps",
            f"got {train.grad_accum_steps}; expected 1 (no accumulation) or more steps per update",
        )
    if train.eval_every is not None and train.eval_every < 1:
        raise ConfigError(
            "train.eval_every",
            f"got {train.eval_every}; expected a positive number of epochs (null: evaluate at the end only)",
        )
    if train.max_time is not None and train.max_time <= 0:
        raise ConfigError(
            "train.max_time",
            f"got {train.max_time:g}; expected a positive duration such as 3600, 90m or 1:30:00 "
            "(null: no limit)",
        )
    _check_early_stopping(train.early_stopping, train.eval_every)


EARLY_STOPPING_MODES = ("auto", "min", "max")


def _check_early_stopping(early: EarlyStoppingConfig, eval_every: int | None) -> None:
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
            f"got {early.monitor!r} with train.eval_every=null; val_ metrics exist only when training "
            "evaluates: "
            f"set train.eval_every=1, or monitor a training metric such as loss",
        )


def _check_profile(profile: ProfileConfig) -> None:
    steps = profile.steps
    if steps is None:
        return
    if len(steps) != 2 or not 1 <= steps[0] <= steps[1]:
        raise ConfigError(
            "profile.steps",
            f"got {list(steps)}; expected [first, last] training steps with 1 <= first <= last, e.g. [10,20]",
        )


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


def check_pipeline(pipeline: PipelineConfig, mesh: MeshConfig, batch_size: int) -> None:
    """The stage axis may not be the batch axis, and the microbatches must split each data
    replica's rows evenly (every microbatch takes the same rows of every replica). Checked again
    once a -1 in the mesh is filled."""
    if pipeline.microbatches is not None and pipeline.microbatches < 1:
        raise ConfigError(
            "pipeline.microbatches",
            f"got {pipeline.microbatches}; expected a positive integer (null: one per stage)",
        )
    if pipeline.repeats < 1:
        raise ConfigError(
            "pipeline.repeats",
            f"got {pipeline.repeats}; expected a positive integer (1: GPipe, more: the circular schedule)",
        )
    if pipeline.axis not in mesh.axis_names:
        return
    if pipeline.axis == mesh.batch_axis:
        others = [a for a in mesh.axis_names if a != pipeline.axis]
        valid = (
            f"valid: {one_of(others)}"
            if others
            else f"add a batch axis, e.g. mesh.axis_names=[{pipeline.axis},data]"
        )
        raise ConfigError(
            "mesh.batch_axis",
            f"got {mesh.batch_axis!r}, the pipeline's stage axis (pipeline.axis), whose devices hold "
            f"different blocks, not copies of the model to split the batch over; {valid}",
        )
    if FILL in mesh.shape:
        return
    rows = batch_size // mesh.axis_size(mesh.batch_axis)
    microbatches = pipeline.microbatches_on(mesh)
    if rows % microbatches:
        divisors = [n for n in range(1, rows + 1) if rows % n == 0]
        given = (
            f"got {microbatches}"
            if pipeline.microbatches
            else f"left null, which means one per stage ({microbatches})"
        )
        raise ConfigError(
            "pipeline.microbatches",
            f"{given}, which does not divide the {rows} rows of each data replica "
            f"(train.batch_size={batch_size} over {mesh.batch_axis!r} of size "
            f"{mesh.axis_size(mesh.batch_axis)}); valid: {one_of(divisors)}",
        )
    stages = pipeline.stages(mesh)
    if pipeline.repeats > 1 and microbatches % stages:
        valid = [n for n in range(stages, rows + 1, stages) if rows % n == 0]
        raise ConfigError(
            "pipeline.microbatches",
            f"got {microbatches} with pipeline.repeats={pipeline.repeats}: the circular schedule "
            f"takes microbatches in groups of the {stages} stages; valid: "
            f"{one_of(valid) if valid else f'none for {rows} rows a replica: use pipeline.repeats=1'}",
        )


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


def _check_slices(config: RunConfig) -> None:
    """mesh.dcn against the job's process count, where the config alone gives it (with
    distributed.mode=auto it is known when the process joins)."""
    distributed = config.distributed
    if distributed.launches_locally:
        processes, key = distributed.local_processes, "distributed.local_processes"
    elif distributed.num_processes is not None:
        processes, key = distributed.num_processes, "distributed.num_processes"
    elif distributed.mode == "off":
        processes, key = 1, "distributed.mode=off"
    else:
        return
    if config.mesh.size is None:
        check_dcn(config.mesh, processes, key)
    else:
        with_dcn(config.mesh, processes, (config.pipeline.axis,), key)


def check_distributed_values(config: DistributedConfig) -> None:
    """Range checks of the distributed section on its own."""
    if config.local_processes < 1:
        raise ConfigError(
            "distributed.local_processes",
            f"got {config.local_processes}; expected a positive integer (1: one process)",
        )
    if config.num_processes is not None and config.num_processes < 1:
        raise ConfigError(
            "distributed.num_processes", f"got {config.num_processes}; expected a positive integer"
        )
    if (
        config.process_id is not None
        and config.num_processes is not None
        and not 0 <= config.process_id < config.num_processes
    ):
        raise ConfigError(
            "distributed.process_id",
            f"got {config.process_id}; valid: 0 to {config.num_processes - 1} "
            f"(distributed.num_processes={config.num_processes})",
        )
    if config.coordinator is not None and not _HOST_PORT.fullmatch(config.coordinator):
        raise ConfigError(
            "distributed.coordinator",
            f"got {config.coordinator!r}; expected host:port of process 0, e.g. node01:12345",
        )
    if config.bind_address is not None and not _HOST_PORT.fullmatch(config.bind_address):
        raise ConfigError(
            "distributed.bind_address",
            f"got {config.bind_address!r}; expected HOST:PORT where process 0's coordinator "
            "listens, an address of its host, e.g. 10.0.0.5:12345, 127.0.0.1:12345 or [::]:12345",
        )
    if config.port is not None and not 0 < config.port < 65536:
        raise ConfigError(
            "distributed.port", f"got {config.port}; expected a TCP port, 1 to 65535 (null: pick a free one)"
        )
    if config.timeout_s <= 0:
        raise ConfigError(
            "distributed.timeout_s", f"got {config.timeout_s}; expected a positive number of seconds"
        )


def check_processes(mesh: MeshConfig, devices: DevicesConfig, processes: int, key: str) -> None:
    """The job's devices must split evenly over its processes (each holds the same number). For
    a mesh holding -1 that is known before jax starts only for emulated CPU devices."""
    if mesh.size is None and devices.platform != "cpu" and key != "distributed.local_processes":
        return
    total = mesh.size or devices.cpu_devices
    if total % processes:
        valid = [n for n in range(1, total + 1) if total % n == 0]
        what = (
            f"mesh {format_shape(mesh.shape)}'s {total} devices"
            if mesh.size
            else f"devices.cpu_devices={total}"
        )
        raise ConfigError(
            key,
            f"got {processes}, but {what} do not split evenly over {processes} processes; valid: "
            f"{one_of(valid)}",
        )
