"""The JAX trainer of Keras as meshrun uses it past its public API: the training state fit passes
to its train step and its shardings, a batch placed on the mesh as fit places it (XLA's cost
analysis of the real train step, meshrun.run.costs), and the state written back to the variables
before a checkpoint. Importing this module imports neither Keras nor jax."""

from __future__ import annotations

from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.backend.jax.trainer",
        "_distribute_data",
        "placing a batch on the mesh as fit does, to lower the real train step for XLA's cost analysis",
    ),
    PrivateName(
        "keras",
        "keras",
        "Model._get_jax_state",
        "the training state fit passes to the train step (cost analysis)",
    ),
    PrivateName(
        "keras",
        "keras",
        "Model._get_state_sharding_spec",
        "the state shardings fit gives jax.jit (cost analysis)",
    ),
    PrivateName(
        "keras",
        "keras",
        "Model._symbolic_build",
        "building a compiled model's loss, metrics and optimizer on a batch of shapes, as fit does "
        "first, to compile its train step on abstract inputs (the plan's step memory)",
    ),
    PrivateName(
        "keras",
        "keras",
        "Model.jax_state_sync",
        "writing the live training state back to the variables before a checkpoint",
    ),
)


def distribute_data(batch):
    """`batch` placed on the mesh of the distribution in force, as fit places it."""
    ensure("keras")
    from keras.src.backend.jax import trainer

    return trainer._distribute_data(batch)


def training_state(model):
    """The (trainable, non-trainable, optimizer, metrics) state tuple fit passes to the train step."""
    ensure("keras")
    return model._get_jax_state(
        trainable_variables=True,
        non_trainable_variables=True,
        optimizer_variables=True,
        metrics_variables=True,
    )


def state_shardings(model):
    """The shardings of the training state, as fit gives them to jax.jit as out_shardings."""
    ensure("keras")
    return model._get_state_sharding_spec()


def build_for_training(model, batch) -> None:
    """Builds a compiled model's loss, metrics and optimizer for `batch` ((x, y, sample weights),
    arrays or shapes), as fit does before its first step."""
    ensure("keras")
    model._symbolic_build(data_batch=batch)


def sync_training_state(model) -> None:
    """Writes the state the JAX trainer keeps off the variables during an epoch back onto them."""
    ensure("keras")
    model.jax_state_sync()
