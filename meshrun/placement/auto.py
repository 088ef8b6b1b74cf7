"""`layout=auto`: layout rules derived from a model's real variables and the mesh, so that any model
can be sharded without hand-written rules.

Every variable of at least `min_bytes` is split over each mesh axis besides the batch axis (the
largest axis first) along a dimension that divides by the axis size: tensor parallelism. With
`fsdp`, it is also split over the batch axis along another dimension: fully sharded data
parallelism. Which dimension:

- The model's width is the dimension size shared by the most large variables (d_model in a
  transformer). Tensor parallelism prefers the outermost dimension that is not the width, so that
  q/k/v and the output projection split by heads, MLP kernels by their hidden size (column- then
  row-parallel) and embeddings by rows (the vocabulary); dimensions under MIN_SPLIT_SIZE (kernel
  windows) come last. FSDP prefers the width, then the largest dimension left.
- Embedding tables (paths ending in `/embeddings`) split by rows first.
- Attention projections (the kernels and biases of layers named like Keras' MultiHeadAttention's:
  query, key, value, attention_output) keep their heads whole: tensor parallelism splits only
  their heads dimension, never head_dim, and leaves them replicated over an axis that does not
  divide the heads (the plan says so in a warning).

The result is ordinary rules with origin `auto`: the rules of paths that differ only by a number
(a block index) are collapsed into one pattern (`block_\\d+/mlp_up/kernel`) where that pattern
matches exactly those paths and they all get the same axes. Plain Python over shapes; no jax.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from meshrun.config.layout_schema import AxisSpec, LayoutRule, MeshConfig
from meshrun.config.slices import across_processes
from meshrun.placement.layout import TensorSpec, is_lora_adapter, matching_rules
from meshrun.wording import format_bytes, format_shape, one_of

ORIGIN = "auto"
MIN_SPLIT_SIZE = 8  # smaller dimensions (a conv kernel's window) are split only when nothing else divides
_NUMBER = re.compile(r"\d+")
# Layers whose variables hold attention heads: Keras' MultiHeadAttention and KerasHub's attention
# layers name their projections so (zoo transformer, GPT-2, Llama, Gemma, Mistral, Qwen, ...).
ATTENTION_LAYERS = frozenset(
    {"query", "key", "value", "attention_output", "query_dense", "key_dense", "value_dense"}
)


@dataclass(frozen=True)
class AutoLayout:
    """What `layout=auto` decided: its rules, a warning when it shards nothing (why, and the
    largest variable, which is what a user would want sharded), one for each mesh axis that
    attention projections stay replicated over because it does not divide their heads, and one for
    each axis it left out because it spans processes."""

    rules: tuple[LayoutRule, ...]
    warning: str | None = None
    heads_kept_whole: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()

    @property
    def warnings(self) -> tuple[str, ...]:
        """Every warning, for the plan's lint."""
        return (*self.left_out, *((self.warning,) if self.warning else ()), *self.heads_kept_whole)


def derive_layout(
    variables: list[TensorSpec],
    mesh: MeshConfig,
    min_bytes: int,
    fsdp: bool,
    taken: tuple[LayoutRule, ...] = (),
) -> AutoLayout:
    """The rules of `layout=auto` for `variables` on `mesh`. Variables matched by one of `taken`
    (layout.extra_rules, which take precedence) are left to those; LoRA adapters stay replicated
    (they are small, and splitting them only adds collectives)."""
    free = [v for v in variables if not matching_rules(taken, v.path) and not is_lora_adapter(v.path)]
    large = [v for v in free if v.shape and _bytes(v) >= min_bytes]
    width = model_width(large)
    placed = {}
    for v in large:
        axes = place_variable(
            v.shape, mesh, fsdp, width, _is_embedding(v.path), heads_dimension(v.path, v.shape, width)
        )
        if axes:
            placed[v.path] = axes
    rules = collapse(placed, [v.path for v in variables])
    return AutoLayout(
        rules=rules,
        warning=None if rules else _nothing_placed(free, large, mesh, min_bytes, fsdp),
        heads_kept_whole=_heads_kept_whole(large, mesh, width),
        left_out=_axes_left_out(mesh),
    )


def model_width(variables: list[TensorSpec]) -> int | None:
    """The dimension size shared by the most of `variables` (each counted once; sizes under
    MIN_SPLIT_SIZE left out), the larger size on a tie; None when no size is shared."""
    counts = Counter(size for v in variables for size in set(v.shape) if size >= MIN_SPLIT_SIZE)
    if not counts:
        return None
    size, count = max(counts.items(), key=lambda item: (item[1], item[0]))
    return size if count > 1 else None


def place_variable(
    shape: tuple[int, ...],
    mesh: MeshConfig,
    fsdp: bool,
    width: int | None,
    embedding: bool = False,
    heads_at: int | None = None,
) -> tuple[AxisSpec, ...] | None:
    """The axes for one large variable, or None when no axis of the mesh divides any dimension.
    `heads_at`: the dimension holding an attention projection's heads, the only one tensor
    parallelism may split (None: not an attention projection)."""
    axes: list[AxisSpec] = [None] * len(shape)
    order = [heads_at] if heads_at is not None else _tensor_parallel_order(shape, width, embedding)
    for axis in _model_axes(mesh):
        _split(axes, shape, axis, mesh.axis_size(axis), order)
    if fsdp and mesh.axis_size(mesh.batch_axis) > 1:
        _split(axes, shape, mesh.batch_axis, mesh.axis_size(mesh.batch_axis), _fsdp_order(shape, width))
    return tuple(axes) if any(axes) else None


def _model_axes(mesh: MeshConfig) -> list[str]:
    """The axes tensor parallelism splits over: every axis of more than one device besides the
    batch axis and those that span processes (mesh.dcn: their collectives would cross the slow
    network), the largest first."""
    crossing = across_processes(mesh)
    return sorted(
        (a for a in mesh.axis_names if a != mesh.batch_axis and mesh.axis_size(a) > 1 and a not in crossing),
        key=lambda a: -mesh.axis_size(a),
    )


def _axes_left_out(mesh: MeshConfig) -> tuple[str, ...]:
    """A warning for each axis besides the batch axis that layout=auto leaves unused because it
    spans processes."""
    return tuple(
        f"layout=auto splits nothing over mesh axis {a!r}: it spans {mesh.dcn[mesh.axis_names.index(a)]} "
        "processes (mesh.dcn), and tensor parallelism over the slow network between them costs more than it "
        "saves; keep that axis within a process (mesh.dcn) or give it size 1"
        for a in across_processes(mesh)
        if a != mesh.batch_axis
    )


def heads_dimension(path: str, shape: tuple[int, ...], width: int | None) -> int | None:
    """The dimension holding the heads of an attention projection (a variable of a layer in
    ATTENTION_LAYERS with two dimensions besides the width: heads, then head_dim, innermost), or
    None for any other variable. Keras' and KerasHub's layouts: query (width, heads, head_dim),
    Gemma's (heads, width, head_dim), attention_output (heads, head_dim, width), biases (heads, head_dim)."""
    layer = path.rsplit("/", 2)[-2] if "/" in path else ""
    others = [d for d, size in enumerate(shape) if size != width]
    if layer not in ATTENTION_LAYERS or len(others) < 2:
        return None
    return others[-2]


def _heads_kept_whole(large: list[TensorSpec], mesh: MeshConfig, width: int | None) -> tuple[str, ...]:
    """One warning per mesh axis that attention projections stay replicated over because it does
    not divide their heads (splitting head_dim instead would cut every head across devices)."""
    heads_of = {
        v.path: v.shape[d] for v in large if (d := heads_dimension(v.path, v.shape, width)) is not None
    }
    warnings = []
    for axis in _model_axes(mesh):
        kept = [v for v in large if v.path in heads_of and heads_of[v.path] % mesh.axis_size(axis)]
        if not kept:
            continue
        first = kept[0]
        heads = sorted({heads_of[v.path] for v in kept})
        more = f" and {len(kept) - 1} more attention variables" if len(kept) > 1 else ""
        warnings.append(
            f"layout=auto keeps attention heads whole: {first.path} ({format_shape(first.shape)}){more} "
            f"{'have' if more else 'has'} {one_of(heads)} heads, which mesh axis {axis!r} (size "
            f"{mesh.axis_size(axis)}) does not divide: kept replicated over {axis!r} rather than split along "
            f"head_dim; a {axis!r} axis whose size divides the heads shards them"
        )
    return tuple(warnings)


def _split(axes: list[AxisSpec], shape, axis: str, size: int, order: list[int]) -> None:
    """Puts `axis` on the first dimension in `order` that is free and divides by its size."""
    for dim in order:
        if axes[dim] is None and shape[dim] % size == 0:
            axes[dim] = axis
            return


def _tensor_parallel_order(shape, width: int | None, embedding: bool) -> list[int]:
    dims = list(range(len(shape)))
    if embedding:
        return dims  # rows (the vocabulary) first
    return sorted(dims, key=lambda d: (shape[d] == width, shape[d] < MIN_SPLIT_SIZE, d))


def _fsdp_order(shape, width: int | None) -> list[int]:
    return sorted(range(len(shape)), key=lambda d: (shape[d] != width, -shape[d], d))


def collapse(placed: dict[str, tuple[AxisSpec, ...]], all_paths: list[str]) -> tuple[LayoutRule, ...]:
    """Rules for `placed` (path -> axes): one pattern for the paths that differ only by numbers
    where the pattern matches exactly those paths (among `all_paths`) and gives them all the same
    axes, else one rule per path (its exact name)."""
    groups: dict[str, list[str]] = {}
    for path in placed:
        groups.setdefault(_number_pattern(path), []).append(path)
    rules = []
    for pattern, paths in groups.items():
        axes = {placed[p] for p in paths}
        covers = [p for p in all_paths if re.fullmatch(pattern, p)]
        if len(paths) > 1 and len(axes) == 1 and sorted(covers) == sorted(paths):
            rules.append(LayoutRule(pattern, placed[paths[0]], origin=ORIGIN))
        else:
            rules += [LayoutRule(re.escape(p), placed[p], origin=ORIGIN) for p in paths]
    return tuple(rules)


def _number_pattern(path: str) -> str:
    """`path` as a regex in which every number may be any number: block_3/mlp/kernel ->
    block_\\d+/mlp/kernel."""
    pieces = _NUMBER.split(path)
    return r"\d+".join(re.escape(piece) for piece in pieces)


def _is_embedding(path: str) -> bool:
    """An Embedding layer's table (vocabulary, width); a reverse embedding (width, vocabulary) is
    left to the width rule, which splits its vocabulary too."""
    return path.rsplit("/", 1)[-1] == "embeddings"


def _bytes(variable: TensorSpec) -> int:
    count = variable.itemsize
    for size in variable.shape:
        count *= size
    return count


def _nothing_placed(free, large, mesh: MeshConfig, min_bytes: int, fsdp: bool) -> str | None:
    """The warning for a mesh on which auto shards nothing, naming the largest variable."""
    if (mesh.size or 1) <= 1 or not free:
        return None
    largest = max(free, key=_bytes)
    named = (
        f"the largest is {largest.path} ({format_shape(largest.shape, 'scalar')}, "
        f"{format_bytes(_bytes(largest))})"
    )
    others = _model_axes(mesh)
    if not others and not fsdp and _axes_left_out(mesh):
        return None  # the axes spanning processes were left out, and say so
    if not others and not fsdp:
        return (
            f"layout=auto shards nothing on mesh {format_shape(mesh.shape)}: no axis besides the batch axis "
            f"{mesh.batch_axis!r} has more than one device, so every variable is replicated ({named}); "
            "layout.fsdp=true splits variables over the batch axis too"
        )
    if not large:
        return (
            f"layout=auto shards nothing: no variable reaches layout.min_bytes={format_bytes(min_bytes)}, so "
            f"every variable is replicated ({named}); lower layout.min_bytes to shard smaller ones"
        )
    used = others + ([mesh.batch_axis] if fsdp else [])
    sizes = ", ".join(f"{a}={mesh.axis_size(a)}" for a in used)
    return (
        f"layout=auto shards nothing on mesh {format_shape(mesh.shape)}: no dimension of any variable of at "
        f"least {format_bytes(min_bytes)} divides by the axis "
        f"sizes ({sizes}), so every variable is replicated ({named})"
    )
