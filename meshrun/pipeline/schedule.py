"""The GPipe schedule: every stage runs all microbatches forward in turn, each handing its output to
the next stage with a collective permute; autodiff through it gives the backward pass, with the
microbatches' gradients summed as one batch's."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, PartitionSpec


def check_split(blocks: int, stages: int, batch: int, microbatches: int) -> None:
    """ValueError, saying what would fit, when `blocks` do not split evenly into `stages` or the
    `batch` does not split into `microbatches`. (meshrun's config checks say the same in the
    config's terms before anything is built; this guards the schedule's own callers.)"""
    if blocks % stages:
        raise ValueError(f"{blocks} blocks do not split into {stages} stages of equal length; "
                         f"use a stage count that divides {blocks}")
    if microbatches < 1 or batch % microbatches:
        raise ValueError(f"{microbatches} microbatches do not divide the batch of {batch}; "
                         f"use a divisor of {batch}")


def gpipe(stage_fn: Callable, stage_params, x: jax.Array, mesh: Mesh, axis: str, microbatches: int,
          side: dict | None = None) -> jax.Array:
    """Runs `stage_fn(params, x, side)` as a pipeline over mesh axis `axis`: `stage_params` is a
    pytree of arrays whose leading dimension is split over the stages (each stage gets its own
    contiguous blocks); `x` is cut into `microbatches` along its first dimension, microbatch m taking
    rows m, m + M, m + 2M, ... (so that a batch split over a data axis stays split the same way within
    every microbatch: no rows move between data replicas). `side` holds arrays every block takes
    beside `x`, by name (a padding mask), with x's rows: each stage gets the rows of the microbatch it
    works on. Returns what the last stage made of every row, in the input's order, replicated over
    the stage axis."""
    side = side or {}
    stages = mesh.shape[axis]
    check_split(jax.tree.leaves(stage_params)[0].shape[0], stages, x.shape[0], microbatches)
    if stages == 1:  # nothing to hand on (and XLA refuses a collective over a manual axis of one device)
        return stage_fn(stage_params, x, side)
    neighbours = [(i, (i + 1) % stages) for i in range(stages)]

    def per_stage(params, x, side):
        stage = lax.axis_index(axis)
        last = stage == stages - 1
        batches = split_microbatches(x, microbatches)
        side_batches = {name: split_microbatches(value, microbatches) for name, value in side.items()}

        def tick(carry, t):
            handed, outputs = carry
            fresh = lax.dynamic_index_in_dim(batches, jnp.minimum(t, microbatches - 1), keepdims=False)
            working_on = jnp.clip(t - stage, 0, microbatches - 1)  # the microbatch this stage holds at tick t
            beside = {name: lax.dynamic_index_in_dim(value, working_on, keepdims=False) for name, value in side_batches.items()}
            out = stage_fn(params, jnp.where(stage == 0, fresh, handed), beside)
            finished = t - (stages - 1)  # the microbatch the last stage completes at this tick (< 0: none yet)
            slot = jnp.maximum(finished, 0)
            kept = lax.dynamic_index_in_dim(outputs, slot, keepdims=False)
            outputs = lax.dynamic_update_index_in_dim(outputs, jnp.where(last & (finished >= 0), out, kept), slot, 0)
            return (lax.ppermute(out, axis, neighbours), outputs), None

        # A scan over the M + S - 1 ticks, not a Python loop: compile time stays flat in the microbatch count.
        start = (jnp.zeros_like(batches[0]), jnp.zeros_like(batches))
        (_, outputs), _ = lax.scan(tick, start, jnp.arange(microbatches + stages - 1))
        return join_microbatches(lax.psum(outputs, axis))  # only the last stage wrote any: the others' are zeros

    param_specs = jax.tree.map(lambda _: PartitionSpec(axis), stage_params)
    side_specs = {name: PartitionSpec() for name in side}
    staged = jax.shard_map(per_stage, mesh=mesh, in_specs=(param_specs, PartitionSpec(), side_specs), out_specs=PartitionSpec(),
                           axis_names={axis}, check_vma=False)
    return jax.jit(staged)(stage_params, x, side)  # jitted: called eagerly, a shard_map with automatic axes fails


def split_microbatches(x: jax.Array, microbatches: int) -> jax.Array:
    """`x` (batch, ...) as (microbatches, batch / microbatches, ...), microbatch m holding rows m,
    m + M, m + 2M, ...: each data replica's contiguous rows are spread over all microbatches alike."""
    return x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:]).swapaxes(0, 1)


def join_microbatches(batches: jax.Array) -> jax.Array:
    """The inverse of split_microbatches: (M, batch / M, ...) back to (batch, ...) in row order."""
    return batches.swapaxes(0, 1).reshape(batches.shape[0] * batches.shape[1], *batches.shape[2:])
