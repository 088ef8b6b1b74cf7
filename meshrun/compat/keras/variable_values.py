"""Keras variables without values, past Keras' public API: weights described by their shapes,
dtypes and initializers alone (the plan's abstract build, the template blocks pipelined stacks are
made from), the initializer a weight was made with, a first value given to a variable made without
one, and the arrays of stacked blocks' weights dropped. Importing this module imports neither Keras
nor jax."""

from __future__ import annotations

import contextlib

from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.backend.common.variables",
        "Variable.__init__",
        "the initializer of a block's weight, which the "
        "weights of pipelined blocks stacked from it start with",
        source_contains="self._initializer = initializer",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.variables",
        "initialize_all_variables",
        "leaving a pipelined block's template weights unmade (only their shapes and initializers are used)",
        source_contains='"uninitialized_variables"',
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.variables",
        "Variable.__init__",
        "dropping the arrays of block weights once they are stacked (release_values)",
        source_contains="self._value = None",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.jax.core",
        "JaxVariable._initialize",
        "giving a variable made without a value its first "
        "one, laid out where it already lies (initialize_with)",
        source_contains="self._direct_assign(value)",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.common.stateless_scope",
        "in_stateless_scope",
        "stacking pipelined blocks' values only where they have some (building_abstractly)",
    ),
)


def initialize_with(variable, value) -> None:
    """Gives `variable`, made without a value (weights_described_only), `value` as its first, laid
    out as the distribution says: a value laid out so already is not copied (where `assign` would
    need a first value to replace, and Keras' own initial values may take a whole copy on one
    device)."""
    ensure("keras")
    variable._initialize(value)


def release_values(variables) -> None:
    """Drops the arrays of `variables`, which nothing reads again: the weights of blocks that
    pipelined stacks were made from. (The model's old graph still reaches those blocks, through the
    nodes of the layers it shares with the new one, so they would otherwise stay in memory.)"""
    ensure("keras")
    for variable in variables:
        variable._value = None


def building_abstractly() -> bool:
    """Whether variables made now get shapes alone, no values (inside a keras.StatelessScope: the
    plan's abstract build)."""
    ensure("keras")
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    return in_stateless_scope()


def initializer_of(variable):
    """The initializer `variable` was created with (None for one created from a value)."""
    ensure("keras")
    return variable._initializer


@contextlib.contextmanager
def weights_described_only():
    """Layers built in the block have weights with shapes, dtypes and initializers but no values,
    and never get them: Keras would otherwise make them at its next initialization of deferred
    variables."""
    ensure("keras")
    import keras
    from keras.src.backend.common import global_state

    before = list(global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True))
    with keras.StatelessScope(initialize_variables=False):
        yield
    global_state.set_global_attribute("uninitialized_variables", before)
