"""One training run: devices, the placement plan and its checks, the distributed model, fit,
evaluate, XLA's cost analysis of the step, and the metrics.

Call `meshrun.devices.prepare` before importing this module: importing it imports jax and keras.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import jax
import keras
from rich.console import Console

import meshrun
from meshrun import build as build_lib
from meshrun import callbacks as callbacks_lib
from meshrun import checkpoint as checkpoint_lib
from meshrun import costs as costs_lib
from meshrun import data as data_lib
from meshrun import devices as devices_lib
from meshrun import distribution as distribution_lib
from meshrun import hardware
from meshrun import schedule as schedule_lib
from meshrun import sinks as sinks_lib
from meshrun.errors import ConfigError, one_of
from meshrun.plan import Plan
from meshrun.processes import ONE_PROCESS, Identity
from meshrun.progress import EpochProgress, progress_mode
from meshrun.schema import RunConfig, check_batch, check_processes, format_shape
from meshrun.timing import StepTimer, process_start_time

log = logging.getLogger("meshrun")


@dataclass
class RunContext:
    """Facts about the launch that the config does not hold (where the run writes, what was
    chosen, this process's place in a multi-process job)."""

    run_dir: str = ""
    choices: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)
    started_at: float = field(default_factory=process_start_time)
    identity: Identity = ONE_PROCESS
    # The process ends right after this run (one run of the meshrun program): Keras' session is
    # left as it is instead of cleared, which can take seconds (collecting tf.data's graphs).
    process_ends_after: bool = False


@dataclass(frozen=True)
class RunResult:
    """What a finished run hands back: the metrics (metrics.json) and the plan it was checked
    against (plan.json)."""

    metrics: dict
    plan: Plan


_runs_started: list[float] = []  # when each run of this process began (a multirun holds several)


def run(config: RunConfig, context: RunContext) -> RunResult:
    """Trains and evaluates the configured model on its mesh.

    Raises ConfigError for anything wrong with the config, before any training starts."""
    _runs_started.append(time.time())
    try:
        result = _run(config, context)
    except BaseException:
        distribution_lib.reset()
        raise
    # The session is cleared before metrics.json is written, so its cost is in the figures.
    teardown_started = time.time()
    if not context.process_ends_after:
        distribution_lib.reset()
    ended = time.time()
    result.metrics["timing"].update(teardown_s=ended - teardown_started, wall_s=ended - _job_start(context))
    return result


def _job_start(context: RunContext) -> float:
    """When this job began, which its start-up and wall times and train.max_time count from: at
    process start for the first run of a process (imports and device set-up count), at its own
    start for a later job of a multirun, which shares the process."""
    return context.started_at if len(_runs_started) <= 1 else _runs_started[-1]


def plan(config: RunConfig, processes: int = 1) -> Plan:
    """The placement plan of a run of `processes` processes. A mesh with a -1 is filled in from
    the devices here (as a run would); an explicit shape is planned as written, whatever devices
    this machine has."""
    mesh = config.mesh
    if mesh.size is None:
        mesh = devices_lib.discover(config.devices, mesh).mesh
        check_batch(config.train.batch_size, mesh)
        check_processes(mesh, config.devices, processes, "distributed.num_processes")
    return build_lib.plan_model(config, mesh, processes).plan


def _run(config: RunConfig, context: RunContext) -> RunResult:
    cache_dir = devices_lib.set_compilation_cache(config.cache)  # before anything compiles
    device_set = devices_lib.discover(config.devices, config.mesh)
    mesh = device_set.mesh
    check_batch(config.train.batch_size, mesh)
    _say_devices(device_set, mesh, config)

    checkpoints, resume_point, start = _checkpoint_plan(config, context, device_set.processes)
    planned = build_lib.plan_model(config, mesh, device_set.processes)
    spec, options, placement = planned.spec, planned.options, planned.plan
    placement.raise_first_error()
    for warning in placement.warnings:
        log.warning(warning)
    build_lib.check_loss(config.train.loss, spec, options, planned.abstract)

    distribution = distribution_lib.make_distribution(mesh, planned.rules, device_set.devices)
    keras.distribution.set_distribution(distribution)
    shard_index, shard_count = distribution_lib.batch_share(distribution, config.train.batch_size)
    # Every Keras object, the optimizer's variables included, must be created under the distribution,
    # and the layers under the dtype policy (reset to float32 by distribution_lib.reset).
    keras.config.set_dtype_policy(config.train.precision)
    devices_lib.import_tensorflow()  # before set_random_seed imports it (it seeds tf.data's shuffles too)
    keras.utils.set_random_seed(config.train.seed)
    model, signature = build_lib.build_model(spec, options, config.data)  # plan_model left a fresh session
    build_lib.check_paths_match(model, planned.abstract, spec, options)
    compiled = build_lib.compiled_objectives(model)
    loss = build_lib.make_loss(config.train.loss, spec, options, compiled)
    loss_function = build_lib.loss_function(loss)
    context_data = data_lib.DataContext(
        model=spec, model_options=options, batch_size=config.train.batch_size, seed=config.train.seed,
        shard_index=shard_index, shard_count=shard_count, process_count=device_set.processes,
        signature=signature, loss=loss_function,
    )
    # After the seed: tf.data's shuffle order follows TensorFlow's global seed too.
    datasets = data_lib.make_datasets(config.data.name, config.data.options, context_data)
    if spec.sample_weight_input and not datasets.weighted:
        datasets = data_lib.pipeline.weighted_by_input(datasets, spec.sample_weight_input)
    total_steps = config.train.epochs * datasets.steps_per_epoch
    _check_step_counts(config, total_steps)
    optimizer = build_lib.make_optimizer(
        config.train.optimizer, schedule_lib.keras_schedule(config.train, total_steps), config.train.clip_norm,
        loss_scaling=config.train.precision == "mixed_float16", accumulate=config.train.grad_accum_steps,
    )
    metrics = build_lib.make_metrics(config.train.metrics, loss_function, config.train.loss is None, spec, options, compiled)
    _check_monitor(config.train, build_lib.metric_names(metrics))
    input_key = next((f"model.{k}" for k in ("input_shape", "seq_len") if getattr(options, k, None) is not None), None)
    data_lib.pipeline.check_fits_model(datasets.train.element_spec, signature, loss_function, input_key)
    # With sample weights (a padding mask), metrics count only the samples (tokens) that weigh.
    model.compile(optimizer=optimizer, loss=loss, **({"weighted_metrics": metrics} if datasets.weighted else {"metrics": metrics}))
    built_at = time.time()

    hooks = _callbacks(config, context, checkpoints, start, resume_point, datasets.steps_per_epoch, total_steps, device_set)
    try:
        history = _fit(model, datasets, config.train, hooks.all, start)
    finally:
        hooks.checkpointing.finish()
        if hooks.step_log is not None:
            hooks.step_log.close()
    if hooks.guard is not None:
        hooks.guard.check(hooks.checkpointing.last_saved)
    stats = hooks.timer.stats()
    eval_started = time.perf_counter()
    evaluation = _evaluate(model, datasets, spec)
    eval_s = time.perf_counter() - eval_started
    if config.checkpoint.export:
        Path(context.run_dir).mkdir(parents=True, exist_ok=True)
        model.save(Path(context.run_dir) / EXPORT_FILE)
    step_costs = costs_lib.train_step_costs(model, datasets.sample_batch)
    job_start = _job_start(context)

    batch = config.train.batch_size
    tokens_per_step = batch * spec.tokens_per_sample(options) if spec.tokens_per_sample else None
    sharding = placed_sharding(model, placement)
    metrics = {
        "status": "ok",
        "error": None,
        "run_dir": context.run_dir,
        "choices": context.choices,
        "overrides": context.overrides,
        "mesh": {"shape": list(mesh.shape), "axis_names": list(mesh.axis_names), "batch_axis": mesh.batch_axis},
        "devices": {
            "platform": device_set.platform,
            "kind": device_set.kind,
            "count": len(device_set.devices),
            "available": device_set.available,
            "emulated": device_set.emulated,
            "processes": device_set.processes,
            "per_process": len(_local(device_set.devices)),
        },
        "distributed": context.identity.describe(),
        "layout": {"rules": {r.pattern: list(r.axes) for r in planned.rules}, "origins": {r.pattern: r.origin for r in planned.rules},
                   "from_model": config.layout.from_model},
        "model": {"name": spec.name, "label": spec.name_of(options), "params": int(model.count_params()),
                  "options": _jsonable(asdict(options)), **signature.describe()},
        "data": {
            "source": config.data.name,
            **_jsonable(asdict(config.data.options)),
            **datasets.info,
            "global_batch_size": batch,
            "process_batch_size": context_data.process_batch_size,
            "processes": context_data.process_count,
            "process_share": {"index": shard_index, "count": shard_count},
        },
        "train": {
            "global_batch_size": batch,
            "per_replica_batch_size": batch // mesh.axis_size(mesh.batch_axis),
            "steps_per_epoch": datasets.steps_per_epoch,
            "epochs": config.train.epochs,
            "optimizer": config.train.optimizer,
            "learning_rate": config.train.learning_rate,
            "lr_schedule": config.train.lr_schedule,
            "warmup_steps": config.train.warmup_steps,
            "min_learning_rate": config.train.min_learning_rate,
            "clip_norm": config.train.clip_norm,
            "precision": config.train.precision,
            "grad_accum_steps": config.train.grad_accum_steps,
            "samples_per_update": batch * config.train.grad_accum_steps,
            "updates": int(model.optimizer.iterations),
            "eval_every": config.train.eval_every,
            "max_time_s": config.train.max_time,
            "early_stopping": asdict(config.train.early_stopping) if config.train.early_stopping.monitor else None,
            "stopped": hooks.stopped(),
            "loss": build_lib.loss_name(loss),
            "seed": config.train.seed,
        },
        "timing": {
            "startup_s": built_at - job_start,
            "time_to_first_step_s": stats.first_step_at - job_start,
            "compile_s": stats.compile_s,
            "step_time_s": stats.step_time_s,
            "step_time_p90_s": stats.step_time_p90_s,
            "steady_steps": stats.steady_steps,
            "async_log_fetch": hooks.timer.async_safe,
            "samples_per_s": batch / stats.step_time_s,
            "tokens_per_s": tokens_per_step / stats.step_time_s if tokens_per_step else None,
            "epoch_s": stats.epoch_s,
            "eval_s": eval_s,
            "cost_analysis_s": step_costs.seconds,
            "checkpoint_s": hooks.checkpointing.seconds,
            # teardown_s and wall_s: added by run() once the session is cleared
        },
        "cache": {"enabled": config.cache.enabled, "dir": cache_dir},
        "flops": flops_metrics(step_costs, stats.step_time_s, device_set, config, spec, placement),
        "memory": memory_metrics(step_costs, sharding, model, placement, device_set),
        "checkpoint": {
            "dir": str(checkpoints) if hooks.checkpointing.saved_steps or config.checkpoint.saves else None,
            "saved_steps": hooks.checkpointing.saved_steps,
            "resumed_from": str(resume_point) if resume_point else None,
            "resumed_at_step": start.global_step if resume_point else None,
            "exported": str(Path(context.run_dir) / EXPORT_FILE) if config.checkpoint.export else None,
        },
        "logs": hooks.log_files(),
        "profile": hooks.profile_report(),
        "history": history,
        "eval": evaluation,
        "sharding": sharding,
        "versions": {"meshrun": meshrun.__version__, "keras": keras.__version__, "jax": jax.__version__},
    }
    return RunResult(metrics=metrics, plan=placement)


EXPORT_FILE = "model.keras"


def _checkpoint_plan(config: RunConfig, context: RunContext, processes: int):
    """Where checkpoints go, which one to resume from, and the progress it holds (all checked
    before anything is built: a bad resume path, an unwritable dir, nothing left to train)."""
    root = checkpoint_lib.directory(config.checkpoint, context.run_dir)
    if config.checkpoint.export and processes > 1:
        raise ConfigError("checkpoint.export", "got true with several processes; a .keras file is written by one process, so export from a one-process run (resume from the checkpoint there)")
    if config.checkpoint.saves or config.train.max_time is not None:  # the budget's stop saves a checkpoint
        checkpoint_lib.check_writable(root)
    point = checkpoint_lib.find(config.resume_mode, root)
    start = checkpoint_lib.read_progress(point) if point else checkpoint_lib.Progress()
    if point and start.epoch >= config.train.epochs:
        raise ConfigError(
            "resume",
            f"checkpoint {point} is at the end of training (epoch {start.epoch} of {config.train.epochs}); nothing is left to "
            "train: raise train.epochs, or start again with resume=never",
        )
    return root, point, start


def _check_step_counts(config: RunConfig, total_steps: int) -> None:
    """Switches that count training steps must fit in the run's `total_steps` (a checkpoint
    schedule that never fires is only a warning: the run is still worth its result)."""
    accumulate = config.train.grad_accum_steps
    if accumulate > total_steps:
        raise ConfigError(
            "train.grad_accum_steps",
            f"got {accumulate}, more than the run's {total_steps} training steps; no update would be applied: valid 1 to {total_steps}",
        )
    every = config.checkpoint.every_steps
    if every and every > total_steps:
        log.warning(f"checkpoint.every_steps={every} is more than the run's {total_steps} training steps, so it never saves; "
                    f"give at most {total_steps} or checkpoint.every_epoch=true")
    steps = config.profile.steps
    if steps is not None and steps[1] > total_steps:
        raise ConfigError("profile.steps", f"got {list(steps)}; the run has {total_steps} training steps: valid 1 <= first <= last <= {total_steps}")


def _check_monitor(train, names: list[str]) -> None:
    """Early stopping must monitor a metric the run logs."""
    monitor = train.early_stopping.monitor
    if monitor is None:
        return
    logged = names + ([f"val_{name}" for name in names] if train.eval_every else [])
    if monitor not in logged:
        raise ConfigError("train.early_stopping.monitor", f"got {monitor!r}, which this run does not log; valid: {one_of(logged)}")


@dataclass
class RunHooks:
    """The Keras callbacks of a run, and what they found out."""

    timer: StepTimer
    checkpointing: checkpoint_lib.Checkpointing
    guard: Optional[callbacks_lib.StopOnNaN] = None
    step_log: Optional[callbacks_lib.StepLog] = None
    budget: Optional[callbacks_lib.TimeBudget] = None
    early: Optional[callbacks_lib.EarlyStopping] = None
    profiler: Optional[callbacks_lib.StepProfiler] = None
    progress: Optional[EpochProgress] = None

    @property
    def all(self) -> list:
        """The callbacks in the order Keras calls them: the timer, then checkpoints (a checkpoint
        that does not fit is rejected before anything else starts), then the rest."""
        optional = (self.guard, self.budget, self.early, self.profiler, self.step_log, self.progress)
        return [self.timer, self.checkpointing, *(c for c in optional if c is not None)]

    def stopped(self) -> Optional[dict]:
        """Why training ended before its last epoch, and where (None: it ran to the end)."""
        if self.budget is not None and self.budget.stopped_at is not None:
            return {"reason": "max_time", "step": self.budget.stopped_at, "checkpoint": self.checkpointing.last_saved}
        if self.early is not None and self.early.stopped_after is not None:
            return {"reason": "early_stopping", "epoch": self.early.stopped_after, "checkpoint": self.checkpointing.last_saved}
        return None

    def log_files(self) -> dict:
        """Where the step log went: file paths by kind."""
        return {sink.kind: str(sink.path) for sink in (self.step_log.sinks if self.step_log else [])}

    def profile_report(self) -> Optional[dict]:
        """The profiler trace: its dir, the steps asked for and traced, and its files."""
        if self.profiler is None:
            return None
        p = self.profiler
        return {"dir": str(p.directory), "steps": [p.first, p.last], "traced": list(p.traced) if p.traced else None,
                "files": p.trace_files()}


def _callbacks(config: RunConfig, context: RunContext, checkpoints: Path, start, resume_point, steps_per_epoch: int,
               total_steps: int, device_set) -> RunHooks:
    """Builds the run's callbacks from its config. The step log, progress bar and profiler run in
    the first process only; the others log a line per epoch into their logs."""
    train = config.train
    first = start.global_step
    budget = None
    if train.max_time is not None:
        budget = callbacks_lib.TimeBudget(_job_start(context) + train.max_time, first, several_processes=device_set.processes > 1)
    hooks = RunHooks(
        timer=StepTimer(async_safe=not device_set.emulated),
        guard=callbacks_lib.StopOnNaN(first, steps_per_epoch) if train.stop_on_nan else None,
        checkpointing=checkpoint_lib.Checkpointing(config.checkpoint, checkpoints, start, resume_point, budget=budget),
        budget=budget,
    )
    early = train.early_stopping
    if early.monitor is not None:
        hooks.early = callbacks_lib.EarlyStopping(monitor=early.monitor, patience=early.patience, min_delta=early.min_delta,
                                                  mode=early.mode, verbose=0)
    lead = context.identity.is_first and bool(context.run_dir)
    run_dir = Path(context.run_dir)
    if lead:
        sinks = functools.partial(sinks_lib.open_sinks, run_dir, config.logging.tensorboard, config.logging.csv)
        hooks.step_log = callbacks_lib.StepLog(sinks, train, total_steps, first)
        if config.profile.steps is not None:
            where = Path(config.profile.dir).expanduser() if config.profile.dir else run_dir / PROFILE_DIR
            hooks.profiler = callbacks_lib.StepProfiler(*config.profile.steps, where, first)
    mode = progress_mode(train.verbose, context.identity.is_first, Console().is_terminal)
    if mode is not None:
        hooks.progress = EpochProgress(mode, train.epochs, train.batch_size)
    return hooks


PROFILE_DIR = "profile"


def _fit(model, datasets, train, callbacks: list, start) -> dict:
    """Trains from `start` to the last epoch and returns the per-epoch history (epochs before
    `start` come from its checkpoint). A half-done epoch runs first, for its remaining steps;
    each fit call reads the data stream from the global step it starts at. Evaluates every
    `train.eval_every` epochs (if set). Ends early once a callback stops training."""
    history = {name: list(values) for name, values in start.history.items()}
    steps_per_epoch = datasets.steps_per_epoch
    spans = []  # (first epoch, end epoch, steps per epoch)
    epoch = start.epoch
    if start.step_in_epoch:
        spans.append((epoch, epoch + 1, steps_per_epoch - start.step_in_epoch))
        epoch += 1
    if epoch < train.epochs:
        spans.append((epoch, train.epochs, steps_per_epoch))
    step = start.global_step
    validation = {"validation_data": datasets.eval, "validation_freq": train.eval_every} if train.eval_every else {}
    for first, end, steps in spans:
        fitted = model.fit(
            datasets.train.skip(step) if step else datasets.train,
            initial_epoch=first, epochs=end, steps_per_epoch=steps, verbose=0, callbacks=callbacks,
            shuffle=False,  # the tf.data pipeline shuffles, seeded
            **validation,
        )
        for name, values in fitted.history.items():
            history.setdefault(name, []).extend(float(v) for v in values)
        if model.stop_training:
            break
        step += (end - first) * steps
    return history


def _evaluate(model, datasets, spec) -> dict:
    """The final evaluation: every compiled metric, and perplexity for a language model."""
    evaluation = {name: float(value) for name, value in model.evaluate(datasets.eval, verbose=0, return_dict=True).items()}
    if spec.language_model and "loss" in evaluation:
        evaluation["perplexity"] = math.exp(min(evaluation["loss"], 700.0))  # exp overflows a float past ~709
    return evaluation


def flops_metrics(step_costs, step_time_s: float, device_set, config: RunConfig, spec, placement: Plan) -> dict:
    """FLOPs of one step as XLA counts them, the rate achieved, and utilisation where the peak of
    the device kind is known (from devices.peak_flops, else meshrun's table; never guessed)."""
    per_step = step_costs.flops_per_step
    per_s = per_step / step_time_s if per_step is not None else None
    if config.devices.peak_flops is not None:
        peak, source = config.devices.peak_flops, "devices.peak_flops"
    else:
        peak = hardware.peak_flops(device_set.kind) if not device_set.emulated else None
        source = "table" if peak is not None else None
    analytic = spec.analytic_flops(config.model.options, config.train.batch_size, placement.variables) if spec.analytic_flops else None
    return {
        "per_step": per_step,
        "per_step_per_device": step_costs.flops_per_step_per_device,
        "per_s": per_s,
        "peak_per_device": peak,
        "peak_source": source,
        "mfu": hardware.mfu(per_s, len(device_set.devices), peak),
        "analytic_per_step": analytic,
        "analytic_over_xla": analytic / per_step if analytic and per_step else None,
    }


def memory_metrics(step_costs, sharding: dict, model, placement: Plan, device_set) -> dict:
    """Bytes per device: what the placed variables and optimizer slots hold (read from the arrays)
    beside the plan's figures, XLA's compiled estimate of the step, and the live peak where the
    platform reports one."""
    return {
        "params_bytes_per_device": sum(v["bytes_per_device"] for v in sharding.values()),
        "optimizer_bytes_per_device": sum(_bytes_on_one_device(v) for v in model.optimizer.variables),
        "planned_params_bytes_per_device": placement.params_bytes_per_device,
        "planned_optimizer_bytes_per_device": placement.optimizer_bytes_per_device,
        "peak_bytes_per_device": step_costs.peak_bytes_per_device,
        "compiled": {
            "argument_bytes": step_costs.argument_bytes,
            "output_bytes": step_costs.output_bytes,
            "temp_bytes": step_costs.temp_bytes,
            "alias_bytes": step_costs.alias_bytes,
            "generated_code_bytes": step_costs.generated_code_bytes,
        },
        "live_peak_bytes_per_device": costs_lib.live_peak_bytes(_local(device_set.devices)),
    }


def placed_sharding(model, placement: Plan) -> dict:
    """For every model variable: its shape, the PartitionSpec and bytes per device read back from
    the placed array, and the rule that placed it (None: replicated, no rule matched) with its
    origin. The run's variables have the plan's paths (meshrun.build.check_paths_match)."""
    planned = {p.path: p for p in placement.variables}
    placed = {}
    for variable in model.variables:
        spec = variable.value.sharding.spec
        placed[variable.path] = {
            "shape": list(variable.shape),
            "dtype": str(variable.dtype),
            "spec": [list(axis) if isinstance(axis, tuple) else axis for axis in spec]
            + [None] * (len(variable.shape) - len(spec)),
            "bytes_per_device": _bytes_on_one_device(variable),
            "rule": planned[variable.path].rule,
            "origin": planned[variable.path].origin,
        }
    return placed


def _local(devices) -> list:
    """The devices of `devices` that belong to this process (all of them with one process)."""
    return [d for d in devices if d.process_index == jax.process_index()]


def _bytes_on_one_device(variable) -> int:
    return int(variable.value.addressable_shards[0].data.nbytes)


def _say_devices(device_set, mesh, config: RunConfig) -> None:
    shape = format_shape(mesh.shape)
    spread = f" over {device_set.processes} processes" if device_set.processes > 1 else ""
    if device_set.emulated:
        reason = "no accelerator found" if config.devices.platform == "auto" else "devices.platform=cpu"
        log.info(f"{reason}; emulating {device_set.available} CPU devices{spread}, using {len(device_set.devices)} for mesh {shape}")
    else:
        log.info(f"using {len(device_set.devices)} {device_set.kind} devices{spread} for mesh {shape}")


def _jsonable(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
