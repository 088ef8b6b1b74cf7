"""Layout rules checked against a model's real variables and layer outputs, before training.

Keras' LayoutMap looks a path up as an exact key first, then tries every key as a regex with
re.fullmatch; a path no rule matches is silently replicated, two matches raise, and a rule of the
wrong rank only fails deep inside the build. meshrun applies the same matching here, on shapes
alone, and turns every such problem into a ConfigError that names the rule and the path.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from meshrun.config.layout_schema import LayoutRule, MeshConfig
from meshrun.errors import ConfigError
from meshrun.specs.quantized import QuantizedOf
from meshrun.wording import closest, format_bytes, format_shape, one_of, shape_text


@dataclass(frozen=True)
class TensorSpec:
    """A variable or a `<layer>/output` of the model: its path, shape (None: unknown size, such as
    the batch dimension of an output), element type, whether it trains (False: frozen, such as
    the weights LoRA leaves as they are; the optimizer keeps no state for it), and for a stacked
    variable of pipelined blocks, the per-block paths its slices hold along its first dimension;
    for a variable of a quantized layer (model.quantize), the float kernel it stands for."""

    path: str
    shape: tuple[int | None, ...]
    is_output: bool = False
    dtype: str = "float32"
    itemsize: int = 4
    trainable: bool = True
    blocks: tuple[str, ...] = ()
    quantized: QuantizedOf | None = None


# The variables a LoRA adapter adds to a layer (Keras' Dense, EinsumDense and Embedding).
LORA_ADAPTER = re.compile(r"(.*/)?lora_(kernel|embeddings)_[ab]")


def is_lora_adapter(path: str) -> bool:
    """Whether the variable at `path` is one of a LoRA adapter's two factors."""
    return LORA_ADAPTER.fullmatch(path) is not None


@dataclass(frozen=True)
class Bend:
    """A path a lenient rule (LayoutRule.replicate_if_indivisible) places with some dimensions left
    whole, because their mesh axis does not divide them: the rule as written, the path's shape and
    bytes, and each such dimension as (dimension, mesh axis)."""

    rule: LayoutRule
    path: str
    shape: tuple[int, ...]
    bytes: int
    whole: tuple[tuple[int, str], ...]

    @property
    def exact_rule(self) -> LayoutRule:
        """The rule Keras gets for this path alone: the written rule's axes, but None for the
        dimensions left whole (Keras looks an exact key up before any pattern)."""
        kept = {dim for dim, _ in self.whole}
        axes = tuple(None if dim in kept else axis for dim, axis in enumerate(self.rule.axes))
        return LayoutRule(
            self.path, axes, origin=self.rule.origin, derived_from=self.rule.derived_from or self.rule.pattern
        )


@dataclass(frozen=True)
class RuleCheck:
    """What the rules do to a model: the rule that places each path, every problem found (rules
    matching nothing, paths matched twice, rank mismatches, indivisible dimensions), the optional
    rules that matched nothing (not a problem, but worth saying for the model's own), the paths a
    rule matches but does not fit (`misfits`, so that a plan shows the rule the lint names), and
    the paths lenient rules placed with dimensions left whole (`bends`: `assigned` holds the exact
    rule of each)."""

    assigned: dict[str, LayoutRule]
    errors: tuple[ConfigError, ...]
    unmatched_optional: tuple[LayoutRule, ...] = ()
    misfits: dict[str, LayoutRule] = field(default_factory=dict)
    bends: tuple[Bend, ...] = ()

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
    fit it is left unassigned (a misfit), and a lenient rule's indivisible dimensions are left whole."""
    assigned: dict[str, LayoutRule] = {}
    misfits: dict[str, LayoutRule] = {}
    bends: list[Bend] = []
    matched: set[str] = set()
    problems: dict[tuple, list[ConfigError]] = {}
    for tensor in tensors:
        matches = matching_rules(rules, tensor.path)
        matched.update(
            pattern for rule in matches for pattern in (rule.pattern, rule.derived_from) if pattern
        )
        if len(matches) > 1:
            names = [repr(rule.pattern) for rule in matches]
            if len(set(names)) < len(names):  # one pattern twice: say where each came from
                names = [f"{name} ({rule.origin})" for name, rule in zip(names, matches, strict=True)]
            problem = ConfigError(
                "layout.rules",
                f"{tensor.path!r} is matched by {len(matches)} rules, {' and '.join(names)}; "
                "make the patterns exclusive so each path matches at most one",
            )
            problems.setdefault(tuple(names), []).append(problem)
        elif matches:
            rule = matches[0]
            problem = _rank_misfit(rule, tensor)
            whole = () if problem else _indivisible(rule, mesh, tensor)
            if whole and rule.replicate_if_indivisible:
                bend = Bend(
                    rule, tensor.path, tuple(tensor.shape), math.prod(tensor.shape) * tensor.itemsize, whole
                )
                bends.append(bend)
                assigned[tensor.path] = bend.exact_rule
                continue
            problem = problem or (_indivisible_error(rule, mesh, tensor, whole[0][0]) if whole else None)
            if problem:
                problems.setdefault((rule.pattern,), []).append(problem)
                misfits[tensor.path] = rule
            else:
                assigned[tensor.path] = rule
    errors = [_with_count(found) for found in problems.values()]
    errors += _unused_rules(rules, matched, tensors)
    unmatched_optional = tuple(rule for rule in rules if rule.optional and rule.pattern not in matched)
    return RuleCheck(
        assigned=assigned,
        errors=tuple(errors),
        unmatched_optional=unmatched_optional,
        misfits=misfits,
        bends=tuple(bends),
    )


def with_bends(
    rules: tuple[LayoutRule, ...], mesh: MeshConfig, tensors: list[TensorSpec]
) -> tuple[tuple[LayoutRule, ...], tuple[Bend, ...]]:
    """The rules Keras gets for `tensors`: an exact rule for each path a lenient rule places with a
    dimension left whole, then `rules`; and those bends (for the plan's notes)."""
    bends = check_rules(rules, mesh, tensors).bends
    return replacing(tuple(bend.exact_rule for bend in bends), rules), bends


def replacing(exact: tuple[LayoutRule, ...], rules: tuple[LayoutRule, ...]) -> tuple[LayoutRule, ...]:
    """`exact` rules (one path each) first, then `rules` less any whose pattern is one of those
    paths: a written rule that is the exact path of a rule derived from it (bent, quantized) gives
    way to it rather than standing beside it (Keras would see two keys for one path)."""
    replaced = {rule.pattern for rule in exact}
    return (*exact, *(rule for rule in rules if rule.pattern not in replaced))


def with_extra_rules(rules: tuple[LayoutRule, ...], extra: tuple[LayoutRule, ...]) -> tuple[LayoutRule, ...]:
    """A layout's `rules` (or the model's own map) with layout.extra_rules on top: an extra rule
    with the pattern of one of them replaces it, the others are added."""
    replaced = {rule.pattern for rule in extra}
    return (*(rule for rule in rules if rule.pattern not in replaced), *extra)


def bend_notes(bends: tuple[Bend, ...], mesh: MeshConfig) -> list[str]:
    """One note for each lenient rule that left dimensions whole: the first path, why, what it
    costs and how many more paths it did the same to."""
    by_rule: dict[str, list[Bend]] = {}
    for bend in bends:
        by_rule.setdefault(bend.rule.pattern, []).append(bend)
    notes = []
    for pattern, found in by_rule.items():
        first = found[0]
        dim, axis = first.whole[0]
        more = (
            f"; the same for {len(found) - 1} more path{'s' if len(found) > 2 else ''}"
            if len(found) > 1
            else ""
        )
        notes.append(
            f"rule '{pattern}'{_origin_text(first.rule)} cannot split dimension {dim} of {first.path!r} "
            f"(size {first.shape[dim]}, shape {shape_text(first.shape)}) over mesh axis {axis!r} of size "
            f"{mesh.axis_size(axis)}, so it keeps that dimension whole, replicated "
            f"over {axis!r}{more} ({format_bytes(sum(b.bytes for b in found))} in all)"
        )
    return notes


def _origin_text(rule: LayoutRule) -> str:
    return f" ({rule.origin})" if rule.origin != "rules" else ""


def _with_count(found: list[ConfigError]) -> ConfigError:
    """The first of several problems of one rule, saying how many more paths share it."""
    first = found[0]
    if len(found) == 1:
        return first
    message = str(first).removeprefix(f"{first.key}: ")
    more = len(found) - 1
    return ConfigError(
        first.key, f"{message} (and {more} more path{'s' if more > 1 else ''} matched the same way)"
    )


def assign_rules(
    rules: tuple[LayoutRule, ...], mesh: MeshConfig, tensors: list[TensorSpec]
) -> dict[str, LayoutRule]:
    """Maps each tensor path to the rule that places it; raises ConfigError for the first of: two
    rules on one path, a rank mismatch, an indivisible dimension, a rule that matches nothing."""
    check = check_rules(rules, mesh, tensors)
    check.raise_first()
    return check.assigned


def _subject(rule: LayoutRule, tensor: TensorSpec) -> tuple[str, str]:
    """How an error names the rule (the model's own rules say so) and what it places."""
    return (
        "the model's own rule " + repr(rule.pattern) + " " if rule.origin == "from_model" else "",
        "output" if tensor.is_output else "variable",
    )


def _rank_misfit(rule: LayoutRule, tensor: TensorSpec) -> ConfigError | None:
    """The error of a rule with another number of axes than `tensor` has dimensions, if it has."""
    if len(rule.axes) == len(tensor.shape):
        return None
    subject, what = _subject(rule, tensor)
    return ConfigError(
        rule.key,
        f"{subject}gives {len(rule.axes)} axes {_axes_text(rule.axes)} but {what} {tensor.path!r} has "
        f"rank {len(tensor.shape)} (shape {shape_text(tensor.shape)}); give exactly "
        f"{len(tensor.shape)} entries, one mesh axis or null per dimension",
    )


def _indivisible(rule: LayoutRule, mesh: MeshConfig, tensor: TensorSpec) -> tuple[tuple[int, str], ...]:
    """The dimensions of `tensor` (of the rule's rank) that the rule puts on a mesh axis whose size
    does not divide them, as (dimension, axis); dimensions of unknown size divide."""
    return tuple(
        (dim, axis)
        for dim, (size, axis) in enumerate(zip(tensor.shape, rule.axes, strict=True))
        if axis is not None and size is not None and size % mesh.axis_size(axis)
    )


def _indivisible_error(rule: LayoutRule, mesh: MeshConfig, tensor: TensorSpec, dim: int) -> ConfigError:
    """The error of a rule that shards dimension `dim` of `tensor` over an axis that does not divide it."""
    subject, what = _subject(rule, tensor)
    size, axis = tensor.shape[dim], rule.axes[dim]
    axis_size = mesh.axis_size(axis)
    fitting = [a for a in mesh.axis_names if size % mesh.axis_size(a) == 0]
    whole = _axes_text(tuple(None if d == dim else a for d, a in enumerate(rule.axes))).replace(" ", "")
    replace = (
        f"; 'layout.extra_rules={{{rule.pattern}:{whole}}}' replaces the rule with one that keeps it whole"
        if rule.origin == "rules"
        else ""
    )
    return ConfigError(
        rule.key,
        f"{subject}shards dimension {dim} of {what} {tensor.path!r} (size {size}, shape "
        f"{shape_text(tensor.shape)}) over mesh axis {axis!r} of size {axis_size}, which "
        f"does not divide {size} on mesh {format_shape(mesh.shape)}; valid for this "
        f"dimension: {one_of(['null', *fitting])}{replace}",
    )


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
