"""The float-base comparison of a quantized run, a step of its own between `prepare` and `execute`
(meshrun.run.phases): where the model's options ask for a quantized base (ModelSpec.quantization)
and train.eval_float_base is on, the float model it is made from is planned on the run's mesh (on
its own, so that its rules fit its float kernels: layout=auto derives them from those), built under
its own distribution (its weights loaded onto their shards as the run's are), evaluated once on the
run's evaluation data and freed with its session, all before the quantized model is built: that
build then gets the planned names, and `memory.load_peak_*` measure it alone. What it found is a
FloatBaseLoss, which `execute` reports beside the quantized base's own loss (metrics.json's
quantize record).

Importing this module imports jax and keras: call `meshrun.placement.devices.prepare` first.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import keras

from meshrun.config.schema import RunConfig
from meshrun.errors import ConfigError
from meshrun.placement import devices as devices_lib
from meshrun.placement import distribution as distribution_lib
from meshrun.run.build import build_model
from meshrun.run.prepare import PlannedModel, RunSetup, place
from meshrun.run.session import compile_model, enter_run_session, evaluate
from meshrun.system import allocator, signals

log = logging.getLogger("meshrun")


@dataclass(frozen=True)
class FloatBase:
    """The float base a quantized run measures its base against, planned on its own (so that its
    rules fit its float kernels), and the distribution that lays it out."""

    planned: PlannedModel
    distribution: Any  # keras.distribution.ModelParallel


@dataclass(frozen=True)
class FloatBaseLoss:
    """What the float-base step hands `execute`: the float base's evaluation loss, and the seconds
    its build, evaluation and freeing took (they count in the quantize record's seconds)."""

    loss: float
    seconds: float


def compare(setup: RunSetup, stop_signals: signals.StopSignals) -> FloatBaseLoss | None:
    """The float base's loss, for a run whose model is quantized and that evaluates its float base
    (train.eval_float_base); None where there is none to evaluate: a float model, the option off,
    or a float base whose plan does not fit the devices (a warning says so). It is built under
    meshrun's allocator policy (meshrun.system.allocator), with the stop signals the training
    that follows catches (`stop_signals`, entered here too: a signal stops that training at its
    first step)."""
    quantized = setup.planned.spec.quantization_of(setup.planned.options)
    if quantized is None or not setup.config.train.eval_float_base:
        return None
    float_base = plan(setup.config, quantized.float_options, setup.devices)
    if float_base is None:
        return None
    allocator.set_training_policy()
    with stop_signals:
        started = time.perf_counter()
        loss = evaluate_float_base(setup, float_base)
        return FloatBaseLoss(loss, time.perf_counter() - started)


def plan(config: RunConfig, float_options, found: devices_lib.DeviceSet) -> FloatBase | None:
    """The float base (the model of `float_options`) planned and laid out on the run's mesh; None,
    with a warning, where it would not fit the devices."""
    float_config = dataclasses.replace(config, model=dataclasses.replace(config.model, options=float_options))
    floated = place(
        float_config, found.mesh, found.processes, devices_lib.device_memory(config.devices, found)
    )
    try:
        floated.plan.raise_first_error()
    except ConfigError as err:
        log.warning(
            "the float base is not evaluated beside the quantized one: %s (train.eval_float_base=false "
            "says so without planning it)",
            err,
        )
        return None
    return FloatBase(floated, distribution_lib.make_distribution(found.mesh, floated.rules, found.devices))


def evaluate_float_base(setup: RunSetup, float_base: FloatBase) -> float:
    """The evaluation loss of the float base: built under its own distribution (rules that fit its
    float kernels; its weights loaded onto their shards as the run's are), evaluated once on the
    run's evaluation data, then freed with its session, so that the quantized build that follows
    gets the planned names and `memory.load_peak_*` measure that build alone."""
    planned = float_base.planned
    enter_run_session(setup, float_base.distribution)
    model, _ = build_model(planned.spec, planned.options, setup.config.data)
    compile_model(model, setup)
    loss = evaluate(model, setup, [])["loss"]
    del model
    keras.backend.clear_session(free_memory=True)  # the names restart; its arrays go
    return loss
