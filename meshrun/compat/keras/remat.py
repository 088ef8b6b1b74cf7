"""Rematerialisation (train.remat): a layer made to be recomputed in the backward pass after it was
made (a KerasHub backbone's transformer layers, the blocks of `repeated_blocks`), by a call set on
the instance, which Keras runs in place of its class's; the layers of a model so made; and Keras'
public `RematScope`, which marks the layers made inside it (train.remat=activations)."""

from __future__ import annotations

import contextlib

from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.ops.operation",
        "Operation.__call__",
        "train.remat=blocks: a call set on a layer instance is the one Keras runs",
        source_contains="call_fn = self.call",
    ),
    PrivateName(
        "keras",
        "keras.src.ops.operation",
        "Operation.__call__",
        "train.remat: a quantized layer runs its quantized_call instead of its call",
        source_contains="call_fn = self.quantized_call",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.stateless_scope",
        "get_stateless_scope",
        "train.remat: the state a recomputed layer changes (a dropout's seed) carried out of jax.checkpoint",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.stateless_scope",
        "StatelessScope.add_update",
        "train.remat: a recomputed layer's changed state set again outside jax.checkpoint",
    ),
)

SCOPED_MODES = ("activations",)  # train.remat's policies that are a RematScope's mode
RECOMPUTES = "meshrun_recomputes"  # set on the calls recompute_in_backward makes


def recompute_in_backward(layer) -> None:
    """Marks `layer` (a whole block, its sublayers inside) to be recomputed in the backward pass
    from its inputs instead of keeping what it made: its call runs inside jax.checkpoint. Unlike
    Keras' list_of_layers mode, which hands every argument to jax.checkpoint (a `training=False`
    would become a traced value that a dropout cannot branch on), only the arrays among the call's
    arguments are traced; the others (training, flags, None) stay what they are."""
    ensure("keras")
    runs = "quantized_call" if getattr(layer, "quantization_mode", None) is not None else "call"
    own_call = getattr(layer, runs)  # what Keras runs: a quantized layer's quantized_call

    def call(*args, **kwargs):
        return checkpointed(layer, own_call, args, kwargs)

    setattr(call, RECOMPUTES, True)
    setattr(layer, runs, call)


def recompute_every_layer(model) -> None:
    """Marks every layer inside `model` (nested ones included, each inside its owner's recomputation)
    to be recomputed in the backward pass: train.remat=full."""
    import keras

    from meshrun.compat.keras.models import sublayers

    for layer in sublayers(model):
        if not isinstance(layer, keras.layers.InputLayer):
            recompute_in_backward(layer)


def checkpointed(layer, function, args: tuple, kwargs: dict):
    """`function(*args, **kwargs)` (a call of `layer`) inside jax.checkpoint, with the arrays among
    the arguments traced and everything else held as it is. What the call changes of the layer's
    state in the stateless scope the trainer runs it in (a dropout's seed) leaves the checkpoint as
    its output and is set again outside it, where the trainer reads it; outside a stateless scope
    (eager) there is no backward pass, and the call runs as it is."""
    import jax
    import numpy as np
    from keras.src.backend.common.stateless_scope import get_stateless_scope

    scope = get_stateless_scope()
    if scope is None:
        return function(*args, **kwargs)
    state = list(layer.non_trainable_variables)
    leaves, structure = jax.tree_util.tree_flatten((args, kwargs))
    traced = [index for index, leaf in enumerate(leaves) if isinstance(leaf, (jax.Array, np.ndarray))]
    changed: list[int] = []

    def run(*arrays):
        filled = list(leaves)
        for index, array in zip(traced, arrays, strict=True):
            filled[index] = array
        call_args, call_kwargs = jax.tree_util.tree_unflatten(structure, filled)
        before = [scope.get_current_value(v) for v in state]
        outputs = function(*call_args, **call_kwargs)
        after = [scope.get_current_value(v) for v in state]
        changed[:] = [i for i, (old, new) in enumerate(zip(before, after, strict=True)) if new is not old]
        return outputs, [after[i] for i in changed]

    outputs, updates = jax.checkpoint(run)(*(leaves[index] for index in traced))
    for index, value in zip(changed, updates, strict=True):
        scope.add_update((state[index], value))
    return outputs


def recomputed_layers(model) -> list[str]:
    """The names of the layers in `model` marked by recompute_in_backward, in the model's order."""
    from meshrun.compat.keras.models import sublayers

    return [
        layer.name
        for layer in sublayers(model)
        if any(getattr(getattr(layer, runs, None), RECOMPUTES, False) for runs in ("call", "quantized_call"))
    ]


def creation_scope(policy: str):
    """The scope a model is made in under train.remat=`policy`: Keras' RematScope for activations
    (the activation function of every layer made inside is recomputed), else nothing. (Its mode
    full hands a layer's `training` flag to jax.checkpoint as a traced value, which a dropout cannot
    branch on: full is recompute_every_layer.)"""
    import keras

    return keras.RematScope(mode=policy) if policy in SCOPED_MODES else contextlib.nullcontext()
