"""The Keras objects a run is made of, built from its config: the model (one build path for the
plan's abstract description and for the run, so both see the same variable paths), its layout
rules, the optimizer, the loss, and the model's abstract description (variables, layer outputs and
optimizer slots as shapes, nothing allocated) that layout checks and plans work from.

Importing this module imports keras: call `meshrun.devices.prepare` first.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from meshrun.errors import ConfigError, closest, first_line, one_of, shape_text
from meshrun.layout import TensorSpec
from meshrun.models.registry import InputSpec, ModelSpec
from meshrun.plan import Plan, make_plan
from meshrun.schema import LayoutRule, MeshConfig, RunConfig, check_rule_axes


@dataclass(frozen=True)
class OptimizerSlot:
    """One optimizer variable: its spec, and the model variable it mirrors (a slot such as Adam's
    momentum takes that variable's layout), or None for the optimizer's own scalars."""

    tensor: TensorSpec
    reference: str | None


@dataclass(frozen=True)
class Signature:
    """What a model takes and gives per sample: its inputs (by name when it takes a dict; one
    unnamed input otherwise) and its outputs, shapes without the batch dimension (None: any size)."""

    inputs: tuple[InputSpec, ...]
    outputs: tuple[InputSpec, ...]

    @property
    def named(self) -> bool:
        """Whether the model takes a dict of inputs by name."""
        return self.inputs[0].name is not None

    def describe(self) -> dict:
        """The signature as JSON-ready data."""
        def one(spec: InputSpec) -> dict:
            return {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype}

        return {"inputs": [one(s) for s in self.inputs], "outputs": [one(s) for s in self.outputs]}


@dataclass(frozen=True)
class AbstractModel:
    """A model known by shapes alone: its variables and layer outputs, the optimizer slots the
    configured optimizer would create for it, what it takes and gives, and whether the code that
    made it compiled it with a loss (then its loss and metrics are the run's when train.loss is
    null)."""

    tensors: tuple[TensorSpec, ...]
    slots: tuple[OptimizerSlot, ...]
    signature: Signature | None = None  # None: known by its variables alone (described by hand)
    compiled_loss: bool = False

    @property
    def variables(self) -> tuple[TensorSpec, ...]:
        """The model's variables (not its outputs)."""
        return tuple(t for t in self.tensors if not t.is_output)


def build_model(spec: ModelSpec, options, data, abstract: bool = False):
    """Builds the model of `spec` and returns it with its Signature. When the spec gives the inputs
    the model trains on (`spec.inputs`), the model is called on them; a model that is not built yet
    (subclassed, or Sequential without an Input) is called on the inputs the data source declares
    (`data`: the run's DataConfig). A model with no variables after that is a ConfigError
    (`build(shape)` alone creates none for a subclassed model without a `build()`).

    Call it in a fresh Keras session (as `describe` leaves one), so that layer and seed-generator
    names restart and every build gives the same variable paths, with the run's distribution and
    dtype policy in force."""
    from meshrun.data import declared_inputs

    make = spec.build_abstract if abstract and spec.build_abstract else spec.build
    model = make(options)
    inputs = spec.inputs(options) if spec.inputs else None
    if inputs is None and not model.built:
        inputs = declared_inputs(data)
        if inputs is None:
            raise ConfigError(
                "model.input_shape",
                f"{spec.name_of(options)} returned a model that is not built yet (a subclassed model builds on its first call): "
                "give its inputs as model.input_shape (and model.input_dtype), or use a data source that declares them (data=arrays, data=tfrecord)",
            )
    if inputs is not None:
        symbolic = {name: keras.Input(shape=s.shape, dtype=s.dtype, name=name) for name, s in inputs.items()}
        signature = _signature(symbolic, _call_symbolically(spec, options, model, symbolic))
    else:
        signature = _signature(model.input, model.output)
    if not model.variables:
        raise ConfigError("model", f"{spec.name_of(options)} has no variables after it was built; nothing would train")
    return model, signature


def _call_symbolically(spec: ModelSpec, options, model, symbolic: dict):
    argument = symbolic[None] if None in symbolic else symbolic
    try:
        return model(argument)
    except Exception as err:  # the model's own code decides what fits it
        shapes = ", ".join(f"{name or 'input'} {shape_text(t.shape[1:])}" for name, t in symbolic.items())
        raise ConfigError("model", f"{spec.name_of(options)} cannot be called on inputs {shapes}: {type(err).__name__}: {first_line(err)}") from None


def _signature(inputs, outputs) -> Signature:
    def specs(structure) -> tuple[InputSpec, ...]:
        if isinstance(structure, dict):  # by name; the key None stands for one unnamed input
            return tuple(InputSpec(name and str(name), tuple(t.shape[1:]), keras.backend.standardize_dtype(t.dtype)) for name, t in structure.items())
        flat = structure if isinstance(structure, (list, tuple)) else [structure]
        return tuple(InputSpec(None, tuple(t.shape[1:]), keras.backend.standardize_dtype(t.dtype)) for t in flat)

    return Signature(inputs=specs(inputs), outputs=specs(outputs))


@contextlib.contextmanager
def compile_recorded():
    """While in force, `keras.Model.compile` records which models were compiled with a loss instead
    of compiling them: the abstract build runs the user's factory in a StatelessScope, where
    creating an optimizer fails. Yields the set of ids of those models."""
    compiled: set[int] = set()
    original = keras.Model.compile
    takes = inspect.signature(original)

    def record(model, *args, **kwargs):
        if takes.bind(model, *args, **kwargs).arguments.get("loss") is not None:
            compiled.add(id(model))

    keras.Model.compile = record
    try:
        yield compiled
    finally:
        keras.Model.compile = original


def describe(spec: ModelSpec, options, data, optimizer_name: str, learning_rate: float) -> AbstractModel:
    """Builds the model and the optimizer's slots abstractly. Inside a StatelessScope Keras defers
    variable initialisation; with initialize_variables=False nothing is allocated on leaving it
    either, so a 7B-parameter model is described in seconds and a few hundred MB.

    It builds in a fresh session and leaves one (layer and seed-generator names restart), so this
    build and the run's build that follows give every variable the same path."""
    keras.backend.clear_session(free_memory=False)  # the names restart; nothing to collect yet
    optimizer = make_optimizer(optimizer_name, learning_rate)  # its scalars are real, and tiny
    references = {}
    add_slot = optimizer.add_variable_from_reference

    def recording_add_slot(reference_variable, *args, **kwargs):
        slot = add_slot(reference_variable, *args, **kwargs)
        references[id(slot)] = reference_variable.path
        return slot

    optimizer.add_variable_from_reference = recording_add_slot
    try:
        with keras.StatelessScope(initialize_variables=False), compile_recorded() as compiled:
            model, signature = build_model(spec, options, data, abstract=True)
            optimizer.build(model.trainable_variables)
        tensors = [_spec(v) for v in model.variables] + _outputs(model)
        slots = [OptimizerSlot(_spec(v), references.get(id(v))) for v in optimizer.variables]
    finally:
        # Forgets the deferred variables, so nothing initialises them later.
        keras.backend.clear_session()
    return AbstractModel(tensors=tuple(tensors), slots=tuple(slots), signature=signature, compiled_loss=id(model) in compiled)


def check_paths_match(model, abstract: AbstractModel, spec: ModelSpec, options) -> None:
    """ConfigError when the model built for the run has other variable paths than the one the plan
    was made from: the layout rules were checked against those."""
    built = {v.path for v in model.variables}
    planned = {t.path for t in abstract.variables}
    if built != planned:
        extra, missing = sorted(built - planned), sorted(planned - built)
        raise ConfigError(
            "model",
            f"{spec.name_of(options)} built other variables for the run than for the plan ({', '.join((extra + missing)[:3])}); "
            "a factory must build the same model on every call (create the model inside it, not once at import)",
        )


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


def check_loss(name: str | None, spec: ModelSpec, options, abstract: AbstractModel) -> None:
    """ConfigError, before anything is built, when train.loss names no Keras loss, or when the run
    has no loss at all: train.loss is null, the model has no loss of its own, and the code that
    made it did not compile it with one."""
    if name is not None:
        make_loss(name, spec, options)
    elif spec.loss is None and not abstract.compiled_loss:
        raise _no_loss(spec, options)


def _no_loss(spec: ModelSpec, options) -> ConfigError:
    return ConfigError(
        "train.loss",
        f"is required: {spec.name_of(options)} returns a model that is not compiled with a loss, so it has none of its own; "
        "give a Keras loss, e.g. train.loss=sparse_categorical_crossentropy, or compile the model in the factory",
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
        valid = sorted(n for n in dir(keras.losses) if n.islower() and not n.startswith("_") and n not in skip)
        raise ConfigError("train.loss", f"got {name!r}; {_did_you_mean(name, valid)}valid: {one_of(valid)}") from None


def make_metrics(names, loss_name_: str, own_loss: bool, model_spec: ModelSpec, options, compiled: dict | None = None) -> list:
    """The metrics to compile with: Keras metrics `names` when given; else, with the model's own
    loss, the model's own metrics (its spec's, or those it was compiled with); else accuracy for a
    cross-entropy loss (Keras picks the kind); else none."""
    if names is not None:
        for name in names:
            try:
                keras.metrics.get(name)
            except (ValueError, TypeError):
                raise ConfigError("train.metrics", f"got {name!r}, which is not a Keras metric; e.g. accuracy, mae, auc") from None
        return list(names)
    if own_loss:
        if model_spec.metrics:
            return model_spec.metrics(options)
        compiled = compiled or {}
        return [*compiled.get("metrics", []), *compiled.get("weighted_metrics", [])]
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


def layout_rules(config: RunConfig, spec: ModelSpec, options, mesh: MeshConfig) -> tuple[LayoutRule, ...]:
    """The run's layout rules: the layout config's, or the model's own layout map
    (layout.from_model), followed by layout.extra_rules."""
    layout = config.layout
    if not layout.from_model:
        return layout.rules + layout.extra_rules
    if spec.layout_rules is None:
        raise ConfigError(
            "layout.from_model",
            f"got true, but {spec.name_of(options)} has no layout map of its own; pick one of its layouts "
            f"(layout={one_of(spec.layouts)}) or write layout.rules",
        )
    own = tuple(spec.layout_rules(options, mesh))
    for rule in own:
        check_rule_axes(rule.key, rule.axes, mesh)
    return own + layout.extra_rules


@dataclass(frozen=True)
class PlannedModel:
    """A run's model before it is built: its spec and options, the abstract description, the
    layout rules in force and where they place everything."""

    spec: ModelSpec
    options: Any
    abstract: AbstractModel
    rules: tuple[LayoutRule, ...]
    plan: Plan


def plan_model(config: RunConfig, mesh: MeshConfig, processes: int = 1) -> PlannedModel:
    """The placement plan of the configured model, optimizer and layout rules on `mesh` (a mesh
    with no -1 left) for a job of `processes` processes, built from shapes alone."""
    from meshrun.models import get_model

    spec = get_model(config.model.name)
    options = config.model.options
    rules = layout_rules(config, spec, options, mesh)
    abstract = describe(spec, options, config.data, config.train.optimizer, config.train.learning_rate)
    advice = (lambda variables, on: spec.layout_advice(options, variables, on)) if spec.layout_advice else None
    plan = make_plan(spec.name_of(options), mesh, rules, abstract, config.train.optimizer, processes, advice=advice)
    return PlannedModel(spec=spec, options=options, abstract=abstract, rules=rules, plan=plan)
