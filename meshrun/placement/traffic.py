"""What one training step sends over the slow network between processes (hosts), estimated from the
plan: the bytes each process sends per step for each kind of collective whose axis crosses
processes (meshrun.config.slices). An estimate for comparing meshes and layouts, not a measurement:

- gradients: over the batch axis's slices, an all-reduce (ring: 2 (n-1)/n of what a process holds)
  of each trainable variable the batch axis does not shard, and a reduce-scatter ((n-1)/n) of each
  one it shards (FSDP);
- FSDP all-gathers: each variable the batch axis shards is gathered whole once a step ((n-1)/n);
- tensor-parallel activations: each matmul weight a cross-process axis other than the batch and
  stage axes splits costs one all-reduce of an activation a step (Megatron's count: the output of
  one split on its input dimension, the input gradient of one split on its output dimension), as
  large as the rows the process computes times that dimension;
- stage activations: with the stage axis across processes, every microbatch's block output goes
  forward to the next stage and its gradient back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from meshrun.config.layout_schema import MeshConfig
from meshrun.config.slices import span_of, spans


@dataclass(frozen=True)
class Activations:
    """What the step's activations look like: the samples of the global batch, the positions of
    a sample (tokens, pixels) in the output of each layer whose output is known (by layer path;
    `positions` for any other), the bytes of one activation element, and with pipeline stages the
    stage axis, the rounds each row makes through the stages (pipeline.repeats) and the bytes of one
    row of the blocks' output (None: not known)."""

    samples: int
    itemsize: int
    positions: int = 1
    layer_positions: Mapping[str, int] = field(default_factory=dict)
    stage_axis: str | None = None
    stage_rounds: int = 1
    block_output_bytes_per_row: int | None = None


@dataclass(frozen=True)
class SlowTraffic:
    """Bytes one process sends over the slow network per training step, by kind (None: the kind
    crosses processes but its size is not known)."""

    gradients: int
    fsdp_all_gathers: int
    tensor_activations: int
    stage_activations: int | None
    tensor_axes: tuple[str, ...]

    @property
    def total(self) -> int:
        return (
            self.gradients + self.fsdp_all_gathers + self.tensor_activations + (self.stage_activations or 0)
        )

    def to_dict(self) -> dict:
        return {
            "bytes_per_step": self.total,
            "gradients": self.gradients,
            "fsdp_all_gathers": self.fsdp_all_gathers,
            "tensor_activations": self.tensor_activations,
            "stage_activations": self.stage_activations,
            "tensor_axes_across_processes": list(self.tensor_axes),
        }


def slow_traffic(variables, mesh: MeshConfig, activations: Activations) -> SlowTraffic:
    """The estimate for `variables` (the plan's Placements) on `mesh` (dcn filled in)."""
    slices = {span.name: span for span in spans(mesh)}
    batch = slices[mesh.batch_axis].across_processes
    gradients = gathers = tensor = 0
    tensor_axes = _tensor_axes(variables, mesh, activations.stage_axis)
    for p in variables:
        held = p.bytes // math.prod(slices[a].across_processes for a in p.spec if a and a != mesh.batch_axis)
        if mesh.batch_axis in p.spec:
            gathers += _share(held, batch)
            gradients += _share(held, batch) if p.trainable else 0
        elif p.trainable:
            gradients += 2 * _share(held, batch)
        for axis in tensor_axes:
            if axis in p.spec and len(p.shape) >= 2:
                tensor += 2 * _share(
                    _activation_bytes(p, axis, mesh, activations), slices[axis].across_processes
                )
    return SlowTraffic(gradients, gathers, tensor, _stage_bytes(mesh, activations), tensor_axes)


def _share(nbytes: int, slices: int) -> int:
    """What a process sends to reduce-scatter or all-gather `nbytes` over `slices` processes in a ring."""
    return nbytes * (slices - 1) // slices


def _tensor_axes(variables, mesh: MeshConfig, stage_axis: str | None) -> tuple[str, ...]:
    """The axes across processes, other than the batch and stage axes, that split some variable."""
    used = {a for p in variables for a in p.spec if a}
    return tuple(
        span.name
        for span in spans(mesh)
        if span.across_processes > 1 and span.name in used and span.name not in (mesh.batch_axis, stage_axis)
    )


def _activation_bytes(p, axis: str, mesh: MeshConfig, activations: Activations) -> int:
    """The activation one matmul weight split over `axis` all-reduces in a step, as one process
    holds it: its rows (those of the batch shards the process holds) times the dimension that is not
    split, an embedding's width either way."""
    dim = p.spec.index(axis)
    width = (
        p.shape[-1] if dim < len(p.shape) - 1 or p.path.endswith("embeddings") else math.prod(p.shape[:-1])
    )
    batch = span_of(mesh, mesh.batch_axis)
    rows = activations.samples * _positions(p.path, activations) * batch.in_process // batch.size
    return rows * width * activations.itemsize


def _positions(path: str, activations: Activations) -> int:
    """The positions per sample in the output of the nearest layer around the variable at `path`."""
    parts = path.split("/")[:-1]
    for end in range(len(parts), 0, -1):
        found = activations.layer_positions.get("/".join(parts[:end]))
        if found is not None:
            return found
    return activations.positions


def _stage_bytes(mesh: MeshConfig, activations: Activations) -> int | None:
    """The block outputs (and their gradients) that leave a process's stages in a step; 0 when the
    stage axis stays within processes, None when the blocks' output size is not known."""
    axis = activations.stage_axis
    if axis is None or axis not in mesh.axis_names:
        return 0
    if span_of(mesh, axis).across_processes == 1:
        return 0
    if activations.block_output_bytes_per_row is None:
        return None
    batch = span_of(mesh, mesh.batch_axis)
    rows = activations.samples * batch.in_process // batch.size
    return 2 * activations.stage_rounds * rows * activations.block_output_bytes_per_row
