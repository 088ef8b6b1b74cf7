"""The GPipe schedule and its circular form: every stage runs all microbatches forward in turn, each
handing its output to the next stage with a collective permute; autodiff through it gives the
backward pass, with the microbatches' gradients summed as one batch's. In the circular form
(`repeats` R > 1) each device holds R non-adjacent stages (device s: stages s, s + S, ...) and the
microbatches go round the ring of devices R times, in groups of S, so a device waits S - 1 ticks of
a stage R times shorter: the idle share falls from (S-1)/(M+S-1) to (S-1)/(RM+S-1)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, PartitionSpec


def check_split(blocks: int, stages: int, batch: int, microbatches: int, repeats: int = 1) -> None:
    """ValueError, saying what would fit, when `blocks` do not split evenly into `stages` (times
    `repeats`), the `batch` does not split into `microbatches`, or (circular) the microbatches are
    not a multiple of the stages. (meshrun's config checks say the same in the config's terms before
    anything is built; this guards the schedule's own callers.)"""
    if blocks % (stages * repeats):
        raise ValueError(f"{blocks} blocks do not split into {stages * repeats} stages of equal length; "
                         f"use a stage count that divides {blocks}")
    if microbatches < 1 or batch % microbatches:
        raise ValueError(f"{microbatches} microbatches do not divide the batch of {batch}; "
                         f"use a divisor of {batch}")
    if repeats > 1 and microbatches % stages:
        raise ValueError(f"the circular schedule takes microbatches in groups of the {stages} stages; "
                         f"{microbatches} is not a multiple of {stages}")


def gpipe(stage_fn: Callable, stage_params, x: jax.Array, mesh: Mesh, axis: str, microbatches: int,
          side: dict | None = None, repeats: int = 1) -> jax.Array:
    """Runs `stage_fn(params, x, side)` as a pipeline over mesh axis `axis`: `stage_params` is a
    pytree of arrays whose leading dimension is split over the stages (each stage gets its own
    contiguous blocks; with `repeats` R > 1 their shape is (R, blocks / R, ...), the second dimension
    split over the stages, and round r's blocks of device s are stage r * S + s); `x` is cut into
    `microbatches` along its first dimension, microbatch m taking rows m, m + M, m + 2M, ... (so that
    a batch split over a data axis stays split the same way within every microbatch: no rows move
    between data replicas). `side` holds arrays every block takes beside `x`, by name (a padding
    mask), with x's rows: each stage gets the rows of the microbatch it works on. Returns what the
    last stage made of every row, in the input's order, replicated over the stage axis."""
    side = side or {}
    stages = mesh.shape[axis]
    leaf = jax.tree.leaves(stage_params)[0]
    check_split(leaf.shape[0] * (leaf.shape[1] if repeats > 1 else 1), stages, x.shape[0], microbatches, repeats)
    if stages == 1:  # nothing to hand on (and XLA refuses a collective over a manual axis of one device)
        return stage_fn(jax.tree.map(lambda p: p.reshape(-1, *p.shape[2:]), stage_params) if repeats > 1 else stage_params, x, side)
    neighbours = [(i, (i + 1) % stages) for i in range(stages)]

    def run_round(params, round_, x, side):
        """The stage's blocks of round `round_` on `x`."""
        if repeats == 1:
            return stage_fn(params, x, side)
        return stage_fn(jax.tree.map(lambda p: lax.dynamic_index_in_dim(p, round_, keepdims=False), params), x, side)

    if repeats > 1:
        # Kept as it is, the backward pass would keep the round's weights, sliced anew at every tick, once per
        # tick: 19.0 MiB a device against 2.0 MiB (2 stages, 16 microbatches, scripts/bench_pipeline.py). Keeping
        # only the matmuls' outputs, it slices them again instead (and redoes the elementwise work).
        run_round = jax.checkpoint(run_round, policy=jax.checkpoint_policies.dots_saveable)

    def per_stage(params, x, side):
        x = x.astype(dtype)
        side = {name: value.astype(side_dtypes[name]) for name, value in side.items()}
        stage = lax.axis_index(axis)
        last = stage == stages - 1
        batches = split_microbatches(x, microbatches)
        side_batches = {name: split_microbatches(value, microbatches) for name, value in side.items()}

        def tick(carry, t):
            handed, outputs = carry
            item = t - stage  # this stage's piece of work at tick t: (group, round, place in group)
            valid = (item >= 0) & (item < microbatches * repeats)
            item = jnp.clip(item, 0, microbatches * repeats - 1)
            round_ = (item // stages) % repeats
            microbatch = item // (stages * repeats) * stages + item % stages
            fresh = lax.dynamic_index_in_dim(batches, microbatch, keepdims=False)
            beside = {name: lax.dynamic_index_in_dim(value, microbatch, keepdims=False) for name, value in side_batches.items()}
            out = run_round(params, round_, jnp.where((stage == 0) & (round_ == 0), fresh, handed), beside)
            done = last & valid & (round_ == repeats - 1)  # the last stage finished this microbatch
            kept = lax.dynamic_index_in_dim(outputs, microbatch, keepdims=False)
            outputs = lax.dynamic_update_index_in_dim(outputs, jnp.where(done, out, kept), microbatch, 0)
            return (lax.ppermute(out, axis, neighbours), outputs), None

        # A scan over the RM + S - 1 ticks, not a Python loop: compile time stays flat in the microbatch count.
        start = (jnp.zeros_like(batches[0]), jnp.zeros_like(batches))
        (_, outputs), _ = lax.scan(tick, start, jnp.arange(microbatches * repeats + stages - 1))
        # Only the last stage wrote any outputs (the others' are zeros); summed in float32 (see below).
        return join_microbatches(lax.psum(outputs.astype(jnp.float32), axis).astype(dtype))

    param_specs = jax.tree.map(lambda _: PartitionSpec(None, axis) if repeats > 1 else PartitionSpec(axis), stage_params)
    side_specs = {name: PartitionSpec() for name in side}
    # Activations enter and leave in float32 at least: the outputs are summed over the stages, and so are the
    # inputs' gradients, and XLA's CPU compiler aborts on those all-reduces in bfloat16, as mixed_bfloat16
    # gives them ("Invalid binary instruction opcode copy").
    dtype, side_dtypes = x.dtype, {name: value.dtype for name, value in side.items()}
    staged = jax.shard_map(per_stage, mesh=mesh, in_specs=(param_specs, PartitionSpec(), side_specs), out_specs=PartitionSpec(),
                           axis_names={axis}, check_vma=False)
    return jax.jit(staged)(stage_params, _at_least_float32(x), {name: _at_least_float32(value) for name, value in side.items()})  # jitted: called eagerly, a shard_map with automatic axes fails


def _at_least_float32(array: jax.Array) -> jax.Array:
    """`array` in float32 when it holds floats of fewer bits (integers, masks, as they are)."""
    return array.astype(jnp.float32) if jnp.issubdtype(array.dtype, jnp.floating) and array.dtype.itemsize < 4 else array


def split_microbatches(x: jax.Array, microbatches: int) -> jax.Array:
    """`x` (batch, ...) as (microbatches, batch / microbatches, ...), microbatch m holding rows m,
    m + M, m + 2M, ...: each data replica's contiguous rows are spread over all microbatches alike."""
    return x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:]).swapaxes(0, 1)


def join_microbatches(batches: jax.Array) -> jax.Array:
    """The inverse of split_microbatches: (M, batch / M, ...) back to (batch, ...) in row order."""
    return batches.swapaxes(0, 1).reshape(batches.shape[0] * batches.shape[1], *batches.shape[2:])
