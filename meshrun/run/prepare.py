"""The first phase of a run: every check that needs no allocation, so that all config errors come
before anything is built. `prepare` answers, in this order: the devices and the mesh, the checkpoint
to resume from, where every variable goes (the model built by shapes only, and the layout's lint),
the loss and the metric names, the prompts to complete after training (train.sample_prompts, with
the run's tokenizer), this process's share of each batch, the data (seeded) and whether it
fits the model, and the step counts. `meshrun plan` reuses its placement step (`place`).

Importing this module imports jax and keras: call `meshrun.placement.devices.prepare` first.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras

from meshrun import data as data_lib
from meshrun.compat import names as compat
from meshrun.compat.keras.startup import set_random_seed
from meshrun.config.checks import check_batch, check_processes, check_rule_axes
from meshrun.config.layout_schema import DEFAULT_AUTO_MIN_BYTES, LayoutConfig, LayoutRule, MeshConfig
from meshrun.config.schema import PipelineConfig, RunConfig, TrainConfig
from meshrun.config.slices import with_dcn
from meshrun.data import order, ranges
from meshrun.errors import ConfigError
from meshrun.models import get_model
from meshrun.placement import devices as devices_lib
from meshrun.placement import distribution as distribution_lib
from meshrun.placement import stacking
from meshrun.placement.auto import derive_layout
from meshrun.placement.identity import ONE_PROCESS, Identity
from meshrun.placement.layout import with_bends, with_extra_rules
from meshrun.placement.plan import DeviceMemory, Plan, make_plan
from meshrun.placement.quantized import quantized_rules
from meshrun.placement.stacking import PipelinePlan
from meshrun.placement.traffic import Activations
from meshrun.run import step_memory
from meshrun.run.build import AbstractModel, abstract_session, describe
from meshrun.run.sampling import check_sampling_settings, plan_sampling
from meshrun.specs.model import ModelSpec
from meshrun.training import checkpoint as checkpoint_lib
from meshrun.training import objectives
from meshrun.wording import closest, format_bytes, format_shape, one_of

log = logging.getLogger("meshrun")


@dataclass(frozen=True)
class RunContext:
    """Facts about the launch that the config does not hold: where the run writes, what was chosen
    on the command line, when the job started (its start-up, wall time and train.max_time count
    from there), this process's place in a multi-process job, and whether the process ends right
    after this run (then Keras' session is left as it is instead of cleared, which can take
    seconds). `said_once`: the warnings that need saying once, not once per job of a multirun,
    that have been said; the invocation's, which its jobs in this process share (a sweep over
    layout=auto,transformer_tp sets layout.min_bytes for auto, and every other job ignores it)."""

    run_dir: str = ""
    choices: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    identity: Identity = ONE_PROCESS
    process_ends_after: bool = False
    unreadable_checkpoints: frozenset = frozenset()  # steps resume=auto passes over (found unreadable)
    requeued: bool = False  # the scheduler started this job again (SLURM_RESTART_COUNT): resume by default
    said_once: set[str] = field(default_factory=set)  # added to as prepare says them


@dataclass(frozen=True)
class CheckpointPlan:
    """Where the run's checkpoints go, the checkpoint it resumes from (None: a fresh start), the
    progress that checkpoint holds, and the run's model as its checkpoints record it."""

    root: Path
    resume: checkpoint_lib.ResumePoint | None
    start: checkpoint_lib.Progress
    model: checkpoint_lib.ModelIdentity | None = None


@dataclass(frozen=True)
class PlannedModel:
    """The run's model before it is built: its spec and options, its abstract description, the
    layout rules in force and where they place everything, and the pipeline stages it is built for
    (None: its blocks are separate layers). `rules` are those Keras gets: with stages one per
    stacked variable, and an exact rule for each path a lenient rule places with a dimension left
    whole; `written_rules` are the rules for separate blocks, as a layout file holds them."""

    spec: ModelSpec
    options: Any
    abstract: AbstractModel
    rules: tuple[LayoutRule, ...]
    plan: Plan
    written_rules: tuple[LayoutRule, ...]
    pipeline: PipelineConfig | None = None


@dataclass(frozen=True)
class Objectives:
    """What the run trains with, by name: the loss as the report names it, the Keras loss function
    (what the labels must fit), and the names Keras logs (loss first, then the metrics)."""

    loss: str
    loss_function: str
    logged: tuple[str, ...]


@dataclass(frozen=True)
class RunSetup:
    """Everything checked and decided before the build: the hand-over from `prepare` to `execute`."""

    config: RunConfig
    context: RunContext
    devices: devices_lib.DeviceSet
    cache_dir: str | None
    checkpoints: CheckpointPlan
    planned: PlannedModel
    objectives: Objectives
    distribution: Any  # keras.distribution.ModelParallel, not yet in force
    data: data_lib.DataContext
    datasets: data_lib.Datasets
    total_steps: int
    generator_in_pipeline: bool = (
        False  # a tf.data generator dataset: the run restores malloc's policy (meshrun.run.feed)
    )
    sampling: Any = None  # meshrun.run.sampling.SamplingPlan: prompts completed after training (None: none)

    @property
    def plan(self) -> Plan:
        return self.planned.plan


def prepare(config: RunConfig, context: RunContext) -> RunSetup:
    """Checks everything about the run that can be known before building it; raises ConfigError
    for the first problem. Nothing is allocated on the devices."""
    compat.ensure("keras")
    cache_dir = devices_lib.set_compilation_cache(config.cache)  # before anything compiles
    found = devices_lib.discover(config.devices, config.mesh, (config.pipeline.axis,))
    check_batch(config.train.batch_size, found.mesh)
    _say_devices(found, config)
    checkpoints = plan_checkpoints(config, context, found.processes)
    planned = place(config, found.mesh, found.processes, devices_lib.device_memory(config.devices, found))
    planned.plan.raise_first_error()
    _say_warnings(planned.plan, config.layout, context.said_once)
    named = check_objectives(config.train, planned)
    if found.processes == 1:  # a job of several processes counts its state only, for now
        planned = step_memory.counted(config, planned, named.loss_function, found.devices)
        planned.plan.raise_first_error()
    sampling = plan_sampling(config, planned, found.mesh, found.processes)
    distribution = distribution_lib.make_distribution(found.mesh, planned.rules, found.devices)
    data = _data_context(config, planned, named, distribution, found.processes)
    datasets = load_data(config, planned, data)
    total_steps = count_steps(config, datasets.steps_per_epoch)
    return RunSetup(
        config=config,
        context=context,
        devices=found,
        cache_dir=cache_dir,
        checkpoints=checkpoints,
        planned=planned,
        objectives=named,
        distribution=distribution,
        data=data,
        datasets=datasets,
        total_steps=total_steps,
        generator_in_pipeline=datasets.holds_generator(),
        sampling=sampling,
    )


def _say_warnings(plan: Plan, layout: LayoutConfig, said_once: set[str]) -> None:
    """Logs the plan's warnings (plan.json keeps them all); that layout keys of layout=auto are
    ignored is said once for the runs that share `said_once` (RunContext.said_once, which it adds
    to)."""
    once = set(_auto_keys_ignored(layout))
    for warning in plan.warnings:
        if warning in said_once:
            continue
        if warning in once:
            said_once.add(warning)
        log.warning(warning)


def place_for_plan(config: RunConfig, processes: int = 1) -> PlannedModel:
    """The planned model of `meshrun plan`, for a job of `processes` processes. A mesh with a -1 is
    filled in from the devices here (as a run would); an explicit shape is planned as written,
    whatever devices this machine has."""
    mesh = config.mesh
    if mesh.size is None:
        mesh = devices_lib.discover(config.devices, mesh).mesh
        check_batch(config.train.batch_size, mesh)
        check_processes(mesh, config.devices, processes, "distributed.num_processes")
    mesh = with_dcn(mesh, processes, (config.pipeline.axis,))
    return place(config, mesh, processes, devices_lib.device_memory(config.devices))


def place(
    config: RunConfig, mesh: MeshConfig, processes: int = 1, memory: DeviceMemory | None = None
) -> PlannedModel:
    """Where the configured model's variables and optimizer slots go on `mesh` (no -1 left) for a
    job of `processes` processes, worked out from shapes alone, and whether they fit in `memory`.
    On a mesh with the pipeline's stage axis the model is described with its blocks stacked, and
    the layout rules (written for separate blocks) are checked as such and carried over to them."""
    spec = get_model(config.model.name)
    options = config.model.options
    train = config.train
    pipeline = staged_for(config, mesh)
    if pipeline:
        _check_not_quantized(spec, options)
    abstract = _described(config, spec, pipeline)
    if pipeline:
        stacking.check_blocks(abstract.tensors, mesh, pipeline, spec.name_of(options))
    written, notes = layout_rules(config, spec, options, mesh, abstract, pipeline)
    written, quantized_notes = quantized_rules(written, mesh, abstract.variables)
    notes = (*notes, *quantized_notes)
    lint, staged = (), None
    if pipeline:
        rules, lint, bends = stacking.stacked_rules(written, mesh, abstract.tensors, pipeline.axis)
        staged = stacking.pipeline_plan(abstract.tensors, mesh, pipeline, train.batch_size)
    else:
        rules, bends = with_bends(written, mesh, list(abstract.tensors))

    def advice(variables, on) -> list[str]:
        return [
            *notes,
            *pipeline_keys_ignored(config.pipeline, on),
            *(spec.layout_advice(options, variables, on) if spec.layout_advice else ()),
        ]

    plan = make_plan(
        spec.name_of(options),
        mesh,
        rules,
        abstract,
        train.optimizer,
        processes,
        advice=advice,
        memory=memory,
        lint=lint,
        pipeline=staged,
        activations=step_activations(abstract, train, staged),
        bends=bends,
    )
    return PlannedModel(
        spec=spec,
        options=options,
        abstract=abstract,
        rules=rules,
        plan=plan,
        written_rules=written,
        pipeline=pipeline,
    )


def _described(config: RunConfig, spec: ModelSpec, pipeline: PipelineConfig | None) -> AbstractModel:
    """The configured model described by shapes, as the run trains it (meshrun.run.build.describe)."""
    train = config.train
    return describe(
        spec,
        config.model.options,
        config.data,
        train.optimizer,
        train.learning_rate,
        train.precision,
        pipeline=pipeline,
        remat=train.remat,
    )


def staged_for(config: RunConfig, mesh: MeshConfig) -> PipelineConfig | None:
    """The pipeline the model is built for on `mesh` (None: no stage axis, no pipeline); under
    train.remat=blocks or full its stacked blocks are recomputed, as with pipeline.remat=true
    (full's recomputation of the stacked layer as a whole keeps what each block makes while the
    stages run: 1.00x of the step's temporaries on the zoo transformer, against 6.6x with them)."""
    if not config.pipeline.stages(mesh):
        return None
    if config.train.remat in ("blocks", "full"):
        return dataclasses.replace(config.pipeline, remat=True)
    return config.pipeline


def _check_not_quantized(spec: ModelSpec, options) -> None:
    """ConfigError: a quantized base (ModelSpec.quantization) does not train in pipeline stages yet."""
    quantized = spec.quantization_of(options)
    if quantized is not None:
        raise ConfigError(
            "model.quantize",
            f"got {quantized.mode!r} with pipeline stages, whose stacked blocks meshrun does not quantize "
            "yet; set model.quantize=null, or train without a stage axis",
        )


def step_activations(abstract: AbstractModel, train: TrainConfig, staged: PipelinePlan | None) -> Activations:
    """The size of a step's activations, for the estimate of what it sends between processes: the
    global batch, in the compute dtype, and the positions of a sample (tokens, pixels: all but the
    last dimension) in each layer output the model describes; elsewhere in its first input's (one
    per token id; all but the last dimension of features)."""
    positions = 1
    if abstract.signature is not None:
        first = abstract.signature.inputs[0]
        positions = math.prod(
            size or 1
            for size in (first.shape if first.dtype.startswith(("int", "uint")) else first.shape[:-1])
        )
    layers = {
        t.path.removesuffix("/output"): math.prod(size or 1 for size in t.shape[1:-1])
        for t in abstract.tensors
        if t.is_output and len(t.shape) >= 2
    }
    itemsize = 2 if "float16" in train.precision else 4
    stages = (
        {}
        if staged is None
        else {
            "stage_axis": staged.axis,
            "stage_rounds": staged.repeats,
            "block_output_bytes_per_row": staged.block_output_bytes_per_row,
        }
    )
    return Activations(
        samples=train.batch_size, itemsize=itemsize, positions=positions, layer_positions=layers, **stages
    )


def layout_rules(
    config: RunConfig,
    spec: ModelSpec,
    options,
    mesh: MeshConfig,
    abstract: AbstractModel,
    pipeline: PipelineConfig | None = None,
) -> tuple[tuple[LayoutRule, ...], tuple[str, ...]]:
    """The run's layout rules and what the plan should warn about them: the layout config's rules,
    the model's own layout map (layout.from_model) or rules derived from its variables
    (layout.auto, which warns when it shards nothing), followed by layout.extra_rules. With
    `pipeline`, the rules are for the model with separate blocks (layout.auto derives them within
    a stage)."""
    layout = config.layout
    if layout.auto:
        variables, within = list(abstract.variables), mesh
        if pipeline:
            variables, within = stacking.per_block_view(variables), stacking.within_stage(mesh, pipeline.axis)
        derived = derive_layout(variables, within, layout.min_bytes, layout.fsdp, taken=layout.extra_rules)
        return derived.rules + layout.extra_rules, derived.warnings
    notes = _auto_keys_ignored(layout)
    if not layout.from_model:
        return with_extra_rules(layout.rules, layout.extra_rules), notes
    if spec.layout_rules is None:
        raise ConfigError(
            "layout.from_model",
            f"got true, but {spec.name_of(options)} has no layout map of its own; pick one of its layouts "
            f"(layout={one_of(spec.layouts)}) or write layout.rules",
        )
    own = tuple(spec.layout_rules(options, mesh))
    for rule in own:
        check_rule_axes(rule.key, rule.axes, mesh)
    return with_extra_rules(own, layout.extra_rules), notes


def pipeline_keys_ignored(pipeline: PipelineConfig, mesh: MeshConfig) -> tuple[str, ...]:
    """A warning when pipeline keys are set on a mesh without the stage axis (pipeline.axis), where
    they do nothing: the run trains without stages (a misspelt axis name, say `stages`)."""
    if pipeline.axis in mesh.axis_names:
        return ()
    default = PipelineConfig()
    given = [
        f"pipeline.{key}={str(value).lower() if isinstance(value, bool) else value}"
        for key, value in vars(pipeline).items()
        if value != getattr(default, key)
    ]
    if not given:
        return ()
    near = closest(pipeline.axis, mesh.axis_names, n=1)
    typo = f" ({near[0]!r} is close: a typo?)" if near else ""
    return (
        f"{' and '.join(given)} {'do' if len(given) > 1 else 'does'} nothing: pipeline stages wait for a "
        f"mesh axis named {pipeline.axis!r} (pipeline.axis), and mesh {format_shape(mesh.shape)}'s axes are "
        f"{', '.join(mesh.axis_names)}{typo}, so the run has no stages; name an "
        f"axis {pipeline.axis!r} in mesh.axis_names, or leave the pipeline keys out",
    )


def _auto_keys_ignored(layout) -> tuple[str, ...]:
    """A warning when layout.fsdp or layout.min_bytes is set for a layout other than auto (they are
    keys of every layout, so that a sweep over layouts can set them)."""
    ignored = ["layout.fsdp=true"] if layout.fsdp else []
    if layout.min_bytes != DEFAULT_AUTO_MIN_BYTES:
        ignored.append(f"layout.min_bytes={format_bytes(layout.min_bytes)}")
    if not ignored:
        return ()
    verb = "steer" if len(ignored) > 1 else "steers"
    return (f"{' and '.join(ignored)} only {verb} layout=auto; this layout's rules are used as written",)


def plan_checkpoints(config: RunConfig, context: RunContext, processes: int) -> CheckpointPlan:
    """Where checkpoints go, which one to resume from, and the progress it holds (a bad resume
    path, an unwritable dir, a checkpoint of another model or nothing left to train are ConfigErrors)."""
    root = checkpoint_lib.directory(config.checkpoint, context.run_dir)
    check_export(config, processes)
    if config.checkpoint.saves or config.train.max_time is not None:  # the budget's stop saves a checkpoint
        checkpoint_lib.check_writable(root)
    point = checkpoint_lib.find(config.resume_mode(context.requeued), root, context.unreadable_checkpoints)
    options = config.model.options
    model = checkpoint_lib.ModelIdentity.of(
        config.model.name, get_model(config.model.name).name_of(options), options
    )
    if point:
        checkpoint_lib.check_same_model(
            point, model
        )  # before the progress, which means nothing for another model
    start = checkpoint_lib.read_progress(point) if point else checkpoint_lib.Progress()
    if point and start.epoch >= config.train.epochs:
        raise ConfigError(
            "resume",
            f"checkpoint {point} is at the end of training (epoch {start.epoch} of {config.train.epochs}); "
            "nothing is left to train: raise train.epochs, or "
            "start again with resume=never in another hydra.run.dir",
        )
    return CheckpointPlan(root, point, start, model)


def check_export(config: RunConfig, processes: int) -> None:
    """An export is written by one process: a ConfigError for checkpoint.export in a job of several."""
    if config.checkpoint.export and processes > 1:
        raise ConfigError(
            "checkpoint.export",
            "got true with several processes; a .keras file is written by one process, "
            "so export from a one-process run (resume from the checkpoint there)",
        )


def check_without_devices(config: RunConfig, planned: PlannedModel, processes: int) -> Objectives:
    """The checks of a run beyond its plan that need neither its devices nor its files, which
    `meshrun plan` and `meshrun k8s` make where the run's devices and data may not be: the loss and
    metric names and the early-stopping monitor, and what a job of `processes` processes cannot do
    (export, complete train.sample_prompts). A ConfigError for the first problem."""
    named = check_objectives(config.train, planned)
    check_export(config, processes)
    check_sampling_settings(config, processes)
    return named


def check_objectives(train: TrainConfig, planned: PlannedModel) -> Objectives:
    """The loss and metric names the run will log (a ConfigError for a name Keras does not know, a
    run without any loss, or an early-stopping monitor the run does not log). The loss and metrics
    are made in an abstract session, so nothing is allocated; the run makes its own."""
    spec, options, compiled = planned.spec, planned.options, planned.abstract.compiled
    with abstract_session(collect=False), keras.StatelessScope(initialize_variables=False):
        loss = objectives.make_loss(train.loss, spec, options, compiled)
        function = objectives.loss_function(loss)
        metrics = objectives.make_metrics(
            train.metrics, function, train.loss is None, spec, options, compiled
        )
        named = Objectives(objectives.loss_name(loss), function, tuple(objectives.metric_names(metrics)))
    _check_monitor(train, list(named.logged))
    return named


def _check_monitor(train: TrainConfig, names: list[str]) -> None:
    """Early stopping must monitor a metric the run logs."""
    monitor = train.early_stopping.monitor
    if monitor is None:
        return
    logged = names + ([f"val_{name}" for name in names] if train.eval_every else [])
    if monitor not in logged:
        raise ConfigError(
            "train.early_stopping.monitor",
            f"got {monitor!r}, which this run does not log; valid: {one_of(logged)}",
        )


def _data_context(
    config: RunConfig, planned: PlannedModel, named: Objectives, distribution, processes: int
) -> data_lib.DataContext:
    """What the data source needs to know about the run, this process's share of each batch included."""
    shard_index, shard_count = distribution_lib.batch_share(distribution, config.train.batch_size)
    return data_lib.DataContext(
        model=planned.spec,
        model_options=planned.options,
        batch_size=config.train.batch_size,
        seed=config.train.seed,
        shard_index=shard_index,
        shard_count=shard_count,
        process_count=processes,
        signature=planned.abstract.signature,
        loss=named.loss_function,
        shared_caches=config.cache.shared,
    )


def load_data(config: RunConfig, planned: PlannedModel, data: data_lib.DataContext) -> data_lib.Datasets:
    """The run's data pipelines, seeded, and checked against the model's inputs and the loss (a
    ConfigError when they do not fit)."""
    set_random_seed(config.train.seed, order.tensorflow_global_seed(config.train.seed))
    datasets = data_lib.make_datasets(config.data.name, config.data.options, data)
    weight_input = planned.spec.sample_weight_input
    if weight_input and not datasets.weighted:
        datasets = data_lib.pipeline.weighted_by_input(datasets, weight_input)
    options = planned.options
    input_key = next(
        (f"model.{k}" for k in ("input_shape", "seq_len") if getattr(options, k, None) is not None), None
    )
    data_lib.pipeline.check_fits_model(datasets.train.element_spec, data.signature, data.loss, input_key)
    return _range_checked(
        datasets, ranges.limits(data.signature, data.loss, planned.spec.language_model, config.data.name)
    )


def _range_checked(datasets: data_lib.Datasets, limits: ranges.Limits) -> data_lib.Datasets:
    """`datasets` checked for token ids and class labels out of the model's range: the first batch
    now (a ConfigError before anything is built), every numpy batch as training reads it."""
    if not limits.checks:
        return datasets
    ranges.check_batch(datasets.sample_batch, limits)
    return dataclasses.replace(
        datasets, train=ranges.checked(datasets.train, limits), eval=ranges.checked(datasets.eval, limits)
    )


def count_steps(config: RunConfig, steps_per_epoch: int) -> int:
    """The run's training steps; switches that count steps must fit in them (a checkpoint schedule
    that never fires is only a warning: the run is still worth its result)."""
    total_steps = config.train.epochs * steps_per_epoch
    accumulate = config.train.grad_accum_steps
    if accumulate > total_steps:
        raise ConfigError(
            "train.grad_accum_steps",
            f"got {accumulate}, more than the run's {total_steps} training "
            f"steps; no update would be applied: valid 1 to {total_steps}",
        )
    every = config.checkpoint.every_steps
    if every and every > total_steps:
        log.warning(
            f"checkpoint.every_steps={every} is more than the run's {total_steps} training steps, so it "
            f"never saves; give at most {total_steps} or checkpoint.every_epoch=true"
        )
    steps = config.profile.steps
    if steps is not None and steps[1] > total_steps:
        raise ConfigError(
            "profile.steps",
            f"got {list(steps)}; the run has {total_steps} training "
            f"steps: valid 1 <= first <= last <= {total_steps}",
        )
    return total_steps


def _say_devices(found: devices_lib.DeviceSet, config: RunConfig) -> None:
    shape = format_shape(found.mesh.shape)
    spread = f" over {found.processes} processes" if found.processes > 1 else ""
    if found.emulated:
        reason = "no accelerator found" if config.devices.platform == "auto" else "devices.platform=cpu"
        log.info(
            f"{reason}; emulating {found.available} CPU devices{spread}, "
            f"using {len(found.devices)} for mesh {shape}"
        )
    else:
        log.info(f"using {len(found.devices)} {found.kind} devices{spread} for mesh {shape}")
