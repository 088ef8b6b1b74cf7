"""PipelinedBlocks: `num_blocks` copies of one Keras block as a single layer, their weights stacked
along a leading dimension (one variable per weight of the block, sharded over the stage axis by a
layout rule such as `blocks/stacked_.*: [stage, ...]`), called through the GPipe schedule."""

from __future__ import annotations

from collections.abc import Callable

import keras
from jax import lax

from meshrun.compat.keras import initializer_of, weights_described_only
from meshrun.pipeline.schedule import gpipe

STACKED_PREFIX = "stacked_"


class StackedInitializer(keras.initializers.Initializer):
    """Initializes a stacked weight block by block with the block's own initializer, so that each
    block starts as it would on its own (fan-in and fan-out are a block's, not the stack's)."""

    def __init__(self, initializer, count: int):
        self.initializer = initializer
        self.count = count

    def __call__(self, shape, dtype=None):
        return keras.ops.stack([_for_block(self.initializer, i)(shape[1:], dtype=dtype) for i in range(self.count)])


def _for_block(initializer, index: int):
    """`initializer` for block `index`: a seeded one (Keras fixes a random initializer's seed when it
    is made, so calling it again repeats its values) with a seed of the block's own."""
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    if "seed" not in config:
        return initializer  # not random: zeros, ones, a constant
    seed = config["seed"]
    return type(initializer).from_config({**config, "seed": seed + index if isinstance(seed, int) else None})


class PipelinedBlocks(keras.layers.Layer):
    """`num_blocks` blocks made by `make_block()`, applied in order, as stages over mesh axis `axis`
    with `microbatches` microbatches per batch (GPipe); with no such axis in force, one after another. The block built by `make_block` is a template
    only: its weights are not the model's (the stacked ones are), and it must have no non-trainable
    weights (each stage calls it statelessly)."""

    def __init__(self, make_block: Callable[[], keras.layers.Layer], num_blocks: int, axis: str = "stage",
                 microbatches: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.make_block = make_block
        self.num_blocks = num_blocks
        self.axis = axis
        self.microbatches = microbatches
        self.stacked: list = []

    def build(self, input_shape):
        template = self.make_block()
        with weights_described_only():  # the stacked weights are the block's; its own are never made
            template.build(input_shape)
            initializers = [initializer_of(variable) for variable in template.trainable_variables]
        if template.non_trainable_variables:
            raise ValueError(f"{template.name} has non-trainable weights "
                             f"({', '.join(v.path for v in template.non_trainable_variables)}); a pipelined block may not")
        object.__setattr__(self, "_template", template)  # not tracked: its weights are not the model's
        self.stacked = [
            self.add_weight(shape=(self.num_blocks, *variable.shape), dtype=variable.dtype,
                            initializer=StackedInitializer(initializer, self.num_blocks),
                            name=STACKED_PREFIX + variable.path.split(f"{template.name}/", 1)[-1].replace("/", "_"))
            for variable, initializer in zip(template.trainable_variables, initializers, strict=True)
        ]

    @property
    def template(self) -> keras.layers.Layer:
        """The block every stage calls, with a block's slice of the stacked weights."""
        return self._template

    def compute_output_shape(self, input_shape):
        """A block gives what it takes (the stages hand each other activations of one shape)."""
        return input_shape

    def call(self, x):
        template = self.template

        def stage(params, x):
            def block(x, weights):
                return template.stateless_call(list(weights), [], x)[0], None

            return lax.scan(block, x, params)[0]

        params = [variable.value for variable in self.stacked]
        distribution = keras.distribution.distribution()
        mesh = distribution.device_mesh.backend_mesh if distribution is not None else None
        if mesh is None or self.axis not in mesh.axis_names:  # no stages: the blocks in turn
            return stage(params, x)
        return gpipe(stage, params, x, mesh, self.axis, self.microbatches)
