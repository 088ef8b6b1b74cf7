"""The last phase of a run: what metrics.json holds (RunMetrics), from what `prepare` decided and
what `execute` found out. Plain arithmetic; nothing is measured here."""

from __future__ import annotations

from dataclasses import dataclass

import meshrun
from meshrun.logs.timing import StepStats
from meshrun.run import hardware
from meshrun.run.costs import StepCosts
from meshrun.run.execute import Outcome, local_devices, stopped_by_signal
from meshrun.run.prepare import RunSetup
from meshrun.specs.jsondata import to_json
from meshrun.specs.metrics import (
    PREEMPTED,
    CacheFigures,
    CheckpointFigures,
    CompiledMemory,
    DataFigures,
    DeviceFigures,
    FlopsFigures,
    LayoutFigures,
    MemoryFigures,
    MeshFigures,
    ModelFigures,
    ProcessFigures,
    QuantizeFigures,
    RunMetrics,
    TimingFigures,
    TrainFigures,
)


@dataclass(frozen=True)
class Ending:
    """How the run ended: the seconds spent clearing Keras' session, and when it was done."""

    teardown_s: float
    ended_at: float


def collect(setup: RunSetup, outcome: Outcome, ending: Ending) -> RunMetrics:
    """The metrics of a finished run."""
    import jax
    import keras

    config, context = setup.config, setup.context
    preempted = stopped_by_signal(outcome.stopped)
    return RunMetrics(
        status=PREEMPTED if preempted else "ok",
        error=None,
        run_dir=context.run_dir,
        choices=context.choices,
        overrides=context.overrides,
        exit_status=outcome.stopped["exit_status"] if preempted else None,
        mesh=MeshFigures(
            list(setup.devices.mesh.shape),
            list(setup.devices.mesh.axis_names),
            setup.devices.mesh.batch_axis,
            list(setup.devices.mesh.dcn),
        ),
        devices=_devices(setup),
        distributed=ProcessFigures(**context.identity.describe()),
        layout=_layout(setup),
        model=_model(setup, outcome),
        data=_data(setup, outcome),
        train=_train(setup, outcome),
        timing=_timing(setup, outcome, ending),
        cache=CacheFigures(enabled=config.cache.enabled, dir=setup.cache_dir),
        flops=_flops(setup, outcome),
        memory=_memory(setup, outcome),
        checkpoint=_checkpoint(setup, outcome),
        logs=outcome.logs,
        profile=outcome.profile,
        history=outcome.history,
        eval=outcome.evaluation,
        quantize=_quantize(outcome),
        samples=outcome.samples,
        skipped=outcome.skipped,
        sharding=outcome.placed,
        versions={"meshrun": meshrun.__version__, "keras": keras.__version__, "jax": jax.__version__},
    )


def _devices(setup: RunSetup) -> DeviceFigures:
    found = setup.devices
    return DeviceFigures(
        platform=found.platform,
        kind=found.kind,
        count=len(found.devices),
        available=found.available,
        emulated=found.emulated,
        processes=found.processes,
        per_process=len(local_devices(found.devices)),
    )


def _layout(setup: RunSetup) -> LayoutFigures:
    rules = setup.planned.rules
    return LayoutFigures(
        rules={r.pattern: list(r.axes) for r in rules},
        origins={r.pattern: r.origin for r in rules},
        from_model=setup.config.layout.from_model,
    )


def _model(setup: RunSetup, outcome: Outcome) -> ModelFigures:
    spec, options = setup.planned.spec, setup.planned.options
    signature = setup.planned.abstract.signature.describe()
    return ModelFigures(
        name=spec.name,
        label=spec.name_of(options),
        params=outcome.params,
        trainable_params=outcome.trainable_params,
        options=to_json(options),
        inputs=signature["inputs"],
        outputs=signature["outputs"],
    )


def _data(setup: RunSetup, outcome: Outcome) -> DataFigures:
    config, data = setup.config, setup.data
    return DataFigures(
        source=config.data.name,
        loader=outcome.loader,
        allocator_restored=outcome.allocator_restored,
        details={**to_json(config.data.options), **setup.datasets.info},
        global_batch_size=data.batch_size,
        process_batch_size=data.process_batch_size,
        processes=data.process_count,
        process_share={"index": data.shard_index, "count": data.shard_count},
    )


def _train(setup: RunSetup, outcome: Outcome) -> TrainFigures:
    train, mesh = setup.config.train, setup.devices.mesh
    return TrainFigures(
        global_batch_size=train.batch_size,
        per_replica_batch_size=train.batch_size // mesh.axis_size(mesh.batch_axis),
        steps_per_epoch=setup.datasets.steps_per_epoch,
        epochs=train.epochs,
        optimizer=train.optimizer,
        learning_rate=train.learning_rate,
        lr_schedule=train.lr_schedule,
        warmup_steps=train.warmup_steps,
        min_learning_rate=train.min_learning_rate,
        clip_norm=train.clip_norm,
        precision=train.precision,
        remat=train.remat,
        grad_accum_steps=train.grad_accum_steps,
        samples_per_update=train.batch_size * train.grad_accum_steps,
        updates=outcome.updates,
        eval_every=train.eval_every,
        max_time_s=train.max_time,
        early_stopping=to_json(train.early_stopping) if train.early_stopping.monitor else None,
        stopped=outcome.stopped,
        loss=outcome.loss,
        seed=train.seed,
    )


def _timing(setup: RunSetup, outcome: Outcome, ending: Ending) -> TimingFigures:
    """Where the job's time went. Throughput is the samples (tokens) of the steps in the throughput
    window over its seconds, so that it agrees with a clock outside; the median step leaves out the
    slow ones and the epochs' starts (meshrun.logs.timing)."""
    started, steps, batch = setup.context.started_at, outcome.steps, setup.config.train.batch_size
    spec, options = setup.planned.spec, setup.planned.options
    tokens_per_step = batch * spec.tokens_per_sample(options) if spec.tokens_per_sample else None
    return TimingFigures(
        startup_s=outcome.built_at - started,
        time_to_first_step_s=steps.first_step_at - started,
        compile_s=steps.compile_s,
        step_time_s=steps.step_time_s,
        step_time_p90_s=steps.step_time_p90_s,
        steady_steps=steps.steady_steps,
        minor_faults_per_step=steps.minor_faults_per_step,
        async_log_fetch=outcome.async_log_fetch,
        samples_per_s=steps.rate(batch),
        tokens_per_s=steps.rate(tokens_per_step),
        throughput_s=steps.throughput_s,
        throughput_steps=steps.throughput_steps,
        epoch_s=steps.epoch_s,
        epoch_steps=steps.epoch_steps,
        eval_s=outcome.eval_s,
        cost_analysis_s=outcome.costs.seconds,
        checkpoint_s=outcome.checkpoint_s,
        teardown_s=ending.teardown_s,
        wall_s=ending.ended_at - started,
    )


def _flops(setup: RunSetup, outcome: Outcome) -> FlopsFigures:
    """The FLOPs figures of the run: the peak of the device kind where it is known (from
    devices.peak_flops, else meshrun's table; never guessed) and the model's analytic count where
    its spec has one, beside XLA's counts (flops_figures)."""
    config, found = setup.config, setup.devices
    if config.devices.peak_flops is not None:
        peak, source = config.devices.peak_flops, "devices.peak_flops"
    else:
        peak = hardware.peak_flops(found.kind) if not found.emulated else None
        source = "table" if peak is not None else None
    spec, options = setup.planned.spec, setup.planned.options
    analytic = (
        spec.analytic_flops(options, config.train.batch_size, setup.plan.variables)
        if spec.analytic_flops
        else None
    )
    pipeline = setup.plan.pipeline
    return flops_figures(
        outcome.costs,
        outcome.steps,
        device_count=len(found.devices),
        peak=peak,
        peak_source=source,
        analytic=analytic,
        analytic_formula=(
            None
            if not analytic
            else "6·N·tokens"
            if setup.plan.trainable_params == setup.plan.params
            else "(4·N+2·T)·tokens"
        ),
        bubble_fraction=pipeline.bubble_fraction if pipeline else None,
    )


def flops_figures(
    costs: StepCosts,
    steps: StepStats,
    *,
    device_count: int,
    peak: float | None,
    peak_source: str | None,
    analytic: float | None,
    analytic_formula: str | None,
    bubble_fraction: float | None,
) -> FlopsFigures:
    """FLOPs of one step as XLA counts them, the rate achieved and utilisation over `peak` (one
    device's, None where unknown); with pipeline stages, the FLOPs of their bubble ticks apart.

    The rate and utilisation come from XLA's global count, or from the `analytic` one where XLA
    gives none (under CUDA) and the model has one; `source` says which. Where XLA gives no global
    count, its count of the compiled program per device is left out: on a GPU it misses the cuBLAS
    and cuDNN calls, the matmuls themselves (0.7% of the analytic count for a 125M transformer)."""
    per_step = costs.flops_per_step
    counted, source = (
        (per_step, "xla") if per_step is not None else (analytic, "analytic" if analytic else None)
    )
    per_s = steps.rate(counted)
    return FlopsFigures(
        per_step=per_step,
        per_step_per_device=costs.flops_per_step_per_device if per_step is not None else None,
        bubble_per_step=costs.bubble_flops_per_step,
        bubble_fraction=bubble_fraction if costs.bubble_flops_per_step is not None else None,
        source=source,
        per_s=per_s,
        peak_per_device=peak,
        peak_source=peak_source,
        mfu=hardware.mfu(per_s, device_count, peak),
        analytic_per_step=analytic,
        analytic_over_xla=analytic / per_step if analytic and per_step else None,
        analytic_formula=analytic_formula,
    )


def _memory(setup: RunSetup, outcome: Outcome) -> MemoryFigures:
    """Bytes per device: the placed variables and optimizer slots (read from the arrays) beside the
    plan's figures, XLA's compiled estimate of the step, the live peak where the platform
    reports one, and the peaks of loading the model."""
    costs, plan = outcome.costs, setup.plan
    split = _split_bytes(setup, outcome) if plan.quantized else {}
    return MemoryFigures(
        params_bytes_per_device=sum(v.bytes_per_device for v in outcome.placed.values()),
        trainable_bytes_per_device=split.get("trainable"),
        frozen_quantized_bytes_per_device=split.get("frozen_quantized"),
        frozen_float_bytes_per_device=split.get("frozen_float"),
        optimizer_bytes_per_device=outcome.optimizer_bytes_per_device,
        planned_params_bytes_per_device=plan.params_bytes_per_device,
        planned_optimizer_bytes_per_device=plan.optimizer_bytes_per_device,
        planned_step_bytes_per_device=plan.step.step_bytes_per_device if plan.step else None,
        planned_step_peak_bytes_per_device=plan.step.step_peak_bytes_per_device if plan.step else None,
        peak_bytes_per_device=costs.peak_bytes_per_device,
        compiled=CompiledMemory(
            argument_bytes=costs.argument_bytes,
            output_bytes=costs.output_bytes,
            temp_bytes=costs.temp_bytes,
            alias_bytes=costs.alias_bytes,
            generated_code_bytes=costs.generated_code_bytes,
        ),
        live_peak_bytes_per_device=outcome.live_peak_bytes_per_device,
        load_peak_bytes_per_device=outcome.load.bytes_per_device,
        load_peak_host_bytes=outcome.load.host_bytes,
    )


def _split_bytes(setup: RunSetup, outcome: Outcome) -> dict[str, int]:
    """A quantized base's variables' bytes per device as placed (read from the arrays), by what the
    plan says they are: trainable, frozen quantized (of a quantized layer) or frozen float."""
    split = dict.fromkeys(("trainable", "frozen_quantized", "frozen_float"), 0)
    for planned in setup.plan.variables:
        kind = (
            "trainable" if planned.trainable else "frozen_quantized" if planned.quantized else "frozen_float"
        )
        split[kind] += outcome.placed[planned.path].bytes_per_device
    return split


def _quantize(outcome: Outcome) -> QuantizeFigures | None:
    """The quantize record: the quantized base's loss before training beside the float base's."""
    losses = outcome.base_losses
    if losses is None:
        return None
    return QuantizeFigures(
        mode=losses.mode,
        base_loss=losses.quantized_loss,
        float_base_loss=losses.float_loss,
        difference=None if losses.float_loss is None else losses.quantized_loss - losses.float_loss,
        seconds=losses.seconds,
    )


def _checkpoint(setup: RunSetup, outcome: Outcome) -> CheckpointFigures:
    config, resume, exported = setup.config, setup.checkpoints.resume, outcome.exported or {}
    return CheckpointFigures(
        dir=str(setup.checkpoints.root) if outcome.saved_steps or config.checkpoint.saves else None,
        saved_steps=outcome.saved_steps,
        resumed_from=str(resume) if resume else None,
        resumed_at_step=setup.checkpoints.start.global_step if resume else None,
        exported=exported.get("model"),
        exported_preset=exported.get("preset"),
        exported_adapter=exported.get("adapter"),
        exported_hf=exported.get("hf"),
        exported_peft=exported.get("peft"),
    )
