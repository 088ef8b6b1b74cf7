"""Layout rules against variable shapes, on shapes alone (no jax): Keras' matching, and meshrun's
checks for what Keras would silently replicate or fail on late."""

import pytest

from meshrun.config.layout_schema import LayoutRule, MeshConfig
from meshrun.errors import ConfigError
from meshrun.placement.layout import (
    TensorSpec,
    assign_rules,
    bend_notes,
    check_rules,
    matching_rules,
    with_bends,
    with_extra_rules,
)

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
    assert {path: r.pattern for path, r in assigned.items()} == {
        "d1/kernel": "d1/kernel",
        "d2/output": "d2/output",
    }


def test_unknown_batch_dimension_of_an_output_is_not_checked_for_divisibility():
    assign_rules((rule("d2/output", "data", None),), MESH, TENSORS)


def test_two_matching_regexes_name_both():
    rules = (rule("d2/.*", None, None), rule(".*/kernel", None, "model"))
    with pytest.raises(ConfigError, match=r"'d2/kernel' is matched by 2 rules, 'd2/\.\*' and '\.\*/kernel'"):
        assign_rules(rules, MESH, TENSORS)


def test_rank_mismatch_names_rule_path_and_shape():
    with pytest.raises(
        ConfigError,
        match=r"^layout\.rules\.d2/bias: gives 2 axes \[null, model\] "
        r"but variable 'd2/bias' has rank 1 \(shape \(10\)\)",
    ):
        assign_rules((rule("d2/bias", None, "model"),), MESH, TENSORS)


def test_indivisible_dimension_lists_axes_that_would_fit():
    with pytest.raises(
        ConfigError,
        match=r"dimension 1 of variable 'd2/kernel' \(size 10.*'model' "
        r"of size 4.*valid for this dimension: null or data",
    ):
        assign_rules((rule("d2/kernel", None, "model"),), MESH, TENSORS)


def test_rule_matching_nothing_lists_closest_paths():
    with pytest.raises(
        ConfigError,
        match=r"^layout\.rules\.d1/bias: matches no variable or output .*closest real paths: d2/bias",
    ):
        assign_rules((rule("d1/bias", "model"),), MESH, TENSORS)


def test_output_rules_are_checked_for_rank():
    with pytest.raises(ConfigError, match=r"output 'd2/output' has rank 2"):
        assign_rules((rule("d2/output", "data"),), MESH, TENSORS)


def test_layout_sections_carry_origins_optional_rules_and_extra_rules():
    from meshrun.config.parse import parse_layout

    layout = parse_layout(
        {
            "rules": {"d1/kernel": [None, "model"], "d9/kernel": ["model", None]},
            "optional": ["d9/kernel"],
            "extra_rules": {"d2/kernel": ["model", None]},
        },
        MESH,
    )
    assert [(r.pattern, r.origin, r.optional) for r in layout.rules] == [
        ("d1/kernel", "rules", False),
        ("d9/kernel", "rules", True),
    ]
    assert [(r.pattern, r.origin, r.key) for r in layout.extra_rules] == [
        ("d2/kernel", "extra_rules", "layout.extra_rules.d2/kernel")
    ]
    check = check_rules(layout.rules + layout.extra_rules, MESH, TENSORS)
    assert check.errors == ()  # d9/kernel matches nothing, but may
    assert [r.pattern for r in check.unmatched_optional] == ["d9/kernel"]
    assert check.assigned["d2/kernel"].origin == "extra_rules"


def test_the_models_own_rules_are_reported_under_layout_from_model():
    from meshrun.config.parse import parse_layout

    own = LayoutRule("d1/kernel", ("model",), origin="from_model", optional=True)
    (error,) = check_rules((own,), MESH, TENSORS).errors
    assert str(error).startswith("layout.from_model: the model's own rule 'd1/kernel' gives 1 axes")
    with pytest.raises(
        ConfigError, match=r"^layout\.rules: got 1 rule with layout\.from_model=true.*layout\.extra_rules"
    ):
        parse_layout({"from_model": True, "rules": {"d1/kernel": [None, "model"]}}, MESH)
    with pytest.raises(ConfigError, match=r"^layout\.extra_rules\.d1/kernel: got axis 'tensor'"):
        parse_layout({"extra_rules": {"d1/kernel": [None, "tensor"]}}, MESH)


# --- lenient rules: a family layout's dimension the mesh cannot divide stays whole ----------------

ATTENTION = [
    TensorSpec("block_0/query/kernel", (8, 64, 16)),  # 8 query heads: divide by 4
    TensorSpec("block_0/key/kernel", (1, 64, 16)),  # 1 key/value head (multi-query attention): does not
    TensorSpec("block_1/query/kernel", (8, 64, 16)),
    TensorSpec("block_1/key/kernel", (1, 64, 16)),
]


def test_a_lenient_rule_leaves_an_indivisible_dimension_whole_with_an_exact_rule_for_keras():
    heads = LayoutRule(
        r"block_\d+/(query|key)/kernel", ("model", "data", None), replicate_if_indivisible=True
    )
    check = check_rules((heads,), MESH, ATTENTION)
    assert check.errors == () and check.misfits == {}
    assert check.assigned["block_0/query/kernel"] == heads
    exact = check.assigned["block_0/key/kernel"]
    assert exact == LayoutRule(
        "block_0/key/kernel", (None, "data", None), derived_from=heads.pattern
    )  # hidden still over data
    assert [(bend.path, bend.whole) for bend in check.bends] == [
        ("block_0/key/kernel", ((0, "model"),)),
        ("block_1/key/kernel", ((0, "model"),)),
    ]
    # Keras looks the exact path up before any pattern: the written rule and the exact ones agree
    # with the check, and the written rule counts as used.
    again = check_rules((*(bend.exact_rule for bend in check.bends), heads), MESH, ATTENTION)
    assert (
        again.errors == ()
        and again.bends == ()
        and again.assigned["block_1/key/kernel"].axes == (None, "data", None)
    )


def test_a_lenient_rule_written_as_its_path_is_replaced_by_the_rule_it_bends_to():
    # KerasHub's maps name the token embedding by its path: the bent rule is that path too, and Keras
    # must get it alone (two rules of one path: an error, and a LayoutMap keeps the last).
    embedding = LayoutRule(
        "emb/embeddings", ("model", "data"), origin="from_model", replicate_if_indivisible=True
    )
    tensors = [TensorSpec("emb/embeddings", (405, 32))]
    rules, bends = with_bends((embedding,), MESH, tensors)
    assert rules == (
        LayoutRule("emb/embeddings", (None, "data"), origin="from_model", derived_from="emb/embeddings"),
    )
    assert [bend.path for bend in bends] == ["emb/embeddings"]
    check = check_rules(rules, MESH, tensors)
    assert check.errors == () and check.assigned["emb/embeddings"].axes == (None, "data")


def test_an_extra_rule_with_a_layouts_pattern_replaces_it_and_the_rest_stay():
    layout = (rule("d1/kernel", None, "model"), rule("d2/kernel", "model", None))
    extra = (LayoutRule("d1/kernel", (None, None), origin="extra_rules"),)
    assert with_extra_rules(layout, extra) == (layout[1], extra[0])
    assert check_rules(with_extra_rules(layout, extra), MESH, TENSORS).errors == ()


def test_one_pattern_twice_names_where_each_came_from():
    twice = (rule("d1/kernel", None, "model"), LayoutRule("d1/kernel", (None, None), origin="extra_rules"))
    with pytest.raises(ConfigError, match=r"'d1/kernel' \(rules\) and 'd1/kernel' \(extra_rules\)"):
        assign_rules(twice, MESH, TENSORS)


def test_a_layouts_strict_rule_on_an_indivisible_dimension_names_the_extra_rule_that_keeps_it_whole():
    vocabulary = [TensorSpec("emb/embeddings", (405, 32))]
    with pytest.raises(ConfigError) as refused:
        assign_rules((rule("emb/embeddings", "model", "data"),), MESH, vocabulary)
    assert str(refused.value).endswith(
        "valid for this dimension: null; 'layout.extra_rules={emb/embeddings:[null,data]}' replaces the rule "
        "with one that keeps it whole"
    )
    with pytest.raises(ConfigError) as written:  # the user's own extra rule: no advice to replace it
        assign_rules((LayoutRule("emb/embeddings", ("model", None), origin="extra_rules"),), MESH, vocabulary)
    assert str(written.value).endswith("valid for this dimension: null")


def test_one_note_per_lenient_rule_says_what_stays_whole_and_why():
    heads = LayoutRule(r"block_\d+/(query|key)/kernel", ("model", None, None), replicate_if_indivisible=True)
    notes = bend_notes(check_rules((heads,), MESH, ATTENTION).bends, MESH)
    assert notes == [
        r"rule 'block_\d+/(query|key)/kernel' cannot split "
        r"dimension 0 of 'block_0/key/kernel' (size 1, shape "
        "(1, 64, 16)) over mesh axis 'model' of size 4, so it keeps that dimension whole, replicated over "
        "'model'; the same for 1 more path (8.00 KiB in all)"
    ]


def test_the_same_rule_written_strict_is_an_error_and_keeps_the_path_as_its_misfit():
    heads = LayoutRule(r"block_\d+/(query|key)/kernel", ("model", None, None))
    check = check_rules((heads,), MESH, ATTENTION)
    assert len(check.errors) == 1 and check.bends == ()
    assert "dimension 0 of variable 'block_0/key/kernel' (size 1" in str(
        check.errors[0]
    ) and "(and 1 more path matched" in str(check.errors[0])
    assert check.misfits == {"block_0/key/kernel": heads, "block_1/key/kernel": heads}
    assert "block_0/key/kernel" not in check.assigned


def test_a_lenient_rule_of_the_wrong_rank_is_still_an_error():
    heads = LayoutRule(r"block_\d+/(query|key)/kernel", ("model", None), replicate_if_indivisible=True)
    check = check_rules((heads,), MESH, ATTENTION)
    assert (
        check.bends == ()
        and "gives 2 axes [model, null] but variable 'block_0/query/kernel' has rank 3"
        in str(check.errors[0])
    )


def test_a_layout_file_marks_its_lenient_rules_and_a_saved_layout_keeps_them():
    import yaml

    from meshrun.config.parse import parse_layout
    from meshrun.placement.layout_file import layout_text
    from meshrun.placement.plan import make_plan
    from meshrun.run.build import AbstractModel

    raw = {
        "rules": {r"block_\d+/(query|key)/kernel": ["model", None, None], r"block_\d+/other": [None]},
        "replicate_if_indivisible": [r"block_\d+/(query|key)/kernel", "not/a/rule/here"],
    }  # one no rule has: marks nothing
    layout = parse_layout(raw, MESH)
    assert [(r.pattern, r.replicate_if_indivisible) for r in layout.rules] == [
        (r"block_\d+/(query|key)/kernel", True),
        (r"block_\d+/other", False),
    ]
    plan = make_plan("toy", MESH, layout.rules[:1], AbstractModel(tensors=tuple(ATTENTION), slots=()), "adam")
    saved = yaml.safe_load(layout_text(layout.rules, plan, ["mesh=2x4"]))
    assert saved["replicate_if_indivisible"] == [r"block_\d+/(query|key)/kernel"]
    assert parse_layout(saved, MESH).rules == layout.rules
    with pytest.raises(
        ConfigError,
        match=r"^layout\.replicate_if_indivisible: got 'block_0'; "
        r"expected a list of patterns of layout\.rules$",
    ):
        parse_layout({**raw, "replicate_if_indivisible": "block_0"}, MESH)
