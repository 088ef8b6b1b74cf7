"""How a model offers its repeated blocks to pipeline stages: it makes them with `repeated_blocks`,
which gives the blocks one after another as separate layers (block_0, block_1, ...) in an ordinary
run, and one PipelinedBlocks layer (their weights stacked, run as stages) when meshrun builds the
model for a mesh with a stage axis. The same model code serves both; the zoo transformer and
`model=python` factories go through it; under train.remat=blocks the separate blocks are recomputed
in the backward pass. (KerasHub's decoder-only LMs hold their blocks already:
meshrun.pipeline.functional pipelines them.)

    from meshrun.pipeline import repeated_blocks

    def build():
        x = inputs = keras.Input((seq_len,), dtype="int32")
        x = keras.layers.Embedding(vocab, width)(x)
        x = repeated_blocks(lambda name: MyBlock(width, name=name), count=8)(x)
        return keras.Model(inputs, keras.layers.Dense(vocab)(x))

A block takes one tensor and gives one of the same shape, and keeps no state (dropout's random state,
moving statistics; frozen weights are fine); tensors every block takes beside it (a padding mask,
with the batch's rows) go by keyword: `repeated_blocks(make, count)(x, padding_mask=mask)`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from meshrun.compat.keras.remat import recompute_in_backward
from meshrun.config.schema import PipelineConfig


@dataclass(frozen=True)
class BlockBuild:
    """How the model being built holds its repeated blocks: as pipelined stacks configured by
    `pipeline` (None: as separate blocks), and whether separate blocks are recomputed in the
    backward pass (train.remat=blocks)."""

    pipeline: PipelineConfig | None = None
    recomputed: bool = False


_building_for: ContextVar[BlockBuild | None] = ContextVar("meshrun_pipeline", default=None)


@contextlib.contextmanager
def stages(pipeline: PipelineConfig | None, recomputed: bool = False) -> Iterator[None]:
    """Models built inside hold their repeated blocks as pipelined stacks configured by `pipeline`
    (None: as separate blocks, recomputed in the backward pass when `recomputed`)."""
    token = _building_for.set(BlockBuild(pipeline, recomputed))
    try:
        yield
    finally:
        _building_for.reset(token)


def building_for() -> PipelineConfig | None:
    """The pipeline the model being built is for (None: its blocks stay separate layers)."""
    building = _building_for.get()
    return building and building.pipeline


def blocks_recomputed() -> bool:
    """Whether the separate blocks of the model being built are recomputed in the backward pass."""
    building = _building_for.get()
    return bool(building and building.recomputed)


def repeated_blocks(
    make_block: Callable[[str], object], count: int, name: str = "blocks", block_name: str = "block_{}"
) -> Callable:
    """`count` blocks made by `make_block(name)` applied in order, as a callable for a functional
    model (`(x, **side)`: keyword tensors every block takes beside x): separate layers named
    `block_name.format(i)`, or (in a build for pipeline stages) one PipelinedBlocks layer named
    `name` whose variables record the per-block paths they hold."""
    pipeline = building_for()
    if pipeline is None:
        blocks = [make_block(block_name.format(index)) for index in range(count)]
        if blocks_recomputed():
            for block in blocks:
                recompute_in_backward(block)
        return lambda x, **side: functools.reduce(lambda hidden, block: block(hidden, **side), blocks, x)
    from meshrun.pipeline.stack import PipelinedBlocks

    return PipelinedBlocks(
        make_block,
        count,
        axis=pipeline.axis,
        microbatches=pipeline.microbatches,
        remat=pipeline.remat,
        block_name=block_name,
        repeats=pipeline.repeats,
        name=name,
    )
