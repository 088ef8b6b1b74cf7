"""The train step's memory in `meshrun plan` (meshrun.run.step_memory does the counting): the plan's
model with its step counted on this machine's CPU devices, and `plan --fit`'s search for the largest
batch or sequence length that fits (meshrun.run.fit_search).

Importing this module imports jax and keras: call `meshrun.placement.devices.prepare_for_plan` first.
"""

from __future__ import annotations

from meshrun.config.schema import RunConfig
from meshrun.errors import ConfigError, DoesNotFit
from meshrun.placement import devices as devices_lib
from meshrun.run import fit_search, step_memory
from meshrun.run.prepare import PlannedModel, check_objectives, place


def counted_for_plan(config: RunConfig, planned: PlannedModel, processes: int = 1) -> PlannedModel:
    """The plan's model with its train step's memory counted on this machine's CPU devices, which
    meshrun.placement.devices.prepare_for_plan emulates one per mesh position when the plan has a
    device memory to fit (step_memory.counted says when it is counted). A bad loss or metric
    leaves it uncounted: the plan reports that error itself; so does a job of several processes
    (its plan counts the state only, for now)."""
    if planned.plan.memory is None or processes > 1:
        return planned
    try:
        named = check_objectives(config.train, planned)
    except ConfigError:
        return planned
    cpus = devices_lib.cpu_devices_in_mesh_order(planned.plan.mesh)
    return step_memory.counted(config, planned, named.loss_function, cpus)


def fit_for_plan(config: RunConfig, planned: PlannedModel, target: str, processes: int = 1):
    """`meshrun plan --fit TARGET`: the largest train.batch_size ("batch") or model.seq_len
    ("seq_len") whose train step fits the plan's device memory (meshrun.run.fit_search.FitFound),
    compiled on this machine's CPU devices. ConfigError where the plan has no memory to fit, its
    state alone does not fit, or even the smallest size does not."""
    if planned.plan.memory is None:
        raise ConfigError(
            "--fit",
            f"got {target!r} but the plan has no device memory to fit: give devices.memory_gib "
            "(emulated CPU devices report none)",
        )
    plan = planned.plan
    blocking = [e for e in plan.errors if not (isinstance(e, DoesNotFit) and plan.step is not None)]
    if blocking:  # the configured size not fitting is what the search answers; anything else stops it
        raise blocking[0]
    if planned.pipeline is not None or processes > 1:
        raise ConfigError(
            "--fit",
            f"got {target!r} for a plan with pipeline stages or several processes; the search runs "
            "without them for now (a pipelined batch must also split into its microbatches)",
        )
    named = check_objectives(config.train, planned)
    cpus = devices_lib.cpu_devices_in_mesh_order(planned.plan.mesh)
    mesh, memory = planned.plan.mesh, planned.plan.memory
    return fit_search.largest_fitting(
        config, planned, named.loss_function, cpus, target, lambda resized: place(resized, mesh, 1, memory)
    )
