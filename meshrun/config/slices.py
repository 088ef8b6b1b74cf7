"""How a mesh spans the slow network between processes (hosts): `mesh.dcn` gives, per mesh axis, how
many slices it spans, MaxText's `dcn_*_parallelism`. Each process holds one slice, a contiguous
block of the mesh of shape `mesh.shape / dcn` (jax's create_hybrid_device_mesh lays the devices out
so), and an axis whose dcn is above 1 steps from one process to another: its collectives cross the
slow network.

Plain arithmetic on the config, with no jax: the checks, the plan and the device order all read it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from meshrun.config.layout_schema import MeshConfig
from meshrun.errors import ConfigError
from meshrun.wording import format_shape, one_of

DCN_KEY = "mesh.dcn"


def check_dcn_shape(mesh: MeshConfig) -> None:
    """ConfigError unless `mesh.dcn` (where given) has one positive size per axis, each dividing
    its axis (a -1 axis is checked once it is filled in)."""
    dcn = mesh.dcn
    if dcn is None:
        return
    if len(dcn) != len(mesh.shape):
        raise ConfigError(
            DCN_KEY,
            f"got {list(dcn)} ({len(dcn)} size{'s' if len(dcn) > 1 else ''}) for the {len(mesh.shape)}-D "
            f"mesh {format_shape(mesh.shape)}; give one slice count per axis "
            f"({one_of(mesh.axis_names)}), e.g. mesh.dcn=[{','.join(['2'] + ['1'] * (len(mesh.shape) - 1))}]",
        )
    for name, size, slices in zip(mesh.axis_names, mesh.shape, dcn, strict=True):
        if size > 0 and size % slices:
            valid = [n for n in range(1, size + 1) if size % n == 0]
            raise ConfigError(
                DCN_KEY,
                f"got {list(dcn)}: {slices} slices do not divide axis {name!r} of size {size} "
                f"(mesh {format_shape(mesh.shape)}); valid for that axis: {one_of(valid)}",
            )


def check_dcn(mesh: MeshConfig, processes: int, key: str) -> None:
    """ConfigError when a given `mesh.dcn` does not make one slice per process of a job of
    `processes` processes (`key`: where the process count came from, named in the message)."""
    check_dcn_shape(mesh)
    if mesh.dcn is not None and math.prod(mesh.dcn) != processes:
        raise ConfigError(
            DCN_KEY,
            f"got {list(mesh.dcn)}, {math.prod(mesh.dcn)} slices, but the job has {processes} "
            f"process{'es' if processes > 1 else ''} ({key}); give slice counts whose product is "
            f"{processes}, one slice per process",
        )


def with_dcn(
    mesh: MeshConfig, processes: int, first: tuple[str, ...] = (), key: str = "distributed.num_processes"
) -> MeshConfig:
    """`mesh` (no -1 left) with its dcn filled in for a job of `processes` processes: the one given
    (checked), else the default: nothing crosses processes in a one-process job; in a job of several,
    the process count is spread over the axes in `first` (the pipeline's stage axis, whose steps send
    little), then the batch axis, then the others from the outermost, each taking the largest share
    of the processes left that divides it. A ConfigError when no such spread exists."""
    if mesh.dcn is not None:
        check_dcn(mesh, processes, key)
        return mesh
    order = [*(a for a in first if a in mesh.axis_names), mesh.batch_axis]
    order += [a for a in mesh.axis_names if a not in order]
    left, dcn = processes, dict.fromkeys(mesh.axis_names, 1)
    for axis in dict.fromkeys(order):
        dcn[axis] = math.gcd(left, mesh.axis_size(axis))
        left //= dcn[axis]
    if left != 1:
        raise ConfigError(
            DCN_KEY,
            f"mesh {format_shape(mesh.shape)} cannot be cut along its axes into {processes} equal slices, "
            f"one per process ({key}); give mesh.dcn, one slice count per axis with product {processes}, "
            "or another shape",
        )
    return dataclasses.replace(mesh, dcn=tuple(dcn[a] for a in mesh.axis_names))


@dataclass(frozen=True)
class AxisSpan:
    """One mesh axis as the processes hold it: its size within a process and how many processes
    (slices) it spans."""

    name: str
    size: int
    in_process: int
    across_processes: int


def spans(mesh: MeshConfig) -> tuple[AxisSpan, ...]:
    """Each axis of `mesh` (dcn filled in: with_dcn) split into its in-process and cross-process parts."""
    dcn = mesh.dcn or (1,) * len(mesh.shape)
    return tuple(
        AxisSpan(name, size, size // slices, slices)
        for name, size, slices in zip(mesh.axis_names, mesh.shape, dcn, strict=True)
    )


def span_of(mesh: MeshConfig, axis: str) -> AxisSpan:
    """Mesh axis `axis` split into its in-process and cross-process parts."""
    return spans(mesh)[mesh.axis_names.index(axis)]


def across_processes(mesh: MeshConfig) -> tuple[str, ...]:
    """The axes of `mesh` whose steps go from one process to another."""
    return tuple(span.name for span in spans(mesh) if span.across_processes > 1)
