"""Layout rules checked against a model's real variables and layer outputs, before training.

Keras' LayoutMap looks a path up as an exact key first, then tries every key as a regex with
re.fullmatch; a path no rule matches is silently replicated, two matches raise, and a rule of the
wrong rank only fails deep inside the build. meshrun applies the same matching here, on shapes
alone, and turns every such problem into a ConfigError that names the rule and the path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from meshrun.errors import ConfigError, closest, one_of
from meshrun.schema import LayoutRule, MeshConfig, format_shape


@dataclass(frozen=True)
class TensorSpec:
    """A variable or a `<layer>/output` of the model: its path and shape (None: unknown size,
    such as the batch dimension of an output)."""

    path: str
    shape: tuple[Optional[int], ...]
    is_output: bool = False


def matching_rules(rules: tuple[LayoutRule, ...], path: str) -> list[LayoutRule]:
    """The rules Keras would consider for `path`: the exact key if there is one, else every
    rule whose regex fullmatches."""
    exact = [rule for rule in rules if rule.pattern == path]
    if exact:
        return exact
    return [rule for rule in rules if re.fullmatch(rule.pattern, path)]


def assign_rules(
    rules: tuple[LayoutRule, ...], mesh: MeshConfig, tensors: list[TensorSpec]
) -> dict[str, LayoutRule]:
    """Maps each tensor path to the rule that places it; raises ConfigError for two rules on one
    path, a rank mismatch, an indivisible dimension, or a rule that matches nothing."""
    assigned: dict[str, LayoutRule] = {}
    for tensor in tensors:
        matches = matching_rules(rules, tensor.path)
        if len(matches) > 1:
            names = [repr(rule.pattern) for rule in matches]
            raise ConfigError(
                "layout.rules",
                f"{tensor.path!r} is matched by {len(matches)} rules, {' and '.join(names)}; "
                "make the patterns exclusive so each path matches at most one",
            )
        if matches:
            _check_fits(matches[0], mesh, tensor)
            assigned[tensor.path] = matches[0]
    _check_all_rules_used(rules, assigned, tensors)
    return assigned


def _check_fits(rule: LayoutRule, mesh: MeshConfig, tensor: TensorSpec) -> None:
    key = f"layout.rules.{rule.pattern}"
    what = "output" if tensor.is_output else "variable"
    if len(rule.axes) != len(tensor.shape):
        raise ConfigError(
            key,
            f"gives {len(rule.axes)} axes {_axes_text(rule.axes)} but {what} {tensor.path!r} has "
            f"rank {len(tensor.shape)} (shape {_shape_text(tensor.shape)}); give exactly "
            f"{len(tensor.shape)} entries, one mesh axis or null per dimension",
        )
    for dim, (size, axis) in enumerate(zip(tensor.shape, rule.axes)):
        if axis is None or size is None:
            continue
        axis_size = mesh.axis_size(axis)
        if size % axis_size:
            fitting = [a for a in mesh.axis_names if size % mesh.axis_size(a) == 0]
            raise ConfigError(
                key,
                f"shards dimension {dim} of {what} {tensor.path!r} (size {size}, shape "
                f"{_shape_text(tensor.shape)}) over mesh axis {axis!r} of size {axis_size}, which "
                f"does not divide {size} on mesh {format_shape(mesh.shape)}; valid for this "
                f"dimension: {one_of(['null', *fitting])}",
            )


def _check_all_rules_used(rules, assigned, tensors) -> None:
    used = {rule.pattern for rule in assigned.values()}
    paths = [t.path for t in tensors]
    for rule in rules:
        if rule.pattern in used:
            continue
        near = closest(rule.pattern, paths, n=3) or paths[:3]
        raise ConfigError(
            f"layout.rules.{rule.pattern}",
            f"matches no variable or output of the model (patterns must match the whole path); "
            f"closest real paths: {', '.join(near)}",
        )


def _axes_text(axes) -> str:
    return "[" + ", ".join("null" if a is None else a for a in axes) + "]"


def _shape_text(shape) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
