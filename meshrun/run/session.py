"""What every build of a run goes through, the model it trains and the float base it measures that
model's quantized base against (meshrun.run.float_base): the run's distribution, dtype policy and
seed put in force (enter_run_session), the model compiled with the run's optimizer, loss and metrics
(compile_model), and evaluated on the run's evaluation data (evaluate).

Importing this module imports keras: call `meshrun.placement.devices.prepare` first.
"""

from __future__ import annotations

import math

import keras

from meshrun.compat.keras.startup import set_random_seed
from meshrun.data import order
from meshrun.placement import distribution as distribution_lib
from meshrun.run import feed
from meshrun.run.prepare import RunSetup
from meshrun.training import objectives
from meshrun.training.schedule import keras_schedule


def enter_run_session(setup: RunSetup, distribution=None) -> None:
    """Puts the run's distribution (or `distribution`), dtype policy and seed in force for a build."""
    train = setup.config.train
    keras.distribution.set_distribution(distribution_lib.in_force(distribution or setup.distribution))
    keras.config.set_dtype_policy(train.precision)  # reset to float32 by distribution.reset
    set_random_seed(train.seed, order.tensorflow_global_seed(train.seed))


def compile_model(model, setup: RunSetup):
    """Compiles `model` with the run's optimizer, loss and metrics; returns the loss."""
    train = setup.config.train
    optimizer = objectives.make_optimizer(
        train.optimizer,
        keras_schedule(train, setup.total_steps),
        train.clip_norm,
        loss_scaling=train.precision == "mixed_float16",
        accumulate=train.grad_accum_steps,
    )
    return objectives.compile_with(
        model,
        optimizer,
        train,
        setup.planned.spec,
        setup.planned.options,
        setup.objectives.loss_function,
        objectives.compiled_objectives(model),
        setup.datasets.weighted,
    )


def evaluate(model, setup: RunSetup, callbacks: list) -> dict:
    """An evaluation on the run's evaluation data: every compiled metric, and perplexity for a
    language model."""
    data = setup.datasets.eval
    evaluated = model.evaluate(
        feed.keras_input(data, model),
        steps=feed.evaluation_steps(data, model),
        verbose=0,
        return_dict=True,
        callbacks=callbacks,
    )
    evaluation = {name: float(value) for name, value in evaluated.items()}
    if setup.planned.spec.language_model and "loss" in evaluation:
        evaluation["perplexity"] = math.exp(min(evaluation["loss"], 700.0))  # exp overflows a float past ~709
    return evaluation
