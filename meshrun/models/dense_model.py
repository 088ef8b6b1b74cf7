"""dense_model: the seeds' MLP, Flatten -> Dense(hidden, relu, `d1`) -> Dropout -> Dense(softmax, `d2`).

Layouts written for it: configs/layout/replicated.yaml (its default) and dense_model.yaml (d1
column-parallel over `model`, the output batch-sharded over `data`). Data: random-normal inputs and
targets, mean squared error, as in the seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.config.fields import setting
from meshrun.errors import ConfigError
from meshrun.models.registry import ModelSpec, register_model, require_positive


@dataclass(frozen=True)
class DenseModelOptions:
    """The MLP's sizes; the defaults are the seeds' (784 -> 200 -> 10, no bias on d1)."""

    input_shape: tuple[int, ...] = setting(
        (28, 28, 1), "The per-sample input shape (flattened by the model)."
    )
    hidden: int = setting(200, "The width of d1 (relu).")
    d1_bias: bool = setting(False, "Whether d1 has a bias.")
    dropout: float = setting(0.4, "The dropout rate after d1: 0 <= dropout < 1.")
    num_classes: int = setting(10, "The width of d2 (softmax).")

    def __post_init__(self):
        if not self.input_shape or any(d <= 0 for d in self.input_shape):
            raise ConfigError("model.input_shape", f"got {list(self.input_shape)}; expected positive sizes")
        require_positive(self, "hidden", "num_classes")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("model.dropout", f"got {self.dropout}; expected 0 <= dropout < 1")

    @property
    def label_shape(self) -> tuple[int, ...]:
        """Shape of one target (the softmax output)."""
        return (self.num_classes,)


def build(options: DenseModelOptions):
    """Builds the functional MLP with explicit layer names, so variable paths are d1/kernel etc."""
    import keras

    inputs = keras.Input(shape=options.input_shape, name="inputs")
    x = keras.layers.Flatten(name="flatten")(inputs)
    x = keras.layers.Dense(options.hidden, activation="relu", use_bias=options.d1_bias, name="d1")(x)
    x = keras.layers.Dropout(options.dropout, name="dropout")(x)
    outputs = keras.layers.Dense(options.num_classes, activation="softmax", name="d2")(x)
    return keras.Model(inputs, outputs, name="dense_model")


SPEC = register_model(
    ModelSpec(
        name="dense_model",
        options=DenseModelOptions,
        build=build,
        layouts=("replicated", "dense_model", "auto"),
        data="regression",
        loss=lambda options: "mse",
        description="the seeds' MLP for 28x28x1 inputs",
    )
)
