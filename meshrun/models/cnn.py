"""cnn: a small conv net for 28x28x1 images, two conv blocks and two dense layers.

inputs -> conv2d_1 (relu) -> max pool -> conv2d_2 (relu) -> max pool -> flatten -> dense_1 (relu)
-> dense_2 (logits)

Variable paths: conv2d_{1,2}/kernel (3, 3, in, filters), conv2d_{1,2}/bias (filters,),
dense_1/kernel (flat, hidden), dense_1/bias (hidden,), dense_2/kernel (hidden, classes), dense_2/bias.

Layouts: cnn (its default: the seeds' conv rules, filters over `model`, dense kernels on `model`)
and replicated. Loss: sparse categorical cross-entropy on logits; data: synthetic labelled images.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.config.fields import setting
from meshrun.errors import ConfigError
from meshrun.models.registry import (
    ModelSpec,
    class_accuracy,
    register_model,
    require_positive,
)


@dataclass(frozen=True)
class CnnOptions:
    """The conv net's sizes: image shape, filters of the two conv layers, dense width, classes."""

    input_shape: tuple[int, ...] = setting((28, 28, 1), "The image shape: [height, width, channels].")
    filters: tuple[int, ...] = setting((32, 64), "The filters of the two conv layers.")
    hidden: int = setting(128, "The width of dense_1.")
    num_classes: int = setting(10, "The classes: the width of dense_2's logits.")

    def __post_init__(self):
        if len(self.input_shape) != 3 or any(d <= 0 for d in self.input_shape):
            raise ConfigError(
                "model.input_shape",
                f"got {list(self.input_shape)}; expected [height, width, channels], all positive",
            )
        if len(self.filters) != 2 or any(f <= 0 for f in self.filters):
            raise ConfigError(
                "model.filters", f"got {list(self.filters)}; expected two positive filter counts"
            )
        if min(self.input_shape[:2]) < 10:
            raise ConfigError(
                "model.input_shape", f"got {list(self.input_shape)}; images need at least 10x10 pixels"
            )
        require_positive(self, "hidden", "num_classes")


def build(options: CnnOptions):
    """Builds the functional conv net; its output is logits of shape (batch, num_classes)."""
    import keras

    inputs = keras.Input(shape=options.input_shape, name="images")
    x = inputs
    for index, filters in enumerate(options.filters, start=1):
        x = keras.layers.Conv2D(filters, 3, activation="relu", name=f"conv2d_{index}")(x)
        x = keras.layers.MaxPooling2D(2, name=f"pool_{index}")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(options.hidden, activation="relu", name="dense_1")(x)
    logits = keras.layers.Dense(options.num_classes, name="dense_2")(x)
    return keras.Model(inputs, logits, name="cnn")


def _loss(options: CnnOptions):
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


SPEC = register_model(
    ModelSpec(
        name="cnn",
        options=CnnOptions,
        build=build,
        layouts=("cnn", "replicated", "auto"),
        data="images",
        loss=_loss,
        description="small conv net for 28x28x1 images, 10 classes",
        metrics=class_accuracy,
    )
)
