"""The layouts Keras' distribution gives variables, past Keras' public API: the layout a variable
was made with or given, and the variables made in a block laid out by a function of meshrun's
(pipelined blocks on their stages' devices). Importing this module imports neither Keras nor jax."""

from __future__ import annotations

import contextlib

from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.backend.jax.core",
        "JaxVariable._initialize_layout",
        "laying out the weights of pipelined blocks on their stages' devices while a model is built: "
        "Keras asks the distribution in force through its instance (variable_layouts)",
        source_contains="distribution.get_variable_layout(self)",
    ),
    PrivateName(
        "keras",
        "keras.src.backend.jax.core",
        "JaxVariable._initialize_layout",
        "telling a variable made with a layout of its own from one the distribution lays out "
        "(layout_of: a variable's _layout)",
        source_contains="self._layout is None",
    ),
)


def layout_of(variable):
    """The layout `variable` was made with or was given by the distribution (its _layout: a
    TensorLayout, a jax sharding, or None where it has none yet)."""
    ensure("keras")
    return getattr(variable, "_layout", None)


@contextlib.contextmanager
def variable_layouts(distribution, layout):
    """While the block runs, each variable made under `distribution` without a layout of its own is
    laid out by `layout(variable)` instead of `distribution.get_variable_layout` (which `layout` may
    call): set on this instance alone, which Keras asks for each variable it makes."""
    ensure("keras")
    distribution.get_variable_layout = layout
    try:
        yield
    finally:
        del distribution.get_variable_layout
