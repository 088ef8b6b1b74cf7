"""Layout rules and the plan's figures for pipelined blocks (meshrun.pipeline).

Layout rules are written for the model with separate blocks (`block_3/mlp_up/kernel`), and a
pipelined run holds each block weight once, stacked (`blocks/stacked_mlp_up_kernel`, one more
leading dimension, split over the stage axis). So the rules are checked against the model as it
would be with separate blocks (`per_block_view`), where their errors read in the user's terms, and
the placement found there becomes one exact rule per stacked variable: the stage axis, then the
axes block 0's weight got (`stacked_rules`). The stage axis itself holds the stages, so a rule may
not also put a block weight's own dimensions on it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from meshrun.config.layout_schema import LayoutRule, MeshConfig
from meshrun.config.schema import PipelineConfig
from meshrun.errors import ConfigError
from meshrun.pipeline.bubble import bubble_fraction, stage_of_block
from meshrun.placement.layout import Bend, TensorSpec, check_rules, replacing
from meshrun.wording import format_shape, one_of


def stacked(tensors) -> list[TensorSpec]:
    """The stacked variables of pipelined blocks among `tensors`."""
    return [t for t in tensors if t.blocks]


def lead(tensor: TensorSpec) -> int:
    """How many leading dimensions of a stacked variable hold its blocks: 1, or 2 for the circular
    schedule's (repeats, blocks / repeats)."""
    return 1 if tensor.shape[0] == len(tensor.blocks) else 2


def per_block_view(tensors) -> list[TensorSpec]:
    """`tensors` as the model with separate blocks has them: each stacked variable as its blocks'
    own variables (its leading dimensions dropped)."""
    view = []
    for tensor in tensors:
        if tensor.blocks:
            view += [
                dataclasses.replace(tensor, path=path, shape=tensor.shape[lead(tensor) :], blocks=())
                for path in tensor.blocks
            ]
        else:
            view.append(tensor)
    return view


def within_stage(mesh: MeshConfig, axis: str) -> MeshConfig:
    """`mesh` as one stage sees it: the stage axis left out (for rules derived by layout=auto)."""
    keep = [i for i, name in enumerate(mesh.axis_names) if name != axis]
    return MeshConfig(
        shape=tuple(mesh.shape[i] for i in keep),
        axis_names=tuple(mesh.axis_names[i] for i in keep),
        batch_axis=mesh.batch_axis,
        dcn=tuple(mesh.dcn[i] for i in keep) if mesh.dcn else None,
    )


def check_blocks(tensors, mesh: MeshConfig, pipeline: PipelineConfig, model: str) -> None:
    """ConfigError when a mesh with a stage axis meets a model without repeated blocks, or blocks
    that the stage axis does not split into equal stages."""
    stacks = stacked(tensors)
    if not stacks:
        raise ConfigError(
            "mesh.axis_names",
            f"got {list(mesh.axis_names)}: axis {pipeline.axis!r} asks for pipeline stages (pipeline.axis), "
            f"but {model} has no repeated blocks to split; models with blocks: model=transformer, "
            "model=keras_hub (its transformer_layers), and a model=python factory that makes "
            "its blocks with meshrun.pipeline.repeated_blocks; or name the axis otherwise",
        )
    blocks, stages, repeats = len(stacks[0].blocks), pipeline.stages(mesh), pipeline.repeats
    if blocks % (stages * repeats):
        valid = [n for n in range(1, blocks + 1) if blocks % (n * repeats) == 0]
        rounds = f" times pipeline.repeats={repeats}" if repeats > 1 else ""
        raise ConfigError(
            "mesh.shape",
            f"got {format_shape(mesh.shape)}: the stage axis {pipeline.axis!r} of size {stages}{rounds} does "
            f"not split {model}'s {blocks} blocks into stages of equal "
            f"length; valid sizes for {pipeline.axis!r}: {one_of(valid)}",
        )


def stacked_rules(
    rules: tuple[LayoutRule, ...], mesh: MeshConfig, tensors, axis: str
) -> tuple[tuple[LayoutRule, ...], tuple[ConfigError, ...], tuple[Bend, ...]]:
    """The rules a pipelined run gives Keras, the problems of `rules` as the model with separate
    blocks would meet them, and the dimensions lenient rules left whole there: the rules that place
    anything besides block weights (an exact one for each such path with a dimension left whole),
    then one exact rule per stacked variable (`axis` for its first dimension, the axes its blocks'
    weights got for the rest)."""
    view = per_block_view(tensors)
    check = check_rules(rules, mesh, view)
    errors = list(check.errors)
    block_paths = {path for tensor in stacked(tensors) for path in tensor.blocks}
    elsewhere = [rule for path, rule in check.assigned.items() if path not in block_paths]
    used_elsewhere = {rule.derived_from or rule.pattern for rule in elsewhere}
    exact_elsewhere = [
        rule
        for path, rule in check.assigned.items()
        if path not in block_paths and rule.pattern == path and rule.derived_from
    ]
    kept = replacing(
        tuple(exact_elsewhere),
        tuple(rule for rule in rules if rule.pattern in used_elsewhere or rule.optional),
    )
    derived = []
    for tensor in stacked(tensors):
        axes, problem = _block_axes(tensor, check.assigned, axis)
        if problem:
            errors.append(problem)
            continue
        source = check.assigned.get(tensor.blocks[0])
        leading = (axis,) if lead(tensor) == 1 else (None, axis)  # the circular schedule's rounds stay whole
        derived.append(
            LayoutRule(
                tensor.path,
                (*leading, *axes),
                origin=source.origin if source else "pipeline",
                derived_from=(source.derived_from or source.pattern) if source else None,
            )
        )
    return (*kept, *derived), tuple(errors), check.bends


def _block_axes(
    tensor: TensorSpec, assigned: dict[str, LayoutRule], axis: str
) -> tuple[tuple, ConfigError | None]:
    """The axes every block's slice of stacked `tensor` gets, or the problem: blocks placed
    differently from each other, or a block weight's dimension put on the stage axis."""
    placements = {
        path: assigned[path].axes if path in assigned else (None,) * (len(tensor.shape) - lead(tensor))
        for path in tensor.blocks
    }
    first = tensor.blocks[0]
    rule = assigned.get(first)
    differing = [path for path in tensor.blocks if placements[path] != placements[first]]
    if differing:
        odd = differing[0]
        key = (assigned.get(odd) or rule).key
        return (), ConfigError(
            key,
            f"places {odd!r} as {_axes(placements[odd])} but {first!r} is placed as "
            f"{_axes(placements[first])}; pipelined blocks are held "
            "stacked, so every block's weight must be placed alike",
        )
    if axis in placements[first]:
        return (), ConfigError(
            rule.key,
            f"puts a dimension of block weight {first!r} on {axis!r}, the pipeline's stage axis, which "
            "already holds the blocks' stages; use another mesh axis (or null) for it",
        )
    return placements[first], None


def _axes(axes) -> str:
    return "[" + ", ".join("null" if a is None else a for a in axes) + "]"


@dataclass(frozen=True)
class PipelinePlan:
    """What pipeline stages do to a run, worked out before it is built: the stage axis, the stages
    and which blocks each holds, the microbatches and their rows (in all, and on each data replica),
    the rounds of the circular schedule (`repeats`; 1: GPipe), the schedule's idle share of a step,
    and the block inputs it keeps for the backward pass on each device (all it keeps with remat;
    without, each block's intermediate activations come on top, which XLA's memory figures of the
    run count)."""

    axis: str
    stages: int
    blocks: int
    microbatches: int
    repeats: int
    microbatch_rows: int
    microbatch_rows_per_replica: int
    bubble_fraction: float
    remat: bool
    kept_activation_bytes_per_device: int | None
    stage_blocks: tuple[tuple[str, ...], ...]
    block_output_bytes_per_row: int | None = None  # what a stage hands the next for one row

    def to_dict(self) -> dict:
        """The pipeline as plan.json holds it."""
        data = dataclasses.asdict(self)
        data["stage_blocks"] = [list(blocks) for blocks in self.stage_blocks]
        return data


def pipeline_plan(tensors, mesh: MeshConfig, pipeline: PipelineConfig, batch_size: int) -> PipelinePlan:
    """The PipelinePlan of a model's abstract `tensors` (stacked variables and layer outputs) on
    `mesh`, its stage axis and blocks already checked (check_blocks)."""
    stacks = stacked(tensors)
    names = _block_names(stacks[0])
    stages, microbatches, repeats = pipeline.stages(mesh), pipeline.microbatches_on(mesh), pipeline.repeats
    per_stage = len(names) // stages
    replicas = mesh.axis_size(mesh.batch_axis)
    rows = batch_size // microbatches
    output_per_row = _output_bytes_per_row(tensors, stacks[0])
    ticks = repeats * microbatches + stages - 1
    return PipelinePlan(
        axis=pipeline.axis,
        stages=stages,
        blocks=len(names),
        microbatches=microbatches,
        repeats=repeats,
        microbatch_rows=rows,
        microbatch_rows_per_replica=rows // replicas,
        bubble_fraction=bubble_fraction(stages, microbatches, repeats),
        remat=pipeline.remat,
        kept_activation_bytes_per_device=_kept_bytes(
            output_per_row, per_stage // repeats, ticks, rows // replicas
        ),
        block_output_bytes_per_row=output_per_row,
        stage_blocks=tuple(
            tuple(
                name
                for block, name in enumerate(names)
                if stage_of_block(block, len(names), stages, repeats) == stage
            )
            for stage in range(stages)
        ),
    )


def _block_names(tensor: TensorSpec) -> tuple[str, ...]:
    """The path of each block: its variable paths less the trailing part they share (the path
    inside the block)."""
    parts = [path.split("/") for path in tensor.blocks]
    shared = 0
    while shared < len(parts[0]) - 1 and len({tuple(p[len(p) - shared - 1 :]) for p in parts}) == 1:
        shared += 1
    return tuple("/".join(p[: len(p) - shared]) for p in parts)


def _output_bytes_per_row(tensors, stack: TensorSpec) -> int | None:
    """The bytes of one row of the blocks' output (None when the stack's output shape is not known)."""
    output = next(
        (t for t in tensors if t.is_output and t.path == f"{stack.path.rsplit('/', 1)[0]}/output"), None
    )
    if output is None or any(size is None for size in output.shape[1:]):
        return None
    return math.prod(output.shape[1:]) * output.itemsize


def _kept_bytes(per_row: int | None, per_stage: int, ticks: int, rows: int) -> int | None:
    """The block inputs a stage keeps for the backward pass: one per block, tick and row, each the
    size of the blocks' output per row (None when that is not known)."""
    return None if per_row is None else ticks * per_stage * rows * per_row
