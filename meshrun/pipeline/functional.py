"""Pipeline stages for a functional model that already holds its blocks, such as KerasHub's
decoder-only LMs (their backbone's `transformer_layers`): the model is rebuilt on fresh inputs with
the run of blocks replaced by one PipelinedBlocks layer, which stacks the blocks' weights as they
are (a preset's, or the model's initial ones). Every other layer is the model's own, so it keeps its
weights and variable paths; the blocks' paths are recorded per stacked variable (block_paths), as for
blocks made with `repeated_blocks`.

The blocks must be one block repeated (same class, same settings, same weights' shapes) applied one
after another, each to the one before's output, with the same tensors by keyword beside it (the
padding mask): anything else is BlockNotPipelinable, naming what differs.
"""

from __future__ import annotations

import re

import keras

from meshrun.compat.keras.models import rerun_functional
from meshrun.config.schema import PipelineConfig
from meshrun.pipeline.stack import BlockNotPipelinable, PipelinedBlocks

# Attributes of a layer that name it rather than configure it.
NAMING_ATTRIBUTES = {"name", "_name", "_path", "_parent_path"}


def with_pipelined_blocks(
    model: keras.Model, blocks: list, pipeline: PipelineConfig, name: str, inputs=None
) -> keras.Model:
    """`model` (functional, functional models nested in it allowed) as a plain functional model of
    the same outputs whose `blocks` run as pipeline stages, in one PipelinedBlocks layer named
    `name`; on `inputs` (symbolic, in the structure of model.input: where they fix a length the
    model leaves open, the plan knows the activations' size), else on inputs like model.input's."""
    check_same_block(blocks)
    stacked = PipelinedBlocks(
        None,
        len(blocks),
        axis=pipeline.axis,
        microbatches=pipeline.microbatches,
        remat=pipeline.remat,
        block_name=numbered_name(blocks),
        repeats=pipeline.repeats,
        blocks=blocks,
        name=name,
    )
    order = {id(block): index for index, block in enumerate(blocks)}
    block_ids = set(order)
    handed = {}  # what the pipelined blocks gave, and the keyword tensors block 0 was called with

    def call(operation, *args, **kwargs):
        index = order.get(id(operation))
        if index is None:
            if block_ids & _operations(operation):
                return rerun_functional(
                    operation, args[0] if args else kwargs["inputs"], call
                )  # a nested model (the backbone)
            return operation(*args, **kwargs)
        if index == 0:
            handed.update(output=stacked(args[0], **kwargs), side=kwargs)
            return handed["output"]
        if (
            handed.get("output") is not args[0]
            or kwargs.keys() != handed["side"].keys()
            or any(value is not handed["side"][key] for key, value in kwargs.items())
        ):
            raise BlockNotPipelinable(
                f"its blocks are not applied one after another ({blocks[index].name} does not take "
                f"{blocks[index - 1].name}'s output and the same tensors beside it)"
            )
        return args[0]  # the pipelined blocks did its work

    if inputs is None:
        inputs = keras.tree.map_structure(
            lambda t: keras.Input(batch_shape=t.shape, dtype=t.dtype, name=t.name), model.input
        )
    return keras.Model(inputs, rerun_functional(model, inputs, call), name=model.name)


def _operations(model) -> set[int]:
    """The ids of every layer inside `model` (none for a layer without sublayers)."""
    from meshrun.compat.keras.models import sublayers

    return {id(layer) for layer in sublayers(model)} if isinstance(model, keras.layers.Layer) else set()


def check_same_block(blocks: list) -> None:
    """BlockNotPipelinable unless `blocks` are one block repeated: the same class, the same settings
    (a layer's plain attributes, its name aside) and weights of the same paths and shapes (Gemma 2's
    blocks alternate sliding-window and global attention, so they differ)."""
    if not blocks:
        raise BlockNotPipelinable("it has no blocks")
    first = blocks[0]
    for block in blocks[1:]:
        if type(block) is not type(first):
            raise BlockNotPipelinable(
                f"its blocks differ: {block.name} is a "
                f"{type(block).__name__}, {first.name} a {type(first).__name__}"
            )
        ours, theirs = _settings(first), _settings(block)
        differing = sorted(key for key in ours.keys() | theirs.keys() if ours.get(key) != theirs.get(key))
        if differing:
            key = differing[0]
            raise BlockNotPipelinable(
                f"its blocks differ: {_setting_name(first, key)} is {theirs.get(key)!r} in {block.name} and "
                f"{ours.get(key)!r} in {first.name}; stages run one block repeated"
            )
        if _weight_shapes(block) != _weight_shapes(first):
            raise BlockNotPipelinable(
                f"its blocks differ: {block.name}'s weights are not {first.name}'s in paths and shapes"
            )


def _settings(layer) -> dict[tuple[int, str], object]:
    """A layer's own plain settings (numbers, strings, booleans, None) and its sublayers', by the
    place of their owner (0: the layer, i: its i-th sublayer, whose names may be numbered
    model-wide, dense_7) and name."""
    from meshrun.compat.keras.models import sublayers

    return {
        (place, key): value
        for place, owner in enumerate([layer, *sublayers(layer)])
        for key, value in vars(owner).items()
        if key not in NAMING_ATTRIBUTES and isinstance(value, (int, float, str, bool, type(None)))
    }


def _setting_name(layer, key: tuple[int, str]) -> str:
    """A setting of _settings as `attention.use_sliding_window_attention`."""
    from meshrun.compat.keras.models import sublayers

    place, name = key
    return f"{sublayers(layer)[place - 1].name}.{name}" if place else name


def _weight_shapes(layer) -> list[tuple]:
    """Each weight of `layer` as (its path inside the layer, shape, dtype)."""
    return [
        (weight.path.split(f"{layer.name}/", 1)[-1], tuple(weight.shape), weight.dtype)
        for weight in layer.weights
    ]


def numbered_name(blocks: list) -> str:
    """The pattern of the blocks' names (`transformer_layer_{}` for transformer_layer_0,
    transformer_layer_1, ...), which the per-block paths of the stacked weights are written with."""
    match = re.fullmatch(r"(.*?)(\d+)", blocks[0].name)
    pattern = f"{match.group(1)}{{}}" if match else None
    if pattern is None or [block.name for block in blocks] != [
        pattern.format(index) for index in range(len(blocks))
    ]:
        raise BlockNotPipelinable(
            f"its blocks are not named by their place ({', '.join(b.name for b in blocks[:3])}, ...); "
            "stages need block i named <name>_i"
        )
    return pattern
