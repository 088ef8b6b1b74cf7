"""Layout rules written for float kernels, carried over to their quantized form (model.quantize).

A rule for a float `.../kernel` (a family layout's, the user's, the model's own map) is what a
user writes; quantization (meshrun.quantize) gives the layer other variables at the same
place: an int8 kernel of the same shape, or an int4 kernel reshaped to (rows, columns) and packed
two columns to a byte, and scales (zero points) per output column or block of rows. Each gets an
exact rule of its own here, mapped from its kernel's rule dimension by dimension; a mesh axis
that no longer splits its dimension evenly (or splits no single dimension of the packed form) is
replicated over instead, and the plan says so. Rules layout=auto derives are left alone: it
derives them from the quantized variables themselves.
"""

from __future__ import annotations

import math

from meshrun.config.layout_schema import LayoutRule, MeshConfig
from meshrun.specs.quantized import COLUMNS, ROWS, QuantizedOf
from meshrun.wording import shape_text


def carried_axes(q: QuantizedOf, float_axes: tuple, mesh: MeshConfig):
    """The axes for the quantized variable `q` given its float kernel's `float_axes`, and, for a
    kernel, the (float dimension, mesh axis) pairs that could not be carried over (replicated
    over instead)."""
    axes = []
    carried: set[int] = set()
    for holds in q.holds:
        if holds is None:
            axes.append(None)
        elif isinstance(holds, int):
            axes.append(float_axes[holds])
            carried.add(holds)
        else:
            axes.append(_reshaped_axis(q, float_axes, mesh, holds, carried))
    lost = [(d, name) for d, name in enumerate(float_axes) if name is not None and d not in carried]
    return tuple(axes), (lost if q.role == "kernel" else [])


def _reshaped_axis(q: QuantizedOf, float_axes: tuple, mesh: MeshConfig, holds: str, carried: set[int]):
    """The mesh axis the ROWS or COLUMNS dimension of int4's reshape can be split over: that of
    the float axis whose blocks are whole blocks of it (for ROWS, the first axis larger than 1;
    for COLUMNS, the axis from which on the float axes make up the columns), where it divides
    the dimension (COLUMNS packed: into blocks of an even number of columns); else None."""
    shape = q.float_shape
    columns = math.prod(shape) // q.rows
    for axis, name in enumerate(float_axes):
        if name is None or axis in carried:
            continue
        size = mesh.axis_size(name)
        if holds == ROWS and math.prod(shape[:axis]) == 1 and q.rows % size == 0:
            carried.add(axis)
            return name
        if holds == COLUMNS and math.prod(shape[axis:]) == columns:
            unit = 2 * size if q.packed else size
            if columns % unit == 0:
                carried.add(axis)
                return name
    return None


def quantized_rules(
    rules: tuple[LayoutRule, ...], mesh: MeshConfig, tensors
) -> tuple[tuple[LayoutRule, ...], list[str]]:
    """`rules` with an exact rule first for each quantized variable whose float kernel a written
    rule places, mapped through the quantization (carried_axes); a written rule that is that
    variable's exact path gives way to it. And a note per rule for the mesh axes it could not
    carry over. Variables whose float kernel no rule (or several) places are left to the rules as
    they are (the checks report those)."""
    from meshrun.placement.layout import matching_rules, replacing

    exact, lost_by_rule = [], {}
    for tensor in tensors:
        q = getattr(tensor, "quantized", None)
        if q is None:
            continue
        matches = [r for r in matching_rules(rules, q.kernel) if r.origin != "auto"]
        if len(matches) != 1 or len(matches[0].axes) != len(q.float_shape):
            continue
        rule = matches[0]
        if q.holds == tuple(range(len(q.float_shape))):
            continue  # int8's kernel: the rule fits it as it is
        written = _divisible(rule, q.float_shape, mesh)
        axes, lost = carried_axes(q, written, mesh)
        exact.append(
            LayoutRule(tensor.path, axes, origin=rule.origin, derived_from=rule.derived_from or rule.pattern)
        )
        if lost:
            lost_by_rule.setdefault(rule.pattern, []).append((tensor, lost))
    return replacing(tuple(exact), rules), [
        _lost_note(pattern, found) for pattern, found in lost_by_rule.items()
    ]


def _divisible(rule: LayoutRule, shape: tuple[int, ...], mesh: MeshConfig) -> tuple:
    """The rule's axes for a float kernel of `shape`, None where a lenient rule's axis does not
    divide its dimension (the checks report a strict rule's)."""
    return tuple(
        None
        if name is not None and rule.replicate_if_indivisible and shape[d] % mesh.axis_size(name)
        else name
        for d, name in enumerate(rule.axes)
    )


def _lost_note(pattern: str, found) -> str:
    tensor, lost = found[0]
    dims = ", ".join(f"dimension {d} over {name!r}" for d, name in lost)
    more = f"; the same for {len(found) - 1} more" if len(found) > 1 else ""
    return (
        f"rule '{pattern}' is written for the float kernel {tensor.quantized.kernel!r} "
        f"{shape_text(tensor.quantized.float_shape)}; its quantized form {shape_text(tensor.shape)} (int4: "
        f"reshaped to rows and columns, two columns a byte) cannot split {dims} the same way, so it is "
        f"replicated there{more}"
    )
