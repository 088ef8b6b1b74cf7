"""The GPipe schedule and its circular form: every stage runs all microbatches forward in turn, each
handing its output to the next stage with a collective permute; autodiff through it gives the
backward pass, with the microbatches' gradients summed as one batch's. In the circular form
(`repeats` R > 1) each device holds R non-adjacent stages (device s: stages s, s + S, ...) and the
microbatches go round the ring of devices R times, in groups of S, so a device waits S - 1 ticks of
a stage R times shorter: the idle share falls from (S-1)/(M+S-1) to (S-1)/(RM+S-1)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

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
        raise ValueError(
            f"{blocks} blocks do not split into {stages * repeats} stages of equal length; "
            f"use a stage count that divides {blocks}"
        )
    if microbatches < 1 or batch % microbatches:
        raise ValueError(
            f"{microbatches} microbatches do not divide the batch of {batch}; use a divisor of {batch}"
        )
    if repeats > 1 and microbatches % stages:
        raise ValueError(
            f"the circular schedule takes microbatches in groups of the {stages} stages; "
            f"{microbatches} is not a multiple of {stages}"
        )


def gpipe(
    stage_fn: Callable,
    stage_params,
    x: jax.Array,
    mesh: Mesh,
    axis: str,
    microbatches: int,
    side: dict | None = None,
    repeats: int = 1,
) -> jax.Array:
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
    ticks = Ticks(stages=mesh.shape[axis], microbatches=microbatches, repeats=repeats, axis=axis)
    leaf = jax.tree.leaves(stage_params)[0]
    check_split(
        leaf.shape[0] * (leaf.shape[1] if repeats > 1 else 1), ticks.stages, x.shape[0], microbatches, repeats
    )
    # One stage: nothing to hand on (and XLA refuses a collective over a manual axis of one device).
    if ticks.stages == 1:
        return stage_fn(_all_blocks(stage_params) if repeats > 1 else stage_params, x, side)
    return _staged(stage_fn, stage_params, x, side, mesh, ticks)


def _all_blocks(stage_params):
    """The blocks of every round, (R, blocks / R, ...) made (blocks, ...): one stage runs them all."""
    return jax.tree.map(lambda p: p.reshape(-1, *p.shape[2:]), stage_params)


def _staged(
    stage_fn: Callable, stage_params, x: jax.Array, side: dict, mesh: Mesh, ticks: Ticks
) -> jax.Array:
    """The pipeline of gpipe over more than one stage: each device of the stage axis runs its stage's
    blocks tick by tick (_run_stage) in a shard_map, jitted."""
    axis, repeats = ticks.axis, ticks.repeats
    # Activations enter and leave in float32 at least: the outputs are summed over the stages, and so are the
    # inputs' gradients, and XLA's CPU compiler aborts on those all-reduces in bfloat16, as mixed_bfloat16
    # gives them ("Invalid binary instruction opcode copy").
    per_stage = functools.partial(
        _run_stage,
        ticks,
        _one_round(stage_fn, repeats),
        x.dtype,
        {name: value.dtype for name, value in side.items()},
    )
    param_specs = jax.tree.map(
        lambda _: PartitionSpec(None, axis) if repeats > 1 else PartitionSpec(axis), stage_params
    )
    side_specs = {name: PartitionSpec() for name in side}
    staged = jax.shard_map(
        per_stage,
        mesh=mesh,
        in_specs=(param_specs, PartitionSpec(), side_specs),
        out_specs=PartitionSpec(),
        axis_names={axis},
        check_vma=False,
    )
    return jax.jit(staged)(
        stage_params, _at_least_float32(x), {name: _at_least_float32(value) for name, value in side.items()}
    )  # jitted: called eagerly, a shard_map with automatic axes fails


@dataclass(frozen=True)
class Ticks:
    """The shape of a schedule: S `stages` over mesh axis `axis`, M `microbatches`, R `repeats`
    (rounds of the circular schedule), run in RM + S - 1 ticks."""

    stages: int
    microbatches: int
    repeats: int
    axis: str

    @property
    def count(self) -> int:
        """How many ticks a step takes: RM + S - 1."""
        return self.microbatches * self.repeats + self.stages - 1

    def work_at(self, tick: jax.Array, stage: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """What `stage` works on at `tick`: whether it is real work (not a bubble tick), the round and
        the microbatch (taken in groups of S, each group going round the ring R times)."""
        item = tick - stage
        valid = (item >= 0) & (item < self.microbatches * self.repeats)
        item = jnp.clip(item, 0, self.microbatches * self.repeats - 1)
        round_ = (item // self.stages) % self.repeats
        microbatch = item // (self.stages * self.repeats) * self.stages + item % self.stages
        return valid, round_, microbatch


def _one_round(stage_fn: Callable, repeats: int) -> Callable:
    """`run_round(params, round_, x, side)`: the stage's blocks of round `round_` on `x` (all of
    them without rounds)."""
    if repeats == 1:
        return lambda params, round_, x, side: stage_fn(params, x, side)

    def run_round(params, round_, x, side):
        return stage_fn(
            jax.tree.map(lambda p: lax.dynamic_index_in_dim(p, round_, keepdims=False), params), x, side
        )

    # Kept as it is, the backward pass would keep the round's weights, sliced anew at every tick, once per
    # tick: 19.0 MiB a device against 2.0 MiB (2 stages, 16 microbatches, scripts/bench_pipeline.py). Keeping
    # only the matmuls' outputs, it slices them again instead (and redoes the elementwise work).
    return jax.checkpoint(run_round, policy=jax.checkpoint_policies.dots_saveable)


def _run_stage(
    ticks: Ticks, run_round: Callable, dtype, side_dtypes: dict, params, x: jax.Array, side: dict
) -> jax.Array:
    """One stage's part of the schedule (the body of the shard_map over the stage axis): every tick
    it works on the microbatch that reached it and hands its output to the next stage. Returns the
    last stage's outputs for every row, on every stage, in `dtype`."""
    x = x.astype(dtype)
    side = {name: value.astype(side_dtypes[name]) for name, value in side.items()}
    stage = lax.axis_index(ticks.axis)
    last = stage == ticks.stages - 1
    batches = split_microbatches(x, ticks.microbatches)
    side_batches = {name: split_microbatches(value, ticks.microbatches) for name, value in side.items()}
    neighbours = [(i, (i + 1) % ticks.stages) for i in range(ticks.stages)]

    def tick(carry, t):
        handed, outputs = carry
        valid, round_, microbatch = ticks.work_at(t, stage)
        fresh = lax.dynamic_index_in_dim(batches, microbatch, keepdims=False)
        beside = {
            name: lax.dynamic_index_in_dim(value, microbatch, keepdims=False)
            for name, value in side_batches.items()
        }
        out = run_round(params, round_, jnp.where((stage == 0) & (round_ == 0), fresh, handed), beside)
        done = last & valid & (round_ == ticks.repeats - 1)  # the last stage finished this microbatch
        kept = lax.dynamic_index_in_dim(outputs, microbatch, keepdims=False)
        outputs = lax.dynamic_update_index_in_dim(outputs, jnp.where(done, out, kept), microbatch, 0)
        return (lax.ppermute(out, ticks.axis, neighbours), outputs), None

    # A scan over the RM + S - 1 ticks, not a Python loop: compile time stays flat in the microbatch count.
    start = (jnp.zeros_like(batches[0]), jnp.zeros_like(batches))
    (_, outputs), _ = lax.scan(tick, start, jnp.arange(ticks.count))
    # Only the last stage wrote any outputs (the others' are zeros); summed in float32 (see gpipe).
    return join_microbatches(lax.psum(outputs.astype(jnp.float32), ticks.axis).astype(dtype))


def _at_least_float32(array: jax.Array) -> jax.Array:
    """`array` in float32 when it holds floats of fewer bits (integers, masks, as they are)."""
    return (
        array.astype(jnp.float32)
        if jnp.issubdtype(array.dtype, jnp.floating) and array.dtype.itemsize < 4
        else array
    )


def split_microbatches(x: jax.Array, microbatches: int) -> jax.Array:
    """`x` (batch, ...) as (microbatches, batch / microbatches, ...), microbatch m holding rows m,
    m + M, m + 2M, ...: each data replica's contiguous rows are spread over all microbatches alike."""
    return x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:]).swapaxes(0, 1)


def join_microbatches(batches: jax.Array) -> jax.Array:
    """The inverse of split_microbatches: (M, batch / M, ...) back to (batch, ...) in row order."""
    return batches.swapaxes(0, 1).reshape(batches.shape[0] * batches.shape[1], *batches.shape[2:])
