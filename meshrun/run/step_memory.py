"""What one train step needs on each device, before anything is allocated: the run's real train
step (Keras' `Model.train_step`, jitted as fit jits it) lowered and compiled on abstract inputs that
carry the plan's shardings, and XLA's memory analysis of it read (meshrun.placement.plan.StepMemory).
The model is built by shapes only, as the plan's description is, so a 7B model costs a compile,
not its weights. The figures are those a run measures after fit (meshrun.run.costs) for the same
program: the state, the batch and the step's own memory (activations, gradients, temporaries).

Importing this module imports jax and keras: call `meshrun.placement.devices.prepare` first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import jax
import keras
from jax.sharding import NamedSharding, PartitionSpec

from meshrun.compat.keras.jax_trainer import build_for_training
from meshrun.compat.keras.models import compile_recorded
from meshrun.config.schema import RunConfig
from meshrun.placement import distribution as distribution_lib
from meshrun.placement.plan import Plan, StepMemory, with_step_memory
from meshrun.run.build import Signature, abstract_session, build_model
from meshrun.training import objectives


def counted(config: RunConfig, planned, loss_function: str, devices):
    """`planned` (meshrun.run.prepare.PlannedModel) with its train step's memory in its plan, and
    the plan's fit verdict worked out from the step's peak, where the plan has a device memory to
    fit, the state alone fits it (else the verdict stands), the model has no pipeline stages and
    `devices` (jax devices in mesh order, one per mesh position) are there to compile on.
    Otherwise `planned` as it is: the plan then counts the state only, and says so."""
    plan = planned.plan
    if plan.memory is None or plan.errors:
        return planned
    if len(devices) != plan.mesh.size or planned.abstract.signature is None:
        return planned
    step = step_memory(config, planned, loss_function, devices)
    return dataclasses.replace(planned, plan=with_step_memory(plan, step))


def step_memory(config: RunConfig, planned, loss_function: str, devices) -> StepMemory:
    """The train step's memory on each device of `planned.plan`'s mesh over `devices`: the model
    and its optimizer built by shapes under the plan's rules, compiled with the run's objectives,
    and its step compiled for a batch of train.batch_size samples."""
    start = time.perf_counter()
    train, plan = config.train, planned.plan
    distribution = distribution_lib.make_distribution(plan.mesh, planned.rules, devices)
    mesh = distribution.device_mesh.backend_mesh
    with abstract_session(train.precision), _in_force(distribution):
        optimizer = objectives.make_optimizer(
            train.optimizer,
            train.learning_rate,
            train.clip_norm,
            loss_scaling=train.precision == "mixed_float16",
            accumulate=train.grad_accum_steps,
        )
        with keras.StatelessScope(initialize_variables=False):
            model, batch = _built_for_training(config, planned, optimizer, loss_function, mesh)
            state = _abstract_state(model, optimizer, plan, mesh)
            step = jax.jit(
                model.train_step,
                donate_argnums=0,
                out_shardings=(None, jax.tree.map(lambda s: s.sharding, state)),
            )
            memory = step.lower(state, batch).compile().memory_analysis()
    own = memory.temp_size_in_bytes
    peak = memory.argument_size_in_bytes + memory.output_size_in_bytes + own - memory.alias_size_in_bytes
    count, platform = len(devices), devices[0].platform.upper()
    method = f"the whole train step compiled on {count} {platform} device{'s' * (count > 1)}"
    return StepMemory(own, peak, method, time.perf_counter() - start, remat=train.remat)


def _built_for_training(config: RunConfig, planned, optimizer, loss_function: str, mesh) -> tuple:
    """The model built by shapes and compiled as the run compiles it (meshrun.run.session.compile_model,
    without its learning-rate schedule: a scalar either way), built for training on one abstract
    global batch as fit builds it first; the model and that batch. Call it in a StatelessScope that
    defers variables, under the plan's distribution."""
    train = config.train
    # A factory that compiles its model is recorded, not run (its optimizer's variables cannot be
    # made here); what it compiled with is the plan's record of it.
    with compile_recorded():
        model, signature = build_model(
            planned.spec,
            planned.options,
            config.data,
            abstract=True,
            pipeline=planned.pipeline,
            remat=train.remat,
        )
    weight_input = planned.spec.sample_weight_input
    objectives.compile_with(
        model,
        optimizer,
        train,
        planned.spec,
        planned.options,
        loss_function,
        planned.abstract.compiled,
        weighted=weight_input is not None,
    )
    batch_axis = planned.plan.mesh.batch_axis
    batch = _abstract_batch(signature, loss_function, train.batch_size, mesh, batch_axis, weight_input)
    x, y, *weights = batch
    build_for_training(model, (x, y, weights[0] if weights else None))
    return model, batch


@contextlib.contextmanager
def _in_force(distribution):
    """Keras' distribution set to `distribution` while in force, and to none after."""
    keras.distribution.set_distribution(distribution)
    try:
        yield
    finally:
        keras.distribution.set_distribution(None)


def _abstract_batch(
    signature: Signature, loss_function: str, batch_size: int, mesh, batch_axis: str, weight_input: str | None
):
    """One global batch as shapes split over the batch axis: (x, y), the inputs the model takes and
    labels shaped as its outputs (class ids, without the last dimension, for a sparse loss), and
    with `weight_input` (the model spec's sample_weight_input: a padding mask) sample weights of
    its shape, as the run's data gives them (meshrun.data.pipeline.weighted_by_input). The XLA
    program with sample weights is another one, with other temporaries."""

    def sharded(shape, dtype):
        spec = PartitionSpec(batch_axis, *(None,) * len(shape))
        return jax.ShapeDtypeStruct((batch_size, *shape), dtype, sharding=NamedSharding(mesh, spec))

    inputs = {spec.name: sharded(spec.shape, spec.dtype) for spec in signature.inputs}
    x = inputs if signature.named else next(iter(inputs.values()))
    output = signature.outputs[0]
    sparse = loss_function.startswith("sparse")
    y = sharded(output.shape[:-1], "int32") if sparse else sharded(output.shape, output.dtype)
    if weight_input is None:
        return x, y
    return x, y, sharded(inputs[weight_input].shape[1:], "float32")


def _abstract_state(model, optimizer, plan: Plan, mesh) -> tuple:
    """The training state fit passes to the train step (trainable, non-trainable, optimizer and
    metrics variables), as shapes with the shardings the plan gives them."""
    by_path = {p.path: p for p in plan.variables}

    def shaped(variable, spec=()):
        sharding = NamedSharding(mesh, PartitionSpec(*spec))
        return jax.ShapeDtypeStruct(variable.shape, variable.dtype, sharding=sharding)

    def placed(variable, placement):
        if tuple(placement.shape) != tuple(variable.shape):
            raise RuntimeError(
                f"the plan's {placement.path} is {placement.shape}, the model's {variable.shape}"
            )
        return shaped(variable, placement.spec)

    return (
        [placed(v, by_path[v.path]) for v in model.trainable_variables],
        [placed(v, by_path[v.path]) for v in model.non_trainable_variables],
        [placed(v, p) for v, p in zip(optimizer.variables, plan.slots, strict=True)],
        [shaped(v) for v in model.metrics_variables],  # replicated
    )
