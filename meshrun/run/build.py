"""Builds a run's model from its spec and options: one build path for the plan's abstract
description and for the run, so both see the same variable paths, and the model's abstract
description itself (variables, layer outputs and optimizer slots as shapes, nothing allocated) that
layout checks and plans work from.

Importing this module imports keras: call `meshrun.placement.devices.prepare` first.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import keras
import numpy as np

from meshrun import quantize
from meshrun.compat.keras.models import compile_recorded, sublayers
from meshrun.compat.keras.remat import creation_scope, recompute_every_layer, recomputed_layers
from meshrun.config.schema import PipelineConfig
from meshrun.errors import ConfigError
from meshrun.models.registry import InputSpec, ModelSpec
from meshrun.pipeline import stages
from meshrun.pipeline.stack import BlockNotPipelinable
from meshrun.placement.layout import TensorSpec
from meshrun.training.objectives import make_optimizer
from meshrun.training.restack import stacks_of
from meshrun.wording import error_text, shape_text


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
    configured optimizer would create for it, what it takes and gives, and what the code that made
    it compiled it with (`compiled`: its loss, metrics and weighted_metrics as given to compile;
    None when it did not compile it with a loss). With a loss of its own, the model's loss and
    metrics are the run's when train.loss is null."""

    tensors: tuple[TensorSpec, ...]
    slots: tuple[OptimizerSlot, ...]
    signature: Signature | None = None  # None: known by its variables alone (described by hand)
    compiled: dict | None = None

    @property
    def variables(self) -> tuple[TensorSpec, ...]:
        """The model's variables (not its outputs)."""
        return tuple(t for t in self.tensors if not t.is_output)


def build_model(
    spec: ModelSpec,
    options,
    data,
    abstract: bool = False,
    pipeline: PipelineConfig | None = None,
    remat: str = "none",
):
    """Builds the model of `spec` and returns it with its Signature; with `pipeline`, for pipeline
    stages (its repeated blocks stacked, meshrun.pipeline.repeated_blocks); what its backward pass
    recomputes as train.remat=`remat` says (_made_for_remat). When the spec gives the
    inputs the model trains on (`spec.inputs`), the model is called on them; a model that is not built yet
    (subclassed, or Sequential without an Input) is called on the inputs the data source declares
    (`data`: the run's DataConfig). A model with no variables after that is a ConfigError
    (`build(shape)` alone creates none for a subclassed model without a `build()`).

    Call it in a fresh Keras session (as `describe` leaves one), so that layer and seed-generator
    names restart and every build gives the same variable paths, with the run's distribution and
    dtype policy in force."""
    from meshrun.data import declared_inputs

    make = spec.build_abstract if abstract and spec.build_abstract else spec.build
    try:
        with _made_for_remat(remat, pipeline), quantize.filled_from_files() as filled:
            model = make(options)
    except BlockNotPipelinable as err:
        raise ConfigError(
            err.key, f"got a stage axis {pipeline.axis!r} for {spec.name_of(options)}, but {err}"
        ) from None
    if remat == "blocks" and pipeline is None:
        _check_blocks_recomputed(model, spec.name_of(options))
    if remat == "full":
        recompute_every_layer(model)
    inputs = spec.inputs(options) if spec.inputs else None
    if inputs is None and not model.built:
        inputs = declared_inputs(data)
        if inputs is None:
            raise ConfigError(
                "model.input_shape",
                f"{spec.name_of(options)} returned a model that is not built yet (a subclassed model builds "
                "on its first call): give its inputs as model.input_shape (and model.input_dtype), "
                "or use a data source that declares them (data=arrays, data=tfrecord)",
            )
    if inputs is not None:
        symbolic = {name: keras.Input(shape=s.shape, dtype=s.dtype, name=name) for name, s in inputs.items()}
        signature = _signature(symbolic, _call_symbolically(spec, options, model, symbolic))
    else:
        signature = _signature(model.input, model.output)
    if not model.variables:
        raise ConfigError(
            "model", f"{spec.name_of(options)} has no variables after it was built; nothing would train"
        )
    quantized = spec.quantization_of(options)
    if quantized is not None:
        quantize.check_quantized(model, quantized.mode, spec.name_of(options))
        if not abstract:
            quantize.fill_from_initializers(model, filled)
    return model, signature


@contextlib.contextmanager
def _made_for_remat(remat: str, pipeline: PipelineConfig | None):
    """The scope a model is made in for train.remat=`remat`: its repeated blocks recomputed in the
    backward pass (blocks: separate ones marked as they are made, a pipeline's stacks by
    pipeline.remat, which the run sets for it), or the activation function of every layer made
    inside Keras' RematScope (activations); full marks every layer once the model is made."""
    with stages(pipeline, recomputed=remat == "blocks"), creation_scope(remat):
        yield


def _check_blocks_recomputed(model, name: str) -> None:
    """ConfigError for train.remat=blocks on a model that holds no repeated blocks to recompute."""
    if not recomputed_layers(model):
        raise ConfigError(
            "train.remat",
            f"got 'blocks' for {name}, which has no repeated blocks to recompute (blocks made with "
            "meshrun.pipeline.repeated_blocks, a KerasHub backbone's transformer_layers); "
            "train.remat=full recomputes every layer",
        )


def built_off_the_mesh(spec: ModelSpec, options, data):
    """The model of `spec` built with separate blocks and no distribution in force, on the default
    device (the distribution in force is put back after): what a pipelined model's export and
    sampling take (meshrun.training.restack.with_separate_blocks)."""
    in_force = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        return build_model(spec, options, data)[0]
    finally:
        keras.distribution.set_distribution(in_force)


def _call_symbolically(spec: ModelSpec, options, model, symbolic: dict):
    argument = symbolic[None] if None in symbolic else symbolic
    try:
        return model(argument)
    except Exception as err:  # the model's own code decides what fits it
        shapes = ", ".join(f"{name or 'input'} {shape_text(t.shape[1:])}" for name, t in symbolic.items())
        raise ConfigError(
            "model", f"{spec.name_of(options)} cannot be called on inputs {shapes}: {error_text(err)}"
        ) from None


def _signature(inputs, outputs) -> Signature:
    def specs(structure) -> tuple[InputSpec, ...]:
        if isinstance(structure, dict):  # by name; the key None stands for one unnamed input
            return tuple(
                InputSpec(name and str(name), tuple(t.shape[1:]), keras.backend.standardize_dtype(t.dtype))
                for name, t in structure.items()
            )
        flat = structure if isinstance(structure, (list, tuple)) else [structure]
        return tuple(
            InputSpec(None, tuple(t.shape[1:]), keras.backend.standardize_dtype(t.dtype)) for t in flat
        )

    return Signature(inputs=specs(inputs), outputs=specs(outputs))


@contextlib.contextmanager
def abstract_session(precision: str = "float32", collect: bool = True):
    """A fresh Keras session under dtype policy `precision` for building things by shape only:
    inside it, variables created in `keras.StatelessScope(initialize_variables=False)` are deferred,
    and leaving it clears the session, which forgets them, so nothing is ever allocated (a
    7B-parameter model is described in seconds and a few hundred MB). The session is left fresh
    too: layer and seed-generator names restart and the policy is float32 again. `collect`: run
    Python's garbage collector on leaving (worth it after a large model)."""
    keras.backend.clear_session(free_memory=False)  # the names restart; nothing to collect yet
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.backend.clear_session(free_memory=collect)


def describe(
    spec: ModelSpec,
    options,
    data,
    optimizer_name: str,
    learning_rate: float,
    precision: str = "float32",
    pipeline: PipelineConfig | None = None,
    remat: str = "none",
) -> AbstractModel:
    """Builds the model (for pipeline stages with `pipeline`, for train.remat=`remat`) and the
    optimizer's slots abstractly, under the dtype policy the run trains with, so this build and the
    run's build that follows give every variable the same path and the model the same signature. A
    stacked variable of pipelined blocks records the per-block paths it holds (TensorSpec.blocks)."""
    with abstract_session(precision), compile_recorded() as compiled:
        optimizer = make_optimizer(optimizer_name, learning_rate)  # its scalars are real, and tiny
        references = {}
        add_slot = optimizer.add_variable_from_reference

        def recording_add_slot(reference_variable, *args, **kwargs):
            slot = add_slot(reference_variable, *args, **kwargs)
            references[id(slot)] = reference_variable.path
            return slot

        optimizer.add_variable_from_reference = recording_add_slot
        with keras.StatelessScope(initialize_variables=False):
            model, signature = build_model(spec, options, data, abstract=True, pipeline=pipeline, remat=remat)
            optimizer.build(model.trainable_variables)
        blocks = stacks_of(model)
        quantized = quantize.variable_facts(model)
        tensors = [_spec(v, blocks.get(v.path, ()), quantized.get(v.path)) for v in model.variables]
        tensors += _outputs(model)
        slots = [OptimizerSlot(_spec(v), references.get(id(v))) for v in optimizer.variables]
    return AbstractModel(
        tensors=tuple(tensors), slots=tuple(slots), signature=signature, compiled=compiled.get(id(model))
    )


def check_paths_match(model, abstract: AbstractModel, spec: ModelSpec, options) -> None:
    """ConfigError when the model built for the run has other variable paths than the one the plan
    was made from: the layout rules were checked against those."""
    built = {v.path for v in model.variables}
    planned = {t.path for t in abstract.variables}
    if built != planned:
        extra, missing = sorted(built - planned), sorted(planned - built)
        raise ConfigError(
            "model",
            f"{spec.name_of(options)} built other variables for the run than for the plan "
            f"({', '.join((extra + missing)[:3])}); a factory must build the same "
            "model on every call (create the model inside it, not once at import)",
        )


def _spec(variable, blocks: tuple[str, ...] = (), quantized=None) -> TensorSpec:
    dtype = keras.backend.standardize_dtype(variable.dtype)
    return TensorSpec(
        variable.path,
        tuple(variable.shape),
        dtype=dtype,
        itemsize=_itemsize(dtype),
        trainable=bool(variable.trainable),
        blocks=blocks,
        quantized=quantized,
    )


def _itemsize(dtype: str) -> int:
    import jax.numpy as jnp

    return int(np.dtype(jnp.dtype(dtype)).itemsize)


def _outputs(model) -> list[TensorSpec]:
    """`<layer>/output` of every layer, the paths Keras looks up for output sharding constraints."""
    outputs = []
    for layer in [*sublayers(model), model]:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        output = getattr(layer, "output", None)
        if isinstance(output, keras.KerasTensor):
            name = layer.path or layer.name
            outputs.append(TensorSpec(f"{name}/output", tuple(output.shape), is_output=True))
    return outputs
