"""Our one seam onto keras.distribution: builds the DeviceMesh, LayoutMap and distribution for a run.

What Keras does not do as meshrun needs is handled here and nowhere else (keras 3.15):
- DataParallel raises on a 2-D mesh, so data parallelism is a ModelParallel with no rules, which
  works on any mesh and splits the batch over the axis we name.
- ModelParallel silently swallows unknown keywords, so the batch axis it ends up with is read
  back and checked.
- With several processes Keras would re-batch and shard a tf.data pipeline itself
  (auto_shard_dataset); meshrun's data sources already read each process's share of every global
  batch (see `batch_share`), so that is switched off.
- A layout map places a variable over the whole mesh; while a model that holds its blocks is
  built for pipeline stages, each block's weights go to its stage's devices alone
  (`blocks_on_their_stages`), which no rule can say.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace

import jax
import keras
import numpy as np
from keras import distribution as kd

from meshrun.compat.keras.variable_layouts import layout_of, variable_layouts
from meshrun.config.layout_schema import LayoutRule, MeshConfig
from meshrun.config.schema import PipelineConfig
from meshrun.pipeline.bubble import stage_of_block


def device_mesh(mesh: MeshConfig, devices) -> kd.DeviceMesh:
    """A Keras DeviceMesh of `mesh.shape` over `devices` (jax devices, mesh order)."""
    return kd.DeviceMesh(shape=tuple(mesh.shape), axis_names=list(mesh.axis_names), devices=list(devices))


def layout_map(rules: tuple[LayoutRule, ...], mesh: kd.DeviceMesh) -> kd.LayoutMap:
    """A LayoutMap holding each rule as `pattern -> tuple of axes`."""
    layouts = kd.LayoutMap(mesh)
    for rule in rules:
        layouts[rule.pattern] = tuple(rule.axes)
    return layouts


def make_distribution(mesh: MeshConfig, rules: tuple[LayoutRule, ...], devices) -> kd.ModelParallel:
    """The distribution for a run: `rules` over a mesh of `devices`, batch split over
    `mesh.batch_axis`. With no rules every variable is replicated (data parallelism)."""
    distribution = kd.ModelParallel(
        layout_map=layout_map(rules, device_mesh(mesh, devices)),
        batch_dim_name=mesh.batch_axis,
        auto_shard_dataset=False,
    )
    if distribution.batch_dim_name != mesh.batch_axis:
        raise RuntimeError(
            f"keras put the batch on axis {distribution.batch_dim_name!r}, not {mesh.batch_axis!r}"
        )
    return distribution


def in_force(distribution: kd.ModelParallel) -> kd.ModelParallel | None:
    """The distribution to put in force for Keras: None when the mesh is jax's default device
    alone (one GPU, one CPU device) in a one-process job. Everything lives on that device either
    way, but without a distribution Keras feeds each batch with a plain device_put (one batch ahead
    on accelerators) instead of make_array_from_process_local_data on the loop's thread, which
    costs about 0.3 ms a step on a CPU: all of a small model's launcher tax there."""
    devices = distribution.device_mesh.devices.flatten()
    if devices.size == 1 and jax.process_count() == 1 and devices[0] == jax.devices()[0]:
        return None
    return distribution


def batch_share(distribution: kd.ModelParallel, batch_size: int) -> tuple[int, int]:
    """Which part of every global batch this process feeds, as (index, count): the batch is cut
    into `count` equal runs of adjacent rows and this process's devices hold run `index`. Read
    from the input sharding Keras uses (the batch split over the batch axis)."""
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = distribution.device_mesh.backend_mesh
    sharding = NamedSharding(mesh, PartitionSpec(distribution.batch_dim_name))
    rows = {
        index[0].indices(batch_size)[:2]
        for index in sharding.addressable_devices_indices_map((batch_size,)).values()
    }
    start, stop = min(r[0] for r in rows), max(r[1] for r in rows)
    size = stop - start
    if sum(b - a for a, b in rows) != size or batch_size % size or start % size:
        raise RuntimeError(
            f"this process's devices hold rows {sorted(rows)} of each batch, not one equal share"
        )
    return start // size, batch_size // size


@contextlib.contextmanager
def blocks_on_their_stages(
    stacks: dict[str, tuple[str, ...]], pipeline: PipelineConfig | None
) -> Iterator[None]:
    """While a model is built for `pipeline`'s stages under the distribution in force, each
    variable a stacked one will hold (`stacks`: the per-block paths of each stacked variable, in
    block order) is made on the devices of its block's stage alone, laid out among them as its row
    of the stack will be. A model that holds its blocks before they are stacked (KerasHub's LMs: a
    preset's weights are loaded into them) then never holds more of them on a device than the
    stacks will. Nothing changes without a pipeline."""
    distribution = keras.distribution.distribution()
    if distribution is None or pipeline is None or not stacks:
        yield
        return
    axis, repeats = pipeline.axis, pipeline.repeats
    mesh = distribution.device_mesh.backend_mesh
    rows = {
        block: (stacked, row, len(blocks))
        for stacked, blocks in stacks.items()
        for row, block in enumerate(blocks)
    }
    by_rules = distribution.get_variable_layout

    def placed(variable):
        found = rows.get(variable.path)
        if found is None or layout_of(variable) is not None:
            return by_rules(variable)
        stacked, row, blocks = found
        lead = (repeats, blocks // repeats) if repeats > 1 else (blocks,)
        spec = tuple(by_rules(SimpleNamespace(path=stacked, shape=(*lead, *variable.shape))).axes)
        return stage_sharding(
            mesh, axis, stage_of_block(row, blocks, mesh.shape[axis], repeats), spec[len(lead) :]
        )

    with variable_layouts(distribution, placed):  # on this instance only, for the build
        yield


def stage_sharding(mesh: jax.sharding.Mesh, axis: str, stage: int, spec: tuple) -> jax.sharding.NamedSharding:
    """`spec` (the stage axis in none of it) over the devices of stage `stage` of mesh axis `axis`."""
    from jax.sharding import NamedSharding, PartitionSpec

    others = tuple(name for name in mesh.axis_names if name != axis)
    devices = np.take(mesh.devices, stage, axis=mesh.axis_names.index(axis))
    return NamedSharding(jax.sharding.Mesh(devices, others), PartitionSpec(*spec))


def reset() -> None:
    """Clears the global distribution and Keras' session state (layer-name counters, seeds), so a
    next run in the same process gets the same variable paths and a clean slate."""
    kd.set_distribution(None)
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()
