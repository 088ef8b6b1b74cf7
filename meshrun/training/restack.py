"""Checkpoints and exports of pipelined blocks in the ordinary form.

A pipelined run holds each block weight once, stacked (`blocks/stacked_mlp_up_kernel`, one row per
block), and its checkpoints save what it holds, with the per-block paths each stacked variable
stands for (the checkpoint's `stacks` item). Reading a checkpoint into a model of the other form
recasts what it lacks from what it has: a stacked variable from its blocks' variables (a run
without a stage axis resumed with one), a block's variable from its row of the stack (the
reverse); the optimizer's slots follow their variables. An export writes the model with separate
blocks, which loads without meshrun.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec


def stacks_of(model) -> dict[str, tuple[str, ...]]:
    """The per-block paths each stacked variable of `model`'s pipelined blocks holds, by its path
    (empty for a model without pipelined blocks)."""
    from meshrun.compat.keras.models import sublayers
    from meshrun.pipeline.stack import PipelinedBlocks

    return {
        variable.path: layer.block_paths(variable)
        for layer in sublayers(model)
        if isinstance(layer, PipelinedBlocks)
        for variable in layer.stacked
    }


@dataclass(frozen=True)
class Recast:
    """How a variable is made from arrays the checkpoint has: the stack of `sources` (one per block,
    in order), row `row` of the one stacked source, or (`whole`) the one source, the same stack held
    in another shape (another pipeline.repeats: its blocks in one leading dimension or two)."""

    sources: tuple[str, ...]
    row: int | None = None
    whole: bool = False


def recasts(missing: Iterable[str], saved: set[str], stacks: dict[str, tuple[str, ...]]) -> dict[str, Recast]:
    """For each path of `missing` that can be made from `saved` paths, how: `stacks` gives the
    per-block paths of each stacked variable (this model's and the checkpoint's). Optimizer slots
    carry their variable's path with '/' written '_' (`adam/blocks_stacked_x_momentum`), so both
    spellings are tried."""
    spellings = [(stacked, blocks) for stacked, blocks in stacks.items()]
    spellings += [(_flat(stacked), tuple(_flat(b) for b in blocks)) for stacked, blocks in stacks.items()]
    found = {}
    for path in missing:
        for stacked, blocks in spellings:
            recast = _recast(path, stacked, blocks, saved)
            if recast:
                found[path] = recast
                break
    return found


def reshaped(
    variables: dict[str, tuple], saved: dict[str, tuple], stacks: dict[str, tuple[str, ...]]
) -> dict[str, Recast]:
    """The stacked variables (and their optimizer slots) among `variables` (shapes by path) that the
    checkpoint holds in another shape with the same elements (`saved`: shapes by path)."""
    names = [*stacks, *(_flat(stacked) for stacked in stacks)]
    return {
        path: Recast((path,), whole=True)
        for path, shape in variables.items()
        if path in saved
        and tuple(saved[path]) != tuple(shape)
        and math.prod(saved[path]) == math.prod(shape)
        and any(_holds(path, name) for name in names)
    }


def _recast(path: str, stacked: str, blocks: tuple[str, ...], saved: set[str]) -> Recast | None:
    if _holds(path, stacked):
        sources = tuple(path.replace(stacked, block, 1) for block in blocks)
        return Recast(sources) if all(source in saved for source in sources) else None
    for row, block in enumerate(blocks):
        if _holds(path, block):
            source = path.replace(block, stacked, 1)
            return Recast((source,), row) if source in saved else None
    return None


def _holds(path: str, name: str) -> bool:
    """Whether `path` is variable `name` or an optimizer slot of it (`<optimizer>/<name>_<slot>`)."""
    return path == name or (f"/{name}_" in path and path.index(f"/{name}_") == path.index("/"))


def _flat(path: str) -> str:
    return path.replace("/", "_")


def made_shape(recast: Recast, source_shape: tuple, target_shape: tuple) -> tuple:
    """The shape of what `recast` makes from sources of `source_shape`, for a target of
    `target_shape`: the blocks fill a stack's leading dimensions, one or the circular schedule's two."""
    if recast.whole:
        return (
            tuple(target_shape) if math.prod(source_shape) == math.prod(target_shape) else tuple(source_shape)
        )
    if recast.row is not None:
        lead = len(source_shape) - len(target_shape)
        return tuple(source_shape[lead if lead in (1, 2) else 1 :])
    lead = len(target_shape) - len(source_shape)
    if lead in (1, 2) and math.prod(target_shape[:lead]) == len(recast.sources):
        return (*target_shape[:lead], *source_shape)
    return (len(recast.sources), *source_shape)


def source_sharding(target, recast: Recast, source_rank: int):
    """The sharding to read `recast`'s sources (of rank `source_rank`) into, given `target`'s (a jax
    array): a block's weight of a stack split over the stages is read whole along that split (each
    device then holds what the same weight holds in a run without stages); a stack a block's row is
    cut from, with its leading dimensions whole."""
    sharding = target.sharding
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = tuple(sharding.spec) + (None,) * (len(target.shape) - len(sharding.spec))
    if recast.whole:  # the blocks' own dimensions as the target has them, the leading ones whole
        block_rank = min(source_rank, len(target.shape)) - 1
        return NamedSharding(
            sharding.mesh,
            PartitionSpec(*(None,) * (source_rank - block_rank), *spec[len(spec) - block_rank :]),
        )
    if recast.row is None:
        return NamedSharding(sharding.mesh, PartitionSpec(*spec[len(target.shape) - source_rank :]))
    return NamedSharding(sharding.mesh, PartitionSpec(*(None,) * (source_rank - len(target.shape)), *spec))


def recast_array(recast: Recast, sources: list, target):
    """The array `recast` makes from its read `sources`, with `target`'s shape and sharding (a stack
    whose blocks are held in two leading dimensions is read as one)."""
    if recast.row is None:
        return jax.jit(
            lambda *blocks: jnp.stack(blocks).reshape(target.shape), out_shardings=target.sharding
        )(*sources)
    return jax.jit(lambda stack: stack.reshape(-1, *target.shape)[recast.row], out_shardings=target.sharding)(
        sources[0]
    )


def with_separate_blocks(model, build_separate: Callable):
    """`model` as the same model with separate blocks (`build_separate()` builds one, its weights
    then set from `model`'s: each block's from its row of the stack); `model` itself when it has no
    pipelined blocks."""
    stacks = stacks_of(model)
    if not stacks:
        return model
    separate = build_separate()
    values = {variable.path: variable.value for variable in model.variables}
    rows = recasts([v.path for v in separate.variables if v.path not in values], set(values), stacks)
    for variable in separate.variables:
        if variable.path in values:
            variable.assign(values[variable.path])
        else:
            recast = rows[variable.path]
            variable.assign(values[recast.sources[0]].reshape(-1, *variable.shape)[recast.row])
    return separate
