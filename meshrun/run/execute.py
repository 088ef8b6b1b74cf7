"""The phase of a run that trains: build the model under the run's distribution, fit it, evaluate
it, export it, and read what the report needs off the placed arrays and XLA's analysis of the step.
Everything it needs was checked by `prepare`, and a quantized base's float base was evaluated by
the step before it (meshrun.run.float_base); what it found out is an `Outcome`.

Importing this module imports jax and keras: call `meshrun.placement.devices.prepare` first.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import jax

from meshrun import quantize
from meshrun.compat.keras.startup import keras_without_tensorflow
from meshrun.logs.timing import StepStats
from meshrun.placement import distribution as distribution_lib
from meshrun.run import costs as costs_lib
from meshrun.run import feed, sampling
from meshrun.run.build import build_model, built_off_the_mesh, check_paths_match
from meshrun.run.float_base import FloatBaseLoss
from meshrun.run.hooks import RunHooks, make_hooks
from meshrun.run.prepare import RunSetup
from meshrun.run.session import compile_model, enter_run_session, evaluate
from meshrun.specs.metrics import SKIPPABLE, PlacedVariable, ProfileFigures
from meshrun.specs.rundir import EXPORT_FILE
from meshrun.system import allocator, signals
from meshrun.system.load_memory import LoadPeaks, LoadWatch
from meshrun.training import objectives, restack
from meshrun.training.callbacks import GracefulStop

log = logging.getLogger("meshrun")


@dataclass(frozen=True)
class Outcome:
    """What a finished run found out: when the model was built, the step times, the per-epoch
    history and the final evaluation, XLA's costs of the step, every variable as placed (read back
    from the arrays), what the hooks saw (early stop, checkpoints, logs, trace, the allocator put
    back), the export, which loader fed Keras (meshrun.run.feed), the completions of
    train.sample_prompts, and for a quantized base its loss before training beside the float base's."""

    built_at: float
    steps: StepStats
    async_log_fetch: bool
    history: dict
    evaluation: dict | None  # None when skipped
    eval_s: float
    costs: costs_lib.StepCosts
    placed: dict[str, PlacedVariable]
    params: int
    trainable_params: int
    optimizer_bytes_per_device: int
    live_peak_bytes_per_device: int | None
    load: LoadPeaks
    updates: int
    loss: str
    stopped: dict | None
    logs: dict
    profile: ProfileFigures | None
    checkpoint_s: float
    saved_steps: list
    exported: (
        dict | None
    )  # by name: model (model.keras), and the model's own formats (KerasHub: preset, adapter)
    loader: str
    allocator_restored: bool
    samples: list | None = None  # train.sample_prompts and their completions (meshrun.run.sampling)
    base_losses: BaseLosses | None = None  # a quantized base's (model.quantize)
    skipped: list | None = None  # what a run stopped by a signal left out (skipped_after_signal)


@dataclass(frozen=True)
class BaseLosses:
    """What quantizing the base costs (model.quantize): the evaluation loss of the quantized base
    before training (its LoRA adapters, B = 0, add nothing) and of the float base it was made from,
    on the same evaluation data (None: not evaluated, meshrun.run.float_base)."""

    mode: str
    quantized_loss: float
    float_loss: float | None
    seconds: float  # the float base's build, evaluation and freeing, and the quantized base's evaluation


def execute(
    setup: RunSetup, float_base: FloatBaseLoss | None = None, stop_signals: signals.StopSignals | None = None
) -> Outcome:
    """Builds, trains, evaluates and exports the model of `setup`, and measures it. A stop signal
    while it builds or trains (meshrun.system.signals; `stop_signals`: those the steps before it
    caught too) stops training at the next step boundary with a checkpoint there; the run then
    skips evaluation, export, sampling and XLA's analysis, to be done before the scheduler's grace
    period ends. Training runs under meshrun's allocator policy (meshrun.system.allocator). A
    quantized base (ModelSpec.quantization) is evaluated before training, beside `float_base`, the
    float base's loss the step before found (meshrun.run.float_base; None: not evaluated)."""
    allocator.set_training_policy()
    with stop_signals or signals.StopSignals() as caught:
        model, loss, load = build(setup)
        built_at = time.time()
        base_losses = _base_losses(model, setup, float_base)
        hooks = make_hooks(setup, caught)
        history = fit(model, setup, hooks)
    stopped = hooks.stopped()
    skipped = skipped_after_signal(setup) if stopped_by_signal(stopped) else None
    if skipped:
        evaluation, eval_s, exported, costs, samples = None, 0.0, None, costs_lib.StepCosts.unknown(), None
    else:
        eval_started = time.perf_counter()
        evaluation = evaluate(model, setup, hooks.evaluation)
        eval_s = time.perf_counter() - eval_started
        separate = functools.cache(lambda: with_separate_blocks(model, setup))
        exported = export(separate, setup)
        samples = sampling.sample(separate(), setup.sampling) if setup.sampling else None
        costs = costs_lib.train_step_costs(model, setup.datasets.sample_batch)
    return Outcome(
        built_at=built_at,
        steps=hooks.timer.stats(),
        async_log_fetch=hooks.async_log_fetch,
        history=history,
        evaluation=evaluation,
        eval_s=eval_s,
        costs=costs,
        placed=placed_variables(model, setup),
        params=quantize.float_model_params(model),
        trainable_params=sum(math.prod(v.shape) for v in model.trainable_variables),
        optimizer_bytes_per_device=sum(_bytes_on_one_device(v) for v in model.optimizer.variables),
        live_peak_bytes_per_device=costs_lib.live_peak_bytes(local_devices(setup.devices.devices)),
        load=load,
        updates=int(model.optimizer.iterations),
        loss=objectives.loss_name(loss),
        stopped=stopped,
        logs=hooks.log_files(),
        profile=hooks.profile(),
        checkpoint_s=hooks.checkpointing.seconds,
        saved_steps=hooks.checkpointing.saved_steps,
        exported=exported,
        loader=feed.loader(setup.datasets.train, model),
        allocator_restored=hooks.allocator_restored,
        samples=samples,
        skipped=skipped,
        base_losses=base_losses,
    )


def _base_losses(model, setup: RunSetup, float_base: FloatBaseLoss | None) -> BaseLosses | None:
    """The quantized base's evaluation loss before training beside the float base's (None: a float
    base). Checkpoints are restored as training begins, so a resumed run measures the base too."""
    quantized = setup.planned.spec.quantization_of(setup.planned.options)
    if quantized is None:
        return None
    started = time.perf_counter()
    loss = evaluate(model, setup, [])["loss"]
    float_loss, float_s = (float_base.loss, float_base.seconds) if float_base else (None, 0.0)
    return BaseLosses(quantized.mode, loss, float_loss, seconds=float_s + time.perf_counter() - started)


def stopped_by_signal(stopped: dict | None) -> bool:
    """Whether training ended on a stop signal (`stopped`: RunHooks.stopped)."""
    return stopped is not None and stopped["reason"] == GracefulStop.SIGNAL


def skipped_after_signal(setup: RunSetup) -> list[str]:
    """What a run stopped by a signal leaves out, to exit within the scheduler's grace period, as
    metrics.json and the summary name it: the evaluation, XLA's cost analysis, and the export and
    samples where the run asked for them."""
    asked = {"export": setup.config.checkpoint.export, "samples": bool(setup.sampling)}
    return [part for part in SKIPPABLE if asked.get(part, True)]


def build(setup: RunSetup):
    """The model, built and compiled under the run's distribution and dtype policy, its initial
    weights drawn from the run's seed (or read from its preset, each weight straight onto its
    shards), the loss it was compiled with, and the memory peaks of building it. Every Keras object,
    the optimizer's variables included, must be created under the distribution."""
    config, placement = setup.config, setup.planned
    spec, options = placement.spec, placement.options
    enter_run_session(setup)
    stacks = {tensor.path: tensor.blocks for tensor in placement.abstract.variables if tensor.blocks}
    with (
        LoadWatch(local_devices(setup.devices.devices)) as watch,
        distribution_lib.blocks_on_their_stages(stacks, placement.pipeline),
    ):
        model, _ = build_model(
            spec, options, config.data, pipeline=placement.pipeline, remat=config.train.remat
        )  # prepare's abstract builds left a fresh session
    check_paths_match(model, placement.abstract, spec, options)
    return model, compile_model(model, setup), watch.peaks()


def fit(model, setup: RunSetup, hooks: RunHooks) -> dict:
    """Trains from the run's start (a fresh one, or the checkpoint it resumes) to the last epoch;
    returns the per-epoch history. Raises Diverged when the NaN guard stopped training. Where a
    second Ctrl-C is a KeyboardInterrupt (meshrun called in its caller's process), it does not wait
    for checkpoints still being written: they are left cut short, and resume passes over them."""
    try:
        history = _fit(model, setup.datasets, setup.config.train, hooks.all, setup.checkpoints.start)
    except Exception:
        hooks.finish()
        raise
    except BaseException:
        hooks.abandon()
        raise
    hooks.finish()
    hooks.check_finite()
    return history


def _fit(model, datasets, train, callbacks: list, start) -> dict:
    """Trains from `start` to the last epoch and returns the per-epoch history (epochs before
    `start` come from its checkpoint). A half-done epoch runs first, for its remaining steps;
    each fit call reads the data stream from the global step it starts at. Evaluates every
    `train.eval_every` epochs (if set). Ends early once a callback stops training."""
    history = {name: list(values) for name, values in start.history.items()}
    steps_per_epoch = datasets.steps_per_epoch
    spans = []  # (first epoch, end epoch, steps per epoch)
    epoch = start.epoch
    if (
        start.step_in_epoch
    ):  # all of an epoch's steps (an older checkpoint of its last step): nothing left of it
        if start.step_in_epoch < steps_per_epoch:
            spans.append((epoch, epoch + 1, steps_per_epoch - start.step_in_epoch))
        epoch += 1
    if epoch < train.epochs:
        spans.append((epoch, train.epochs, steps_per_epoch))
    step = start.global_step
    validation = {}
    if train.eval_every:
        validation = {
            "validation_data": feed.keras_input(datasets.eval, model),
            "validation_freq": train.eval_every,
            "validation_steps": feed.evaluation_steps(datasets.eval, model),
        }
    for first, end, steps in spans:
        fitted = model.fit(
            feed.keras_input(datasets.train.skip(step) if step else datasets.train, model),
            initial_epoch=first,
            epochs=end,
            steps_per_epoch=steps,
            verbose=0,
            callbacks=callbacks,
            shuffle=False,  # the pipeline shuffles, seeded
            **validation,
        )
        for name, values in fitted.history.items():
            history.setdefault(name, []).extend(float(v) for v in values)
        if model.stop_training:
            break
        step += (end - first) * steps
    return history


def with_separate_blocks(model, setup: RunSetup):
    """The trained model as export, the adapter and sampling take it: itself, or for pipelined
    blocks the same model with separate blocks (built off the mesh, on the default device:
    KerasHub's task with its generate and save_to_preset, a model.keras that loads without
    meshrun). `execute` builds it once, where one of them asks."""
    return restack.with_separate_blocks(
        model, lambda: built_off_the_mesh(setup.planned.spec, setup.planned.options, setup.config.data)
    )


def export(trained, setup: RunSetup) -> dict | None:
    """Writes the trained model (`trained()`: with separate blocks, with_separate_blocks) as
    model.keras into the run dir when checkpoint.export asks, and the model's own formats beside it
    (ModelSpec.export: a KerasHub preset and LoRA adapters); their paths by name (model, and what
    the spec's export wrote). Without checkpoint.export: the adapters the run keeps (keep_adapter),
    else None. Keras saves a LoRA-adapted kernel merged (kernel + alpha / rank * A @ B), so
    model.keras loads as the plain architecture with the fine-tuned weights."""
    if not setup.config.checkpoint.export:
        return keep_adapter(trained, setup)
    path = Path(setup.context.run_dir) / EXPORT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    model = trained()
    spec = setup.planned.spec
    with keras_without_tensorflow():  # a run that needed no TensorFlow imports none to save
        model.save(path)
        own = (
            spec.export(model, setup.planned.options, path.parent, setup.config.checkpoint)
            if spec.export
            else {}
        )
    return {"model": str(path), **own}


def keep_adapter(trained, setup: RunSetup) -> dict | None:
    """The adapters a fine-tune keeps in its run dir without an export (checkpoint.keep_adapter;
    ModelSpec.save_adapter: a KerasHub LoRA run's adapter.lora.h5), written by process 0:
    {adapter: path}, None where the run keeps none. A run of several processes with pipeline
    stages keeps none: rebuilding its blocks is a computation every process would have to run."""
    spec, context = setup.planned.spec, setup.context
    if not (
        setup.config.checkpoint.keep_adapter
        and spec.save_adapter
        and context.run_dir
        and context.identity.is_first
    ):
        return None
    several_with_stages = setup.devices.processes > 1 and setup.planned.pipeline is not None

    def model():
        if several_with_stages:
            log.warning(
                "checkpoint.keep_adapter: a run of several processes with pipeline stages keeps no adapter "
                "file (its checkpoints hold the adapters)"
            )
            return None
        return trained()

    path = spec.save_adapter(model, setup.planned.options, Path(context.run_dir))
    return {"adapter": path} if path else None


def placed_variables(model, setup: RunSetup) -> dict[str, PlacedVariable]:
    """Every model variable as placed: its shape, the PartitionSpec and bytes per device read back
    from the array, and the rule that placed it (None: replicated, no rule matched) with its
    origin. The run's variables have the plan's paths (meshrun.run.build.check_paths_match)."""
    planned = {p.path: p for p in setup.plan.variables}
    placed = {}
    for variable in model.variables:
        placed[variable.path] = PlacedVariable(
            shape=list(variable.shape),
            dtype=str(variable.dtype),
            spec=partition_spec(variable.value, len(variable.shape)),
            bytes_per_device=_bytes_on_one_device(variable),
            rule=planned[variable.path].rule,
            origin=planned[variable.path].origin,
        )
    return placed


def partition_spec(array, rank: int) -> list:
    """The PartitionSpec of `array` as a list of `rank` entries (a mesh axis, a list of axes, or
    None). On a mesh of one device Keras' arrays carry a SingleDeviceSharding, which has no spec:
    every dimension is whole, as in a replicated array."""
    spec = getattr(array.sharding, "spec", None) or ()
    return [list(axis) if isinstance(axis, tuple) else axis for axis in spec] + [None] * (rank - len(spec))


def local_devices(devices) -> list:
    """The devices of `devices` that belong to this process (all of them with one process)."""
    return [d for d in devices if d.process_index == jax.process_index()]


def _bytes_on_one_device(variable) -> int:
    return int(variable.value.addressable_shards[0].data.nbytes)
