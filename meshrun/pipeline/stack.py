"""PipelinedBlocks: `num_blocks` copies of one Keras block as a single layer, their weights stacked
along a leading dimension (one variable per weight of the block, sharded over the stage axis by a
layout rule such as `blocks/stacked_.*: [stage, ...]`), called through the GPipe schedule."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax import lax

from meshrun.compat.keras.models import frozen_weights, sublayers
from meshrun.compat.keras.variable_values import (
    building_abstractly,
    initialize_with,
    initializer_of,
    release_values,
    weights_described_only,
)
from meshrun.pipeline.counting import BubbleWork, counted_calls
from meshrun.pipeline.schedule import gpipe

STACKED_PREFIX = "stacked_"


class BlockNotPipelinable(ValueError):
    """Blocks that cannot run as pipeline stages (they keep state besides their weights, or do not
    split into the rounds of the circular schedule); `key`: the config key to name."""

    def __init__(self, message: str, key: str = "mesh.axis_names"):
        super().__init__(message)
        self.key = key


class StackedInitializer(keras.initializers.Initializer):
    """Initializes a stacked weight block by block, each with its own block's initializer (so each
    block starts exactly as it would as a layer of its own: same seed, fan-in and fan-out); the
    weight's first `lead` dimensions hold the blocks."""

    def __init__(self, initializers: list, lead: int = 1):
        self.initializers = initializers
        self.lead = lead

    def __call__(self, shape, dtype=None):
        blocks = [initializer(shape[self.lead :], dtype=dtype) for initializer in self.initializers]
        return keras.ops.reshape(keras.ops.stack(blocks), shape)


def stack_on_shards(arrays: list[jax.Array], shape: tuple, sharding) -> jax.Array:
    """`arrays` (a block's weight each, laid out anywhere) stacked into an array of `shape` (their
    count in one or two leading dimensions, then theirs) and `sharding`, made device by device from
    the slices each device holds already: a device holds at most its own shard of the stack more
    (meshrun.placement.distribution.blocks_on_their_stages puts each block where its rows go)."""
    lead = len(shape) - arrays[0].ndim
    rows = np.arange(math.prod(shape[:lead])).reshape(shape[:lead])
    shards = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        held = rows[index[:lead]]
        pieces = [_slice_on(arrays[row], index[lead:], device) for row in held.reshape(-1)]
        shards.append(jnp.stack(pieces).reshape(*held.shape, *pieces[0].shape))
    return jax.make_array_from_single_device_arrays(shape, sharding, shards)


def sharding_for(variable) -> jax.sharding.Sharding:
    """Where the distribution in force puts `variable` (jax's default device without one)."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return jax.sharding.SingleDeviceSharding(jax.devices()[0])
    layout = distribution.get_variable_layout(variable)
    return layout.backend_layout if isinstance(layout, keras.distribution.TensorLayout) else layout


def _slice_on(array: jax.Array, index: tuple, device) -> jax.Array:
    """array[index] on `device`: cut from the shard the device holds, where it holds one that covers
    it (else copied there)."""
    wanted = [part.indices(size)[:2] for part, size in zip(index, array.shape, strict=True)]
    for shard in array.addressable_shards:
        held = [part.indices(size)[:2] for part, size in zip(shard.index, array.shape, strict=True)]
        if shard.device == device and wanted == held:
            return shard.data
        if shard.device == device and all(
            h0 <= w0 and w1 <= h1 for (w0, w1), (h0, h1) in zip(wanted, held, strict=True)
        ):
            return shard.data[
                tuple(slice(w0 - h0, w1 - h0) for (w0, w1), (h0, _) in zip(wanted, held, strict=True))
            ]
    return jax.device_put(array[index], device)


def holds_pipelined_blocks(model) -> bool:
    """Whether `model` holds a PipelinedBlocks layer (at any depth)."""
    return any(isinstance(layer, PipelinedBlocks) for layer in sublayers(model))


class PipelinedBlocks(keras.layers.Layer):
    """`num_blocks` blocks made by `make_block(name)`, applied in order, as stages over mesh axis
    `axis` with `microbatches` microbatches per batch (GPipe; None: as many as there are stages);
    with no such axis in force, one after another. `remat` recomputes each block's activations in
    the backward pass instead of keeping them. The block made by `make_block` is a template only:
    its weights are not the model's (the stacked ones are). Frozen weights (of layers set
    trainable=False, as LoRA leaves kernels) are stacked too, as non-trainable weights; state a
    block keeps by design (seed generators, moving statistics) is refused, since each stage calls
    the block statelessly. `block_name` names block i as the model would with
    separate blocks (`block_{}` -> block_3), so each stacked variable knows the per-block paths it
    holds (`block_paths`). Instead of `make_block`, `blocks` may give the blocks a model already
    holds, built: the stacks start with their weights' values, which are dropped once stacked
    (block 0 serves as the template). With `repeats` R > 1 (the circular schedule) a stacked
    weight is (R, blocks / R, ...), its second dimension split over the stages: device s holds the
    blocks of stages s, s + S, ..., in the blocks' order when the two leading dimensions are read
    as one."""

    def __init__(
        self,
        make_block: Callable[[str], keras.layers.Layer] | None,
        num_blocks: int,
        axis: str = "stage",
        microbatches: int | None = None,
        remat: bool = False,
        block_name: str = "block_{}",
        repeats: int = 1,
        blocks: list | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.make_block = make_block
        self.num_blocks = num_blocks
        # Blocks a model already holds (built, their weights loaded): stacked from their values, block 0 the
        # template.
        object.__setattr__(self, "_given", blocks)  # not tracked: their weights are not the model's
        self.axis = axis
        self.microbatches = microbatches
        self.remat = remat
        self.repeats = repeats
        self.block_name = block_name
        self.stacked: list = []
        self._inner_paths: dict[str, str] = {}  # stacked variable path -> its path inside a block

    @property
    def lead(self) -> tuple[int, ...]:
        """The leading dimensions of a stacked weight that hold the blocks: (blocks,), or for the
        circular schedule (repeats, blocks / repeats), whose second dimension goes over the stages."""
        return (self.repeats, self.num_blocks // self.repeats) if self.repeats > 1 else (self.num_blocks,)

    def build(self, input_shape):
        if self.num_blocks % self.repeats:
            raise BlockNotPipelinable(
                f"its {self.num_blocks} blocks do not split into pipeline.repeats={self.repeats} rounds "
                "of equal length",
                key="pipeline.repeats",
            )
        blocks, starts = self._blocks(input_shape)
        template = blocks[0]
        frozen = [id(v) for v in frozen_weights(template)]
        # By each weight's own flag: a block set trainable=False around trainable LoRA adapters lists them all
        # as non-trainable.
        state = [
            v.path.split(f"{template.name}/", 1)[-1]
            for v in template.variables
            if not v.trainable and id(v) not in frozen
        ]
        if state:
            dropout = (
                " (dropout's random state: set the model's dropout to 0)"
                if any("seed_generator" in p for p in state)
                else ""
            )
            raise BlockNotPipelinable(
                f"its blocks keep state besides their weights ({', '.join(state)}){dropout}, "
                "which pipeline stages cannot hand on yet; train it without a stage axis"
            )
        object.__setattr__(self, "_template", template)  # not tracked: its weights are not the model's
        # Trainable weights first, then frozen ones: the order stateless_call takes them in.
        self._trainable_count = len(template.trainable_variables)
        weights = [block.trainable_variables + block.non_trainable_variables for block in blocks]
        from_values = self._given is not None and not building_abstractly()
        for variable, *same_in_each in zip(weights[0], *weights, strict=True):
            per_block = [starts(weight) for weight in same_in_each]
            inner = variable.path.split(f"{template.name}/", 1)[-1]
            # Stacked from the blocks' values, a weight is made without one first (no initial values
            # anywhere).
            with weights_described_only() if from_values else contextlib.nullcontext():
                stacked = self.add_weight(
                    shape=(*self.lead, *variable.shape),
                    dtype=variable.dtype,
                    initializer=StackedInitializer(per_block, len(self.lead)),
                    trainable=variable.trainable,
                    name=STACKED_PREFIX + inner.replace("/", "_"),
                )
            self.stacked.append(stacked)
            self._inner_paths[stacked.path] = inner
            if from_values:
                values = [weight.value for weight in same_in_each]
                initialize_with(stacked, stack_on_shards(values, tuple(stacked.shape), sharding_for(stacked)))
                release_values(
                    same_in_each
                )  # held stacked now (the template's too: stages give it the stack's rows)
        object.__setattr__(self, "_given", None)

    def _blocks(self, input_shape) -> tuple[list, Callable]:
        """The blocks whose weights are stacked, and what gives a block weight's starting value (an
        initializer). Blocks made here are made and built by shapes alone, in the order separate
        blocks would be, so that each initializer draws the seed it would draw there: a pipelined run
        starts from the same weights. Given blocks start the stack with their weights' values."""
        if self._given is not None:
            return list(self._given), initializer_of  # never run: the stacks take the blocks' values (build)
        blocks = [self.make_block(self.block_name.format(index)) for index in range(self.num_blocks)]
        with weights_described_only():  # the stacked weights are the blocks'; their own are never made
            for block in blocks:
                block.build(input_shape)
        return blocks, initializer_of

    @property
    def template(self) -> keras.layers.Layer:
        """The block every stage calls, with a block's slice of the stacked weights."""
        return self._template

    def block_paths(self, variable) -> tuple[str, ...]:
        """The paths the slices of stacked `variable` have in the same model with separate blocks
        (block i's first, in block order)."""
        prefix = self.path[: -len(self.name)]
        inner = self._inner_paths[variable.path]
        return tuple(f"{prefix}{self.block_name.format(i)}/{inner}" for i in range(self.num_blocks))

    def compute_output_shape(self, input_shape, **side_shapes):
        """A block gives what it takes (the stages hand each other activations of one shape)."""
        return input_shape

    def call(self, x, **side):
        """The blocks on `x`; `side`: tensors every block takes beside it by keyword, with x's rows
        (a padding mask), each stage given the rows of the microbatch it works on."""
        params = [variable.value for variable in self.stacked]
        distribution = keras.distribution.distribution()
        mesh = distribution.device_mesh.backend_mesh if distribution is not None else None
        stages = mesh.shape[self.axis] if mesh is not None and self.axis in mesh.axis_names else None
        counted = counted_calls()
        if counted is not None:  # traced for XLA's count of FLOPs (meshrun.pipeline.counting)
            if stages and stages > 1:
                counted.append(self._bubble_work(params, x, side, stages))
            return self._in_turn(self._as_blocks(params), x, side, as_counted=True)
        if stages is None:  # no stages: the blocks in turn
            return self._in_turn(self._as_blocks(params), x, side)
        return gpipe(
            self._in_turn, params, x, mesh, self.axis, self.microbatches or stages, side, self.repeats
        )

    def _as_blocks(self, params: list) -> list:
        """Stacked weights with one leading dimension, the blocks in order (the circular schedule's
        rounds joined)."""
        return [p.reshape(self.num_blocks, *p.shape[len(self.lead) :]) for p in params]

    def _in_turn(self, params: list, x, side: dict, as_counted: bool = False):
        """The blocks whose stacked weights `params` holds (one leading dimension) applied to `x` one
        after another, in a scan; `as_counted`: as the model's FLOPs are counted, each block's ops
        written out on their own (XLA's cost analysis counts a loop's body once) and none
        recomputed (remat's recomputation is the run's choice, not the model's work)."""
        template = self.template

        def block(x, weights):
            weights = list(weights)
            trainable, frozen = weights[: self._trainable_count], weights[self._trainable_count :]
            return template.stateless_call(trainable, frozen, x, **side)[0], None

        if as_counted:
            # Split, not indexed: the gradient of a split is a concatenation, where indexed slices would add
            # up their gradients padded to the whole stack (blocks squared times a block's weights: 2.6% more
            # FLOPs for 4 tiny blocks).
            for weights in zip(*[jnp.split(p, p.shape[0]) for p in params], strict=True):
                x = block(x, [jnp.squeeze(w, 0) for w in weights])[0]
            return x
        return lax.scan(jax.checkpoint(block) if self.remat else block, x, params)[0]

    def _bubble_work(self, params: list, x, side: dict, stages: int) -> BubbleWork:
        """What the schedule over `stages` computes on its bubble ticks, as a multiple of one
        block's forward and backward pass on the batch `x` (the blocks are one block repeated:
        each costs the same; meshrun.pipeline.counting)."""
        microbatches = self.microbatches or stages

        def forward_and_backward(trainable, frozen, x, side):
            """One block's forward pass, and the gradients a train step takes of it (its trainable
            weights' and its input's)."""
            out, pullback = jax.vjp(
                lambda trainable, x: self._in_turn([*trainable, *frozen], x, side, as_counted=True),
                trainable,
                x,
            )
            return out, pullback(
                jnp.ones_like(out)
            )  # out too: unused, jax would leave out the block's last matmul

        one_block = [jax.ShapeDtypeStruct((1, *p.shape[len(self.lead) :]), p.dtype) for p in params]
        shapes = (
            one_block[: self._trainable_count],
            one_block[self._trainable_count :],
            *jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (x, side)),
        )
        return BubbleWork(
            forward_and_backward, shapes, self.num_blocks * (stages - 1) / (self.repeats * microbatches)
        )
