"""The Keras objects a run is made of, built from its config: the optimizer, the loss, and the
model's abstract description (variables, layer outputs and optimizer slots as shapes, nothing
allocated) that layout checks and plans work from.

Importing this module imports keras: call `meshrun.devices.prepare` first.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np

from meshrun.errors import ConfigError, closest, one_of
from meshrun.layout import TensorSpec


@dataclass(frozen=True)
class OptimizerSlot:
    """One optimizer variable: its spec, and the model variable it mirrors (a slot such as Adam's
    momentum takes that variable's layout), or None for the optimizer's own scalars."""

    tensor: TensorSpec
    reference: str | None


@dataclass(frozen=True)
class AbstractModel:
    """A model known by shapes alone: its variables and layer outputs, and the optimizer slots the
    configured optimizer would create for it."""

    tensors: tuple[TensorSpec, ...]
    slots: tuple[OptimizerSlot, ...]

    @property
    def variables(self) -> tuple[TensorSpec, ...]:
        """The model's variables (not its outputs)."""
        return tuple(t for t in self.tensors if not t.is_output)


def describe(build, options, optimizer_name: str, learning_rate: float) -> AbstractModel:
    """Builds the model and the optimizer's slots abstractly. Inside a StatelessScope Keras defers
    variable initialisation; with initialize_variables=False nothing is allocated on leaving it
    either, so a 7B-parameter model is described in seconds and a few hundred MB."""
    optimizer = make_optimizer(optimizer_name, learning_rate)  # its scalars are real, and tiny
    references = {}
    add_slot = optimizer.add_variable_from_reference

    def recording_add_slot(reference_variable, *args, **kwargs):
        slot = add_slot(reference_variable, *args, **kwargs)
        references[id(slot)] = reference_variable.path
        return slot

    optimizer.add_variable_from_reference = recording_add_slot
    try:
        with keras.StatelessScope(initialize_variables=False):
            model = build(options)
            optimizer.build(model.trainable_variables)
        tensors = [_spec(v) for v in model.variables] + _outputs(model)
        slots = [OptimizerSlot(_spec(v), references.get(id(v))) for v in optimizer.variables]
    finally:
        # Forgets the deferred variables, so nothing initialises them later.
        keras.backend.clear_session()
    return AbstractModel(tensors=tuple(tensors), slots=tuple(slots))


def _spec(variable) -> TensorSpec:
    dtype = keras.backend.standardize_dtype(variable.dtype)
    return TensorSpec(variable.path, tuple(variable.shape), dtype=dtype, itemsize=_itemsize(dtype))


def _itemsize(dtype: str) -> int:
    import jax.numpy as jnp

    return int(np.dtype(jnp.dtype(dtype)).itemsize)


def _outputs(model) -> list[TensorSpec]:
    """`<layer>/output` of every layer, the paths Keras looks up for output sharding constraints."""
    outputs = []
    for layer in [*model._flatten_layers(include_self=False), model]:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        output = getattr(layer, "output", None)
        if isinstance(output, keras.KerasTensor):
            name = layer.path or layer.name
            outputs.append(TensorSpec(f"{name}/output", tuple(output.shape), is_output=True))
    return outputs


def make_optimizer(name: str, learning_rate, clip_norm: float | None = None, loss_scaling: bool = False,
                   accumulate: int = 1):
    """The Keras optimizer called `name` (e.g. adam, sgd, adamw) at `learning_rate` (a number or a
    Keras schedule), clipping gradients to global norm `clip_norm` when given, averaging the
    gradients of `accumulate` steps into each update, wrapped for dynamic loss scaling when asked
    (float16 training)."""
    config = {"learning_rate": learning_rate, **({"global_clipnorm": clip_norm} if clip_norm else {})}
    if accumulate > 1:
        config["gradient_accumulation_steps"] = accumulate
    try:
        optimizer = keras.optimizers.get({"class_name": name, "config": config})
    except (ValueError, TypeError):
        valid = _optimizer_names()
        raise ConfigError("train.optimizer", f"got {name!r}; {_did_you_mean(name, valid)}valid: {one_of(valid)}") from None
    return keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaling else optimizer


def make_loss(name: str | None, model_spec, options):
    """The loss to train with: Keras' loss called `name`, or the model's own when `name` is None."""
    if name is None:
        return model_spec.loss(options)
    try:
        keras.losses.get(name)
        return name
    except (ValueError, TypeError):
        skip = ("get", "serialize", "deserialize")
        valid = sorted(n for n in dir(keras.losses) if n.islower() and not n.startswith("_") and n not in skip)
        raise ConfigError("train.loss", f"got {name!r}; {_did_you_mean(name, valid)}valid: {one_of(valid)}") from None


def make_metrics(names, loss_name_: str, own_loss: bool, model_spec, options) -> list:
    """The metrics to compile with: Keras metrics `names` when given; else the model's own with its
    own loss; else accuracy for a cross-entropy loss (Keras picks the kind); else none."""
    if names is not None:
        for name in names:
            try:
                keras.metrics.get(name)
            except (ValueError, TypeError):
                raise ConfigError("train.metrics", f"got {name!r}, which is not a Keras metric; e.g. accuracy, mae, auc") from None
        return list(names)
    if own_loss:
        return model_spec.metrics(options) if model_spec.metrics else []
    return ["accuracy"] if "crossentropy" in loss_name_ else []


def metric_names(metrics: list) -> list[str]:
    """The names Keras logs for compiled `metrics` (names or metric objects), after `loss`."""
    return ["loss", *(m if isinstance(m, str) else getattr(m, "name", getattr(m, "__name__", "")) for m in metrics)]


def loss_function(loss) -> str:
    """The Keras loss function under `loss` (a name or a loss object), e.g.
    sparse_categorical_crossentropy for the transformer's next-token loss."""
    if isinstance(loss, str):
        return keras.losses.get(loss).__name__ if callable(keras.losses.get(loss)) else loss
    function = getattr(loss, "fn", None)
    return getattr(function, "__name__", type(loss).__name__)


def loss_name(loss) -> str:
    """A loss as the report names it."""
    return loss if isinstance(loss, str) else getattr(loss, "name", type(loss).__name__)


def _did_you_mean(name: str, valid: list[str]) -> str:
    hint = closest(name, valid, n=1)
    return f"did you mean {hint[0]}? " if hint else ""


def _optimizer_names() -> list[str]:
    names = []
    for attr in dir(keras.optimizers):
        obj = getattr(keras.optimizers, attr)
        if isinstance(obj, type) and issubclass(obj, keras.optimizers.Optimizer) and obj is not keras.optimizers.Optimizer:
            names.append(attr.lower())
    return sorted(set(names) - {"lossscaleoptimizer"})


def plan_model(config, mesh, processes: int = 1):
    """The placement plan of the configured model, optimizer and layout rules on `mesh` (a mesh
    with no -1 left) for a job of `processes` processes, built from shapes alone."""
    from meshrun.models import get_model
    from meshrun.plan import make_plan

    spec = get_model(config.model.name)
    abstract = describe(spec.build, config.model.options, config.train.optimizer, config.train.learning_rate)
    return make_plan(spec.name, mesh, config.layout.rules, abstract, config.train.optimizer, processes)
