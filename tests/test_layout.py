"""Layout rules against variable shapes, on shapes alone (no jax): Keras' matching, and meshrun's
checks for what Keras would silently replicate or fail on late."""

import pytest

from meshrun.config.schema import LayoutRule, MeshConfig
from meshrun.errors import ConfigError
from meshrun.placement.layout import TensorSpec, assign_rules, check_rules, matching_rules

MESH = MeshConfig(shape=(2, 4), axis_names=("data", "model"), batch_axis="data")
TENSORS = [
    TensorSpec("d1/kernel", (784, 200)),
    TensorSpec("d2/kernel", (200, 10)),
    TensorSpec("d2/bias", (10,)),
    TensorSpec("d2/output", (None, 10), is_output=True),
]


def rule(pattern, *axes):
    return LayoutRule(pattern, tuple(axes))


def test_exact_key_wins_over_regexes_like_keras():
    rules = (rule("d.*/kernel", None, "model"), rule("d1/kernel", "model", None))
    assert matching_rules(rules, "d1/kernel") == [rules[1]]
    assert matching_rules(rules, "d2/kernel") == [rules[0]]


def test_patterns_must_match_the_whole_path():
    assert matching_rules((rule("kernel", None, "model"),), "d1/kernel") == []
    assert matching_rules((rule("d1", None, "model"),), "d1/kernel") == []


def test_seeds_rules_assign_and_leave_the_rest_replicated():
    rules = (rule("d1/kernel", None, "model"), rule("d2/output", "data", None))
    assigned = assign_rules(rules, MESH, TENSORS)
    assert {path: r.pattern for path, r in assigned.items()} == {"d1/kernel": "d1/kernel", "d2/output": "d2/output"}


def test_unknown_batch_dimension_of_an_output_is_not_checked_for_divisibility():
    assign_rules((rule("d2/output", "data", None),), MESH, TENSORS)


def test_two_matching_regexes_name_both():
    rules = (rule("d2/.*", None, None), rule(".*/kernel", None, "model"))
    with pytest.raises(ConfigError, match=r"'d2/kernel' is matched by 2 rules, 'd2/\.\*' and '\.\*/kernel'"):
        assign_rules(rules, MESH, TENSORS)


def test_rank_mismatch_names_rule_path_and_shape():
    with pytest.raises(ConfigError, match=r"^layout\.rules\.d2/bias: gives 2 axes \[null, model\] but variable 'd2/bias' has rank 1 \(shape \(10\)\)"):
        assign_rules((rule("d2/bias", None, "model"),), MESH, TENSORS)


def test_indivisible_dimension_lists_axes_that_would_fit():
    with pytest.raises(ConfigError, match=r"dimension 1 of variable 'd2/kernel' \(size 10.*'model' of size 4.*valid for this dimension: null or data"):
        assign_rules((rule("d2/kernel", None, "model"),), MESH, TENSORS)


def test_rule_matching_nothing_lists_closest_paths():
    with pytest.raises(ConfigError, match=r"^layout\.rules\.d1/bias: matches no variable or output .*closest real paths: d2/bias"):
        assign_rules((rule("d1/bias", "model"),), MESH, TENSORS)


def test_output_rules_are_checked_for_rank():
    with pytest.raises(ConfigError, match=r"output 'd2/output' has rank 2"):
        assign_rules((rule("d2/output", "data"),), MESH, TENSORS)


def test_layout_sections_carry_origins_optional_rules_and_extra_rules():
    from meshrun.config.parse import parse_layout

    layout = parse_layout(
        {"rules": {"d1/kernel": [None, "model"], "d9/kernel": ["model", None]}, "optional": ["d9/kernel"],
         "extra_rules": {"d2/kernel": ["model", None]}},
        MESH,
    )
    assert [(r.pattern, r.origin, r.optional) for r in layout.rules] == [("d1/kernel", "rules", False), ("d9/kernel", "rules", True)]
    assert [(r.pattern, r.origin, r.key) for r in layout.extra_rules] == [("d2/kernel", "extra_rules", "layout.extra_rules.d2/kernel")]
    check = check_rules(layout.rules + layout.extra_rules, MESH, TENSORS)
    assert check.errors == ()  # d9/kernel matches nothing, but may
    assert [r.pattern for r in check.unmatched_optional] == ["d9/kernel"]
    assert check.assigned["d2/kernel"].origin == "extra_rules"


def test_the_models_own_rules_are_reported_under_layout_from_model():
    from meshrun.config.parse import parse_layout

    own = LayoutRule("d1/kernel", ("model",), origin="from_model", optional=True)
    (error,) = check_rules((own,), MESH, TENSORS).errors
    assert str(error).startswith("layout.from_model: the model's own rule 'd1/kernel' gives 1 axes")
    with pytest.raises(ConfigError, match=r"^layout\.rules: got 1 rule with layout\.from_model=true.*layout\.extra_rules"):
        parse_layout({"from_model": True, "rules": {"d1/kernel": [None, "model"]}}, MESH)
    with pytest.raises(ConfigError, match=r"^layout\.extra_rules\.d1/kernel: got axis 'tensor'"):
        parse_layout({"extra_rules": {"d1/kernel": [None, "tensor"]}}, MESH)
