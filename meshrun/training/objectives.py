"""The optimizer, loss and metrics a run compiles with, made from their config names or taken from
the model (its spec's own loss and metrics, or those the user's code compiled it with).

Importing this module imports keras: call `meshrun.placement.devices.prepare` first.
"""

from __future__ import annotations

import keras

from meshrun.errors import ConfigError
from meshrun.specs.model import ModelSpec
from meshrun.wording import did_you_mean, one_of


def make_optimizer(
    name: str, learning_rate, clip_norm: float | None = None, loss_scaling: bool = False, accumulate: int = 1
):
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
        raise ConfigError(
            "train.optimizer", f"got {name!r}; {did_you_mean(name, valid)}valid: {one_of(valid)}"
        ) from None
    return keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaling else optimizer


def _no_loss(spec: ModelSpec, options) -> ConfigError:
    return ConfigError(
        "train.loss",
        f"is required: {spec.name_of(options)} returns a model that is not compiled with a loss, so it has "
        "none of its own; give a Keras loss, e.g. "
        "train.loss=sparse_categorical_crossentropy, or compile the model in the factory",
    )


def compiled_objectives(model) -> dict | None:
    """The loss and metrics the model was compiled with (fresh objects), or None if it was not
    compiled. The optimizer it was compiled with is not used: train.* chooses meshrun's."""
    if not model.compiled:
        return None
    config = model.get_compile_config()
    kinds = ("loss", "metrics", "weighted_metrics")
    return {k: keras.saving.deserialize_keras_object(config[k]) for k in kinds if config.get(k) is not None}


def make_loss(name: str | None, model_spec: ModelSpec, options, compiled: dict | None = None):
    """The loss to train with: Keras' loss called `name`, or the model's own when `name` is None
    (its spec's, else the one it was compiled with)."""
    if name is None:
        if model_spec.loss is not None:
            return model_spec.loss(options)
        if not compiled or compiled.get("loss") is None:
            raise _no_loss(model_spec, options)
        return compiled["loss"]
    try:
        keras.losses.get(name)
        return name
    except (ValueError, TypeError):
        skip = ("get", "serialize", "deserialize")
        valid = sorted(
            n for n in dir(keras.losses) if n.islower() and not n.startswith("_") and n not in skip
        )
        raise ConfigError(
            "train.loss", f"got {name!r}; {did_you_mean(name, valid)}valid: {one_of(valid)}"
        ) from None


def make_metrics(
    names, loss_name_: str, own_loss: bool, model_spec: ModelSpec, options, compiled: dict | None = None
) -> list:
    """The metrics to compile with: Keras metrics `names` when given; else, with the model's own
    loss, the model's own metrics (its spec's, or those it was compiled with); else accuracy for a
    cross-entropy loss (Keras picks the kind); else none."""
    if names is not None:
        for name in names:
            try:
                keras.metrics.get(name)
            except (ValueError, TypeError):
                raise ConfigError(
                    "train.metrics", f"got {name!r}, which is not a Keras metric; e.g. accuracy, mae, auc"
                ) from None
        return list(names)
    if own_loss:
        if model_spec.metrics:
            return model_spec.metrics(options)
        compiled = compiled or {}
        return [*compiled.get("metrics", []), *compiled.get("weighted_metrics", [])]
    return ["accuracy"] if "crossentropy" in loss_name_ else []


def compile_with(
    model, optimizer, train, model_spec: ModelSpec, options, loss_function: str, compiled, weighted: bool
):
    """Compiles `model` with `optimizer` and the run's loss and metrics (`train`: its TrainConfig;
    `compiled`: what the model's own code compiled it with, or None); with `weighted` (batches carry
    sample weights, a padding mask), the metrics count only the samples (tokens) that weigh.
    Returns the loss."""
    loss = make_loss(train.loss, model_spec, options, compiled)
    metrics = make_metrics(train.metrics, loss_function, train.loss is None, model_spec, options, compiled)
    weighing = {"weighted_metrics": metrics} if weighted else {"metrics": metrics}
    model.compile(optimizer=optimizer, loss=loss, **weighing)
    return loss


def metric_names(metrics: list) -> list[str]:
    """The names Keras logs for compiled `metrics` (names or metric objects), after `loss`."""
    return [
        "loss",
        *(m if isinstance(m, str) else getattr(m, "name", getattr(m, "__name__", "")) for m in metrics),
    ]


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


def _optimizer_names() -> list[str]:
    names = []
    for attr in dir(keras.optimizers):
        obj = getattr(keras.optimizers, attr)
        if (
            isinstance(obj, type)
            and issubclass(obj, keras.optimizers.Optimizer)
            and obj is not keras.optimizers.Optimizer
        ):
            names.append(attr.lower())
    return sorted(set(names) - {"lossscaleoptimizer"})
