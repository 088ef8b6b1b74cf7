"""One training run: devices, layout checks, the distributed model, fit, evaluate, and the metrics.

Call `meshrun.devices.prepare` before importing this module: importing it imports jax and keras.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

import jax
import keras

import meshrun
from meshrun import data as data_lib
from meshrun import devices as devices_lib
from meshrun import distribution as distribution_lib
from meshrun.errors import ConfigError, closest, one_of
from meshrun.layout import TensorSpec, assign_rules
from meshrun.models import get_model
from meshrun.schema import RunConfig, check_batch, format_shape
from meshrun.timing import StepTimer, process_start_time

log = logging.getLogger("meshrun")


@dataclass
class RunContext:
    """Facts about the launch that the config does not hold (where the run writes, what was chosen)."""

    run_dir: str = ""
    choices: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)
    started_at: float = field(default_factory=process_start_time)


def run(config: RunConfig, context: RunContext) -> dict:
    """Trains and evaluates the configured model on its mesh; returns the metrics dict.

    Raises ConfigError for anything wrong with the config, before any training starts."""
    try:
        return _run(config, context)
    finally:
        distribution_lib.reset()


def _run(config: RunConfig, context: RunContext) -> dict:
    device_set = devices_lib.discover(config.devices, config.mesh)
    mesh = device_set.mesh
    check_batch(config.train.batch_size, mesh)
    _say_devices(device_set, mesh, config)

    spec = get_model(config.model.name)
    tensors = describe_model(spec.build, config.model.options)
    assigned = assign_rules(config.layout.rules, mesh, tensors)
    loss = check_loss(config.train.loss)

    distribution = distribution_lib.make_distribution(mesh, config.layout.rules, device_set.devices)
    keras.distribution.set_distribution(distribution)
    # Every Keras object, the optimizer's variables included, must be created under the distribution.
    optimizer = make_optimizer(config.train.optimizer, config.train.learning_rate)
    keras.utils.set_random_seed(config.train.seed)
    model = spec.build(config.model.options)
    model.compile(optimizer=optimizer, loss=loss)
    datasets = data_lib.make_datasets(
        config.data, config.model.options, config.train.batch_size, config.train.seed
    )
    built_at = time.time()

    timer = StepTimer(async_safe=not device_set.emulated)
    history = model.fit(
        datasets.train,
        epochs=config.train.epochs,
        steps_per_epoch=datasets.steps_per_epoch,
        verbose=config.train.verbose,
        callbacks=[timer],
        shuffle=False,  # the tf.data pipeline shuffles, seeded
    )
    stats = timer.stats()
    eval_started = time.perf_counter()
    evaluation = model.evaluate(datasets.eval, verbose=0, return_dict=True)
    eval_s = time.perf_counter() - eval_started
    finished_at = time.time()

    batch_axis_size = mesh.axis_size(mesh.batch_axis)
    return {
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
        },
        "layout": {"rules": {r.pattern: list(r.axes) for r in config.layout.rules}},
        "model": {"name": spec.name, "params": int(model.count_params()), "options": _jsonable(asdict(config.model.options))},
        "data": asdict(config.data),
        "train": {
            "global_batch_size": config.train.batch_size,
            "per_replica_batch_size": config.train.batch_size // batch_axis_size,
            "steps_per_epoch": datasets.steps_per_epoch,
            "epochs": config.train.epochs,
            "optimizer": config.train.optimizer,
            "learning_rate": config.train.learning_rate,
            "loss": config.train.loss,
            "seed": config.train.seed,
        },
        "timing": {
            "startup_s": built_at - context.started_at,
            "time_to_first_step_s": stats.first_step_at - context.started_at,
            "compile_s": stats.compile_s,
            "step_time_s": stats.step_time_s,
            "step_time_p90_s": stats.step_time_p90_s,
            "steady_steps": stats.steady_steps,
            "async_log_fetch": timer.async_safe,
            "samples_per_s": config.train.batch_size / stats.step_time_s,
            "epoch_s": stats.epoch_s,
            "eval_s": eval_s,
            "wall_s": finished_at - context.started_at,
        },
        "history": {name: [float(v) for v in values] for name, values in history.history.items()},
        "eval": {name: float(value) for name, value in evaluation.items()},
        "sharding": placed_sharding(model, assigned),
        "versions": {"meshrun": meshrun.__version__, "keras": keras.__version__, "jax": jax.__version__},
    }


def describe_model(build, options) -> list[TensorSpec]:
    """The model's variables and layer outputs as paths and shapes, built abstractly: inside a
    StatelessScope Keras defers variable initialisation, so nothing is allocated."""
    with keras.StatelessScope():
        model = build(options)
    tensors = [TensorSpec(v.path, tuple(v.shape)) for v in model.variables]
    for layer in [*model._flatten_layers(include_self=False), model]:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        output = getattr(layer, "output", None)
        if isinstance(output, keras.KerasTensor):
            name = layer.path or layer.name
            tensors.append(TensorSpec(f"{name}/output", tuple(output.shape), is_output=True))
    keras.backend.clear_session()
    return tensors


def placed_sharding(model, assigned: dict) -> dict:
    """For every model variable: its shape, the PartitionSpec read back from the placed array, and
    the rule that placed it (None: replicated, no rule matched)."""
    placed = {}
    for variable in model.variables:
        spec = variable.value.sharding.spec
        rule = assigned.get(variable.path)
        placed[variable.path] = {
            "shape": list(variable.shape),
            "dtype": str(variable.dtype),
            "spec": [list(axis) if isinstance(axis, tuple) else axis for axis in spec],
            "rule": rule.pattern if rule else None,
        }
    return placed


def make_optimizer(name: str, learning_rate: float):
    """The Keras optimizer called `name` (e.g. adam, sgd, adamw) at `learning_rate`."""
    try:
        return keras.optimizers.get({"class_name": name, "config": {"learning_rate": learning_rate}})
    except (ValueError, TypeError):
        valid = _optimizer_names()
        hint = closest(name, valid, n=1)
        raise ConfigError(
            "train.optimizer",
            f"got {name!r}; {'did you mean ' + hint[0] + '? ' if hint else ''}valid: {one_of(valid)}",
        ) from None


def check_loss(name: str) -> str:
    """`name` if Keras knows a loss by that name, else a ConfigError listing the known ones."""
    try:
        keras.losses.get(name)
        return name
    except (ValueError, TypeError):
        valid = sorted(n for n in dir(keras.losses) if n.islower() and not n.startswith("_") and n not in ("get", "serialize", "deserialize"))
        hint = closest(name, valid, n=1)
        raise ConfigError(
            "train.loss",
            f"got {name!r}; {'did you mean ' + hint[0] + '? ' if hint else ''}valid: {one_of(valid)}",
        ) from None


def _optimizer_names() -> list[str]:
    names = []
    for attr in dir(keras.optimizers):
        obj = getattr(keras.optimizers, attr)
        if isinstance(obj, type) and issubclass(obj, keras.optimizers.Optimizer) and obj is not keras.optimizers.Optimizer:
            names.append(attr.lower())
    return sorted(set(names) - {"lossscaleoptimizer"})


def _say_devices(device_set, mesh, config: RunConfig) -> None:
    shape = format_shape(mesh.shape)
    if device_set.emulated:
        reason = "no accelerator found" if config.devices.platform == "auto" else "devices.platform=cpu"
        log.info(f"{reason}; emulating {device_set.available} CPU devices, using {len(device_set.devices)} for mesh {shape}")
    else:
        log.info(f"using {len(device_set.devices)} {device_set.kind} devices for mesh {shape}")


def _jsonable(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
