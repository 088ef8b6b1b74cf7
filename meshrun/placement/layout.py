"""Layout rules checked against a model's real variables and layer outputs, before training.

Keras' LayoutMap looks a path up as an exact key first, then tries every key as a regex with
re.fullmatch; a path no rule matches is silently replicated, two matches raise, and a rule of the
wrong rank only fails deep inside the build. meshrun applies the same matching here, on shapes
alone, and turns every such problem into a ConfigError that names the rule and the path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshrun.config.schema import LayoutRule, MeshConfig
from meshrun.errors import ConfigError
from meshrun.wording import closest, format_shape, one_of, shape_text


@dataclass(frozen=True)
class TensorSpec:
    """A variable or a `<layer>/output` of the model: its path, shape (None: unknown size, such as
    the batch dimension of an output), element type, whether it trains (False: frozen, such as
    the weights LoRA leaves as they are; the optimizer keeps no state for it), and for a stacked
    variable of pipelined blocks, the per-block paths its slices hold along its first dimension."""

    path: str
    shape: tuple[int | None, ...]
    is_output: bool = False
    dtype: str = "float32"
    itemsize: int = 4
    trainable: bool = True
    blocks: tuple[str, ...] = ()


# The variables a LoRA adapter adds to a layer (Keras' Dense, EinsumDense and Embedding).
LORA_ADAPTER = re.compile(r"(.*/)?lora_(kernel|embeddings)_[ab]")


def is_lora_adapter(path: str) -> bool:
    """Whether the variable at `path` is one of a LoRA adapter's two factors."""
    return LORA_ADAPTER.fullmatch(path) is not None


@dataclass(frozen=True)
class RuleCheck:
    """What the rules do to a model: the rule that places each path, every problem found (rules
    matching nothing, paths matched twice, rank mismatches, indivisible dimensions), and the
    optional rules that matched nothing (not a problem, but worth saying for the model's own)."""

    assigned: dict[str, LayoutRule]
    errors: tuple[ConfigError, ...]
    unmatched_optional: tuple[LayoutRule, ...] = ()

    def raise_first(self) -> None:
        """Raises the first problem found, if any (a run stops at the first)."""
        if self.errors:
            raise self.errors[0]


def matching_rules(rules: tuple[LayoutRule, ...], path: str) -> list[LayoutRule]:
    """The rules Keras would consider for `path`: the exact key if there is one, else every
    rule whose regex fullmatches."""
    exact = [rule for rule in rules if rule.pattern == path]
    if exact:
        return exact
    return [rule for rule in rules if re.fullmatch(rule.pattern, path)]


def check_rules(rules: tuple[LayoutRule, ...], mesh: MeshConfig, tensors: list[TensorSpec]) -> RuleCheck:
    """Applies `rules` to every tensor the way Keras would and collects every problem, one per rule
    (or pair of rules) with a count of the further paths it affects; a path whose rule does not
    fit it is left unassigned."""
    assigned: dict[str, LayoutRule] = {}
    matched: set[str] = set()
    problems: dict[tuple, list[ConfigError]] = {}
    for tensor in tensors:
        matches = matching_rules(rules, tensor.path)
        matched.update(rule.pattern for rule in matches)
        if len(matches) > 1:
            names = [repr(rule.pattern) for rule in matches]
            problem = ConfigError(
                "layout.rules",
                f"{tensor.path!r} is matched by {len(matches)} rules, {' and '.join(names)}; "
                "make the patterns exclusive so each path matches at most one",
            )
            problems.setdefault(tuple(names), []).append(problem)
        elif matches:
            problem = _misfit(matches[0], mesh, tensor)
            if problem:
                problems.setdefault((matches[0].pattern,), []).append(problem)
            else:
                assigned[tensor.path] = matches[0]
    errors = [_with_count(found) for found in problems.values()]
    errors += _unused_rules(rules, matched, tensors)
    unmatched_optional = tuple(rule for rule in rules if rule.optional and rule.pattern not in matched)
    return RuleCheck(assigned=assigned, errors=tuple(errors), unmatched_optional=unmatched_optional)


def _with_count(found: list[ConfigError]) -> ConfigError:
    """The first of several problems of one rule, saying how many more paths share it."""
    first = found[0]
    if len(found) == 1:
        return first
    message = str(first).removeprefix(f"{first.key}: ")
    more = len(found) - 1
    return ConfigError(first.key, f"{message} (and {more} more path{'s' if more > 1 else ''} matched the same way)")


def assign_rules(
    rules: tuple[LayoutRule, ...], mesh: MeshConfig, tensors: list[TensorSpec]
) -> dict[str, LayoutRule]:
    """Maps each tensor path to the rule that places it; raises ConfigError for the first of: two
    rules on one path, a rank mismatch, an indivisible dimension, a rule that matches nothing."""
    check = check_rules(rules, mesh, tensors)
    check.raise_first()
    return check.assigned


def _misfit(rule: LayoutRule, mesh: MeshConfig, tensor: TensorSpec) -> ConfigError | None:
    key = rule.key
    what = "output" if tensor.is_output else "variable"
    subject = f"the model's own rule {rule.pattern!r} " if rule.origin == "from_model" else ""
    if len(rule.axes) != len(tensor.shape):
        return ConfigError(
            key,
            f"{subject}gives {len(rule.axes)} axes {_axes_text(rule.axes)} but {what} {tensor.path!r} has "
            f"rank {len(tensor.shape)} (shape {shape_text(tensor.shape)}); give exactly "
            f"{len(tensor.shape)} entries, one mesh axis or null per dimension",
        )
    for dim, (size, axis) in enumerate(zip(tensor.shape, rule.axes, strict=False)):
        if axis is None or size is None:
            continue
        axis_size = mesh.axis_size(axis)
        if size % axis_size:
            fitting = [a for a in mesh.axis_names if size % mesh.axis_size(a) == 0]
            return ConfigError(
                key,
                f"{subject}shards dimension {dim} of {what} {tensor.path!r} (size {size}, shape "
                f"{shape_text(tensor.shape)}) over mesh axis {axis!r} of size {axis_size}, which "
                f"does not divide {size} on mesh {format_shape(mesh.shape)}; valid for this "
                f"dimension: {one_of(['null', *fitting])}",
            )
    return None


def _unused_rules(rules, matched: set[str], tensors) -> list[ConfigError]:
    paths = [t.path for t in tensors]
    errors = []
    for rule in rules:
        if rule.pattern in matched or rule.optional:
            continue
        near = closest(rule.pattern, paths, n=3) or paths[:3]
        errors.append(
            ConfigError(
                rule.key,
                f"matches no variable or output of the model (patterns must match the whole path); "
                f"closest real paths: {', '.join(near)}",
            )
        )
    return errors


def _axes_text(axes) -> str:
    return "[" + ", ".join("null" if a is None else a for a in axes) + "]"
