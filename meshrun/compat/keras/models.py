"""A Keras model as meshrun reads it past Keras' public API: every layer inside it, the weights of
its layers made to train but frozen, its functional graph run again with some layers' calls
replaced (pipelined blocks), and what its own code compiles it with, recorded where compiling
cannot run (the abstract build). Importing this module imports neither Keras nor jax."""

from __future__ import annotations

import contextlib
import inspect

from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
    "keras",
    PrivateName(
        "keras",
        "keras",
        "Layer._flatten_layers",
        "every layer of a model, whose <layer>/output paths layout rules may match",
    ),
    PrivateName(
        "keras",
        "keras",
        "Model.compile",
        "recording what a model's own code compiles it with where compiling cannot run (the abstract build)",
        source_contains="weighted_metrics",
    ),
    PrivateName(
        "keras",
        "keras.src.layers.layer",
        "Layer",
        "telling a pipelined block's frozen weights (made to train, then frozen) from its state (seed "
        "generators, moving statistics): a layer's _trainable_variables",
        source_contains="self._trainable_variables = trainable_variables",
    ),
    PrivateName(
        "keras",
        "keras.src.ops.function",
        "Function._run_through_graph",
        "rebuilding a functional model with its blocks replaced by pipelined ones (KerasHub's LMs)",
        source_contains="call_fn",
    ),
)

COMPILED_ARGUMENTS = ("loss", "metrics", "weighted_metrics")  # what compile_recorded records


def sublayers(model) -> list:
    """Every layer inside `model`, nested ones included (not the model itself)."""
    ensure("keras")
    return list(model._flatten_layers(include_self=False))


def frozen_weights(layer) -> list:
    """The weights of `layer` (and the layers inside it) made to train but frozen (trainable=False
    set on their layer), as opposed to state a layer keeps by design (moving statistics, seed
    generators' states), which is non-trainable from the start."""
    ensure("keras")
    return [
        v
        for sub in layer._flatten_layers(include_self=True)
        for v in sub._trainable_variables
        if not v.trainable
    ]


def rerun_functional(model, inputs, call):
    """The outputs of functional `model`'s graph applied to `inputs`, each of its layers' calls made
    by `call(layer, *args, **kwargs)` (which may call something else instead)."""
    ensure("keras")
    return model._run_through_graph(inputs, operation_fn=lambda operation: operation, call_fn=call)


@contextlib.contextmanager
def compile_recorded():
    """While in force, `keras.Model.compile` records what models were compiled with instead of
    compiling them: the abstract build runs the user's factory in a StatelessScope, where creating
    an optimizer fails. Yields {id(model): its loss, metrics and weighted_metrics as given} for
    the models compiled with a loss."""
    ensure("keras")
    import keras

    compiled: dict[int, dict] = {}
    original = keras.Model.compile
    takes = inspect.signature(original)

    def record(model, *args, **kwargs):
        given = takes.bind(model, *args, **kwargs).arguments
        if given.get("loss") is not None:
            compiled[id(model)] = {k: given[k] for k in COMPILED_ARGUMENTS if given.get(k) is not None}

    keras.Model.compile = record
    try:
        yield compiled
    finally:
        keras.Model.compile = original
